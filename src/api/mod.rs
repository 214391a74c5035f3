//! The supervisor's read-only API: HTTP/1.1 and JSON on a Unix socket,
//! never TCP. What it says lives here; how it is served (hyper, the socket,
//! limits) lives in [`server`]; which request gets which answer is the pure
//! [`routes::route`]. The one health aggregate, which the daemon also
//! writes to the journal and its status file, is [`health`]'s.
//!
//! - `GET /healthz`: 200 while the loop runs and its last pass is recent;
//!   503 when systemd could not be scanned at all or the loop stalled.
//! - `GET /v1/workloads`, `GET /v1/workloads/NAME`: record and live state.
//! - `GET /v1/cluster` (cluster mode): peers, states, lease ages, owners
//!   and this node's fence deadline, as the agent last gathered them.
//! - `GET /v1/freezes`: the node's freeze and each workload's, with
//!   `frozen_scope` (`node`|`cluster`, `instance`|`object`) and
//!   `frozen_at`; each workload's view also carries `frozen`: what holds
//!   it back (its own freeze, else the node's), or null.
//! - `GET /v1/events`: Server-Sent Events; a `sync` snapshot, then
//!   `MODIFIED` / `ADDED` / `DELETED`, and `OWNER` when an HA workload's
//!   owner key changes (cluster mode). The subscription is taken before the
//!   snapshot; nothing is replayed; a reader that falls behind loses events
//!   (told by a fresh `sync`) and never slows the others or the loop.
//!
//! - `GET /metrics`: Prometheus' text format, or OpenMetrics when asked
//!   ([`metrics`]), from the daemon's own state.
//!
//! GET and HEAD only; query strings are ignored. The server runs on its own
//! thread and runtime, so a stalled supervisor loop cannot stall it, and
//! `/healthz` can say so.

pub mod health;
pub mod metrics;
mod routes;
mod server;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::sync::broadcast;

use crate::state::records::Record;
use crate::systemd::ActiveState;
use health::{Health, HealthStatus};

pub use server::{Bound, start, start_metrics, stop};

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WorkloadView {
    pub name: String,
    pub unit: String,
    pub active_state: ActiveState,
    pub main_pid: u32,
    pub invocation_id: String,
    pub record: Option<RecordJson>,
    /// What `/metrics` serves of it, taken from the record when the view
    /// is published: a scrape parses no JSON.
    #[serde(skip)]
    pub facts: metrics::Facts,
}

/// A record as the JSON the API serves it, serialized once when it is
/// published rather than on every request. As a struct, the 5000 views of
/// 5000 workloads held 5.5 MB; as text, a third of that.
#[derive(Debug, Clone, Serialize)]
pub struct RecordJson(Box<RawValue>);

impl RecordJson {
    pub fn of(record: &Record) -> Option<RecordJson> {
        serde_json::value::to_raw_value(record).ok().map(RecordJson)
    }

    pub fn as_str(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for RecordJson {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum EventKind {
    #[serde(rename = "ADDED")]
    Added,
    #[serde(rename = "MODIFIED")]
    Modified,
    #[serde(rename = "DELETED")]
    Deleted,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Added => "ADDED",
            EventKind::Modified => "MODIFIED",
            EventKind::Deleted => "DELETED",
        }
    }
}

/// What `/v1/events` sends after its `sync`.
#[derive(Debug, Clone)]
pub enum Event {
    Workload(EventKind, WorkloadView),
    /// An HA workload's owner key was put or deleted.
    Owner(OwnerChange),
}

impl Event {
    /// The SSE event name.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Workload(kind, _) => kind.as_str(),
            Event::Owner(_) => "OWNER",
        }
    }

    /// The SSE data line.
    pub fn data(&self) -> String {
        match self {
            Event::Workload(_, view) => serde_json::to_string(view),
            Event::Owner(change) => serde_json::to_string(change),
        }
        .unwrap_or_else(|_| "{}".into())
    }
}

/// An owner key's change, as the agent's watch saw it. The names come
/// from etcd: JSON-escaped like everything served.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OwnerChange {
    pub workload: String,
    /// The owner now; None when the key was deleted (released, or its
    /// lease expired) or does not read as an owner.
    pub owner: Option<String>,
    /// Its lease, hex; None when deleted.
    pub lease: Option<String>,
    pub stop_bound_s: Option<u64>,
    /// etcd's revision of the change.
    pub revision: i64,
}

/// `/v1/cluster`'s answer.
#[derive(Debug, Clone, PartialEq)]
pub enum ClusterSlot {
    /// Not in cluster mode.
    Off,
    /// In cluster mode, nothing gathered yet.
    Waiting,
    /// The last view gathered (with an `error` when the last try failed);
    /// shared, so that a read holds the lock only to take a reference.
    View(Arc<Value>),
}

/// `/healthz`'s verdict: the supervisor's aggregate, unless the loop
/// stalled or systemd could not be listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Healthy,
    Degraded,
    Unhealthy,
}

/// The body of `/healthz`.
#[derive(Debug, Clone, Serialize)]
pub struct HealthReport {
    pub status: Verdict,
    pub loop_fresh: bool,
    pub systemd_scanned: bool,
    pub last_pass_age_ms: Option<u64>,
    pub degraded: usize,
    pub failed_workloads: Vec<String>,
    pub unconverged_workloads: Vec<String>,
    /// Why the cluster agent cannot list owners and presences (it takes
    /// nothing meanwhile): degraded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_listing_error: Option<String>,
}

/// What the supervisor shares with the API.
pub struct Shared {
    /// Shared views: a snapshot (every request of /v1/workloads and
    /// /metrics) copies 5000 pointers, not 5000 views and their records.
    workloads: Mutex<BTreeMap<String, Arc<WorkloadView>>>,
    heartbeat: Mutex<Option<SystemTime>>,
    systemd_ok: Mutex<bool>,
    events: broadcast::Sender<Event>,
    /// The supervisor's health aggregate.
    health: Mutex<Health>,
    /// A pass older than this is a stalled loop.
    stale_after: Duration,
    cluster: Mutex<ClusterSlot>,
    /// `/v1/cluster` was read since the agent last looked.
    cluster_asked: AtomicBool,
    /// The node's and the workloads' freezes, as the daemon last read them
    /// (each pass, and at once when it adopts or clears one).
    freezes: Mutex<Arc<crate::state::freeze::Freezes>>,
    listing_error: Mutex<Option<String>>,
    /// The last drain's report and the last autostart's, as the daemon
    /// last read them.
    last_drain: Mutex<Option<Arc<crate::state::drain_report::Report>>>,
    last_autostart: Mutex<Option<crate::state::autostart_report::Report>>,
    /// The daemon's own adoption at its start: workloads found running,
    /// and how long its first pass took.
    adoption: Mutex<Option<(usize, Duration)>>,
    /// The daemon's and the server's own counters, for `/metrics`.
    pub stats: metrics::Stats,
    /// The cluster agent's own counters and lease, for `/metrics`.
    pub agent: metrics::AgentStats,
}

const EVENT_BUFFER: usize = 256;

/// A panic elsewhere must not take the API down with it: the data behind
/// a poisoned lock is still a consistent snapshot (every writer replaces
/// whole values).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub fn new(stale_after: Duration) -> Arc<Shared> {
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        Arc::new(Shared {
            workloads: Mutex::new(BTreeMap::new()),
            heartbeat: Mutex::new(None),
            systemd_ok: Mutex::new(false),
            events,
            health: Mutex::new(Health::default()),
            stale_after,
            cluster: Mutex::new(ClusterSlot::Off),
            cluster_asked: AtomicBool::new(false),
            freezes: Mutex::new(Arc::default()),
            listing_error: Mutex::new(None),
            last_drain: Mutex::new(None),
            last_autostart: Mutex::new(None),
            adoption: Mutex::new(None),
            stats: metrics::Stats::default(),
            agent: metrics::AgentStats::default(),
        })
    }

    pub fn set_last_drain(&self, report: Option<crate::state::drain_report::Report>) {
        *lock(&self.last_drain) = report.map(Arc::new);
    }

    pub fn last_drain(&self) -> Option<Arc<crate::state::drain_report::Report>> {
        lock(&self.last_drain).clone()
    }

    pub fn set_last_autostart(&self, report: Option<crate::state::autostart_report::Report>) {
        *lock(&self.last_autostart) = report;
    }

    pub fn last_autostart(&self) -> Option<crate::state::autostart_report::Report> {
        lock(&self.last_autostart).clone()
    }

    /// The daemon's first pass adopted `running` workloads in `took`.
    pub fn set_adoption(&self, running: usize, took: Duration) {
        *lock(&self.adoption) = Some((running, took));
    }

    pub fn adoption(&self) -> Option<(usize, Duration)> {
        *lock(&self.adoption)
    }

    /// A pass took `took`.
    pub fn observe_pass(&self, took: Duration) {
        lock(&self.stats.passes).observe(took.as_secs_f64());
    }

    /// The passes' histogram as it is now.
    pub fn passes(&self) -> metrics::exposition::Histogram {
        lock(&self.stats.passes).clone()
    }

    pub fn set_freezes(&self, freezes: crate::state::freeze::Freezes) {
        let mut slot = lock(&self.freezes);
        if **slot != freezes {
            *slot = Arc::new(freezes);
        }
    }

    pub fn freezes(&self) -> Arc<crate::state::freeze::Freezes> {
        lock(&self.freezes).clone()
    }

    /// `/v1/cluster`'s answer; reading it asks the agent for a fresh one.
    pub fn cluster(&self) -> ClusterSlot {
        self.cluster_asked.store(true, Ordering::Relaxed);
        lock(&self.cluster).clone()
    }

    /// Whether `/v1/cluster` was read since the last call.
    pub fn cluster_asked(&self) -> bool {
        self.cluster_asked.swap(false, Ordering::Relaxed)
    }

    /// The agent runs: a view will come.
    pub fn cluster_waiting(&self) {
        *lock(&self.cluster) = ClusterSlot::Waiting;
    }

    pub fn set_cluster(&self, view: Value) {
        *lock(&self.cluster) = ClusterSlot::View(Arc::new(view));
    }

    /// The last gathering failed: the previous view stays, saying so.
    pub fn cluster_unreachable(&self, error: &str) {
        let mut slot = lock(&self.cluster);
        let view = match &*slot {
            ClusterSlot::View(v) => match &**v {
                Value::Object(v) => {
                    let mut v = v.clone();
                    v.insert("error".into(), Value::String(error.into()));
                    Value::Object(v)
                }
                _ => serde_json::json!({ "error": error }),
            },
            _ => serde_json::json!({ "error": error }),
        };
        *slot = ClusterSlot::View(Arc::new(view));
    }

    /// The cluster agent's listing failed (`Some`), or succeeds again.
    pub fn set_listing_error(&self, error: Option<String>) {
        *lock(&self.listing_error) = error;
    }

    /// An owner key changed.
    pub fn owner_changed(&self, change: OwnerChange) {
        let _ = self.events.send(Event::Owner(change));
    }

    /// Every workload's view, in name order.
    pub fn snapshot(&self) -> Vec<Arc<WorkloadView>> {
        lock(&self.workloads).values().cloned().collect()
    }

    /// One workload's view, if published.
    pub fn view(&self, name: &str) -> Option<Arc<WorkloadView>> {
        lock(&self.workloads).get(name).cloned()
    }

    /// Stores a workload's view; publishes it when it changed.
    pub fn publish(&self, view: WorkloadView) {
        let mut all = lock(&self.workloads);
        let kind = match all.get(&view.name) {
            Some(old) if **old == view => return,
            Some(_) => EventKind::Modified,
            None => EventKind::Added,
        };
        all.insert(view.name.clone(), Arc::new(view.clone()));
        drop(all);
        let _ = self.events.send(Event::Workload(kind, view));
    }

    pub fn remove(&self, name: &str) {
        let removed = lock(&self.workloads).remove(name);
        if let Some(view) = removed {
            let view = Arc::unwrap_or_clone(view);
            let _ = self.events.send(Event::Workload(EventKind::Deleted, view));
        }
    }

    /// Keeps the workloads `keep` says yes to; the others are DELETED.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let gone: Vec<String> = lock(&self.workloads)
            .keys()
            .filter(|n| !keep(n))
            .cloned()
            .collect();
        for name in gone {
            self.remove(&name);
        }
    }

    /// Whether the last pass could list the units at all.
    pub fn set_systemd_ok(&self, ok: bool) {
        *lock(&self.systemd_ok) = ok;
    }

    /// A pass completed: its time and the health it found.
    pub fn passed(&self, heartbeat: SystemTime, health: Health) {
        *lock(&self.systemd_ok) = true;
        *lock(&self.heartbeat) = Some(heartbeat);
        *lock(&self.health) = health;
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// The same aggregate as the journal event and the status file; only
    /// a stalled loop or an unlistable systemd makes it unhealthy.
    pub fn health_report(&self, now: SystemTime) -> HealthReport {
        let heartbeat = *lock(&self.heartbeat);
        let systemd_scanned = *lock(&self.systemd_ok);
        let age = heartbeat.and_then(|h| now.duration_since(h).ok());
        let loop_fresh = age.is_some_and(|a| a <= self.stale_after);
        let Health {
            status,
            failed,
            unconverged,
        } = lock(&self.health).clone();
        let listing_error = lock(&self.listing_error).clone();
        let verdict = match (loop_fresh && systemd_scanned, status) {
            (false, _) => Verdict::Unhealthy,
            (true, HealthStatus::Healthy) if listing_error.is_none() => Verdict::Healthy,
            (true, _) => Verdict::Degraded,
        };
        HealthReport {
            status: verdict,
            loop_fresh,
            systemd_scanned,
            last_pass_age_ms: age.map(|a| u64::try_from(a.as_millis()).unwrap_or(u64::MAX)),
            degraded: failed.len() + unconverged.len(),
            failed_workloads: failed,
            unconverged_workloads: unconverged,
            cluster_listing_error: listing_error,
        }
    }
}

#[cfg(test)]
pub(crate) fn view(name: &str) -> WorkloadView {
    WorkloadView {
        name: name.into(),
        unit: crate::names::unit_name(name),
        active_state: ActiveState::Active,
        main_pid: 42,
        invocation_id: "abc".into(),
        record: None,
        facts: metrics::Facts::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_is_unhealthy_until_a_fresh_pass_then_follows_the_aggregate() {
        let shared = Shared::new(Duration::from_secs(10));
        let now = SystemTime::now();
        assert_eq!(shared.health_report(now).status, Verdict::Unhealthy);
        shared.passed(now, Health::default());
        assert_eq!(shared.health_report(now).status, Verdict::Healthy);
        shared.set_listing_error(Some("owners/ holds more than 20000 keys".into()));
        let report = shared.health_report(now);
        assert_eq!(
            report.status,
            Verdict::Degraded,
            "a failing cluster listing degrades"
        );
        assert!(report.cluster_listing_error.is_some());
        shared.set_listing_error(None);
        assert_eq!(shared.health_report(now).status, Verdict::Healthy);
        shared.passed(now, Health::new(vec!["web".into()], vec![]));
        let r = shared.health_report(now);
        assert_eq!((r.status, r.degraded), (Verdict::Degraded, 1));
        // A stalled loop, or a pass that could not list the units.
        assert_eq!(
            shared.health_report(now + Duration::from_secs(11)).status,
            Verdict::Unhealthy
        );
        shared.set_systemd_ok(false);
        assert_eq!(shared.health_report(now).status, Verdict::Unhealthy);
    }

    #[test]
    fn publish_sends_only_changes_and_retain_deletes() {
        let shared = Shared::new(Duration::from_secs(10));
        let mut rx = shared.subscribe();
        shared.publish(view("a"));
        shared.publish(view("a"));
        let mut changed = view("a");
        changed.main_pid = 7;
        shared.publish(changed);
        shared.publish(view("b"));
        shared.retain(|n| n == "b");
        let kinds: Vec<(EventKind, String)> = std::iter::from_fn(|| rx.try_recv().ok())
            .filter_map(|e| match e {
                Event::Workload(kind, view) => Some((kind, view.name)),
                Event::Owner(_) => None,
            })
            .collect();
        assert_eq!(
            kinds,
            [
                (EventKind::Added, "a".into()),
                (EventKind::Modified, "a".into()),
                (EventKind::Added, "b".into()),
                (EventKind::Deleted, "a".into()),
            ]
        );
        assert_eq!(shared.snapshot().len(), 1);
    }
}
