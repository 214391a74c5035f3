//! Carrying the plan out: groups in order, at most `drain_parallelism`
//! stops at a time, each graceful stop bounded by its stop delay, then
//! forced or abandoned per policy, everything inside one deadline.

use std::time::{Duration, SystemTime};

// tokio's clock: the same as std's in production, and pausable in tests.
use tokio::time::Instant;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::mpsc::UnboundedSender;

use super::plan::{self, Target};
use super::progress::{Progress, WAITING_EVERY};
use super::report::{log_outcome, record, summarize, this_run, write, write_record};
use crate::config::{Loaded, StopAction};
use crate::events::Events;
use crate::paths::Root;
use crate::state::drain_report::{Found, Outcome, Report, StopResult};
use crate::state::records::{self, Updated};
use crate::state::{atomic, lock};
use crate::systemd::{
    ActiveState, Job, JobResult, JobType, MAX_JOBS_IN_FLIGHT, Ops, SystemdError, UnitStatus,
};
use crate::time::rfc3339;

/// Runs the drain. When the live units cannot be listed, every configured
/// workload is still attempted.
///
/// `began` is when the drain began, before it connected to systemd: the
/// deadline is one budget for everything, connecting included. Whatever
/// systemd has not answered for when the budget is spent (a bus that
/// stopped answering queues every call for 10 s) is reported Failed, so
/// that the report is written before systemd's TimeoutStopSec= kill.
pub async fn run<O: Ops>(ops: &O, root: &Root, loaded: &Loaded, events: &Events, began: Instant) -> Report {
    run_telling(ops, root, loaded, events, began, None).await
}

/// [`run`], each result also sent to `tell` as it comes (the cluster's
/// release of owner keys, which must not wait for the whole drain).
pub async fn run_telling<O: Ops>(
    ops: &O,
    root: &Root,
    loaded: &Loaded,
    events: &Events,
    began: Instant,
    tell: Option<UnboundedSender<StopResult>>,
) -> Report {
    run_showing(
        ops,
        root,
        loaded,
        events,
        began,
        |total| Progress::for_drain(total, events.echoes()),
        tell,
    )
    .await
}

/// [`run`], its progress shown where `progress` (given the number of
/// running workloads to stop) says.
pub(super) async fn run_showing<O: Ops, W: Write>(
    ops: &O,
    root: &Root,
    loaded: &Loaded,
    events: &Events,
    began: Instant,
    progress: impl FnOnce(usize) -> Progress<W>,
    tell: Option<UnboundedSender<StopResult>>,
) -> Report {
    let started = began;
    let started_at = rfc3339(SystemTime::now() - began.elapsed());
    let deadline = started + Duration::from_secs(loaded.host.drain_deadline_s);
    let spent = deadline + BUDGET_AFTER_DEADLINE;
    let existing = loaded.workload_units().existing_units();
    // Asked together: a bus that stopped answering costs one wait.
    let (listed, state, manager_started, drain) = tokio::join!(
        ops.list_workloads(&existing),
        ops.system_state(),
        ops.manager_started_us(),
        ops.details(crate::names::DRAIN)
    );
    // The shutdown's stop job of the drain unit (none when run by hand):
    // job ids only grow, so a workload's stop job older than it was
    // queued before the shutdown began.
    let drain_job = drain.ok().map(|d| d.job_id).filter(|id| *id != 0);
    let shutdown = state.ok().map(|s| s == "stopping");
    let listed_ok = listed.is_ok();
    let live = match listed {
        Ok(mut live) => {
            // systemd lists no alias: an existing unit named by one (which
            // check --live reports) is asked for by that name, so that it
            // is drained all the same.
            let unlisted: Vec<&String> = existing
                .iter()
                .filter(|u| !live.iter().any(|l| &l.name == *u))
                .collect();
            for unit in unlisted {
                if let Ok(state) = ops.active_state(unit).await
                    && !state.is_down()
                {
                    live.push(UnitStatus {
                        name: unit.clone(),
                        load_state: crate::systemd::LoadState::Loaded,
                        active_state: state,
                        sub_state: String::new(),
                        path: String::new(),
                        job: None,
                    });
                }
            }
            live
        }
        Err(e) => {
            events.warn(&format!(
                "cannot list the live workload units ({e}); stopping every configured one"
            ));
            loaded
                .workloads
                .iter()
                .map(|w| UnitStatus {
                    name: w.unit_name(),
                    load_state: crate::systemd::LoadState::Loaded,
                    active_state: ActiveState::Active,
                    sub_state: "unknown".into(),
                    path: String::new(),
                    job: None,
                })
                .collect()
        }
    };
    let found = listed_ok.then(|| found_states(loaded, &live, drain_job));
    let groups = plan::groups(loaded, &live);
    let everyone: Vec<(String, String)> = groups
        .iter()
        .flatten()
        .map(|t| (t.name.clone(), t.unit.clone()))
        .collect();
    let mut progress =
        progress(groups.iter().flatten().filter(|t| t.running).count()).naming(loaded.workload_units());
    let parallelism = loaded.host.drain_parallelism.max(1) as usize;
    let mut results = Vec::new();
    let within_budget = tokio::time::timeout_at(
        spent,
        stop_groups(
            ops,
            root,
            events,
            groups,
            parallelism,
            started,
            deadline,
            &mut results,
            &mut progress,
            tell.as_ref(),
        ),
    )
    .await
    .is_ok();
    if !within_budget {
        let unanswered: Vec<(String, String)> = everyone
            .into_iter()
            .filter(|(n, _)| !results.iter().any(|r| r.workload == *n))
            .collect();
        for (name, unit) in unanswered {
            let r = StopResult {
                workload: name,
                unit,
                outcome: Outcome::Failed,
                started_ms: 0,
                code: Some("E_SYSTEMD".to_string()),
                elapsed_ms: started.elapsed().as_millis() as u64,
                detail: Some("no answer from systemd before the drain's budget ran out".to_string()),
                found: None,
            };
            record(root, &r, None, events);
            results.push(r);
        }
    }

    if let Some(found) = &found {
        for r in &mut results {
            r.found = Some(found.get(&r.workload).copied().unwrap_or(Found::Off));
        }
    }
    let (boot_id, run) = this_run(root, manager_started.ok(), events);
    let report = Report {
        started_at,
        finished_at: rfc3339(SystemTime::now()),
        elapsed_ms: started.elapsed().as_millis() as u64,
        deadline_s: loaded.host.drain_deadline_s,
        parallelism: loaded.host.drain_parallelism,
        deadline_reached: Instant::now() >= deadline,
        boot_id,
        run,
        shutdown,
        node_frozen: crate::state::freeze::node_frozen(root),
        workloads: results,
    };
    summarize(&report, events);
    write(root, &report, events);
    report
}

/// How each configured workload's unit was when the drain began, by
/// workload (absent: its unit is not loaded, so off). `drain_job` is the
/// shutdown's stop job of the drain unit.
fn found_states(loaded: &Loaded, live: &[UnitStatus], drain_job: Option<u32>) -> BTreeMap<String, Found> {
    let units = loaded.workload_units();
    live.iter()
        .filter_map(|u| {
            let name = units.workload_of(&u.name)?;
            let found = if stopped_before_the_shutdown(u, drain_job) {
                Found::Stopping
            } else if u.restart_pending() {
                Found::Restarting
            } else if u.is_running() {
                Found::Running
            } else if u.active_state == ActiveState::Failed {
                Found::Failed
            } else {
                Found::Off
            };
            Some((name.to_string(), found))
        })
        .collect()
}

/// A unit deactivating when the drain begins is being stopped by someone
/// other than the drain, which has not stopped anything yet. The
/// shutdown transaction never stops a workload unit itself (no
/// Conflicts=shutdown.target), but an admin's own dependencies can pull
/// a stop into it: only a stop job queued before the shutdown's (an
/// older, smaller id) is an admin's or a dependency's decision to stop
/// it. Its own exit (no job) and a restart stay meant to run.
fn stopped_before_the_shutdown(u: &UnitStatus, drain_job: Option<u32>) -> bool {
    u.active_state == ActiveState::Deactivating
        && matches!((&u.job, drain_job), (Some((id, JobType::Stop)), Some(drain)) if *id < drain)
}

/// The groups, in order, `parallelism` stops at a time; past the deadline
/// everything left at once. Results go into `results` as they come, so
/// that what was done survives the budget running out.
#[allow(clippy::too_many_arguments)]
async fn stop_groups<O: Ops, W: Write>(
    ops: &O,
    root: &Root,
    events: &Events,
    groups: Vec<Vec<Target>>,
    parallelism: usize,
    started: Instant,
    deadline: Instant,
    results: &mut Vec<StopResult>,
    progress: &mut Progress<W>,
    tell: Option<&UnboundedSender<StopResult>>,
) {
    let mut records = Vec::new();
    // Whose stops are under way, for the waiting line.
    let mut stopping: BTreeSet<String> = BTreeSet::new();
    let mut waiting = tokio::time::interval_at(Instant::now() + WAITING_EVERY, WAITING_EVERY);
    // A loop held up for longer says so once, not once per missed tick.
    waiting.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut groups = groups.into_iter();
    while let Some(mut group) = groups.next() {
        // Past the deadline the remaining groups are one batch: everything
        // still pending is forced at once.
        if Instant::now() >= deadline {
            group.extend(groups.by_ref().flatten());
        }
        let mut queue = group.into_iter();
        let mut in_flight = FuturesUnordered::new();
        loop {
            // Past the deadline everything still pending is forced at once,
            // not drain_parallelism at a time. Either way no more than
            // systemd can track over the bus (MAX_JOBS_IN_FLIGHT, 256):
            // each stop holds a job and its workload's lock.
            let limit = if Instant::now() >= deadline {
                MAX_JOBS_IN_FLIGHT
            } else {
                parallelism.min(MAX_JOBS_IN_FLIGHT)
            };
            while in_flight.len() < limit {
                match queue.next() {
                    Some(t) => {
                        if t.running {
                            stopping.insert(t.name.clone());
                        }
                        in_flight.push(stop_one(ops, t, Some(root), started, deadline));
                    }
                    None => break,
                }
            }
            let next = if in_flight.is_empty() {
                None
            } else {
                // Wake at the deadline too, to release what still waits.
                tokio::select! {
                    r = in_flight.next() => r,
                    _ = tokio::time::sleep_until(deadline), if Instant::now() < deadline => {
                        // The later groups join now: a stop that hangs in
                        // this group must not hold them back.
                        let rest: Vec<Target> = queue.by_ref().chain(groups.by_ref().flatten()).collect();
                        queue = rest.into_iter();
                        continue;
                    }
                    _ = waiting.tick() => {
                        progress.waiting(stopping.iter().map(String::as_str), deadline);
                        continue;
                    }
                }
            };
            if let Some((r, _)) = &next {
                stopping.remove(&r.workload);
                progress.finished(r);
                if let Some(tell) = tell {
                    let _ = tell.send(r.clone());
                }
            }
            match next {
                Some((r, lock)) if Instant::now() >= deadline && queue.len() > 0 => {
                    records.push(record_aside(root, &r, lock, events));
                    results.push(r);
                    // The deadline passed inside this group: pull the later
                    // groups into it.
                    let rest: Vec<Target> = queue.by_ref().chain(groups.by_ref().flatten()).collect();
                    queue = rest.into_iter();
                }
                Some((r, lock)) => {
                    // Logged as each finishes: if systemd ever kills the
                    // drain, what was done is already in the journal. The
                    // record is written off this thread, so that its
                    // fsyncs never delay the next stop.
                    records.push(record_aside(root, &r, lock, events));
                    results.push(r);
                }
                None => break,
            }
        }
    }
    // Every record written, and synced, before the report is: each
    // file as it was written, their directory once now.
    let mut synced = Vec::new();
    for (name, written) in records {
        let (recorded, files) = written.await.unwrap_or_else(|e| {
            (
                Err(std::io::Error::other(format!("the record writer failed: {e}"))),
                Ok(Vec::new()),
            )
        });
        events.recorded(&name, recorded);
        match files {
            Ok(files) => synced.extend(files),
            Err(e) => events.warn(&format!("cannot sync the record of {name}: {e}")),
        }
    }
    let dirs = tokio::task::spawn_blocking(move || atomic::sync_dirs(&synced))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(format!("the record sync failed: {e}"))));
    if let Err(e) = dirs {
        events.warn(&format!(
            "cannot sync the records in {}: {e}",
            records::records_dir(root).display()
        ));
    }
}

/// A record's write, and the files it synced (or why not).
type RecordWrite = (std::io::Result<Updated>, std::io::Result<Vec<std::path::PathBuf>>);

/// Logs a workload's outcome now and writes and syncs its record on the
/// blocking pool, while the next stops go on; the handle says how the
/// write went. The lock is held until the record is written, not synced.
fn record_aside(
    root: &Root,
    r: &StopResult,
    lock: Option<std::fs::File>,
    events: &Events,
) -> (String, tokio::task::JoinHandle<RecordWrite>) {
    log_outcome(r, events);
    let (root, result) = (root.clone(), r.clone());
    let written = tokio::task::spawn_blocking(move || {
        // The file's fsync here, alongside the other records' (the
        // journal has the outcome already); their directory's once,
        // after the last stop: two fsyncs each in turn cost 5 s at 2000
        // workloads, and a sync of the whole file system paid for every
        // other writer's pages too.
        let batch = atomic::Batch::begin();
        let written = write_record(&root, &result, lock.as_ref());
        drop(lock);
        (written, batch.commit_files())
    });
    (r.workload.clone(), written)
}

/// Stops each of `stops` at once, whatever its place in a drain order,
/// each within its own bound, recorded as stopped for `reason` and told
/// in the journal: the stop path of cluster mode's fence. The outcome of
/// each.
pub async fn stop_at_once<O: Ops>(
    ops: &O,
    root: &Root,
    stops: Vec<(&crate::config::Workload, Duration)>,
    reason: records::TransitionReason,
    events: &Events,
) -> Vec<StopResult> {
    let began = Instant::now();
    let stopping = stops.into_iter().map(|(w, bound)| {
        stop_one(
            ops,
            Target::from_workload(w, true),
            Some(root),
            began,
            began + bound,
        )
    });
    let mut results = Vec::new();
    for (r, lock) in futures_util::future::join_all(stopping).await {
        events.recorded(
            &r.workload,
            super::report::write_record_as(root, &r, lock.as_ref(), reason.clone()),
        );
        log_outcome(&r, events);
        results.push(r);
    }
    results
}

/// After the deadline, what is left is forced off at once; if systemd has
/// not answered by this much later, the drain gives up waiting and writes
/// its report: the unit's TimeoutStopSec= is the deadline plus
/// [`crate::config::host::DRAIN_EXIT_MARGIN_S`] (30 s), which leaves 10 s for the rest.
const BUDGET_AFTER_DEADLINE: Duration = Duration::from_secs(20);

/// How long a stop waits for its workload's lock (held for a moment by
/// the supervisor or a helper writing the record).
const LOCK_WAIT: Duration = Duration::from_secs(1);

/// Stops one workload. `root` given: its lock is taken first and handed back
/// with the result, so that the supervisor does not record this stop as
/// someone else's before the drain has recorded it.
async fn stop_one<O: Ops>(
    ops: &O,
    t: Target,
    root: Option<&Root>,
    drain_began: Instant,
    deadline: Instant,
) -> (StopResult, Option<std::fs::File>) {
    // Waited on without blocking the runtime, and never past the budget:
    // a lock someone holds delays neither this stop nor the others, and
    // the stop goes ahead without it.
    let lock = match root.filter(|_| t.running) {
        Some(root) => {
            let wait = LOCK_WAIT.min(deadline.saturating_duration_since(Instant::now()));
            lock::workload_within(root, &t.name, wait).await.ok()
        }
        None => None,
    };
    let began = Instant::now();
    let (outcome, code, detail) = if !t.running {
        (Outcome::AlreadyOff, None, None)
    } else {
        match stop_running(ops, root, &t, deadline).await {
            Ok(done) => done,
            Err(e) => (Outcome::Failed, Some("E_SYSTEMD"), Some(e.to_string())),
        }
    };
    let result = StopResult {
        workload: t.name,
        unit: t.unit,
        outcome,
        started_ms: began.duration_since(drain_began).as_millis() as u64,
        code: code.map(str::to_string),
        elapsed_ms: began.elapsed().as_millis() as u64,
        detail,
        found: None,
    };
    (result, lock)
}

type Done = (Outcome, Option<&'static str>, Option<String>);

/// How long a forced stop may take to complete once SIGKILL was sent.
const FORCE_SETTLE: Duration = Duration::from_secs(10);

/// How a guest's stop ended, as its watcher left it in the runtime
/// directory (not its exit status: systemd unloads an inactive unit, and
/// its ExecMainStatus with it): saved, or shut down after a failed save.
fn guest_outcome(root: Option<&Root>, t: &Target) -> Done {
    use crate::libvirt::guest::{StopEnd, take_stop_end};
    let end = match (root, &t.guest) {
        (Some(root), Some(domain)) => take_stop_end(&root.runtime_dir(), domain),
        _ => None,
    };
    match end {
        Some(StopEnd::Saved) => (Outcome::Saved, None, None),
        Some(StopEnd::SaveFailed) => (
            Outcome::GracefulOff,
            Some("E_DRAIN_SAVE_FAILED"),
            Some("the managed save failed; the guest was shut down instead".into()),
        ),
        _ => (Outcome::GracefulOff, None, None),
    }
}

/// Forces `t` off: SIGKILL to every process of its unit, or, for a
/// libvirt guest, its watcher asked to destroy the guest.
async fn force<O: Ops>(ops: &O, t: &Target) -> Result<(), SystemdError> {
    if t.guest.is_some() {
        ops.ask_to_destroy(&t.unit).await
    } else {
        ops.kill(&t.unit).await
    }
}

async fn stop_running<O: Ops>(
    ops: &O,
    root: Option<&Root>,
    t: &Target,
    deadline: Instant,
) -> Result<Done, SystemdError> {
    if t.stop_action == StopAction::PowerOff {
        // Killed at once, deadline or not, force-off setting or not: that
        // is what power_off asks for. A failed kill (the processes already
        // gone) still gets its stop.
        let killed = force(ops, t).await;
        let job = ops.stop(&t.unit).await?;
        let result = ops.wait(&job, Some(FORCE_SETTLE)).await;
        return Ok(match (result, killed) {
            (Some(JobResult::Done), _) => (Outcome::PoweredOff, None, None),
            (other, Err(e)) => (
                Outcome::Failed,
                Some("E_SYSTEMD"),
                Some(format!("{e}; stop job: {}", describe(&other))),
            ),
            (other, Ok(())) => (
                Outcome::Failed,
                Some("E_SYSTEMD"),
                Some(format!("stop job after SIGKILL: {}", describe(&other))),
            ),
        });
    }
    let now = Instant::now();
    if now >= deadline {
        // Never attempted gracefully: the deadline passed while it waited.
        return force_or_abandon(ops, t, None, "E_DRAIN_DEADLINE").await;
    }
    let mut job = ops.stop(&t.unit).await?;
    let budget = Duration::from_secs(t.stop_delay_s);
    let left = deadline - now;
    let (limit, code) = if left < budget {
        (left, "E_DRAIN_DEADLINE")
    } else {
        (budget, "E_DRAIN_FORCED_OFF")
    };
    let mut again = 0;
    let mut first_end: Option<String> = None;
    loop {
        let within = limit.saturating_sub(now.elapsed());
        match ops.wait(&job, Some(within)).await {
            Some(JobResult::Done) if t.guest.is_some() => return Ok(guest_outcome(root, t)),
            Some(JobResult::Done) => {
                return Ok((
                    Outcome::GracefulOff,
                    None,
                    first_end.map(|e| format!("{e}; stopped again")),
                ));
            }
            Some(r) => {
                // The job ended without the unit going down cleanly
                // (canceled by someone else, failed): say what systemd
                // said.
                let state = ops.active_state(&t.unit).await.unwrap_or_default();
                let said = format!("stop job {r}, unit {state}");
                if state.is_down() {
                    return Ok((Outcome::GracefulOff, None, Some(said)));
                }
                // A start queued meanwhile (`systemctl start` racing the
                // drain) replaces a stop job: the drain's stop wins, within
                // its budget and a few tries.
                if again < STOP_AGAIN && !within.is_zero() {
                    again += 1;
                    first_end.get_or_insert(said);
                    job = ops.stop(&t.unit).await?;
                    continue;
                }
                return Ok((Outcome::Failed, Some("E_SYSTEMD"), Some(said)));
            }
            None => return force_or_abandon(ops, t, Some(job), code).await,
        }
    }
}

/// How many times a stop job that something else ended is queued again.
const STOP_AGAIN: u32 = 3;

/// Past its budget: SIGKILL and let the stop complete (ForcedOff), or, with
/// force-off disabled, cancel the pending stop job so it cannot hold the
/// shutdown, and leave the workload to systemd's final kill (TimedOut).
/// The outcome follows what systemd says happened, not the timer alone: a
/// stop job that completed just then, or a unit already down, is
/// GracefulOff.
async fn force_or_abandon<O: Ops>(
    ops: &O,
    t: &Target,
    job: Option<Job>,
    code: &'static str,
) -> Result<Done, SystemdError> {
    if let Some(job) = &job
        && ops.wait(job, Some(Duration::ZERO)).await == Some(JobResult::Done)
    {
        return Ok((Outcome::GracefulOff, None, None));
    }
    if !t.force_off_on_timeout {
        if let Some(job) = &job
            && let Err(e) = ops.cancel(&t.unit, job).await
            && !e.is_gone()
        {
            return Err(e);
        }
        if ops.active_state(&t.unit).await.unwrap_or_default().is_down() {
            return Ok((
                Outcome::GracefulOff,
                None,
                Some("went down at its stop delay".into()),
            ));
        }
        return Ok((Outcome::TimedOut, Some("E_DRAIN_GUEST_TIMEOUT"), None));
    }
    // A kill that reports an error may have done its work all the same
    // (systemd 252 killed the main process, then failed on the cgroup
    // going away: EIO): what the stop job says decides.
    let kill_error = force(ops, t).await.err().filter(|e| !e.is_gone());
    let job = match job {
        Some(job) => job,
        None => ops.stop(&t.unit).await?,
    };
    match (ops.wait(&job, Some(FORCE_SETTLE)).await, kill_error) {
        (Some(JobResult::Done), None) => Ok((Outcome::ForcedOff, Some(code), None)),
        (Some(JobResult::Done), Some(e)) => Ok((
            Outcome::ForcedOff,
            Some(code),
            Some(format!("down, though the kill reported: {e}")),
        )),
        (other, kill_error) => Ok((
            Outcome::Failed,
            Some("E_SYSTEMD"),
            Some(format!(
                "no stop within {} s of SIGKILL ({}){}",
                FORCE_SETTLE.as_secs(),
                describe(&other),
                kill_error.map(|e| format!("; the kill: {e}")).unwrap_or_default()
            )),
        )),
    }
}

/// A job's end for a detail message, as the report always wrote it:
/// `Some("done")`, or `None` when it did not end in time.
fn describe(result: &Option<JobResult>) -> String {
    format!("{:?}", result.as_ref().map(JobResult::as_str))
}
