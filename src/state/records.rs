//! Per-workload records in `/var/lib/berth/records/NAME.json`: what the
//! helpers and the supervisor did to each workload and when.
//!
//! Writes are atomic ([`atomic::write_json`]) and happen under the
//! workload's lock ([`lock::workload`]), which the CLI, the helpers and the
//! supervisor share.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::PathBuf;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::{atomic, lock};
use crate::macros::string_enum;
use crate::paths::Root;
use crate::time::rfc3339;

string_enum! {
    /// What berth last knew of a workload.
    #[derive(Default)]
    pub enum RecordState {
        Running = "running",
        Stopped = "stopped",
        Failed = "failed",
        /// Never seen (a record just created).
        #[default]
        Unknown = "unknown",
    }
}

string_enum! {
    /// What made the last transition.
    #[derive(Default)]
    pub enum TransitionReason {
        /// No transition recorded yet.
        #[default]
        None = "",
        /// Started by the boot autostart.
        Boot = "boot",
        /// Stopped by the drain.
        Drain = "drain",
        /// Found running by the autostart with no running record.
        Adopted = "adopted",
        /// Started (or restarted) by someone else: the supervisor saw it.
        StartUser = "start-user",
        /// Stopped by someone else's stop or restart job.
        StopUser = "stop-user",
        /// Went down with no stop job.
        UnexpectedExit = "unexpected-exit",
        /// Started again by systemd after an exit, as its `restart` asks
        /// (systemd's NRestarts grew); the exit is recorded before it
        /// when the supervisor saw it.
        SystemdRestart = "systemd-restart",
        /// Found running under a new InvocationID by a pass, with no job
        /// to explain it: the recorded instance ended and another was
        /// started while no supervisor watched. One transition for both;
        /// how the old one ended is in the journal under its InvocationID.
        Replaced = "replaced",
        /// Started by its cluster agent, which took its owner key
        /// (cluster mode, `ha = true`).
        HaTake = "ha-take",
        /// Stopped by its cluster agent's fence: the node's lease was
        /// about to expire (cluster mode, `ha = true`).
        Fence = "fence",
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub name: String,
    pub state: RecordState,
    /// +1 per committed transition, never reused.
    pub transition_generation: u64,
    pub last_transition_reason: TransitionReason,
    pub last_transition_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<String>,
    /// The last helper outcome (Started, StartFailed, GracefulOff, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// When a boot last found it running and left it alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopted_at: Option<String>,
    /// Why it last stopped, as systemd tells it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_cause: Option<ExitCause>,
    /// `scan` when the supervisor found the transition on a pass (e.g. it
    /// happened while the supervisor was down): dated at detection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detected_by: Option<String>,
    /// Fingerprint of the definition the running instance was started
    /// with; a different current one means a restart is pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definition: Option<String>,
    /// systemd's InvocationID of the running instance, once seen: a new one
    /// means it was restarted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation_id: Option<String>,
    /// systemd's NRestarts as the daemon last saw it: its automatic
    /// restarts, counted since systemd last reset it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts: Option<u32>,
    /// Committed transitions by reason since the record was created:
    /// counters that survive daemon restarts (berth's metrics serve them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub transitions: BTreeMap<String, u64>,
    /// Ends with systemd's cause, by its Result (`exit-code`, `signal`,
    /// `success`, …), as the supervisor recorded them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub exits: BTreeMap<String, u64>,
}

impl Record {
    fn new(name: &str) -> Record {
        Record {
            name: name.into(),
            ..Default::default()
        }
    }
}

/// The exit as systemd recorded it for the service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitCause {
    /// The unit's Result: success, exit-code, signal, core-dump, timeout, …
    pub result: String,
    /// exited, killed or dumped (from ExecMainCode).
    pub code: String,
    /// The exit status, or the signal number when killed or dumped.
    pub status: i32,
}

pub fn records_dir(root: &Root) -> PathBuf {
    root.state_dir().join("records")
}

pub fn record_path(root: &Root, name: &str) -> PathBuf {
    records_dir(root).join(format!("{name}.json"))
}

pub fn load(root: &Root, name: &str) -> io::Result<Option<Record>> {
    match fs::read(record_path(root, name)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Applies `change` to the workload's record under its lock and writes it
/// back atomically. `change` returns whether this is a transition (the
/// generation and transition time then advance). A record that cannot be
/// parsed is moved aside as `NAME.json.corrupt` and started afresh.
pub fn update(root: &Root, name: &str, change: impl FnOnce(&mut Record) -> bool) -> io::Result<Updated> {
    let lock = lock::workload(root, name)?;
    update_locked(root, name, &lock, change)
}

/// Like [`update`], but never waits: `Ok(None)` when another process holds
/// the workload's lock (the supervisor defers to its next pass).
pub fn try_update(
    root: &Root,
    name: &str,
    change: impl FnOnce(&mut Record) -> bool,
) -> io::Result<Option<Updated>> {
    match lock::try_workload(root, name) {
        Ok(lock) => update_locked(root, name, &lock, change).map(Some),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

/// [`update`] for a caller that already holds the workload's lock (a
/// helper holds it across its start or stop job).
pub fn update_locked(
    root: &Root,
    name: &str,
    _lock: &fs::File,
    change: impl FnOnce(&mut Record) -> bool,
) -> io::Result<Updated> {
    let path = record_path(root, name);
    let mut quarantined = None;
    let mut record = match load(root, name) {
        Ok(Some(r)) => r,
        Ok(None) => Record::new(name),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            // Kept for inspection; rebuilt from systemd's live state.
            let aside = path.with_extension("json.corrupt");
            let _ = fs::rename(&path, &aside);
            quarantined = Some(format!(
                "{}: corrupt record ({e}); kept as {} and rebuilt from systemd's live state",
                path.display(),
                aside.display()
            ));
            Record::new(name)
        }
        Err(e) => return Err(e),
    };
    let before = record.clone();
    if change(&mut record) {
        record.transition_generation += 1;
        record.last_transition_at = rfc3339(SystemTime::now());
        count_transition(&mut record, &before);
    }
    // Unchanged records are not rewritten: a supervisor pass over idle
    // workloads writes nothing.
    if record != before || !path.exists() {
        atomic::write_json(&path, &serde_json::to_vec_pretty(&record)?)?;
    }
    Ok(Updated { record, quarantined })
}

/// Adds a committed transition to the record's counters: its reason, and
/// an end whose cause this transition recorded (a new `exit_cause`).
fn count_transition(record: &mut Record, before: &Record) {
    let reason = record.last_transition_reason.as_str().to_string();
    *record.transitions.entry(reason).or_default() += 1;
    if record.state != RecordState::Running
        && let Some(cause) = record
            .exit_cause
            .as_ref()
            .filter(|c| before.exit_cause.as_ref() != Some(*c))
    {
        *record.exits.entry(cause.result.clone()).or_default() += 1;
    }
}

/// A record as written, and what happened to a corrupt one it replaced.
#[derive(Debug)]
pub struct Updated {
    pub record: Record,
    /// Set when the old file could not be parsed and was moved aside: the
    /// message to log.
    pub quarantined: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_advance_the_generation_and_observations_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let r = update(&root, "web", |r| {
            r.state = RecordState::Running;
            r.last_transition_reason = TransitionReason::Boot;
            true
        })
        .unwrap()
        .record;
        assert_eq!(r.transition_generation, 1);
        let r = update(&root, "web", |r| {
            r.adopted_at = Some("now".into());
            false
        })
        .unwrap()
        .record;
        assert_eq!(r.transition_generation, 1);
        let stored = load(&root, "web").unwrap().unwrap();
        assert_eq!(stored.adopted_at.as_deref(), Some("now"));
        let json = fs::read_to_string(record_path(&root, "web")).unwrap();
        assert!(json.contains(r#""state": "running""#), "{json}");
        assert!(json.contains(r#""last_transition_reason": "boot""#), "{json}");
    }

    /// The counters behind berth's metrics: one per committed
    /// transition by reason, one per end whose cause it recorded; an
    /// observation counts nothing, and a record written before they
    /// existed reads as zeros.
    #[test]
    fn transitions_and_ends_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let killed = ExitCause {
            result: "signal".into(),
            code: "killed".into(),
            status: 9,
        };
        let steps: Vec<(TransitionReason, RecordState, Option<ExitCause>, bool)> = vec![
            (TransitionReason::Boot, RecordState::Running, None, true),
            (
                TransitionReason::UnexpectedExit,
                RecordState::Failed,
                Some(killed.clone()),
                true,
            ),
            // Observed again, not a transition.
            (
                TransitionReason::UnexpectedExit,
                RecordState::Failed,
                Some(killed.clone()),
                false,
            ),
            (TransitionReason::SystemdRestart, RecordState::Running, None, true),
            (
                TransitionReason::UnexpectedExit,
                RecordState::Failed,
                Some(killed.clone()),
                true,
            ),
            // The drain's stop carries no cause of systemd's.
            (TransitionReason::StartUser, RecordState::Running, None, true),
            (TransitionReason::Drain, RecordState::Stopped, None, true),
        ];
        for (reason, state, cause, transition) in steps {
            update(&root, "web", |r| {
                r.last_transition_reason = reason;
                r.state = state;
                r.exit_cause = cause;
                transition
            })
            .unwrap();
        }
        let r = load(&root, "web").unwrap().unwrap();
        let counts = |m: &BTreeMap<String, u64>| m.iter().map(|(k, v)| (k.clone(), *v)).collect::<Vec<_>>();
        assert_eq!(
            counts(&r.transitions),
            [
                ("boot".to_string(), 1),
                ("drain".to_string(), 1),
                ("start-user".to_string(), 1),
                ("systemd-restart".to_string(), 1),
                ("unexpected-exit".to_string(), 2),
            ]
        );
        assert_eq!(counts(&r.exits), [("signal".to_string(), 2)]);
        let old: Record = serde_json::from_str(r#"{"name":"x","state":"running","transition_generation":3,"last_transition_reason":"boot","last_transition_at":""}"#).unwrap();
        assert!(old.transitions.is_empty() && old.exits.is_empty());
    }

    #[test]
    fn a_corrupt_record_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        fs::create_dir_all(records_dir(&root)).unwrap();
        fs::write(record_path(&root, "db"), "{not json").unwrap();
        let u = update(&root, "db", |_| true).unwrap();
        assert_eq!(u.record.transition_generation, 1);
        assert!(u.quarantined.unwrap().contains("corrupt record"));
        assert!(record_path(&root, "db").with_extension("json.corrupt").exists());
    }

    #[test]
    fn a_fresh_record_reads_as_before() {
        let json = serde_json::to_value(Record::new("x")).unwrap();
        assert_eq!(json["state"], "unknown");
        assert_eq!(json["last_transition_reason"], "");
    }
}
