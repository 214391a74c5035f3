//! `berth drain`: stop every running workload in reverse start order,
//! bounded in parallelism and by one deadline, with a typed outcome each.
//!
//! Runs as berth-drain.service's ExecStop during a real shutdown, or by
//! hand. Best effort: it always finishes, records and exits 0.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use serde::Serialize;

use crate::autostart::instance_of;
use crate::config::{Loaded, StopAction, Workload};
use crate::freeze::rfc3339;
use crate::paths::{Root, STATE_DIR};
use crate::plan;
use crate::records;
use crate::report::Events;
use crate::systemd::{Ops, SystemdError, UnitStatus};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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

#[derive(Debug, Clone, Serialize)]
pub struct StopResult {
    pub workload: String,
    pub outcome: Outcome,
    /// When its stop began, in ms since the drain began.
    pub started_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<&'static str>,
    pub elapsed_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub started_at: String,
    pub finished_at: String,
    pub elapsed_ms: u64,
    pub deadline_s: u64,
    pub parallelism: u32,
    pub deadline_reached: bool,
    pub workloads: Vec<StopResult>,
}

/// Runs the drain. `Err` only when the live units cannot be listed; then
/// the configured workloads are still attempted.
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

    for group in groups {
        let mut queue = group.into_iter();
        let mut in_flight = FuturesUnordered::new();
        loop {
            while in_flight.len() < parallelism {
                match queue.next() {
                    Some(t) => in_flight.push(stop_one(ops, t, started, deadline)),
                    None => break,
                }
            }
            match in_flight.next().await {
                Some(r) => results.push(r),
                None => break,
            }
        }
    }

    for r in &results {
        record(root, r, events);
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
    let path = root.join(STATE_DIR).join("last-drain.json");
    if let Err(e) = serde_json::to_vec_pretty(&report)
        .map_err(std::io::Error::from)
        .and_then(|bytes| records::write_atomic(&path, &bytes))
    {
        events.warn(&format!("cannot write {}: {e}", path.display()));
    }
    report
}

async fn stop_one<O: Ops>(ops: &O, t: Target, drain_began: Instant, deadline: Instant) -> StopResult {
    let began = Instant::now();
    let (outcome, code, detail) = if !t.running {
        (Outcome::AlreadyOff, None, None)
    } else {
        match stop_running(ops, &t, deadline).await {
            Ok(done) => done,
            Err(e) => (Outcome::Failed, Some("E_SYSTEMD"), Some(e.to_string())),
        }
    };
    StopResult {
        workload: t.name,
        outcome,
        started_ms: began.duration_since(drain_began).as_millis() as u64,
        code,
        elapsed_ms: began.elapsed().as_millis() as u64,
        detail,
    }
}

type Done = (Outcome, Option<&'static str>, Option<String>);

/// How long a forced stop may take to complete once SIGKILL was sent.
const FORCE_SETTLE: Duration = Duration::from_secs(10);

async fn stop_running<O: Ops>(ops: &O, t: &Target, deadline: Instant) -> Result<Done, SystemdError> {
    let now = Instant::now();
    if now >= deadline {
        // Never attempted gracefully: the deadline passed while it waited.
        return force_or_abandon(ops, t, None, "E_DRAIN_DEADLINE").await;
    }
    if t.power_off() {
        ops.kill(&t.unit).await?;
        let job = ops.stop(&t.unit).await?;
        let result = ops.wait(&job, Some(FORCE_SETTLE)).await;
        return Ok(match result.as_deref() {
            Some("done") => (Outcome::PoweredOff, None, None),
            other => (
                Outcome::Failed,
                Some("E_SYSTEMD"),
                Some(format!("stop job after SIGKILL: {other:?}")),
            ),
        });
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
            if state == "inactive" || state == "failed" {
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
        None => {
            let code = if t.force_off_on_timeout {
                code
            } else {
                "E_DRAIN_GUEST_TIMEOUT"
            };
            force_or_abandon(ops, t, Some(job), code).await
        }
    }
}

/// Past its budget: SIGKILL and let the stop complete (ForcedOff), or, with
/// force-off disabled, cancel the pending stop job so it cannot hold the
/// shutdown, and leave the workload to systemd's final kill (TimedOut).
async fn force_or_abandon<O: Ops>(
    ops: &O,
    t: &Target,
    job: Option<crate::systemd::Job>,
    code: &'static str,
) -> Result<Done, SystemdError> {
    if !t.force_off_on_timeout {
        if let Some(job) = &job {
            ops.cancel(&t.unit, job).await?;
        }
        return Ok((Outcome::TimedOut, Some("E_DRAIN_GUEST_TIMEOUT"), None));
    }
    ops.kill(&t.unit).await?;
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

fn record(root: &Root, r: &StopResult, events: &Events) {
    let now = rfc3339(SystemTime::now());
    let recorded = records::update(root, &r.workload, |rec| {
        let transition =
            rec.state != "stopped" && r.outcome != Outcome::TimedOut && r.outcome != Outcome::Failed;
        rec.outcome = Some(r.outcome.as_str().into());
        rec.code = r.code.map(str::to_string);
        rec.detail = r.detail.clone();
        if transition {
            rec.state = "stopped".into();
            rec.stopped_at = Some(now.clone());
            rec.last_transition_reason = "drain".into();
        }
        transition
    });
    if let Err(e) = recorded {
        events.warn(&format!("cannot record {}: {e}", r.workload));
    }
    let mut fields = vec![
        ("BERTH_WORKLOAD", r.workload.clone()),
        ("BERTH_OUTCOME", r.outcome.as_str().to_string()),
        ("BERTH_ELAPSED_MS", r.elapsed_ms.to_string()),
    ];
    if let Some(code) = r.code {
        fields.push(("BERTH_CODE", code.to_string()));
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
    if let Err(e) = plan::check_drain_deadline(deadline_s, crate::config::Manager::System) {
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
