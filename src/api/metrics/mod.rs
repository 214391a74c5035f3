//! `/metrics`: what the supervisor knows, for Prometheus. Built from the
//! daemon's own state at each scrape (the views the loop published, the
//! freezes and the last drain it read, its own counters, the cluster
//! view the agent gathered): a scrape never calls systemd or etcd.
//! [`families`] is the one list of what is exported; [`exposition`]
//! writes it in either format.

pub mod exposition;
pub mod textfile;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::SystemTime;

use exposition::{Family, Histogram, Type};

use super::{ClusterSlot, Shared, Verdict};
use crate::config::WorkloadKind;
use crate::state::drain_report::{Outcome, Report};
use crate::state::records::Record;
use crate::systemd::ActiveState;

/// A workload's kind, as the `kind` label says it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Kind {
    /// `exec =`: berth@NAME.service runs it.
    #[default]
    Command,
    /// `unit =`: an existing unit under berth's rules.
    Unit,
    /// `libvirt =`: a guest followed by berth@NAME.service.
    Libvirt,
}

impl Kind {
    pub fn of(kind: &WorkloadKind) -> Kind {
        match kind {
            WorkloadKind::Command { .. } => Kind::Command,
            WorkloadKind::Existing { .. } => Kind::Unit,
            WorkloadKind::Libvirt { .. } => Kind::Libvirt,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Command => "command",
            Kind::Unit => "unit",
            Kind::Libvirt => "libvirt",
        }
    }
}

/// What the metrics serve of one workload beyond its live state, taken
/// from its record when its view is published.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    pub kind: Kind,
    /// Committed transitions by reason, and ends by systemd's Result.
    pub transitions: Vec<(String, u64)>,
    pub exits: Vec<(String, u64)>,
    /// systemd's NRestarts as last seen.
    pub restarts: Option<u32>,
    /// When the last transition was committed, in seconds since the epoch,
    /// and why.
    pub last_transition_s: Option<f64>,
    pub last_reason: String,
}

impl Facts {
    pub fn of(kind: Kind, record: Option<&Record>) -> Facts {
        let Some(r) = record else {
            return Facts {
                kind,
                ..Facts::default()
            };
        };
        let pairs =
            |m: &std::collections::BTreeMap<String, u64>| m.iter().map(|(k, v)| (k.clone(), *v)).collect();
        Facts {
            kind,
            transitions: pairs(&r.transitions),
            exits: pairs(&r.exits),
            restarts: r.restarts,
            last_transition_s: crate::time::parse_rfc3339(&r.last_transition_at).map(epoch_seconds),
            last_reason: r.last_transition_reason.as_str().to_string(),
        }
    }
}

fn epoch_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A pass's duration buckets, in seconds: an idle pass is one D-Bus
/// call (a millisecond), a pass over thousands of changed workloads a
/// second or more.
const PASS_BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0];

/// The daemon's own counters, kept in [`Shared`].
#[derive(Debug)]
pub struct Stats {
    pub passes: std::sync::Mutex<Histogram>,
    /// Connections the API accepted on a full slot, on a slot kept for
    /// `/healthz`, and refused (every slot taken: a 503).
    pub connections: AtomicU64,
    pub health_only: AtomicU64,
    pub refused: AtomicU64,
    /// Event streams refused (too many at once).
    pub streams_refused: AtomicU64,
    /// The TCP listener's connections, accepted and refused.
    pub tcp_connections: AtomicU64,
    pub tcp_refused: AtomicU64,
    pub scrapes: AtomicU64,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            passes: std::sync::Mutex::new(Histogram::new(PASS_BUCKETS)),
            connections: AtomicU64::new(0),
            health_only: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            streams_refused: AtomicU64::new(0),
            tcp_connections: AtomicU64::new(0),
            tcp_refused: AtomicU64::new(0),
            scrapes: AtomicU64::new(0),
        }
    }
}

/// Failed calls by kind, counted where they fail (the cluster agent's
/// etcd calls) and read by the metrics: a process-wide count, as the
/// calls come from every thread of the daemon.
pub struct FailureCounts([AtomicU64; 4]);

impl FailureCounts {
    /// The kinds counted: an error answer (or none at all), no answer
    /// within the call's bound, a local file, a listing over its limit.
    pub const KINDS: [&'static str; 4] = ["error", "timeout", "local", "too-many"];

    pub fn count(&self, kind: &str) {
        if let Some(i) = Self::KINDS.iter().position(|k| *k == kind) {
            self.0[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn get(&self, kind: &str) -> u64 {
        Self::KINDS
            .iter()
            .position(|k| *k == kind)
            .map_or(0, |i| self.0[i].load(Ordering::Relaxed))
    }
}

/// What the cluster agent's lease state tells the metrics (the agent's
/// own type answers: the API knows nothing of the cluster's).
pub trait LeaseProbe: Send + Sync {
    /// Seconds left before the fence deadline (negative: passed); None
    /// before the first one of this boot.
    fn fence_deadline_in_s(&self) -> Option<f64>;
    /// Whether the node holds a live lease whose deadline is ahead.
    fn joined(&self) -> bool;
}

/// Why the agent stopped an HA workload of this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceCause {
    /// The lease deadline passed with no keep-alive acknowledged.
    Deadline,
    /// The reconciliation found it running while its owner key is
    /// absent, another node's, or on another lease of this node.
    NotOwner,
    /// A new live lease found it running without its key on that lease.
    NewLease,
}

impl FenceCause {
    pub const ALL: [FenceCause; 3] = [FenceCause::Deadline, FenceCause::NotOwner, FenceCause::NewLease];

    pub fn as_str(self) -> &'static str {
        match self {
            FenceCause::Deadline => "deadline",
            FenceCause::NotOwner => "not-owner",
            FenceCause::NewLease => "new-lease",
        }
    }
}

/// The cluster agent's own work, counted where it happens (its thread
/// writes, a scrape reads).
#[derive(Default)]
pub struct AgentStats {
    /// The agent's lease, once it runs.
    pub lease: OnceLock<Arc<dyn LeaseProbe>>,
    /// Owner keys this node created (it took an unowned workload).
    takeovers: AtomicU64,
    /// Workloads stopped by this daemon's fences, by [`FenceCause`].
    fenced: [AtomicU64; 3],
    /// Starts of owned workloads the reconciliation tried, by answer.
    starts_done: AtomicU64,
    starts_failed: AtomicU64,
    /// Owned here and not run in this ownership: starts tried so far.
    pending: Mutex<Arc<BTreeMap<String, u32>>>,
}

impl AgentStats {
    /// An owner key was created.
    pub fn took(&self) {
        self.takeovers.fetch_add(1, Ordering::Relaxed);
    }

    /// A start of an owned workload answered: done or not.
    pub fn start_answered(&self, done: bool) {
        let counter = if done {
            &self.starts_done
        } else {
            &self.starts_failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn fenced(&self, cause: FenceCause, workloads: usize) {
        self.fenced[cause as usize].fetch_add(workloads as u64, Ordering::Relaxed);
    }

    pub fn fenced_count(&self, cause: FenceCause) -> u64 {
        self.fenced[cause as usize].load(Ordering::Relaxed)
    }

    /// The reconciliation's workloads waiting to run, replaced whole.
    pub fn set_pending(&self, pending: BTreeMap<String, u32>) {
        let mut slot = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if **slot != pending {
            *slot = Arc::new(pending);
        }
    }

    pub fn pending(&self) -> Arc<BTreeMap<String, u32>> {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The daemon's failed etcd calls, by kind.
pub static ETCD_FAILURES: FailureCounts = FailureCounts([
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
]);

fn flag(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}

fn counter(a: &AtomicU64) -> f64 {
    a.load(Ordering::Relaxed) as f64
}

/// Everything `/metrics` exports, in a fixed order.
pub fn families(shared: &Shared, now: SystemTime) -> Vec<Family> {
    let mut out = vec![
        Family::new("berth_build", Type::Info, "The berth that serves these metrics.")
            .with(&[("version", env!("CARGO_PKG_VERSION"))], 1.0),
    ];
    workloads(shared, &mut out);
    daemon(shared, now, &mut out);
    if let Some(report) = shared.last_drain() {
        drain(&report, &mut out);
    }
    if let Some(report) = shared.last_autostart() {
        autostart(&report, &mut out);
    }
    cluster(shared, &mut out);
    out
}

fn workloads(shared: &Shared, out: &mut Vec<Family>) {
    let views = shared.snapshot();
    let freezes = shared.freezes();
    let mut up = Family::new(
        "berth_workload_up",
        Type::Gauge,
        "1 when the workload's unit is active (or reloading), else 0.",
    );
    let mut state = Family::new(
        "berth_workload_state",
        Type::Gauge,
        "The workload unit's ActiveState, as a label; always 1.",
    );
    let mut frozen = Family::new(
        "berth_workload_frozen",
        Type::Gauge,
        "1 when a freeze holds the workload back (its own, or the node's); scope says which.",
    );
    let mut transitions = Family::new(
        "berth_workload_transitions",
        Type::Counter,
        "Transitions committed to the workload's record, by reason.",
    );
    let mut exits = Family::new(
        "berth_workload_exits",
        Type::Counter,
        "Ends of the workload's unit with systemd's cause, by its Result.",
    );
    let mut restarts = Family::new(
        "berth_workload_systemd_restarts",
        Type::Gauge,
        "systemd's NRestarts for the workload's unit: automatic restarts since it was last started by hand.",
    );
    let mut last = Family::new(
        "berth_workload_last_transition_timestamp_seconds",
        Type::Gauge,
        "When the workload's last transition was committed; reason says why (unexpected-exit: it went down by itself).",
    );
    for view in &views {
        let name = view.name.as_str();
        let kind = view.facts.kind.as_str();
        let is_up = matches!(view.active_state, ActiveState::Active | ActiveState::Reloading);
        up.add(&[("workload", name), ("kind", kind)], flag(is_up));
        state.add(&[("workload", name), ("state", view.active_state.as_str())], 1.0);
        if let Some(f) = freezes.of(name) {
            frozen.add(&[("workload", name), ("scope", f.scope.as_str())], 1.0);
        }
        for (reason, n) in &view.facts.transitions {
            transitions.add(&[("workload", name), ("reason", reason)], *n as f64);
        }
        for (result, n) in &view.facts.exits {
            exits.add(&[("workload", name), ("result", result)], *n as f64);
        }
        if let Some(n) = view.facts.restarts {
            restarts.add(&[("workload", name)], f64::from(n));
        }
        if let Some(t) = view.facts.last_transition_s {
            last.add(&[("workload", name), ("reason", &view.facts.last_reason)], t);
        }
    }
    out.push(
        Family::new(
            "berth_workloads",
            Type::Gauge,
            "Workloads the supervisor follows.",
        )
        .with(&[], views.len() as f64),
    );
    out.push(
        Family::new(
            "berth_node_frozen",
            Type::Gauge,
            "1 while the node is frozen (a flag or berth.freeze).",
        )
        .with(&[], flag(freezes.node.is_some())),
    );
    out.extend([up, state, frozen, transitions, exits, restarts, last]);
}

fn daemon(shared: &Shared, now: SystemTime, out: &mut Vec<Family>) {
    let health = shared.health_report(now);
    let stats = &shared.stats;
    out.push(
        Family::new(
            "berth_daemon_healthy",
            Type::Gauge,
            "1 while /healthz says healthy, 0 when degraded or unhealthy.",
        )
        .with(&[], flag(health.status == Verdict::Healthy)),
    );
    out.push(
        Family::new(
            "berth_daemon_deferred_workloads",
            Type::Gauge,
            "Workloads the last pass could not converge (busy lock, no answer from systemd).",
        )
        .with(&[], health.unconverged_workloads.len() as f64),
    );
    out.push(
        Family::new(
            "berth_daemon_failed_workloads",
            Type::Gauge,
            "Workloads whose unit is failed.",
        )
        .with(&[], health.failed_workloads.len() as f64),
    );
    if let Some((running, took)) = shared.adoption() {
        out.push(
            Family::new(
                "berth_daemon_adopted_workloads",
                Type::Gauge,
                "Workloads the daemon found running and adopted at its start.",
            )
            .with(&[], running as f64),
        );
        out.push(
            Family::new(
                "berth_daemon_first_pass_seconds",
                Type::Gauge,
                "How long the daemon's first pass (its adoption) took.",
            )
            .with(&[], took.as_secs_f64()),
        );
    }
    if let Some(age) = health.last_pass_age_ms {
        out.push(
            Family::new(
                "berth_daemon_last_pass_age_seconds",
                Type::Gauge,
                "Seconds since the supervisor's last pass completed.",
            )
            .with(&[], age as f64 / 1000.0),
        );
    }
    out.push(shared.passes().family(
        "berth_daemon_pass_duration_seconds",
        "How long the supervisor's passes took.",
    ));
    out.push(
        Family::new(
            "berth_api_connections",
            Type::Counter,
            "Connections accepted, by listener (unix: the API socket; tcp: metrics_listen) and slot (full, or one kept for /healthz).",
        )
        .with(&[("listener", "unix"), ("slot", "full")], counter(&stats.connections))
        .with(&[("listener", "unix"), ("slot", "healthz")], counter(&stats.health_only))
        .with(&[("listener", "tcp"), ("slot", "full")], counter(&stats.tcp_connections)),
    );
    out.push(
        Family::new(
            "berth_api_refusals",
            Type::Counter,
            "Connections and event streams refused at the limits, by listener.",
        )
        .with(
            &[("listener", "unix"), ("what", "connection")],
            counter(&stats.refused),
        )
        .with(
            &[("listener", "unix"), ("what", "event-stream")],
            counter(&stats.streams_refused),
        )
        .with(
            &[("listener", "tcp"), ("what", "connection")],
            counter(&stats.tcp_refused),
        ),
    );
    out.push(
        Family::new(
            "berth_metrics_scrapes",
            Type::Counter,
            "GET requests of /metrics, on the socket or over TCP, this one included.",
        )
        .with(&[], counter(&stats.scrapes)),
    );
}

fn autostart(report: &crate::state::autostart_report::Report, out: &mut Vec<Family>) {
    if let Some(t) = crate::time::parse_rfc3339(&report.started_at).map(epoch_seconds) {
        out.push(
            Family::new(
                "berth_autostart_last_start_timestamp_seconds",
                Type::Gauge,
                "When the last autostart (berth-autostart.service) began.",
            )
            .with(&[], t),
        );
    }
    out.push(
        Family::new(
            "berth_autostart_last_duration_seconds",
            Type::Gauge,
            "How long the last autostart took.",
        )
        .with(&[], report.elapsed_ms as f64 / 1000.0),
    );
    out.push(
        Family::new(
            "berth_autostart_last_workloads",
            Type::Gauge,
            "What the last autostart did, by action: started, failed, skipped (frozen, not to start), adopted (found running).",
        )
        .with(&[("action", "started")], report.started as f64)
        .with(&[("action", "failed")], report.failed as f64)
        .with(&[("action", "skipped")], report.skipped as f64)
        .with(&[("action", "adopted")], report.adopted as f64),
    );
    out.push(
        Family::new(
            "berth_autostart_last_node_frozen",
            Type::Gauge,
            "1 when the last autostart started nothing because the node was frozen.",
        )
        .with(&[], flag(report.node_frozen.is_some())),
    );
}

fn drain(report: &Report, out: &mut Vec<Family>) {
    let started = crate::time::parse_rfc3339(&report.started_at).map(epoch_seconds);
    if let Some(t) = started {
        out.push(
            Family::new(
                "berth_drain_last_start_timestamp_seconds",
                Type::Gauge,
                "When the last drain began.",
            )
            .with(&[], t),
        );
    }
    out.push(
        Family::new(
            "berth_drain_last_duration_seconds",
            Type::Gauge,
            "How long the last drain took.",
        )
        .with(&[], report.elapsed_ms as f64 / 1000.0),
    );
    out.push(
        Family::new(
            "berth_drain_last_deadline_seconds",
            Type::Gauge,
            "The last drain's overall deadline.",
        )
        .with(&[], report.deadline_s as f64),
    );
    out.push(
        Family::new(
            "berth_drain_last_deadline_reached",
            Type::Gauge,
            "1 when the last drain hit its deadline with workloads still up.",
        )
        .with(&[], flag(report.deadline_reached)),
    );
    let counts = report.counts();
    let mut by_outcome = Family::new(
        "berth_drain_last_workloads",
        Type::Gauge,
        "Workloads of the last drain, by outcome (every outcome, 0 included).",
    );
    for outcome in Outcome::ALL {
        by_outcome.add(
            &[("outcome", outcome.as_str())],
            counts.get(&outcome).copied().unwrap_or(0) as f64,
        );
    }
    out.push(by_outcome);
    let mut each = Family::new(
        "berth_drain_last_outcome",
        Type::Gauge,
        "Each workload's outcome in the last drain, as a label; always 1.",
    );
    let mut elapsed = Family::new(
        "berth_drain_last_stop_duration_seconds",
        Type::Gauge,
        "How long each workload's stop took in the last drain.",
    );
    for w in &report.workloads {
        each.add(&[("workload", &w.workload), ("outcome", w.outcome.as_str())], 1.0);
        elapsed.add(&[("workload", &w.workload)], w.elapsed_ms as f64 / 1000.0);
    }
    out.extend([each, elapsed]);
}

/// From the view the agent last gathered (JSON: its names came from etcd
/// and are escaped by the exposition like every label).
fn cluster(shared: &Shared, out: &mut Vec<Family>) {
    let view = match shared.cluster() {
        ClusterSlot::Off => return,
        ClusterSlot::Waiting => None,
        ClusterSlot::View(v) => Some(v),
    };
    out.push(
        Family::new(
            "berth_cluster_view_ok",
            Type::Gauge,
            "1 when the last gathering of the cluster view from etcd succeeded.",
        )
        .with(&[], flag(view.as_ref().is_some_and(|v| v.get("error").is_none()))),
    );
    let mut failures = Family::new(
        "berth_cluster_etcd_failures",
        Type::Counter,
        "etcd calls of this daemon that failed, by kind: error (refused, or an error answer), timeout (no answer in time), local (a local file), too-many (a listing over its limit).",
    );
    for kind in FailureCounts::KINDS {
        failures.add(&[("kind", kind)], ETCD_FAILURES.get(kind) as f64);
    }
    out.push(failures);
    agent(&shared.agent, out);
    let Some(view) = view else { return };
    // A failed gathering keeps an older view (or none): what it says of
    // this node's key is not known now.
    let me = view
        .get("node")
        .and_then(|v| v.as_str())
        .filter(|_| view.get("error").is_none());
    let mine = view
        .get("peers")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
        .find(|p| me.is_some() && p.get("node").and_then(|v| v.as_str()) == me);
    out.push(
        Family::new(
            "berth_cluster_node_state",
            Type::Gauge,
            "This node's state as its node key says it (up, maintenance, shutting-down, drained; absent: none; unknown: the last gathering failed), as a label; always 1.",
        )
        .with(
            &[(
                "state",
                match (me, mine) {
                    (None, _) => "unknown",
                    (Some(_), Some(p)) => p.get("state").and_then(|v| v.as_str()).unwrap_or("unreadable"),
                    (Some(_), None) => "absent",
                },
            )],
            1.0,
        ),
    );
    let mut peers = Family::new(
        "berth_cluster_peer_state",
        Type::Gauge,
        "Each peer's state from its node key (absent: none), as a label; always 1.",
    );
    let mut remaining = Family::new(
        "berth_cluster_peer_lease_remaining_seconds",
        Type::Gauge,
        "What is left of each peer's lease.",
    );
    for p in view.get("peers").and_then(|v| v.as_array()).into_iter().flatten() {
        let node = p.get("node").and_then(|v| v.as_str()).unwrap_or("");
        let state = p.get("state").and_then(|v| v.as_str()).unwrap_or("unreadable");
        let member = p.get("member").and_then(|v| v.as_bool()).unwrap_or(false);
        peers.add(
            &[
                ("node", node),
                ("state", state),
                ("member", if member { "true" } else { "false" }),
            ],
            1.0,
        );
        if let Some(s) = p.get("lease_remaining_s").and_then(|v| v.as_i64()) {
            remaining.add(&[("node", node)], s as f64);
        }
    }
    // Every HA workload some peer announces, and every owned one.
    let mut ha: std::collections::BTreeMap<&str, Option<&str>> = std::collections::BTreeMap::new();
    for p in view.get("peers").and_then(|v| v.as_array()).into_iter().flatten() {
        for w in p.get("ha").and_then(|v| v.as_array()).into_iter().flatten() {
            if let Some(w) = w.as_str() {
                ha.entry(w).or_insert(None);
            }
        }
    }
    for o in view
        .get("owners")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
    {
        if let Some(workload) = o.get("workload").and_then(|v| v.as_str()) {
            // A value that does not read as an owner names nobody.
            ha.insert(workload, o.get("node").and_then(|v| v.as_str()));
        }
    }
    let mut owned = Family::new(
        "berth_cluster_ha_owned",
        Type::Gauge,
        "1 when the HA workload has an owner key naming a node, 0 when it has none (or an unreadable one).",
    );
    let mut owner = Family::new(
        "berth_cluster_ha_owner",
        Type::Gauge,
        "The node an HA workload's owner key names, as a label; always 1.",
    );
    for (workload, node) in &ha {
        owned.add(&[("workload", workload)], flag(node.is_some()));
        if let Some(node) = node {
            owner.add(&[("workload", workload), ("node", node)], 1.0);
        }
    }
    out.extend([peers, remaining, owned, owner]);
}

/// What the agent itself counted and holds: live, not gathered.
fn agent(stats: &AgentStats, out: &mut Vec<Family>) {
    if let Some(lease) = stats.lease.get() {
        out.push(
            Family::new(
                "berth_cluster_joined",
                Type::Gauge,
                "1 while this node holds a live lease whose fence deadline is ahead.",
            )
            .with(&[], flag(lease.joined())),
        );
        if let Some(s) = lease.fence_deadline_in_s() {
            out.push(
                Family::new(
                    "berth_cluster_fence_deadline_seconds",
                    Type::Gauge,
                    "Seconds left before this node fences its HA workloads unless its lease is renewed (negative: passed).",
                )
                .with(&[], s),
            );
        }
    }
    out.push(
        Family::new(
            "berth_cluster_takeovers",
            Type::Counter,
            "Owner keys this daemon created: HA workloads it took while nobody owned them.",
        )
        .with(&[], counter(&stats.takeovers)),
    );
    let mut fenced = Family::new(
        "berth_cluster_fenced_workloads",
        Type::Counter,
        "HA workloads this daemon's fences stopped, by cause: deadline (the lease deadline passed), not-owner (running while its owner key is not this node's live one), new-lease (running without its key on a new lease).",
    );
    for cause in FenceCause::ALL {
        fenced.add(&[("cause", cause.as_str())], stats.fenced_count(cause) as f64);
    }
    out.push(fenced);
    out.push(
        Family::new(
            "berth_cluster_reconcile_starts",
            Type::Counter,
            "Starts of HA workloads owned here that the reconciliation tried, by whether the start job ended done.",
        )
        .with(&[("result", "done")], counter(&stats.starts_done))
        .with(&[("result", "failed")], counter(&stats.starts_failed)),
    );
    let mut pending = Family::new(
        "berth_cluster_reconcile_attempts",
        Type::Gauge,
        "Per HA workload owned here that has not run in this ownership: the starts tried so far (they wait a doubling backoff).",
    );
    for (workload, n) in stats.pending().iter() {
        pending.add(&[("workload", workload)], f64::from(*n));
    }
    out.push(pending);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::exposition::{Format, render};
    use super::*;
    use crate::api::view;
    use crate::state::drain_report::StopResult;
    use crate::state::records::{ExitCause, RecordState, TransitionReason};

    fn text(shared: &Shared) -> String {
        render(&families(shared, SystemTime::now()), Format::Text)
    }

    #[test]
    fn workloads_with_their_record_and_freezes() {
        let shared = Shared::new(Duration::from_secs(10));
        let record = Record {
            name: "web".into(),
            state: RecordState::Failed,
            last_transition_reason: TransitionReason::UnexpectedExit,
            last_transition_at: "2026-12-06T04:00:00Z".into(),
            exit_cause: Some(ExitCause {
                result: "signal".into(),
                code: "killed".into(),
                status: 9,
            }),
            restarts: Some(2),
            transitions: [("boot".to_string(), 1), ("unexpected-exit".to_string(), 3)].into(),
            exits: [("signal".to_string(), 3)].into(),
            ..Record::default()
        };
        let mut web = view("web");
        web.active_state = ActiveState::Failed;
        web.facts = Facts::of(Kind::Libvirt, Some(&record));
        shared.publish(web);
        shared.publish(view("db"));
        shared.set_freezes(crate::state::freeze::Freezes {
            node: None,
            instances: [(
                "db".to_string(),
                crate::state::freeze::Freeze::instance("db", "upgrade", SystemTime::UNIX_EPOCH),
            )]
            .into(),
        });
        let text = text(&shared);
        for line in [
            "berth_build_info{version=\"0.1.0\"} 1",
            "berth_workloads 2",
            "berth_node_frozen 0",
            "berth_workload_up{workload=\"db\",kind=\"command\"} 1",
            "berth_workload_up{workload=\"web\",kind=\"libvirt\"} 0",
            "berth_workload_state{workload=\"web\",state=\"failed\"} 1",
            "berth_workload_frozen{workload=\"db\",scope=\"instance\"} 1",
            "berth_workload_transitions_total{workload=\"web\",reason=\"unexpected-exit\"} 3",
            "berth_workload_transitions_total{workload=\"web\",reason=\"boot\"} 1",
            "berth_workload_exits_total{workload=\"web\",result=\"signal\"} 3",
            "berth_workload_systemd_restarts{workload=\"web\"} 2",
            "berth_workload_last_transition_timestamp_seconds{workload=\"web\",reason=\"unexpected-exit\"} 1796529600",
            "berth_daemon_healthy 0",
        ] {
            assert!(text.contains(&format!("\n{line}\n")), "no {line:?} in:\n{text}");
        }
        assert!(!text.contains("frozen{workload=\"web\""), "{text}");
        assert!(!text.contains("berth_drain_"), "no drain yet:\n{text}");
        assert!(!text.contains("berth_cluster_"), "not in cluster mode:\n{text}");
    }

    #[test]
    fn the_last_drain() {
        let shared = Shared::new(Duration::from_secs(10));
        let stop = |name: &str, outcome, ms| StopResult {
            workload: name.into(),
            unit: String::new(),
            outcome,
            started_ms: 0,
            code: None,
            elapsed_ms: ms,
            detail: None,
            found: None,
        };
        shared.set_last_drain(Some(Report {
            started_at: "2026-12-06T04:00:00Z".into(),
            finished_at: "2026-12-06T04:00:03Z".into(),
            elapsed_ms: 3250,
            deadline_s: 90,
            parallelism: 4,
            deadline_reached: false,
            boot_id: String::new(),
            run: String::new(),
            shutdown: Some(true),
            node_frozen: None,
            workloads: vec![
                stop("a", Outcome::GracefulOff, 1500),
                stop("b", Outcome::ForcedOff, 3000),
            ],
        }));
        let text = text(&shared);
        for line in [
            "berth_drain_last_start_timestamp_seconds 1796529600",
            "berth_drain_last_duration_seconds 3.25",
            "berth_drain_last_deadline_seconds 90",
            "berth_drain_last_deadline_reached 0",
            "berth_drain_last_workloads{outcome=\"GracefulOff\"} 1",
            "berth_drain_last_workloads{outcome=\"ForcedOff\"} 1",
            "berth_drain_last_workloads{outcome=\"Failed\"} 0",
            "berth_drain_last_outcome{workload=\"b\",outcome=\"ForcedOff\"} 1",
            "berth_drain_last_stop_duration_seconds{workload=\"a\"} 1.5",
        ] {
            assert!(text.contains(&format!("\n{line}\n")), "no {line:?} in:\n{text}");
        }
    }

    #[test]
    fn the_last_autostart_and_the_adoption() {
        let shared = Shared::new(Duration::from_secs(10));
        shared.set_last_autostart(Some(crate::state::autostart_report::Report {
            started_at: "2026-12-06T04:00:00Z".into(),
            elapsed_ms: 1500,
            started: 3,
            failed: 1,
            skipped: 0,
            adopted: 2,
            node_frozen: None,
        }));
        shared.set_adoption(5, Duration::from_millis(250));
        let text = text(&shared);
        for line in [
            "berth_autostart_last_start_timestamp_seconds 1796529600",
            "berth_autostart_last_duration_seconds 1.5",
            "berth_autostart_last_workloads{action=\"started\"} 3",
            "berth_autostart_last_workloads{action=\"failed\"} 1",
            "berth_autostart_last_workloads{action=\"adopted\"} 2",
            "berth_autostart_last_node_frozen 0",
            "berth_daemon_adopted_workloads 5",
            "berth_daemon_first_pass_seconds 0.25",
        ] {
            assert!(text.contains(&format!("\n{line}\n")), "no {line:?} in:\n{text}");
        }
    }

    /// Names from etcd are hostile: a node named with a quote and a line
    /// feed stays inside its label.
    #[test]
    fn the_cluster_view_with_hostile_names() {
        let shared = Shared::new(Duration::from_secs(10));
        shared.cluster_waiting();
        assert!(text(&shared).contains("\nberth_cluster_view_ok 0\n"));
        shared.set_cluster(serde_json::json!({
            "node": "n1",
            "fence_deadline_in_ms": 12500,
            "peers": [
                {"node": "n1", "state": "up", "member": true, "lease_remaining_s": 9, "ha": ["db", "cache"]},
                {"node": "evil\"}\nberth_x 1", "state": "absent", "member": true, "ha": []}
            ],
            "owners": [
                {"workload": "db", "node": "n1"},
                {"workload": "queue", "node": null}
            ]
        }));
        let text = text(&shared);
        for line in [
            "berth_cluster_view_ok 1",
            "berth_cluster_node_state{state=\"up\"} 1",
            "berth_cluster_peer_state{node=\"n1\",state=\"up\",member=\"true\"} 1",
            "berth_cluster_peer_state{node=\"evil\\\"}\\nberth_x 1\",state=\"absent\",member=\"true\"} 1",
            "berth_cluster_peer_lease_remaining_seconds{node=\"n1\"} 9",
            "berth_cluster_ha_owned{workload=\"cache\"} 0",
            "berth_cluster_ha_owned{workload=\"db\"} 1",
            "berth_cluster_ha_owned{workload=\"queue\"} 0",
            "berth_cluster_ha_owner{workload=\"db\",node=\"n1\"} 1",
        ] {
            assert!(text.contains(&format!("\n{line}\n")), "no {line:?} in:\n{text}");
        }
        assert!(!text.contains("\nberth_x 1"), "{text}");
        // The view's own deadline is as old as its gathering: the live one
        // comes from the agent's lease.
        assert!(!text.contains("berth_cluster_fence_deadline_seconds"), "{text}");
        assert!(
            text.contains("\nberth_cluster_etcd_failures_total{kind=\"timeout\"} "),
            "{text}"
        );
    }

    struct Lease(Option<f64>, bool);

    impl LeaseProbe for Lease {
        fn fence_deadline_in_s(&self) -> Option<f64> {
            self.0
        }

        fn joined(&self) -> bool {
            self.1
        }
    }

    /// The agent's own counters and its live lease; a node with no key
    /// of its own in the view shows as absent.
    #[test]
    fn the_agent_counts_and_its_lease() {
        let shared = Shared::new(Duration::from_secs(10));
        shared.cluster_waiting();
        let before = text(&shared);
        for line in [
            "berth_cluster_takeovers_total 0",
            "berth_cluster_fenced_workloads_total{cause=\"deadline\"} 0",
            "berth_cluster_reconcile_starts_total{result=\"failed\"} 0",
        ] {
            assert!(
                before.contains(&format!("\n{line}\n")),
                "no {line:?} in:\n{before}"
            );
        }
        assert!(
            !before.contains("berth_cluster_joined"),
            "no lease yet:\n{before}"
        );
        let _ = shared.agent.lease.set(Arc::new(Lease(Some(-1.5), false)));
        shared.agent.took();
        shared.agent.took();
        shared.agent.fenced(FenceCause::Deadline, 3);
        shared.agent.fenced(FenceCause::NotOwner, 1);
        for _ in 0..4 {
            shared.agent.start_answered(false);
        }
        shared.agent.set_pending([("db".to_string(), 4)].into());
        shared.set_cluster(serde_json::json!({
            "node": "n2",
            "peers": [{"node": "n1", "state": "maintenance", "member": true, "ha": []}],
            "owners": []
        }));
        let text = text(&shared);
        for line in [
            "berth_cluster_joined 0",
            "berth_cluster_fence_deadline_seconds -1.5",
            "berth_cluster_takeovers_total 2",
            "berth_cluster_fenced_workloads_total{cause=\"deadline\"} 3",
            "berth_cluster_fenced_workloads_total{cause=\"not-owner\"} 1",
            "berth_cluster_fenced_workloads_total{cause=\"new-lease\"} 0",
            "berth_cluster_reconcile_starts_total{result=\"done\"} 0",
            "berth_cluster_reconcile_starts_total{result=\"failed\"} 4",
            "berth_cluster_reconcile_attempts{workload=\"db\"} 4",
            "berth_cluster_node_state{state=\"absent\"} 1",
            "berth_cluster_peer_state{node=\"n1\",state=\"maintenance\",member=\"true\"} 1",
        ] {
            assert!(text.contains(&format!("\n{line}\n")), "no {line:?} in:\n{text}");
        }
        shared.agent.set_pending(BTreeMap::new());
        // A failed gathering: the older view's word on this node's key is
        // not taken for now's.
        shared.cluster_unreachable("etcd: no answer");
        let after = render(&families(&shared, SystemTime::now()), Format::Text);
        assert!(!after.contains("berth_cluster_reconcile_attempts{"), "{after}");
        assert!(
            after.contains("\nberth_cluster_node_state{state=\"unknown\"} 1\n"),
            "{after}"
        );
    }
}
