//! `berth drain`: stop every running workload in reverse start order,
//! bounded in parallelism and by one deadline, with a typed outcome each.
//!
//! Runs as berth-drain.service's ExecStop during a real shutdown, or by
//! hand. Best effort: it always finishes, records and exits 0.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

// tokio's clock: the same as std's in production, and pausable in tests.
use tokio::time::Instant;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use serde::Serialize;

use crate::autostart::instance_of;
use crate::config::{Loaded, StopAction, Workload};
use crate::freeze::rfc3339;
use crate::paths::Root;
use crate::plan;
use crate::records;
use crate::report::Events;
use crate::systemd::{Ops, SystemdError, UnitStatus};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum Outcome {
    GracefulOff,
    PoweredOff,
    AlreadyOff,
    ForcedOff,
    TimedOut,
    Failed,
}

impl Outcome {
    pub fn message_id(self) -> &'static str {
        match self {
            Outcome::GracefulOff => "a0ddea6ee36c427990a5421dd1040be6",
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
            Outcome::PoweredOff => "PoweredOff",
            Outcome::AlreadyOff => "AlreadyOff",
            Outcome::ForcedOff => "ForcedOff",
            Outcome::TimedOut => "TimedOut",
            Outcome::Failed => "Failed",
        }
    }
}

pub const SUMMARY_MESSAGE_ID: &str = "61e222e9096b43169c2ddfd80dc89fbb";

/// When systemd cannot be reached at all: every configured workload is
/// reported Failed, so that `berth drain --last` after the next boot tells
/// the truth rather than showing an older drain.
pub fn unreachable(root: &Root, loaded: &Loaded, error: &SystemdError, events: &Events) {
    let now = rfc3339(SystemTime::now());
    let workloads: Vec<StopResult> = loaded
        .workloads
        .iter()
        .map(|w| StopResult {
            workload: w.name.clone(),
            outcome: Outcome::Failed,
            started_ms: 0,
            code: Some("E_SYSTEMD".into()),
            elapsed_ms: 0,
            detail: Some(format!("systemd unreachable: {error}")),
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
        workloads,
    };
    write_report(root, &report, events);
}

fn write_report(root: &Root, report: &Report, events: &Events) {
    let path = root.state_dir().join("last-drain.json");
    if let Err(e) = serde_json::to_vec_pretty(report)
        .map_err(std::io::Error::from)
        .and_then(|bytes| records::write_atomic(&path, &bytes))
    {
        events.warn(&format!("cannot write {}: {e}", path.display()));
    }
}

/// One workload the drain acts on: from config, or a running unit whose
/// definition is gone or broken (host defaults, last group).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Target {
    pub name: String,
    pub unit: String,
    pub running: bool,
    pub stop_action: &'static str,
    pub stop_delay_s: u64,
    pub force_off_on_timeout: bool,
    pub configured: bool,
}

impl Target {
    fn from_workload(w: &Workload, running: bool) -> Target {
        Target {
            name: w.name.clone(),
            unit: w.unit_name(),
            running,
            stop_action: w.stop_action.as_str(),
            stop_delay_s: w.stop_delay_s,
            force_off_on_timeout: w.force_off_on_timeout,
            configured: true,
        }
    }

    fn power_off(&self) -> bool {
        self.stop_action == StopAction::PowerOff.as_str()
    }

    /// The longest the drain waits for it before forcing.
    pub fn budget_s(&self) -> u64 {
        if self.power_off() { 0 } else { self.stop_delay_s }
    }
}

/// The drain's groups: configured workloads in reverse start order, then
/// the running units nobody configured.
pub fn plan_groups(loaded: &Loaded, live: &[UnitStatus]) -> Vec<Vec<Target>> {
    let running: BTreeMap<String, bool> = live
        .iter()
        .filter_map(|u| instance_of(&u.name).map(|n| (n, u.is_running())))
        .collect();
    let mut groups: Vec<Vec<Target>> = plan::drain_groups(&loaded.workloads)
        .into_iter()
        .map(|g| {
            g.into_iter()
                .map(|w| Target::from_workload(w, running.get(&w.name).copied().unwrap_or(false)))
                .collect()
        })
        .collect();
    let orphans: Vec<Target> = running
        .iter()
        .filter(|(name, running)| **running && loaded.workload(name).is_none())
        .map(|(name, _)| Target {
            name: name.clone(),
            unit: crate::config::unit_name(name),
            running: true,
            stop_action: StopAction::GuestShutdown.as_str(),
            stop_delay_s: loaded.host.default_stop_delay_s,
            force_off_on_timeout: loaded.host.force_off_on_timeout,
            configured: false,
        })
        .collect();
    if !orphans.is_empty() {
        groups.push(orphans);
    }
    groups
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct StopResult {
    pub workload: String,
    pub outcome: Outcome,
    /// When its stop began, in ms since the drain began.
    pub started_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    pub elapsed_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Report {
    pub started_at: String,
    pub finished_at: String,
    pub elapsed_ms: u64,
    pub deadline_s: u64,
    pub parallelism: u32,
    pub deadline_reached: bool,
    pub workloads: Vec<StopResult>,
}

/// Runs the drain. When the live units cannot be listed, every configured
/// workload is still attempted.
pub async fn run<O: Ops>(ops: &O, root: &Root, loaded: &Loaded, events: &Events) -> Report {
    let started = Instant::now();
    let started_at = rfc3339(SystemTime::now());
    let deadline = started + Duration::from_secs(loaded.host.drain_deadline_s);
    let live = match ops.list_workloads().await {
        Ok(live) => live,
        Err(e) => {
            events.warn(&format!(
                "cannot list the live workload units ({e}); stopping every configured one"
            ));
            loaded
                .workloads
                .iter()
                .map(|w| UnitStatus {
                    name: w.unit_name(),
                    load_state: "loaded".into(),
                    active_state: "active".into(),
                    sub_state: "unknown".into(),
                    path: zbus::OwnedObjectPath::try_from("/").expect("root path"),
                })
                .collect()
        }
    };
    let groups = plan_groups(loaded, &live);
    let parallelism = loaded.host.drain_parallelism.max(1) as usize;
    let mut results = Vec::new();

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
            // not drain_parallelism at a time.
            let limit = if Instant::now() >= deadline {
                usize::MAX
            } else {
                parallelism
            };
            while in_flight.len() < limit {
                match queue.next() {
                    Some(t) => in_flight.push(stop_one(ops, t, Some(root), started, deadline)),
                    None => break,
                }
            }
            let next = if in_flight.is_empty() {
                None
            } else {
                // Wake at the deadline too, to release what still waits.
                tokio::select! {
                    r = in_flight.next() => r,
                    _ = tokio::time::sleep_until(deadline), if Instant::now() < deadline => continue,
                }
            };
            match next {
                Some((r, lock)) if Instant::now() >= deadline && queue.len() > 0 => {
                    record(root, &r, lock.as_ref(), events);
                    results.push(r);
                    // The deadline passed inside this group: pull the later
                    // groups into it.
                    let rest: Vec<Target> = queue.by_ref().chain(groups.by_ref().flatten()).collect();
                    queue = rest.into_iter();
                }
                Some((r, lock)) => {
                    // Recorded as each finishes: if systemd ever kills the
                    // drain, what was done is already in the journal.
                    record(root, &r, lock.as_ref(), events);
                    results.push(r);
                }
                None => break,
            }
        }
    }
    let report = Report {
        started_at,
        finished_at: rfc3339(SystemTime::now()),
        elapsed_ms: started.elapsed().as_millis() as u64,
        deadline_s: loaded.host.drain_deadline_s,
        parallelism: loaded.host.drain_parallelism,
        deadline_reached: Instant::now() >= deadline,
        workloads: results,
    };
    summarize(&report, events);
    write_report(root, &report, events);
    report
}

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
    let lock = root
        .filter(|_| t.running)
        .and_then(|root| records::lock(root, &t.name).ok());
    let began = Instant::now();
    let (outcome, code, detail) = if !t.running {
        (Outcome::AlreadyOff, None, None)
    } else {
        match stop_running(ops, &t, deadline).await {
            Ok(done) => done,
            Err(e) => (Outcome::Failed, Some("E_SYSTEMD"), Some(e.to_string())),
        }
    };
    let result = StopResult {
        workload: t.name,
        outcome,
        started_ms: began.duration_since(drain_began).as_millis() as u64,
        code: code.map(str::to_string),
        elapsed_ms: began.elapsed().as_millis() as u64,
        detail,
    };
    (result, lock)
}

type Done = (Outcome, Option<&'static str>, Option<String>);

/// How long a forced stop may take to complete once SIGKILL was sent.
const FORCE_SETTLE: Duration = Duration::from_secs(10);

async fn stop_running<O: Ops>(ops: &O, t: &Target, deadline: Instant) -> Result<Done, SystemdError> {
    if t.power_off() {
        // Killed at once, deadline or not, force-off setting or not: that
        // is what power_off asks for. A failed kill (the processes already
        // gone) still gets its stop.
        let killed = ops.kill(&t.unit).await;
        let job = ops.stop(&t.unit).await?;
        let result = ops.wait(&job, Some(FORCE_SETTLE)).await;
        return Ok(match (result.as_deref(), killed) {
            (Some("done"), _) => (Outcome::PoweredOff, None, None),
            (other, Err(e)) => (
                Outcome::Failed,
                Some("E_SYSTEMD"),
                Some(format!("{e}; stop job: {other:?}")),
            ),
            (other, Ok(())) => (
                Outcome::Failed,
                Some("E_SYSTEMD"),
                Some(format!("stop job after SIGKILL: {other:?}")),
            ),
        });
    }
    let now = Instant::now();
    if now >= deadline {
        // Never attempted gracefully: the deadline passed while it waited.
        return force_or_abandon(ops, t, None, "E_DRAIN_DEADLINE").await;
    }
    let job = ops.stop(&t.unit).await?;
    let budget = Duration::from_secs(t.stop_delay_s);
    let left = deadline - now;
    let (limit, code) = if left < budget {
        (left, "E_DRAIN_DEADLINE")
    } else {
        (budget, "E_DRAIN_FORCED_OFF")
    };
    match ops.wait(&job, Some(limit)).await {
        Some(r) if r == "done" => Ok((Outcome::GracefulOff, None, None)),
        Some(r) => {
            // The job ended without the unit going down cleanly (canceled
            // by someone else, failed): say what systemd said.
            let state = ops.active_state(&t.unit).await.unwrap_or_default();
            if is_down(&state) {
                Ok((
                    Outcome::GracefulOff,
                    None,
                    Some(format!("stop job {r}, unit {state}")),
                ))
            } else {
                Ok((
                    Outcome::Failed,
                    Some("E_SYSTEMD"),
                    Some(format!("stop job {r}, unit {state}")),
                ))
            }
        }
        None => force_or_abandon(ops, t, Some(job), code).await,
    }
}

fn is_down(active_state: &str) -> bool {
    matches!(active_state, "inactive" | "failed")
}

/// Past its budget: SIGKILL and let the stop complete (ForcedOff), or, with
/// force-off disabled, cancel the pending stop job so it cannot hold the
/// shutdown, and leave the workload to systemd's final kill (TimedOut).
/// The outcome follows what systemd says happened, not the timer alone: a
/// stop job that completed just then, or a unit already down, is
/// GracefulOff.
async fn force_or_abandon<O: Ops>(
    ops: &O,
    t: &Target,
    job: Option<crate::systemd::Job>,
    code: &'static str,
) -> Result<Done, SystemdError> {
    if let Some(job) = &job
        && ops.wait(job, Some(Duration::ZERO)).await.as_deref() == Some("done")
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
        if is_down(&ops.active_state(&t.unit).await.unwrap_or_default()) {
            return Ok((
                Outcome::GracefulOff,
                None,
                Some("went down at its stop delay".into()),
            ));
        }
        return Ok((Outcome::TimedOut, Some("E_DRAIN_GUEST_TIMEOUT"), None));
    }
    if let Err(e) = ops.kill(&t.unit).await
        && !e.is_gone()
    {
        return Err(e);
    }
    let job = match job {
        Some(job) => job,
        None => ops.stop(&t.unit).await?,
    };
    match ops.wait(&job, Some(FORCE_SETTLE)).await.as_deref() {
        Some("done") => Ok((Outcome::ForcedOff, Some(code), None)),
        other => Ok((
            Outcome::Failed,
            Some("E_SYSTEMD"),
            Some(format!(
                "no stop within {} s of SIGKILL ({other:?})",
                FORCE_SETTLE.as_secs()
            )),
        )),
    }
}

fn record(root: &Root, r: &StopResult, lock: Option<&std::fs::File>, events: &Events) {
    let now = rfc3339(SystemTime::now());
    let change = |rec: &mut records::Record| {
        // Only a stop the drain made is a transition; AlreadyOff keeps the
        // state (a failed workload stays failed).
        let transition = rec.state != "stopped"
            && matches!(
                r.outcome,
                Outcome::GracefulOff | Outcome::ForcedOff | Outcome::PoweredOff
            );
        rec.outcome = Some(r.outcome.as_str().into());
        rec.code = r.code.clone();
        rec.detail = r.detail.clone();
        if transition {
            rec.state = "stopped".into();
            rec.stopped_at = Some(now.clone());
            rec.last_transition_reason = "drain".into();
            rec.detected_by = None;
            rec.invocation_id = None;
        }
        transition
    };
    let recorded = match lock {
        Some(lock) => records::update_locked(root, &r.workload, lock, change),
        None => records::update(root, &r.workload, change),
    };
    if let Err(e) = recorded {
        events.warn(&format!("cannot record {}: {e}", r.workload));
    }
    let mut fields = vec![
        ("BERTH_WORKLOAD", r.workload.clone()),
        ("BERTH_OUTCOME", r.outcome.as_str().to_string()),
        ("BERTH_ELAPSED_MS", r.elapsed_ms.to_string()),
    ];
    if let Some(code) = &r.code {
        fields.push(("BERTH_CODE", code.clone()));
    }
    let level = match r.outcome {
        Outcome::GracefulOff | Outcome::PoweredOff | Outcome::AlreadyOff => log::Level::Info,
        Outcome::ForcedOff | Outcome::TimedOut => log::Level::Warn,
        Outcome::Failed => log::Level::Error,
    };
    let detail = r.detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default();
    events.emit(
        level,
        r.outcome.message_id(),
        &fields,
        &format!(
            "drain: berth@{}.service {} after {} ms{detail}",
            r.workload,
            r.outcome.as_str(),
            r.elapsed_ms
        ),
    );
}

fn summarize(report: &Report, events: &Events) {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &report.workloads {
        *counts.entry(r.outcome.as_str()).or_default() += 1;
    }
    let text = counts
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut fields = vec![
        ("BERTH_ELAPSED_MS", report.elapsed_ms.to_string()),
        ("BERTH_WORKLOADS", report.workloads.len().to_string()),
    ];
    for (k, v) in &counts {
        fields.push((outcome_field(k), v.to_string()));
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

fn outcome_field(outcome: &str) -> &'static str {
    match outcome {
        "GracefulOff" => "BERTH_GRACEFUL_OFF",
        "PoweredOff" => "BERTH_POWERED_OFF",
        "AlreadyOff" => "BERTH_ALREADY_OFF",
        "ForcedOff" => "BERTH_FORCED_OFF",
        "TimedOut" => "BERTH_TIMED_OUT",
        _ => "BERTH_FAILED",
    }
}

impl Report {
    /// What `berth drain --last` prints.
    pub fn text(&self) -> String {
        let mut out = format!(
            "last drain: {} to {} ({} ms, deadline {} s{}, {} at a time)\n",
            self.started_at,
            self.finished_at,
            self.elapsed_ms,
            self.deadline_s,
            if self.deadline_reached { ", reached" } else { "" },
            self.parallelism
        );
        for w in &self.workloads {
            out.push_str(&format!(
                "  berth@{}.service: {}{} after {} ms{}\n",
                w.workload,
                w.outcome.as_str(),
                w.code.as_deref().map(|c| format!(" ({c})")).unwrap_or_default(),
                w.elapsed_ms,
                w.detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default()
            ));
        }
        out
    }
}

/// `berth drain --dry-run`: the plan, each budget, the worst case, and
/// whether the deadline fits.
#[derive(Debug, Serialize)]
pub struct DryRun {
    pub groups: Vec<Vec<Target>>,
    pub parallelism: u32,
    pub deadline_s: u64,
    pub worst_case_s: u64,
    pub drain_timeout_stop_s: u64,
    pub warnings: Vec<String>,
}

pub fn dry_run(loaded: &Loaded, live: Option<&[UnitStatus]>) -> DryRun {
    let groups = plan_groups(loaded, live.unwrap_or(&[]));
    let p = loaded.host.drain_parallelism.max(1) as usize;
    let worst_case_s = groups
        .iter()
        .map(|g| g.len().div_ceil(p) as u64 * g.iter().map(Target::budget_s).max().unwrap_or(0))
        .sum();
    let deadline_s = loaded.host.drain_deadline_s;
    let mut warnings = Vec::new();
    if live.is_none() {
        warnings
            .push("systemd not reachable: live units not included, every configured workload shown".into());
    }
    if worst_case_s > deadline_s {
        warnings.push(format!(
            "the worst case ({worst_case_s} s) exceeds drain_deadline_s ({deadline_s} s): at the deadline the rest is forced off, or left to systemd's final kill without force-off"
        ));
    }
    if let Err(e) = plan::check_drain_deadline(deadline_s, loaded.host.manager) {
        warnings.push(format!("drain_deadline_s: {e}"));
    }
    DryRun {
        groups,
        parallelism: loaded.host.drain_parallelism,
        deadline_s,
        worst_case_s,
        drain_timeout_stop_s: plan::drain_timeout_stop_s(deadline_s),
        warnings,
    }
}

impl DryRun {
    pub fn text(&self) -> String {
        let mut out = format!(
            "drain plan: {} at a time per group, deadline {} s (unit TimeoutStopSec={} s), worst case {} s\n",
            self.parallelism, self.deadline_s, self.drain_timeout_stop_s, self.worst_case_s
        );
        for (i, g) in self.groups.iter().enumerate() {
            out.push_str(&format!("group {}:\n", i + 1));
            for t in g {
                out.push_str(&format!(
                    "  {} {}: {}{}\n",
                    t.unit,
                    if t.running { "running" } else { "not running" },
                    if t.stop_action == "power_off" {
                        "power_off (SIGKILL at once)".to_string()
                    } else {
                        format!(
                            "stop, wait up to {} s, then {}",
                            t.stop_delay_s,
                            if t.force_off_on_timeout {
                                "force off"
                            } else {
                                "leave running"
                            }
                        )
                    },
                    if t.configured {
                        ""
                    } else {
                        " [not configured: host defaults]"
                    }
                ));
            }
        }
        for w in &self.warnings {
            out.push_str(&format!("warning: {w}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{Behaviour, FakeOps};
    use std::time::Duration;

    fn setup(host: &str, workloads: &[(&str, &str)]) -> (tempfile::TempDir, Root, Loaded) {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc/berth/workloads");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(dir.path().join("etc/berth/berth.toml"), host).unwrap();
        for (name, body) in workloads {
            std::fs::write(
                etc.join(format!("{name}.toml")),
                format!("exec = [\"/bin/x\"]\n{body}"),
            )
            .unwrap();
        }
        let root = Root::new(dir.path());
        let loaded = crate::config::load(&root);
        assert!(loaded.is_clean(), "{:?}", loaded.errors);
        (dir, root, loaded)
    }

    fn outcomes(report: &Report) -> BTreeMap<String, (Outcome, Option<&str>)> {
        report
            .workloads
            .iter()
            .map(|w| (w.workload.clone(), (w.outcome, w.code.as_deref())))
            .collect()
    }

    const SEC: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn groups_run_in_reverse_order_and_parallelism_is_bounded() {
        let (_d, root, loaded) = setup(
            "drain_parallelism = 2",
            &[
                ("a", "order = 0"),
                ("b", "order = 10"),
                ("c", "order = 10"),
                ("d", "order = 10"),
                ("e", "order = 20"),
            ],
        );
        let ops = ["a", "b", "c", "d", "e"]
            .iter()
            .fold(FakeOps::default(), |f, n| f.unit(n, true, Behaviour::Takes(SEC)));
        let report = run(&ops, &root, &loaded, &Events::new("test")).await;
        assert!(
            outcomes(&report).values().all(|o| o.0 == Outcome::GracefulOff),
            "{report:?}"
        );
        assert_eq!(ops.peak("stop"), 2);
        let (e_begin, e_end) = ops.span("e", "stop");
        let group10: Vec<_> = ["b", "c", "d"].iter().map(|n| ops.span(n, "stop")).collect();
        assert!(
            group10.iter().all(|(b, _)| *b >= e_end),
            "group 10 began before group 20 ended"
        );
        let group10_end = group10.iter().map(|s| s.1).max().unwrap();
        assert!(ops.span("a", "stop").0 >= group10_end);
        // 1 s + 2 rounds of 1 s + 1 s.
        assert_eq!(ops.span("a", "stop").1 - e_begin, 4 * SEC);
    }

    #[tokio::test(start_paused = true)]
    async fn a_workload_that_ignores_sigterm_is_forced_at_its_stop_delay() {
        let (_d, root, loaded) = setup(
            "",
            &[
                ("hard", "stop_delay_s = 3"),
                ("soft", "stop_delay_s = 3\nforce_off_on_timeout = false"),
            ],
        );
        let ops = FakeOps::default()
            .unit("hard", true, Behaviour::IgnoresTerm)
            .unit("soft", true, Behaviour::IgnoresTerm);
        let report = run(&ops, &root, &loaded, &Events::new("test")).await;
        let o = outcomes(&report);
        assert_eq!(o["hard"], (Outcome::ForcedOff, Some("E_DRAIN_FORCED_OFF")));
        assert_eq!(o["soft"], (Outcome::TimedOut, Some("E_DRAIN_GUEST_TIMEOUT")));
        assert_eq!(*ops.killed.borrow(), ["berth@hard.service"]);
        assert_eq!(
            *ops.cancelled.borrow(),
            ["berth@soft.service"],
            "the abandoned stop job is cancelled"
        );
        let hard = report.workloads.iter().find(|w| w.workload == "hard").unwrap();
        assert_eq!(hard.elapsed_ms, 3000);
        let rec = crate::records::load(&root, "hard").unwrap().unwrap();
        assert_eq!(
            (rec.state.as_str(), rec.last_transition_reason.as_str()),
            ("stopped", "drain")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn power_off_already_off_and_orphans() {
        let (_d, root, loaded) = setup("", &[("zap", "stop_action = \"power_off\""), ("idle", "")]);
        let ops = FakeOps::default()
            .unit("zap", true, Behaviour::IgnoresTerm)
            .unit("idle", false, Behaviour::Takes(SEC))
            .unit("ghost", true, Behaviour::Takes(SEC));
        let report = run(&ops, &root, &loaded, &Events::new("test")).await;
        let o = outcomes(&report);
        assert_eq!(o["zap"].0, Outcome::PoweredOff);
        assert_eq!(o["idle"].0, Outcome::AlreadyOff);
        assert_eq!(
            o["ghost"].0,
            Outcome::GracefulOff,
            "a running unit without config is drained"
        );
        assert_eq!(
            report.workloads.last().unwrap().workload,
            "ghost",
            "orphans come last"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_forces_everything_still_pending() {
        let (_d, root, loaded) = setup(
            "drain_parallelism = 1\ndrain_deadline_s = 5",
            &[
                ("s1", "stop_delay_s = 10"),
                ("s2", "stop_delay_s = 10"),
                ("s3", "stop_delay_s = 10"),
            ],
        );
        let ops = ["s1", "s2", "s3"]
            .iter()
            .fold(FakeOps::default(), |f, n| f.unit(n, true, Behaviour::IgnoresTerm));
        let began = tokio::time::Instant::now();
        let report = run(&ops, &root, &loaded, &Events::new("test")).await;
        assert!(
            outcomes(&report)
                .values()
                .all(|o| *o == (Outcome::ForcedOff, Some("E_DRAIN_DEADLINE"))),
            "{report:?}"
        );
        assert!(report.deadline_reached);
        assert_eq!(
            tokio::time::Instant::now() - began,
            5 * SEC,
            "nothing waits past the deadline"
        );
    }

    #[test]
    fn dry_run_reports_budgets_and_the_worst_case() {
        let (_d, _root, loaded) = setup(
            "drain_parallelism = 2\ndrain_deadline_s = 60",
            &[
                ("a", "stop_delay_s = 50"),
                ("b", "stop_delay_s = 40"),
                ("c", "stop_delay_s = 30\norder = 5"),
            ],
        );
        let plan = dry_run(&loaded, None);
        assert_eq!(plan.worst_case_s, 80);
        assert_eq!(plan.drain_timeout_stop_s, 90);
        assert!(
            plan.warnings
                .iter()
                .any(|w| w.contains("worst case (80 s) exceeds drain_deadline_s (60 s)"))
        );
        assert!(plan.text().contains("berth@c.service"));
    }
}
