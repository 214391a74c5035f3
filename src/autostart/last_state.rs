//! `autostart = "last-state"`: what was running when the last shutdown
//! drain began, and whether that drain may be believed.
//!
//! A drain report counts only when a shutdown ran it (not `berth drain` by
//! hand) in the previous boot, as the boots ledger tells it, or earlier in
//! this one (a soft reboot, or a user manager that exited and came back,
//! keeps the boot id). Anything else is *unknown*: no report (first boot),
//! one that cannot be read, one from a drain by hand, or one older than the
//! previous boot (the host went down since without a drain: power lost,
//! `poweroff -ff`, a crash). Unknown means last-state workloads start, as
//! with `autostart = true`: after a crash, the workloads coming back is the
//! safer mistake than all of them staying down.

use std::collections::BTreeSet;

use crate::config::Autostart;
use crate::state::boots::Boots;
use crate::state::drain_report::{ReadError, Report};

/// What a last-state workload goes by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LastState {
    /// From a shutdown drain of the previous boot.
    Known {
        boot_id: String,
        started_at: String,
        /// The workloads the drain found running.
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
    /// A drain run by hand (`berth drain`), not by a shutdown.
    ByHand {
        started_at: String,
    },
    /// A shutdown drain, but not of the previous boot.
    Stale {
        started_at: String,
        boot_id: String,
    },
}

impl std::fmt::Display for Unknown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unknown::NoReport => write!(f, "no drain has been recorded"),
            Unknown::Unreadable(e) => write!(f, "the last drain's report is unreadable ({e})"),
            Unknown::ByHand { started_at } => write!(
                f,
                "the last drain ({started_at}) was run by hand, not by a shutdown"
            ),
            Unknown::Stale { started_at, boot_id } => write!(
                f,
                "the last shutdown drain ({started_at}, boot {}) is not of the previous boot: \
                 the host went down since without a drain",
                if boot_id.is_empty() { "unknown" } else { boot_id }
            ),
        }
    }
}

/// Whether the last drain's report tells the last state. Pure: `boots` is
/// the ledger once this boot (`boots.current`) was noted.
pub fn judge(report: Result<Report, ReadError>, boots: &Boots) -> LastState {
    let report = match report {
        Ok(r) => r,
        Err(ReadError::Missing(_)) => return LastState::Unknown(Unknown::NoReport),
        Err(e) => return LastState::Unknown(Unknown::Unreadable(e.to_string())),
    };
    if !report.shutdown {
        return LastState::Unknown(Unknown::ByHand {
            started_at: report.started_at,
        });
    }
    let of = |boot: &str| !boot.is_empty() && report.boot_id == boot;
    if !(of(&boots.previous) || of(&boots.current)) {
        return LastState::Unknown(Unknown::Stale {
            started_at: report.started_at,
            boot_id: report.boot_id,
        });
    }
    LastState::Known {
        running: report.found_running().map(str::to_string).collect(),
        listed: report.workloads.iter().map(|r| r.workload.clone()).collect(),
        boot_id: report.boot_id,
        started_at: report.started_at,
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
            Decision::StartBecause("it was running when the last shutdown drain began".into())
        }
        (
            Autostart::LastState,
            LastState::Known {
                listed, started_at, ..
            },
        ) if listed.contains(name) => Decision::Skip(format!(
            "autostart = \"last-state\" and it was not running when the last shutdown drain began ({started_at})"
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
    use crate::state::drain_report::{Outcome, StopResult};
    use std::path::PathBuf;

    fn report(shutdown: bool, boot_id: &str, outcomes: &[(&str, Outcome)]) -> Result<Report, ReadError> {
        Ok(Report {
            started_at: "T".into(),
            finished_at: "T".into(),
            elapsed_ms: 0,
            deadline_s: 180,
            parallelism: 4,
            deadline_reached: false,
            boot_id: boot_id.into(),
            shutdown,
            workloads: outcomes
                .iter()
                .map(|(w, o)| StopResult {
                    workload: w.to_string(),
                    unit: String::new(),
                    outcome: *o,
                    started_ms: 0,
                    code: None,
                    elapsed_ms: 0,
                    detail: None,
                })
                .collect(),
        })
    }

    fn boots(current: &str, previous: &str) -> Boots {
        Boots {
            current: current.into(),
            previous: previous.into(),
        }
    }

    /// Each case: the report, the ledger, and what a last-state workload
    /// of each name gets (S: starts, -: stays off).
    #[test]
    fn which_reports_count_and_what_they_start() {
        use Outcome::*;
        let all = [
            ("graceful", GracefulOff),
            ("saved", Saved),
            ("forced", ForcedOff),
            ("timed_out", TimedOut),
            ("failed", Failed),
            ("stopped_by_admin", AlreadyOff),
        ];
        let names = [
            "graceful",
            "saved",
            "forced",
            "timed_out",
            "failed",
            "stopped_by_admin",
            "added_since",
        ];
        let missing = Err(ReadError::Missing(PathBuf::from("/x")));
        // What, the report, the ledger, the kind of last state, and S or -
        // for each of `names`.
        type Case = (
            &'static str,
            Result<Report, ReadError>,
            Boots,
            &'static str,
            &'static str,
        );
        let cases: Vec<Case> = vec![
            (
                "a shutdown drain of the previous boot",
                report(true, "b1", &all),
                boots("b2", "b1"),
                "known",
                "SSSSS-S",
            ),
            (
                "the same boot: a soft reboot or a user manager back",
                report(true, "b2", &all),
                boots("b2", "b1"),
                "known",
                "SSSSS-S",
            ),
            (
                "a drain by hand",
                report(false, "b1", &all),
                boots("b2", "b1"),
                "by hand",
                "SSSSSSS",
            ),
            (
                "power lost after a boot that used it",
                report(true, "b1", &all),
                boots("b3", "b2"),
                "stale",
                "SSSSSSS",
            ),
            (
                "a report from before boot ids were recorded",
                report(true, "", &all),
                boots("b2", ""),
                "stale",
                "SSSSSSS",
            ),
            ("no report", missing, boots("b2", "b1"), "no report", "SSSSSSS"),
            (
                "an unreadable report",
                Err(ReadError::NotAReport(
                    PathBuf::from("/x"),
                    serde_json::from_str::<Report>("{").unwrap_err(),
                )),
                boots("b2", "b1"),
                "unreadable",
                "SSSSSSS",
            ),
        ];
        for (what, report, ledger, kind, expected) in cases {
            let last = judge(report, &ledger);
            let got_kind = match &last {
                LastState::Known { .. } => "known",
                LastState::Unknown(Unknown::NoReport) => "no report",
                LastState::Unknown(Unknown::Unreadable(_)) => "unreadable",
                LastState::Unknown(Unknown::ByHand { .. }) => "by hand",
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

    #[test]
    fn true_and_false_ignore_the_last_state() {
        let last = judge(
            report(true, "b1", &[("w", Outcome::AlreadyOff)]),
            &boots("b2", "b1"),
        );
        assert_eq!(decide(Autostart::Yes, "w", &last), Decision::Start);
        assert_eq!(
            decide(Autostart::No, "w", &last),
            Decision::Skip("autostart = false".into())
        );
        assert!(
            matches!(decide(Autostart::LastState, "w", &last), Decision::Skip(r) if r.contains("not running"))
        );
    }
}
