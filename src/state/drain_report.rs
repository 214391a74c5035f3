//! The last drain's report, `last-drain.json` in the state directory: one
//! typed outcome per workload, written before the drain exits so that
//! `berth drain --last` and `berth status` can show it after the next boot.

use std::io;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::paths::Root;

/// How one workload's stop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Outcome {
    GracefulOff,
    /// A libvirt guest saved (managed save): it resumes at its next start.
    Saved,
    PoweredOff,
    AlreadyOff,
    ForcedOff,
    TimedOut,
    Failed,
}

impl Outcome {
    pub const ALL: [Outcome; 7] = [
        Outcome::GracefulOff,
        Outcome::Saved,
        Outcome::PoweredOff,
        Outcome::AlreadyOff,
        Outcome::ForcedOff,
        Outcome::TimedOut,
        Outcome::Failed,
    ];

    /// The workload is known to be down after it: what its owner key (in
    /// cluster mode) may be released on.
    pub fn is_down(self) -> bool {
        matches!(
            self,
            Outcome::GracefulOff
                | Outcome::Saved
                | Outcome::PoweredOff
                | Outcome::AlreadyOff
                | Outcome::ForcedOff
        )
    }

    pub fn message_id(self) -> &'static str {
        match self {
            Outcome::GracefulOff => "a0ddea6ee36c427990a5421dd1040be6",
            Outcome::Saved => "3c6f2d8e91a54b0fa7e5d1c2b4a69f08",
            Outcome::PoweredOff => "089fe267674d4f0ebf8dde1c34946cf4",
            Outcome::AlreadyOff => "5fcdcfa2011b4cf1963341c3862f35f2",
            Outcome::ForcedOff => "d74ad424d3bf40c6bf0b97994b7ba6a6",
            Outcome::TimedOut => "77846b70b9fa45779ccea3898efdb420",
            Outcome::Failed => "15a8acea34054433a36a0397e2cd9e99",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::GracefulOff => "GracefulOff",
            Outcome::Saved => "Saved",
            Outcome::PoweredOff => "PoweredOff",
            Outcome::AlreadyOff => "AlreadyOff",
            Outcome::ForcedOff => "ForcedOff",
            Outcome::TimedOut => "TimedOut",
            Outcome::Failed => "Failed",
        }
    }

    /// The journal field that counts this outcome in the summary.
    pub fn count_field(self) -> &'static str {
        match self {
            Outcome::GracefulOff => "BERTH_GRACEFUL_OFF",
            Outcome::Saved => "BERTH_SAVED",
            Outcome::PoweredOff => "BERTH_POWERED_OFF",
            Outcome::AlreadyOff => "BERTH_ALREADY_OFF",
            Outcome::ForcedOff => "BERTH_FORCED_OFF",
            Outcome::TimedOut => "BERTH_TIMED_OUT",
            Outcome::Failed => "BERTH_FAILED",
        }
    }

    /// The drain stopped it: a transition in the workload's record.
    pub fn stopped_it(self) -> bool {
        matches!(
            self,
            Outcome::GracefulOff | Outcome::Saved | Outcome::ForcedOff | Outcome::PoweredOff
        )
    }
}

/// How the drain found a workload's unit when it began.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Found {
    /// Active, activating, reloading, or deactivating other than by a
    /// stop queued before the shutdown (its own exit, a restart, or a
    /// stop the shutdown itself pulled in).
    Running,
    /// Deactivating by a stop job queued before the shutdown began (the
    /// drain's own stop job is newer): an admin's stop, or a dependency's.
    /// Meant to be off, like one found inactive.
    Stopping,
    /// Failed: it crashed or its start failed; nobody stopped it.
    Failed,
    /// Down, with systemd about to start it again (`restart`; SubState
    /// auto-restart): the drain's stop canceled that restart.
    Restarting,
    /// Inactive: stopped (by an admin, or itself), or never started.
    Off,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StopResult {
    pub workload: String,
    /// Its unit: `berth@NAME.service`, or a `unit =` workload's own.
    /// Absent from reports written before there were others.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub unit: String,
    pub outcome: Outcome,
    /// When its stop began, in ms since the drain began.
    pub started_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    pub elapsed_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// How its unit was when the drain began; absent when systemd could
    /// not list the units (and in reports written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found: Option<Found>,
}

impl StopResult {
    /// Its unit, also for a report that did not say.
    pub fn unit_name(&self) -> String {
        if self.unit.is_empty() {
            crate::names::unit_name(&self.workload)
        } else {
            self.unit.clone()
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub started_at: String,
    pub finished_at: String,
    pub elapsed_ms: u64,
    pub deadline_s: u64,
    pub parallelism: u32,
    pub deadline_reached: bool,
    /// The boot it ran in; empty when unknown (or written before it was
    /// recorded).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub boot_id: String,
    /// The run of the manager it ran in (`BOOT_ID/MANAGER_START_US`, see
    /// `state::runs`); empty when unknown.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub run: String,
    /// Run by a shutdown (systemd's SystemState was "stopping" when it
    /// began: true), or by hand (false); null when that could not be
    /// asked, and absent from reports written before it was recorded.
    /// Only a shutdown's drain tells `autostart = "last-state"` what ran.
    #[serde(default)]
    pub shutdown: Option<bool>,
    /// Why the node was frozen in the run that ended with this drain (the
    /// autostart did not run then: what was off says nothing of what
    /// should run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_frozen: Option<String>,
    pub workloads: Vec<StopResult>,
}

impl Report {
    /// How many workloads ended with each outcome, in outcome order.
    /// The workloads meant to run when it began: those it found running,
    /// failed (crashed, or a start that failed: nobody stopped them), or
    /// waiting for systemd's restart.
    /// When it could not tell, every outcome but AlreadyOff counts.
    pub fn meant_to_run(&self) -> impl Iterator<Item = &str> {
        self.workloads
            .iter()
            .filter(|r| match r.found {
                Some(found) => matches!(found, Found::Running | Found::Failed | Found::Restarting),
                None => r.outcome != Outcome::AlreadyOff,
            })
            .map(|r| r.workload.as_str())
    }

    pub fn counts(&self) -> std::collections::BTreeMap<Outcome, usize> {
        let mut counts = std::collections::BTreeMap::new();
        for r in &self.workloads {
            *counts.entry(r.outcome).or_default() += 1;
        }
        counts
    }
}

pub fn path(root: &Root) -> PathBuf {
    root.state_dir().join("last-drain.json")
}

pub fn write(root: &Root, report: &Report) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(report).map_err(io::Error::from)?;
    super::atomic::write_json(&path(root), &bytes)
}

/// Why the last report cannot be shown.
#[derive(Debug)]
pub enum ReadError {
    /// No drain recorded yet.
    Missing(PathBuf),
    Io(PathBuf, io::Error),
    NotAReport(PathBuf, serde_json::Error),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Missing(p) => write!(f, "no drain recorded yet ({} does not exist)", p.display()),
            ReadError::Io(p, e) => write!(f, "cannot read {}: {e}", p.display()),
            ReadError::NotAReport(p, e) => write!(f, "{}: not a drain report: {e}", p.display()),
        }
    }
}

impl std::error::Error for ReadError {}

/// The report's text as stored, and the report parsed from it.
pub fn read(root: &Root) -> Result<(String, Report), ReadError> {
    let path = path(root);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ReadError::Missing(path)),
        Err(e) => return Err(ReadError::Io(path, e)),
    };
    match serde_json::from_str(&text) {
        Ok(report) => Ok((text, report)),
        Err(e) => Err(ReadError::NotAReport(path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workload_found_waiting_for_its_restart_was_meant_to_run() {
        let result = |name: &str, outcome, found| StopResult {
            workload: name.into(),
            unit: String::new(),
            outcome,
            started_ms: 0,
            code: None,
            elapsed_ms: 0,
            detail: None,
            found,
        };
        let report: Report = serde_json::from_value(serde_json::json!({
            "started_at": "", "finished_at": "", "elapsed_ms": 0, "deadline_s": 1,
            "parallelism": 1, "deadline_reached": false, "workloads": []
        }))
        .unwrap();
        let report = Report {
            workloads: vec![
                result("restarting", Outcome::GracefulOff, Some(Found::Restarting)),
                result("off", Outcome::AlreadyOff, Some(Found::Off)),
                result("running", Outcome::GracefulOff, Some(Found::Running)),
            ],
            ..report
        };
        assert_eq!(
            report.meant_to_run().collect::<Vec<_>>(),
            ["restarting", "running"]
        );
        let text = serde_json::to_string(&report.workloads[0]).unwrap();
        assert!(text.contains(r#""found":"restarting""#), "{text}");
    }
}
