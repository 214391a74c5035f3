//! `autostart = "last-state"`: what was meant to run when the last
//! shutdown drain began, and whether that drain may be believed.
//!
//! A drain report counts only when a shutdown ran it (not `berth drain` by
//! hand) in the previous run of the manager, as the runs ledger tells it
//! (`state::runs`: a boot, or a user manager's or a soft reboot's new
//! start), and the node was not frozen in that run (the autostart did not
//! run then: what was off says nothing of what should run). Anything else
//! is *unknown*: no report (first boot), one that cannot be read, one from
//! a drain by hand or that did not record who ran it, one of a frozen run,
//! or one older than the previous run (the host went down since without a
//! drain: power lost, `poweroff -ff`, a crash). Unknown means last-state
//! workloads start, as with `autostart = true`: after a crash, the
//! workloads coming back is the safer mistake than all of them staying
//! down.
//!
//! Meant to run: found running, or failed (it crashed, or its start
//! failed: nobody stopped it). Found inactive: stopped by an admin (or
//! by itself, cleanly), or never started.

use std::collections::BTreeSet;

use crate::config::Autostart;
use crate::state::drain_report::{ReadError, Report};
use crate::state::runs::Runs;

/// What a last-state workload goes by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LastState {
    /// From a shutdown drain of the previous run.
    Known {
        run: String,
        started_at: String,
        /// The workloads meant to run then (found running or failed).
        running: BTreeSet<String>,
        /// Every workload it listed (it lists all configured ones).
        listed: BTreeSet<String>,
    },
    Unknown(Unknown),
}

/// Why there is no last state to go by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unknown {
    NoReport,
    Unreadable(String),
    /// This run could not be placed in the ledger.
    ThisRun(String),
    /// A drain run by hand (`berth drain`), not by a shutdown.
    ByHand {
        started_at: String,
    },
    /// A report that does not say who ran it (an older berth's, or
    /// systemd did not answer).
    NotRecorded {
        started_at: String,
    },
    /// The node was frozen in the run the drain ended.
    Frozen {
        started_at: String,
        reason: String,
    },
    /// A shutdown drain, but not of the previous run.
    Stale {
        started_at: String,
    },
}

impl std::fmt::Display for Unknown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unknown::NoReport => write!(f, "no drain has been recorded"),
            Unknown::Unreadable(e) => write!(f, "the last drain's report is unreadable ({e})"),
            Unknown::ThisRun(e) => write!(f, "this run of the manager cannot be placed ({e})"),
            Unknown::ByHand { started_at } => write!(
                f,
                "the last drain ({}) was run by hand, not by a shutdown",
                started_at.escape_debug()
            ),
            Unknown::NotRecorded { started_at } => write!(
                f,
                "the last drain ({}) did not record whether a shutdown ran it",
                started_at.escape_debug()
            ),
            Unknown::Frozen { started_at, reason } => write!(
                f,
                "the node was frozen in the run the last drain ({}) ended ({}): what was off then says \
                 nothing of what should run",
                started_at.escape_debug(),
                reason.escape_debug()
            ),
            Unknown::Stale { started_at } => write!(
                f,
                "the last shutdown drain ({}) is not of the previous run: the host went down since \
                 without a drain",
                started_at.escape_debug()
            ),
        }
    }
}

/// Whether the last drain's report tells the last state. Pure: `runs` is
/// the ledger once this run (`runs.current`) was noted.
pub fn judge(report: Result<Report, ReadError>, runs: Result<&Runs, &str>) -> LastState {
    let report = match report {
        Ok(r) => r,
        Err(ReadError::Missing(_)) => return LastState::Unknown(Unknown::NoReport),
        Err(e) => return LastState::Unknown(Unknown::Unreadable(e.to_string())),
    };
    let started_at = report.started_at.clone();
    match report.shutdown {
        Some(true) => {}
        Some(false) => return LastState::Unknown(Unknown::ByHand { started_at }),
        None => return LastState::Unknown(Unknown::NotRecorded { started_at }),
    }
    if let Some(reason) = report.node_frozen.clone() {
        return LastState::Unknown(Unknown::Frozen { started_at, reason });
    }
    let runs = match runs {
        Ok(r) => r,
        Err(e) => return LastState::Unknown(Unknown::ThisRun(e.to_string())),
    };
    // Of the previous run; or of this one, which only a manager that ran
    // its shutdown and went on can leave (a soft reboot that kept its
    // start time).
    let of = |run: &str| !run.is_empty() && report.run == run;
    if !(of(&runs.previous) || of(&runs.current)) {
        return LastState::Unknown(Unknown::Stale { started_at });
    }
    LastState::Known {
        running: report.meant_to_run().map(str::to_string).collect(),
        listed: report.workloads.iter().map(|r| r.workload.clone()).collect(),
        run: report.run,
        started_at,
    }
}

/// Why a workload starts, or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Start,
    /// Started under last-state; says why, for the log.
    StartBecause(String),
    Skip(String),
}

/// Whether the autostart starts workload `name` (not running, not frozen).
pub fn decide(mode: Autostart, name: &str, last: &LastState) -> Decision {
    match (mode, last) {
        (Autostart::Yes, _) => Decision::Start,
        (Autostart::No, _) => Decision::Skip("autostart = false".into()),
        (Autostart::LastState, LastState::Known { running, .. }) if running.contains(name) => {
            Decision::StartBecause("it was running (or had failed) when the last shutdown drain began".into())
        }
        (
            Autostart::LastState,
            LastState::Known {
                listed, started_at, ..
            },
        ) if listed.contains(name) => Decision::Skip(format!(
            "autostart = \"last-state\" and it was stopped when the last shutdown drain began ({})",
            started_at.escape_debug()
        )),
        (Autostart::LastState, LastState::Known { .. }) => {
            Decision::StartBecause("it was added since the last shutdown drain".into())
        }
        (Autostart::LastState, LastState::Unknown(why)) => Decision::StartBecause(format!("{why}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::drain_report::{Found, Outcome, StopResult};
    use std::path::PathBuf;

    type Row<'a> = (&'a str, Outcome, Option<Found>);

    fn report(shutdown: Option<bool>, run: &str, frozen: bool, rows: &[Row]) -> Result<Report, ReadError> {
        Ok(Report {
            started_at: "T".into(),
            finished_at: "T".into(),
            elapsed_ms: 0,
            deadline_s: 180,
            parallelism: 4,
            deadline_reached: false,
            boot_id: "b".into(),
            run: run.into(),
            shutdown,
            node_frozen: frozen.then(|| "berth.freeze is on the kernel command line".into()),
            workloads: rows
                .iter()
                .map(|(w, o, found)| StopResult {
                    workload: w.to_string(),
                    unit: String::new(),
                    outcome: *o,
                    started_ms: 0,
                    code: None,
                    elapsed_ms: 0,
                    detail: None,
                    found: *found,
                })
                .collect(),
        })
    }

    fn runs(current: &str, previous: &str) -> Runs {
        Runs {
            current: current.into(),
            previous: previous.into(),
        }
    }

    /// Each case: the report, the ledger, and what a last-state workload
    /// of each name gets (S: starts, -: stays off).
    #[test]
    fn which_reports_count_and_what_they_start() {
        use Outcome::*;
        let (running, failed, off) = (Some(Found::Running), Some(Found::Failed), Some(Found::Off));
        let all: &[Row] = &[
            ("graceful", GracefulOff, running),
            ("saved", Saved, running),
            ("powered", PoweredOff, running),
            ("forced", ForcedOff, running),
            ("timed_out", TimedOut, running),
            ("stop_failed", Failed, running),
            ("crashed", AlreadyOff, failed),
            ("stopped_by_admin", AlreadyOff, off),
            // Never reached before the drain's budget ran out: found off
            // all the same.
            ("unreached_off", Failed, off),
        ];
        let names = [
            "graceful",
            "saved",
            "powered",
            "forced",
            "timed_out",
            "stop_failed",
            "crashed",
            "stopped_by_admin",
            "unreached_off",
            "added_since",
        ];
        let missing = Err(ReadError::Missing(PathBuf::from("/x")));
        let ledger = runs("b2/1", "b1/1");
        let after_power_loss = runs("b3/1", "b2/1");
        let user_manager_back = runs("b2/1", "b1/900");
        let no_previous = runs("b2/1", "");
        // What, the report, the ledger, the kind of last state, and S or -
        // for each of `names`.
        type Case<'a> = (
            &'a str,
            Result<Report, ReadError>,
            Result<&'a Runs, &'a str>,
            &'a str,
            &'a str,
        );
        let cases: Vec<Case> = vec![
            (
                "a shutdown drain of the previous run",
                report(Some(true), "b1/1", false, all),
                Ok(&ledger),
                "known",
                "SSSSSSS--S",
            ),
            (
                "this run: a soft reboot that kept the manager's start",
                report(Some(true), "b2/1", false, all),
                Ok(&ledger),
                "known",
                "SSSSSSS--S",
            ),
            (
                "an older report, its workloads' states not recorded",
                report(
                    Some(true),
                    "b1/1",
                    false,
                    &[
                        ("graceful", GracefulOff, None),
                        ("stopped_by_admin", AlreadyOff, None),
                    ],
                ),
                Ok(&ledger),
                "known",
                "SSSSSSS-SS",
            ),
            (
                "a drain by hand",
                report(Some(false), "b1/1", false, all),
                Ok(&ledger),
                "by hand",
                "SSSSSSSSSS",
            ),
            (
                "a report that does not say who ran it",
                report(None, "b1/1", false, all),
                Ok(&ledger),
                "not recorded",
                "SSSSSSSSSS",
            ),
            (
                "a frozen run's drain",
                report(Some(true), "b1/1", true, all),
                Ok(&ledger),
                "frozen",
                "SSSSSSSSSS",
            ),
            (
                "power lost after a run that used it",
                report(Some(true), "b1/1", false, all),
                Ok(&after_power_loss),
                "stale",
                "SSSSSSSSSS",
            ),
            (
                "a user manager back after a logout, then power lost",
                report(Some(true), "b1/100", false, all),
                Ok(&user_manager_back),
                "stale",
                "SSSSSSSSSS",
            ),
            (
                "no run recorded in the report",
                report(Some(true), "", false, all),
                Ok(&no_previous),
                "stale",
                "SSSSSSSSSS",
            ),
            (
                "this run cannot be placed",
                report(Some(true), "b1/1", false, all),
                Err("cannot read this boot's id"),
                "this run",
                "SSSSSSSSSS",
            ),
            ("no report", missing, Ok(&ledger), "no report", "SSSSSSSSSS"),
            (
                "an unreadable report",
                Err(ReadError::NotAReport(
                    PathBuf::from("/x"),
                    serde_json::from_str::<Report>("{").unwrap_err(),
                )),
                Ok(&ledger),
                "unreadable",
                "SSSSSSSSSS",
            ),
        ];
        for (what, report, ledger, kind, expected) in cases {
            let last = judge(report, ledger);
            let got_kind = match &last {
                LastState::Known { .. } => "known",
                LastState::Unknown(Unknown::NoReport) => "no report",
                LastState::Unknown(Unknown::Unreadable(_)) => "unreadable",
                LastState::Unknown(Unknown::ThisRun(_)) => "this run",
                LastState::Unknown(Unknown::ByHand { .. }) => "by hand",
                LastState::Unknown(Unknown::NotRecorded { .. }) => "not recorded",
                LastState::Unknown(Unknown::Frozen { .. }) => "frozen",
                LastState::Unknown(Unknown::Stale { .. }) => "stale",
            };
            assert_eq!(got_kind, kind, "{what}");
            let got: String = names
                .iter()
                .map(|n| match decide(Autostart::LastState, n, &last) {
                    Decision::Skip(_) => '-',
                    _ => 'S',
                })
                .collect();
            assert_eq!(got, expected, "{what}: {names:?}");
        }
    }

    /// Review of issue 12: a report an older berth wrote has no
    /// `shutdown`, `run` or `found`: it reads, and says it cannot tell.
    #[test]
    fn a_report_from_an_older_berth_reads_as_not_recorded() {
        let old = r#"{"started_at": "2026-11-30T10:00:00Z", "finished_at": "2026-11-30T10:00:01Z",
            "elapsed_ms": 1000, "deadline_s": 180, "parallelism": 4, "deadline_reached": false,
            "workloads": [{"workload": "db", "outcome": "GracefulOff", "started_ms": 0, "elapsed_ms": 7}]}"#;
        let report: Report = serde_json::from_str(old).unwrap();
        assert_eq!(report.shutdown, None);
        let last = judge(Ok(report), Ok(&runs("b2/1", "b1/1")));
        assert!(
            matches!(last, LastState::Unknown(Unknown::NotRecorded { .. })),
            "{last:?}"
        );
    }

    #[test]
    fn true_and_false_ignore_the_last_state() {
        let last = judge(
            report(
                Some(true),
                "b1/1",
                false,
                &[("w", Outcome::AlreadyOff, Some(Found::Off))],
            ),
            Ok(&runs("b2/1", "b1/1")),
        );
        assert_eq!(decide(Autostart::Yes, "w", &last), Decision::Start);
        assert_eq!(
            decide(Autostart::No, "w", &last),
            Decision::Skip("autostart = false".into())
        );
        assert!(
            matches!(decide(Autostart::LastState, "w", &last), Decision::Skip(r) if r.contains("was stopped"))
        );
    }

    /// Hostile bytes from a report never reach the log unescaped.
    #[test]
    fn report_text_is_escaped_in_messages() {
        let mut r = report(Some(false), "", false, &[]).unwrap();
        r.started_at = "\x1b]0;owned\x07".into();
        let last = judge(Ok(r), Ok(&runs("b2/1", "b1/1")));
        let LastState::Unknown(why) = last else { panic!() };
        assert!(!why.to_string().chars().any(char::is_control), "{why}");
    }
}
