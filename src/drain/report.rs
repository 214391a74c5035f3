//! What the drain tells: each workload's outcome in its record and in the
//! journal (with a MESSAGE_ID the shipped catalog explains) as soon as its
//! stop ends, then a summary and `last-drain.json`.

use std::io;
use std::time::SystemTime;

use crate::config::Loaded;
use crate::events::Events;
use crate::paths::Root;
use crate::state::drain_report::{self, Outcome, Report, StopResult};
use crate::state::records::{self, RecordState, TransitionReason, Updated};
use crate::systemd::SystemdError;
use crate::time::rfc3339;

pub const SUMMARY_MESSAGE_ID: &str = "61e222e9096b43169c2ddfd80dc89fbb";

/// When systemd cannot be reached at all: every configured workload is
/// reported Failed, so that `berth drain --last` after the next boot tells
/// the truth rather than showing an older drain.
pub fn unreachable(root: &Root, loaded: &Loaded, error: &SystemdError, events: &Events) {
    events.emit(
        log::Level::Error,
        SUMMARY_MESSAGE_ID,
        &[("BERTH_CODE", "E_SYSTEMD".into())],
        &format!("drain impossible: cannot reach systemd: {error}"),
    );
    let now = rfc3339(SystemTime::now());
    let workloads: Vec<StopResult> = loaded
        .workloads
        .iter()
        .map(|w| StopResult {
            workload: w.name.clone(),
            unit: w.unit_name(),
            outcome: Outcome::Failed,
            started_ms: 0,
            code: Some("E_SYSTEMD".into()),
            elapsed_ms: 0,
            detail: Some(format!("systemd unreachable: {error}")),
            found: None,
        })
        .collect();
    for r in &workloads {
        record(root, r, None, events);
    }
    let report = Report {
        started_at: now.clone(),
        finished_at: now,
        elapsed_ms: 0,
        deadline_s: loaded.host.drain_deadline_s,
        parallelism: loaded.host.drain_parallelism,
        deadline_reached: false,
        boot_id: this_run(root, None, events).0,
        run: String::new(),
        // Whether systemd is shutting down cannot be asked.
        shutdown: None,
        node_frozen: crate::state::freeze::node_frozen(root),
        workloads,
    };
    write(root, &report, events);
}

/// This boot's id and this run's, noted in the runs ledger: a run that
/// ends in a drain is seen even when nothing else of berth ran in it.
/// Empty when unknown.
pub(super) fn this_run(root: &Root, manager_started_us: Option<u64>, events: &Events) -> (String, String) {
    let boot_id = match crate::state::runs::boot_id() {
        Ok(id) => id,
        Err(e) => {
            events.warn(&format!("cannot read this boot's id: {e}"));
            return (String::new(), String::new());
        }
    };
    let Some(started) = manager_started_us else {
        return (boot_id, String::new());
    };
    match crate::state::runs::note_run(root, &boot_id, started) {
        Ok(runs) => (boot_id, runs.current),
        Err(e) => {
            events.warn(&e);
            (boot_id, String::new())
        }
    }
}

pub(super) fn write(root: &Root, report: &Report, events: &Events) {
    if let Err(e) = drain_report::write(root, report) {
        events.warn(&format!(
            "cannot write {}: {e}",
            drain_report::path(root).display()
        ));
    }
}

/// One workload's outcome: into its record (under the lock the stop held,
/// when it had one) and the journal.
pub(super) fn record(root: &Root, r: &StopResult, lock: Option<&std::fs::File>, events: &Events) {
    events.recorded(&r.workload, write_record(root, r, lock));
    log_outcome(r, events);
}

/// The record part of [`record`]: blocking file work (a lock, a write, two
/// fsyncs), which the drain runs off its runtime's thread.
pub(super) fn write_record(root: &Root, r: &StopResult, lock: Option<&std::fs::File>) -> io::Result<Updated> {
    write_record_as(root, r, lock, TransitionReason::Drain)
}

/// [`write_record`] for a stop made for `reason` (the cluster's fence
/// stops through the drain's path).
pub(super) fn write_record_as(
    root: &Root,
    r: &StopResult,
    lock: Option<&std::fs::File>,
    reason: TransitionReason,
) -> io::Result<Updated> {
    let now = rfc3339(SystemTime::now());
    let change = |rec: &mut records::Record| {
        // Only a stop the drain made is a transition; AlreadyOff keeps the
        // state (a failed workload stays failed).
        let transition = rec.state != RecordState::Stopped && r.outcome.stopped_it();
        rec.outcome = Some(r.outcome.as_str().into());
        rec.code = r.code.clone();
        rec.detail = r.detail.clone();
        if transition {
            rec.state = RecordState::Stopped;
            rec.stopped_at = Some(now.clone());
            rec.last_transition_reason = reason;
            rec.detected_by = None;
            rec.invocation_id = None;
        }
        transition
    };
    // Without the stop's lock, only if it is free now: bookkeeping never
    // delays the stops still to come.
    match lock {
        Some(lock) => records::update_locked(root, &r.workload, lock, change),
        None => records::try_update(root, &r.workload, change).and_then(|updated| {
            updated.ok_or_else(|| {
                io::Error::new(io::ErrorKind::WouldBlock, "its lock is held; record not updated")
            })
        }),
    }
}

/// The journal part of [`record`]: one event per workload outcome.
pub(super) fn log_outcome(r: &StopResult, events: &Events) {
    let mut fields = vec![
        ("BERTH_WORKLOAD", r.workload.clone()),
        ("BERTH_OUTCOME", r.outcome.as_str().to_string()),
        ("BERTH_ELAPSED_MS", r.elapsed_ms.to_string()),
    ];
    if let Some(code) = &r.code {
        fields.push(("BERTH_CODE", code.clone()));
    }
    let level = match r.outcome {
        Outcome::GracefulOff | Outcome::Saved | Outcome::PoweredOff | Outcome::AlreadyOff => log::Level::Info,
        Outcome::ForcedOff | Outcome::TimedOut => log::Level::Warn,
        Outcome::Failed => log::Level::Error,
    };
    let detail = r.detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default();
    events.emit(
        level,
        r.outcome.message_id(),
        &fields,
        &format!(
            "drain: {} {} after {} ms{detail}",
            r.unit_name(),
            r.outcome.as_str(),
            r.elapsed_ms
        ),
    );
}

pub(super) fn summarize(report: &Report, events: &Events) {
    let counts = report.counts();
    // Alphabetical by outcome name, as the summary always read.
    let mut named: Vec<(&str, usize)> = counts.iter().map(|(o, n)| (o.as_str(), *n)).collect();
    named.sort();
    let text = named
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut fields = vec![
        ("BERTH_ELAPSED_MS", report.elapsed_ms.to_string()),
        ("BERTH_WORKLOADS", report.workloads.len().to_string()),
    ];
    for (outcome, n) in &counts {
        fields.push((outcome.count_field(), n.to_string()));
    }
    events.emit(
        log::Level::Info,
        SUMMARY_MESSAGE_ID,
        &fields,
        &format!(
            "drain done in {} ms: {}{}",
            report.elapsed_ms,
            if text.is_empty() {
                "no workloads".to_string()
            } else {
                text
            },
            if report.deadline_reached {
                " (deadline reached)"
            } else {
                ""
            }
        ),
    );
}
