//! `berth autostart`: at boot, start the enabled workloads that are not
//! running, in order; leave running ones untouched.
//!
//! Sequence: workloads sorted by (`order`, name). An order group's start
//! jobs all finish before the next group begins. Inside a group the starts
//! go out together, except that a workload with `start_delay_s > 0` holds
//! back everything after it until that many seconds after its own start
//! completed. A workload this run does not start imposes no delay.
//!
//! Whether a workload starts is its `autostart`: true, false, or
//! "last-state" ([`last_state`]).

pub mod last_state;

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use crate::config::{Autostart, Loaded, Workload};
use crate::events::Events;
use crate::paths::Root;
use crate::plan;
use crate::state::atomic;
use crate::state::freeze;
use crate::state::lock;
use crate::state::records::{self, RecordState, TransitionReason};
use crate::systemd::{Job, JobResult, MAX_JOBS_IN_FLIGHT, Ops, SystemdError};
use crate::time::rfc3339;
use last_state::{Decision, LastState};

pub const MESSAGE_ID: &str = "5afd3d3e87ee4d158033841e5f87b361";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Started,
    StartFailed(String),
    Adopted,
    Skipped(String),
}

#[derive(Debug, Default)]
pub struct Summary {
    pub actions: Vec<(String, Action)>,
    pub node_frozen: Option<String>,
}

impl Summary {
    fn count(&self, f: impl Fn(&Action) -> bool) -> usize {
        self.actions.iter().filter(|(_, a)| f(a)).count()
    }
}

/// Runs the autostart. Errs only when systemd cannot be asked at all.
pub async fn run<O: Ops>(
    ops: &O,
    root: &Root,
    loaded: &Loaded,
    node_frozen: Option<String>,
    last: &LastState,
    events: &Events,
) -> Result<Summary, SystemdError> {
    let began = std::time::Instant::now();
    let began_at = crate::time::rfc3339(std::time::SystemTime::now());
    let units = loaded.workload_units();
    let live = ops.list_workloads(&units.existing_units()).await?;
    let running: BTreeSet<String> = live
        .iter()
        .filter(|u| u.is_running())
        .filter_map(|u| units.workload_of(&u.name).map(str::to_string))
        .collect();
    let mut summary = Summary {
        node_frozen: node_frozen.clone(),
        ..Default::default()
    };

    // Every record this run writes is made durable at the end, together,
    // not with two fsyncs each in turn (seconds at 2000 workloads). The
    // runtime is single-threaded, so every write happens on this thread,
    // inside the batch. A crash before the sync may leave a record empty:
    // the supervisor sets it aside and rebuilds it from systemd's state.
    let batch = atomic::Batch::begin();
    adopt(root, &running, events, &mut summary);
    if let Some(reason) = node_frozen {
        events.warn(&format!("starting no workload: {reason}"));
        commit(batch, root, events);
        leave_report(root, &summary, running.len(), &began_at, began, events);
        return Ok(summary);
    }
    if loaded
        .workloads
        .iter()
        .any(|w| w.autostart == Autostart::LastState)
    {
        tell_last_state(last, events);
    }
    for group in plan::start_groups(&loaded.workloads) {
        start_group(ops, root, &group, &running, last, events, &mut summary).await;
    }
    commit(batch, root, events);
    tell_done(&summary, running.len(), events);
    leave_report(root, &summary, running.len(), &began_at, began, events);
    Ok(summary)
}

/// `last-autostart.json`, for the daemon's metrics.
fn leave_report(
    root: &Root,
    summary: &Summary,
    adopted: usize,
    began_at: &str,
    began: std::time::Instant,
    events: &Events,
) {
    let report = crate::state::autostart_report::Report {
        started_at: began_at.to_string(),
        elapsed_ms: u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX),
        started: summary.count(|a| *a == Action::Started),
        failed: summary.count(|a| matches!(a, Action::StartFailed(_))),
        skipped: summary.count(|a| matches!(a, Action::Skipped(_))),
        adopted,
        node_frozen: summary.node_frozen.clone(),
    };
    if let Err(e) = crate::state::autostart_report::write(root, &report) {
        events.warn(&format!(
            "cannot write {}: {e}",
            crate::state::autostart_report::path(root).display()
        ));
    }
}

/// Records each running workload as adopted (left untouched).
fn adopt(root: &Root, running: &BTreeSet<String>, events: &Events, summary: &mut Summary) {
    let now = rfc3339(SystemTime::now());
    for name in running {
        let adopted = records::update(root, name, |r| {
            r.adopted_at = Some(now.clone());
            if r.state != RecordState::Running {
                r.state = RecordState::Running;
                r.last_transition_reason = TransitionReason::Adopted;
                return true;
            }
            false
        });
        events.recorded(name, adopted);
        summary.actions.push((name.clone(), Action::Adopted));
    }
    events.emit(
        log::Level::Info,
        MESSAGE_ID,
        &[("BERTH_ADOPTED", running.len().to_string())],
        &format!("adopted {} running workloads (left untouched)", running.len()),
    );
}

/// Why `w` is not started at boot, if it is not.
fn not_starting(w: &Workload, root: &Root, last: &LastState, events: &Events) -> Option<String> {
    // An HA workload is started by its owner's daemon, never here: the
    // autostart runs without the daemon and would double-run it after a
    // reboot.
    let decision = if w.ha.is_some() {
        Decision::Skip("ha = true: only its owner in the cluster starts it (berth-daemon)".into())
    } else {
        last_state::decide(w.autostart, &w.name, last)
    };
    match decision {
        Decision::Skip(reason) => Some(reason),
        decision => freeze::instance_frozen(root, &w.name).or_else(|| {
            if let Decision::StartBecause(why) = decision {
                events.info(&format!(
                    "starting {} (autostart = \"last-state\"): {why}",
                    w.unit_name()
                ));
            }
            None
        }),
    }
}

/// Starts one group's workloads that do not run. Their starts go out
/// together (the connection bounds the calls in flight) and are waited
/// for together: one after the other, 2000 starts cost 2000 round trips
/// before the last job was even queued. A workload with a start delay
/// holds back what comes after it in the group until its start completed
/// and the delay passed.
async fn start_group<O: Ops>(
    ops: &O,
    root: &Root,
    group: &[&Workload],
    running: &BTreeSet<String>,
    last: &LastState,
    events: &Events,
    summary: &mut Summary,
) {
    let mut in_flight = FuturesUnordered::new();
    for w in group.iter().copied() {
        if running.contains(&w.name) {
            continue;
        }
        if let Some(reason) = not_starting(w, root, last, events) {
            events.info(&format!("not starting {}: {reason}", w.unit_name()));
            summary.actions.push((w.name.clone(), Action::Skipped(reason)));
            continue;
        }
        if w.start_delay_s == 0 {
            // Bounded like the jobs: each start in flight holds its
            // workload's lock open (a descriptor each).
            while in_flight.len() >= MAX_JOBS_IN_FLIGHT {
                if let Some(done) = in_flight.next().await {
                    summary.actions.push(done);
                }
            }
            in_flight.push(start_one(ops, root, w, TransitionReason::Boot, events));
            continue;
        }
        // Its start completes and its delay passes before anything after
        // it is asked for; what went before goes on meanwhile.
        let own = start_one(ops, root, w, TransitionReason::Boot, events);
        tokio::pin!(own);
        let done = loop {
            tokio::select! {
                done = &mut own => break done,
                Some(other) = in_flight.next() => summary.actions.push(other),
            }
        };
        summary.actions.push(done);
        let delay = tokio::time::sleep(Duration::from_secs(w.start_delay_s));
        tokio::pin!(delay);
        loop {
            tokio::select! {
                _ = &mut delay => break,
                Some(other) = in_flight.next() => summary.actions.push(other),
            }
        }
    }
    while let Some(done) = in_flight.next().await {
        summary.actions.push(done);
    }
}

/// The run's one summary line.
fn tell_done(summary: &Summary, adopted: usize, events: &Events) {
    let started = summary.count(|a| *a == Action::Started);
    let failed = summary.count(|a| matches!(a, Action::StartFailed(_)));
    let skipped = summary.count(|a| matches!(a, Action::Skipped(_)));
    events.emit(
        if failed > 0 {
            log::Level::Warn
        } else {
            log::Level::Info
        },
        "",
        &[
            ("BERTH_STARTED", started.to_string()),
            ("BERTH_FAILED", failed.to_string()),
            ("BERTH_SKIPPED", skipped.to_string()),
        ],
        &format!("autostart done: {started} started, {failed} failed, {skipped} skipped, {adopted} adopted"),
    );
}

/// Says once what the last-state workloads go by.
fn tell_last_state(last: &LastState, events: &Events) {
    match last {
        LastState::Known {
            run,
            started_at,
            running,
            ..
        } => events.info(&format!(
            "last state: the shutdown drain of run {} began at {} with {} workloads meant to run",
            run.escape_debug(),
            started_at.escape_debug(),
            running.len()
        )),
        LastState::Unknown(why) => events.warn(&format!(
            "last state unknown: {why}; workloads with autostart = \"last-state\" start as with autostart = true"
        )),
    }
}

fn commit(batch: atomic::Batch, root: &Root, events: &Events) {
    if let Err(e) = batch.commit() {
        events.warn(&format!(
            "cannot sync the records in {}: {e}",
            records::records_dir(root).display()
        ));
    }
}

/// How long a start waits for its workload's lock (held for a moment by
/// the supervisor or another helper writing the record).
const LOCK_WAIT: Duration = Duration::from_secs(1);

/// Starts one workload and records how its start job ended. The lock is
/// held across the job, so that the supervisor does not record this start
/// as someone else's; it is waited for without holding up the others.
pub(crate) async fn start_one<O: Ops>(
    ops: &O,
    root: &Root,
    w: &Workload,
    reason: TransitionReason,
    events: &Events,
) -> (String, Action) {
    let lock = lock::workload_within(root, &w.name, LOCK_WAIT).await.ok();
    let action = match ops.start(&w.unit_name()).await {
        Ok(job) => finish(ops, root, w, &job, reason, lock, events).await,
        Err(e) => record_start(root, w, Action::StartFailed(e.to_string()), reason, lock, events),
    };
    (w.name.clone(), action)
}

async fn finish<O: Ops>(
    ops: &O,
    root: &Root,
    w: &Workload,
    job: &Job,
    reason: TransitionReason,
    lock: Option<std::fs::File>,
    events: &Events,
) -> Action {
    let outcome = match ops.wait(job, None).await {
        Some(JobResult::Done) => Action::Started,
        result => Action::StartFailed(format!(
            "start job {}; see `systemctl status {}`",
            result.as_ref().map_or("unknown", JobResult::as_str),
            w.unit_name()
        )),
    };
    record_start(root, w, outcome, reason, lock, events)
}

fn record_start(
    root: &Root,
    w: &Workload,
    outcome: Action,
    reason: TransitionReason,
    lock: Option<std::fs::File>,
    events: &Events,
) -> Action {
    let (state, detail) = match &outcome {
        Action::StartFailed(e) => (RecordState::Failed, Some(e.clone())),
        _ => (RecordState::Running, None),
    };
    let change = |r: &mut records::Record| {
        r.state = state;
        r.last_transition_reason = reason;
        r.outcome = Some(
            if detail.is_none() {
                "Started"
            } else {
                "StartFailed"
            }
            .into(),
        );
        r.detail = detail.clone();
        r.code = None;
        r.detected_by = None;
        r.exit_cause = None;
        r.definition = Some(crate::render::definition_fingerprint(root, w));
        // A new instance: the supervisor notes its InvocationID.
        r.invocation_id = None;
        true
    };
    let recorded = match &lock {
        Some(lock) => records::update_locked(root, &w.name, lock, change),
        None => records::update(root, &w.name, change),
    };
    events.recorded(&w.name, recorded);
    match &detail {
        None => events.emit(
            log::Level::Info,
            "",
            &[("BERTH_WORKLOAD", w.name.clone())],
            &format!("started {}", w.unit_name()),
        ),
        Some(e) => events.emit(
            log::Level::Error,
            "",
            &[("BERTH_WORKLOAD", w.name.clone())],
            &format!("failed to start {}: {e}", w.unit_name()),
        ),
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::systemd::fake::{Behaviour, FakeOps};

    const NONE: LastState = LastState::Unknown(last_state::Unknown::NoReport);

    #[tokio::test(start_paused = true)]
    async fn groups_in_order_delays_hold_back_the_rest_and_skips_are_free() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc/berth/workloads");
        std::fs::create_dir_all(&etc).unwrap();
        for (name, body) in [
            ("g0a", "order = 0\nstart_delay_s = 2"),
            ("g0b", "order = 0"),
            ("g1a", "order = 10"),
            ("g1b", "order = 10\nautostart = false\nstart_delay_s = 100"),
            ("g1c", "order = 10"),
            ("g2a", "order = 20"),
            ("up", "order = 20\nstart_delay_s = 100"),
        ] {
            std::fs::write(
                etc.join(format!("{name}.toml")),
                format!("exec = [\"/bin/x\"]\n{body}"),
            )
            .unwrap();
        }
        let root = Root::new(dir.path());
        let flags = dir.path().join("var/lib/berth/freeze/instance");
        std::fs::create_dir_all(&flags).unwrap();
        std::fs::write(
            flags.join("g1c"),
            r#"{"scope":"instance","frozen_at":"x","reason":"test"}"#,
        )
        .unwrap();
        let loaded = crate::config::load(&root);
        let second = std::time::Duration::from_secs(1);
        let ops = ["g0a", "g0b", "g1a", "g1b", "g1c", "g2a"]
            .iter()
            .fold(FakeOps::default(), |f, n| {
                f.unit(n, false, Behaviour::Takes(second))
            })
            .unit("up", true, Behaviour::Takes(second));
        let began = tokio::time::Instant::now();
        let summary = run(&ops, &root, &loaded, None, &NONE, &Events::new("test"))
            .await
            .unwrap();

        let action = |n: &str| {
            summary
                .actions
                .iter()
                .find(|(w, _)| w == n)
                .map(|(_, a)| a.clone())
                .unwrap()
        };
        assert_eq!(action("up"), Action::Adopted);
        assert_eq!(action("g1b"), Action::Skipped("autostart = false".into()));
        assert!(matches!(action("g1c"), Action::Skipped(r) if r.contains("frozen")));
        let (a0, a1) = ops.span("g0a", "start");
        let (b0, b1) = ops.span("g0b", "start");
        let (c0, c1) = ops.span("g1a", "start");
        let (d0, _) = ops.span("g2a", "start");
        assert_eq!(a0, began);
        assert_eq!(b0, a1 + 2 * second, "g0b waits for g0a's start plus its delay");
        assert_eq!(c0, b1, "group 10 begins when group 0 is done");
        assert_eq!(d0, c1, "a skipped workload's delay holds nothing back");
        assert!(
            ops.spans.borrow().iter().all(|s| !s.0.contains("@up.")),
            "a running workload is left alone"
        );
    }

    /// Issue 16: one after the other, 2000 starts cost 2000 round trips
    /// before the last job was even queued.
    #[tokio::test(start_paused = true)]
    async fn a_group_starts_go_out_together() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc/berth/workloads");
        std::fs::create_dir_all(&etc).unwrap();
        let names: Vec<String> = (0..100).map(|i| format!("w{i:03}")).collect();
        let mut ops = FakeOps::default();
        for name in &names {
            std::fs::write(etc.join(format!("{name}.toml")), "exec = [\"/bin/x\"]").unwrap();
            ops = ops.unit(name, false, Behaviour::Takes(std::time::Duration::from_secs(1)));
        }
        let round_trip = std::time::Duration::from_millis(10);
        ops.round_trip.set(round_trip);
        let root = Root::new(dir.path());
        let loaded = crate::config::load(&root);
        let began = tokio::time::Instant::now();
        let summary = run(&ops, &root, &loaded, None, &NONE, &Events::new("test"))
            .await
            .unwrap();
        assert_eq!(summary.count(|a| *a == Action::Started), 100);
        let last_queued = names.iter().map(|n| ops.span(n, "start").0).max().unwrap();
        assert!(
            last_queued - began <= 2 * round_trip,
            "the last start was queued {:?} after the first call, 100 round trips of {round_trip:?} would be 1 s",
            last_queued - began
        );
        assert!(
            began.elapsed() < std::time::Duration::from_millis(1100),
            "the jobs ran together: {:?}",
            began.elapsed()
        );
    }

    /// Issue 12, part 3: last-state starts what the last shutdown drain
    /// found running and what was added since; true and false go on as
    /// before.
    #[tokio::test(start_paused = true)]
    async fn last_state_starts_what_was_running_and_what_is_new() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc/berth/workloads");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(
            dir.path().join("etc/berth/berth.toml"),
            "default_autostart = \"last-state\"",
        )
        .unwrap();
        let mut ops = FakeOps::default();
        for (name, body) in [
            ("was_running", ""),
            ("was_off", ""),
            ("new", ""),
            ("always", "autostart = true"),
            ("never", "autostart = false"),
        ] {
            std::fs::write(
                etc.join(format!("{name}.toml")),
                format!("exec = [\"/bin/x\"]\n{body}"),
            )
            .unwrap();
            ops = ops.unit(name, false, Behaviour::Takes(std::time::Duration::ZERO));
        }
        let root = Root::new(dir.path());
        let loaded = crate::config::load(&root);
        let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
        let last = LastState::Known {
            run: "b1/1".into(),
            started_at: "T".into(),
            running: set(&["was_running"]),
            listed: set(&["was_running", "was_off", "always", "never"]),
        };
        let summary = run(&ops, &root, &loaded, None, &last, &Events::new("test"))
            .await
            .unwrap();
        let mut started: Vec<&str> = summary
            .actions
            .iter()
            .filter(|(_, a)| *a == Action::Started)
            .map(|(n, _)| n.as_str())
            .collect();
        started.sort();
        assert_eq!(started, ["always", "new", "was_running"]);
        assert!(summary.actions.iter().any(|(n, a)| n == "was_off"
            && matches!(a, Action::Skipped(r) if r.contains("stopped when the last shutdown drain began"))));

        // Unknown: every last-state workload starts.
        let ops = ["was_running", "was_off", "new", "always", "never"]
            .iter()
            .fold(FakeOps::default(), |f, n| {
                f.unit(n, false, Behaviour::Takes(std::time::Duration::ZERO))
            });
        let summary = run(&ops, &root, &loaded, None, &NONE, &Events::new("test"))
            .await
            .unwrap();
        assert_eq!(summary.count(|a| *a == Action::Started), 4);
    }

    /// Issue 13: the autostart runs without the daemon and would
    /// double-run an HA workload after a reboot; its owner starts it.
    #[cfg(feature = "cluster")]
    #[tokio::test(start_paused = true)]
    async fn ha_workloads_are_left_to_their_owner() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc/berth/workloads");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(
            dir.path().join("etc/berth/berth.toml"),
            "[cluster]\nendpoints = [\"http://127.0.0.1:2379\"]",
        )
        .unwrap();
        std::fs::write(
            etc.join("db.toml"),
            "exec = [\"/bin/x\"]\nha = true\nnodes = [\"n1\"]",
        )
        .unwrap();
        std::fs::write(etc.join("web.toml"), "exec = [\"/bin/x\"]").unwrap();
        let root = Root::new(dir.path());
        let loaded = crate::config::load(&root);
        assert!(loaded.is_clean(), "{:?}", loaded.errors);
        let ops = FakeOps::default()
            .unit("db", false, Behaviour::Takes(std::time::Duration::ZERO))
            .unit("web", false, Behaviour::Takes(std::time::Duration::ZERO));
        let s = run(&ops, &root, &loaded, None, &NONE, &Events::new("test"))
            .await
            .unwrap();
        assert!(s.actions.contains(&("web".into(), Action::Started)));
        assert!(
            s.actions
                .iter()
                .any(|(n, a)| n == "db" && matches!(a, Action::Skipped(r) if r.starts_with("ha = true"))),
            "{:?}",
            s.actions
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_frozen_node_starts_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc/berth/workloads")).unwrap();
        std::fs::write(
            dir.path().join("etc/berth/workloads/w.toml"),
            "exec = [\"/bin/x\"]",
        )
        .unwrap();
        let root = Root::new(dir.path());
        let loaded = crate::config::load(&root);
        let ops = FakeOps::default().unit("w", false, Behaviour::Takes(std::time::Duration::ZERO));
        let s = run(
            &ops,
            &root,
            &loaded,
            Some("test".into()),
            &NONE,
            &Events::new("test"),
        )
        .await
        .unwrap();
        assert!(s.actions.is_empty());
        assert!(ops.spans.borrow().is_empty());
    }
}
