//! The agent's ownership loop: it lists the presences and owner keys
//! (those two directories only, bounded), watches them from that revision
//! (with each deleted key's last value), and takes the HA workloads
//! [`ownership::to_take`] gives this node: a create-if-absent transaction
//! puts the owner key on the node's lease. Starting what this node owns,
//! and fencing what runs here unowned, is the [`reconcile`](super::reconcile)
//! pass's, on every owner key event and every few seconds; the unit's own
//! `berth owner-check` confirms the ownership once more.

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, EventType, PutOptions, Txn, TxnOp};

use super::keys::{LastOwner, Owner};
use super::node::Node;
use super::ownership::{self, Local, OwnerKey, View};
use super::reconcile::{Pending, Reconciler, Seen, Units};
use super::session::{self, CALL_TIMEOUT, ClusterError, boottime};
use crate::config::Workload;
use crate::events::Events;
use crate::state::records::TransitionReason;
use crate::systemd::Ops;
use crate::time::rfc3339;

/// What the presence was last put with: re-announced when either
/// changes.
pub struct Announced {
    pub frozen: bool,
    /// The `waiting` set (at the join: every HA workload).
    pub waiting: BTreeSet<String>,
}

impl Announced {
    /// As the join puts the presence.
    pub fn at_join(node: &Node, frozen: bool) -> Announced {
        Announced {
            frozen,
            waiting: node.ha.keys().cloned().collect(),
        }
    }
}

/// The stop bound of each HA workload, from its live unit: a workload
/// whose unit systemd cannot describe, or whose stop is unbounded, is not
/// taken (its bound could not be written).
async fn locals<O: Ops>(ops: &O, node: &Node) -> Vec<Local> {
    let mut out = Vec::new();
    for w in &node.workloads {
        let Some(policy) = w.ha.clone() else { continue };
        let bound = match ops.topology(&w.unit_name()).await {
            Ok(t) => {
                let timeout = (t.timeout_stop_us != u64::MAX).then(|| t.timeout_stop_us.div_ceil(1_000_000));
                // With a watchdog peers wait its timeout rather than the
                // stop, when that is shorter.
                super::keys::stop_bound_s(t.exec_stop.len(), timeout).map(|b| {
                    super::watchdog::takeover_wait_s(b, node.settings.watchdog.as_ref().map(|w| w.timeout_s))
                })
            }
            Err(e) => {
                node.events.warn(&format!(
                    "cluster: not taking {}: systemd cannot describe {}: {e}",
                    w.name,
                    w.unit_name()
                ));
                continue;
            }
        };
        match bound {
            Some(stop_bound_s) => out.push(Local {
                name: w.name.clone(),
                policy,
                stop_bound_s,
            }),
            None => node.events.warn(&format!(
                "cluster: not taking {}: {} has no bounded stop (TimeoutStopSec=infinity)",
                w.name,
                w.unit_name()
            )),
        }
    }
    out
}

/// This node's units as systemd runs them, starts recorded as HA takes.
struct OpsUnits<O> {
    ops: Rc<O>,
    root: crate::paths::Root,
}

impl<O: Ops + 'static> Units for OpsUnits<O> {
    fn start(&self, workload: &Workload) -> Pending<bool> {
        let (ops, root, w) = (self.ops.clone(), self.root.clone(), workload.clone());
        Box::pin(async move {
            let events = Events::new("berth-daemon");
            let (_, action) =
                crate::autostart::start_one(&*ops, &root, &w, TransitionReason::HaTake, &events).await;
            matches!(action, crate::autostart::Action::Started)
        })
    }

    fn seen(&self, workload: &Workload) -> Pending<Option<Seen>> {
        let (ops, unit) = (self.ops.clone(), workload.unit_name());
        Box::pin(async move {
            use crate::systemd::ActiveState as A;
            let state = tokio::time::timeout(CALL_TIMEOUT, ops.active_state(&unit))
                .await
                .ok()?
                .ok()?;
            Some(match state {
                A::Active | A::Reloading | A::Refreshing => Seen::Running,
                A::Activating => Seen::Starting,
                A::Deactivating => Seen::Stopping,
                A::Inactive | A::Failed | A::Maintenance => Seen::Down,
                // A state this berth does not know: neither started nor
                // fenced on a guess.
                A::Other(_) => return None,
            })
        })
    }

    fn fence(&self, workload: &Workload) -> Pending<bool> {
        let (ops, root, w) = (self.ops.clone(), self.root.clone(), workload.clone());
        Box::pin(async move {
            let events = Events::new("berth-daemon");
            // The reconciliation said why: not the lease deadline's
            // message of fence_now.
            !super::fence::stop_now(&*ops, &root, std::slice::from_ref(&w), &events)
                .await
                .is_empty()
        })
    }
}

/// Empties the metrics' starts of owned workloads when the loop that
/// reports them ends.
struct ClearPending(Option<std::sync::Arc<crate::api::Shared>>);

impl Drop for ClearPending {
    fn drop(&mut self) {
        if let Some(api) = &self.0 {
            api.agent.set_pending(Default::default());
        }
    }
}

/// Runs until the process ends, on a `LocalSet`. `lease` is the live
/// lease the keys go on; `announced`, what the join put.
pub async fn run<O: Ops + 'static>(
    client: Client,
    node: &Node,
    ops: Rc<O>,
    lease: i64,
    announced: Announced,
) {
    let locals = locals(&*ops, node).await;
    let units = Rc::new(OpsUnits {
        ops,
        root: node.root.clone(),
    });
    run_with(client, node, lease, announced, locals, units).await
}

/// What a listing of the two directories the loop follows found, and
/// the revision to watch from.
struct Listing {
    revision: i64,
    presences: BTreeMap<String, super::keys::Presence>,
    owners: BTreeMap<String, OwnerKey>,
    last_owners: BTreeMap<String, LastOwner>,
}

/// Lists `nodes/`, `owners/` and `last-owner/` (only they: whatever else
/// lies under the prefix, however large, is not read) at one revision.
async fn list(client: &Client, node: &Node) -> Result<Listing, ClusterError> {
    let keys = &node.keys;
    let nodes = session::list_dir(client, &keys.nodes()).await?;
    let revision = nodes.header().map_or(0, |h| h.revision());
    let owners = session::list_dir_at(client, &keys.owners(), revision).await?;
    let last_owners = session::list_dir_at(client, &keys.last_owners(), revision).await?;
    let mut listing = Listing {
        revision,
        presences: BTreeMap::new(),
        owners: BTreeMap::new(),
        last_owners: BTreeMap::new(),
    };
    for kv in last_owners.kvs() {
        let Ok(key) = kv.key_str() else { continue };
        if let Some(w) = keys.name_in(&keys.last_owners(), key) {
            // One that cannot be read names nobody: an owner of unknown
            // boot, waited for with this node's bound.
            let last = serde_json::from_slice(kv.value()).unwrap_or(LastOwner {
                node: String::new(),
                boot_id: String::new(),
                stop_bound_s: 0,
            });
            listing.last_owners.insert(w.to_string(), last);
        }
    }
    for kv in nodes.kvs() {
        let Ok(key) = kv.key_str() else { continue };
        if let Some(n) = keys.name_in(&keys.nodes(), key)
            && let Ok(p) = serde_json::from_slice(kv.value())
        {
            listing.presences.insert(n.to_string(), p);
        }
    }
    for kv in owners.kvs() {
        let Ok(key) = kv.key_str() else { continue };
        if let Some(w) = keys.name_in(&keys.owners(), key) {
            let owner = OwnerKey::read(kv.value(), kv.lease()).created(kv.create_revision());
            // A key of a version that writes no record: its owner is the
            // last one, of unknown boot.
            if owner.owner.boot_id.is_empty() {
                listing.last_owners.insert(
                    w.to_string(),
                    LastOwner {
                        node: owner.owner.node.clone(),
                        boot_id: String::new(),
                        stop_bound_s: owner.owner.stop_bound_s,
                    },
                );
            }
            listing.owners.insert(w.to_string(), owner);
        }
    }
    Ok(listing)
}

/// The loop itself, given this node's HA workloads with their stop bounds
/// and its units.
pub async fn run_with(
    client: Client,
    node: &Node,
    lease: i64,
    mut announced: Announced,
    locals: Vec<Local>,
    units: Rc<dyn Units>,
) {
    let keys = &node.keys;
    let mut client = client;
    let mut view = View {
        me: (node.name.clone(), node.boot_id.clone()),
        ..View::default()
    };
    let mut reconciler = Reconciler::default();
    // The starts it reports go with it: a lost lease drops this loop.
    let _pending = ClearPending(node.api.clone());
    // A workload this node has but cannot take (no bounded stop, or
    // systemd cannot describe it) is waited for for good, so that
    // placement passes over this node for it.
    let untakeable: BTreeSet<String> = node
        .ha
        .keys()
        .filter(|w| !locals.iter().any(|l| &l.name == *w))
        .cloned()
        .collect();
    let mut failing: Option<String> = None;
    loop {
        let listing = match list(&client, node).await {
            Ok(l) => l,
            Err(e) => {
                // Said once per kind of failure, not at every retry.
                let said = e.to_string();
                if failing.as_deref() != Some(said.as_str()) {
                    node.events.warn(&format!(
                        "cluster: cannot list owners and presences ({said}); nothing is taken until a listing succeeds"
                    ));
                }
                crate::state::cluster::write_listing_error(&node.root.runtime_dir(), Some(&said));
                if let Some(api) = &node.api {
                    api.set_listing_error(Some(said.clone()));
                    // Not known while nothing is listed.
                    api.agent.set_pending(Default::default());
                }
                failing = Some(said);
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if failing.take().is_some() {
            node.events.info("cluster: owners and presences listed again");
            crate::state::cluster::write_listing_error(&node.root.runtime_dir(), None);
            if let Some(api) = &node.api {
                api.set_listing_error(None);
            }
        }
        // Every listing is treated as the first: a key created and deleted
        // while no watch ran is invisible, so an unowned workload waits
        // this node's bound from now.
        view.last_owners = Some(listing.last_owners);
        view.relisted(listing.presences, listing.owners, &locals, true, boottime());
        reconciler.owners_changed();
        let dirs = [keys.nodes(), keys.owners()];
        let Ok(mut stream) = session::watch_dirs(&client, &dirs, listing.revision + 1).await else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        loop {
            let mut waiting = view.waiting(&locals, boottime());
            waiting.extend(untakeable.iter().cloned());
            reannounce(&mut client, node, &mut announced, lease, waiting).await;
            if take_due(&mut client, node, announced.frozen, &locals, &mut view, lease).await {
                reconciler.owners_changed();
            }
            let now = boottime();
            if reconciler.due(now) {
                let may_start = node.lease.ahead() && !announced.frozen && !node.frozen_now();
                reconciler.pass(&mut client, node, &units, &view, may_start).await;
            }
            let now = boottime();
            let wake = ownership::next_wake(&locals, &view, now)
                .map_or(Duration::from_secs(1), |t| t - now)
                .min(Duration::from_secs(1))
                .min(reconciler.next(now));
            tokio::select! {
                message = stream.message() => match message {
                    Ok(Some(r)) if !r.canceled() => {
                        for ev in r.events() {
                            let Some(kv) = ev.kv() else { continue };
                            let Ok(key) = kv.key_str() else { continue };
                            let deleted = ev.event_type() == EventType::Delete;
                            if let Some(n) = keys.name_in(&keys.nodes(), key) {
                                if deleted {
                                    view.presence_deleted(n);
                                } else {
                                    view.presence_put(n, kv.value());
                                }
                            } else if let Some(w) = keys.name_in(&keys.owners(), key) {
                                tell_owner(node, w, deleted, kv);
                                reconciler.owners_changed();
                                if deleted {
                                    let fallback = locals.iter().find(|l| l.name == w).map_or(0, |l| l.stop_bound_s);
                                    let last = ev.prev_kv().map(|p| p.value());
                                    view.owner_deleted(w, last, fallback, boottime());
                                    released(node, w, last, &view);
                                } else {
                                    view.owner_put_key(w, OwnerKey::read(kv.value(), kv.lease()).created(kv.create_revision()));
                                }
                            }
                        }
                    }
                    // Broken or cancelled (a compacted revision): list again.
                    _ => break,
                },
                answer = reconciler.answer() => reconciler.take_answer(node, answer),
                _ = tokio::time::sleep(wake) => {}
            }
        }
    }
}

/// Puts the presence again when the node's freeze changed, so that peers
/// place nothing here while it is frozen (and may again after a thaw), or
/// when what it waits for from a listing changed (placement passes over
/// a waiting node). Idle, neither changes: no write.
async fn reannounce(
    client: &mut Client,
    node: &Node,
    announced: &mut Announced,
    lease: i64,
    waiting: BTreeSet<String>,
) {
    use super::keys::{NodeState, Presence};
    let keys = &node.keys;
    let frozen = node.frozen_now();
    if frozen == announced.frozen && waiting == announced.waiting {
        return;
    }
    // Only over a presence that says up: a drain's shutting-down or
    // drained is never turned back into up.
    let key = keys.node(&node.name);
    let Ok(now) = session::get(client, &key, None).await else {
        return;
    };
    let Some(kv) = now.kvs().first() else { return };
    let Some(was) = serde_json::from_slice::<Presence>(kv.value())
        .ok()
        .filter(|p| p.state == NodeState::Up)
    else {
        announced.frozen = frozen;
        announced.waiting = waiting;
        return;
    };
    let mut p = super::presence::presence(
        NodeState::Up,
        &node.boot_id,
        node.ha.clone(),
        frozen,
        node.watchdog_s(),
    );
    // Still up since then: a change of flags is no new state.
    p.since = was.since;
    p.waiting = waiting.clone();
    let put = super::presence::announce_if_unchanged(client, keys, &node.name, lease, p, kv.mod_revision());
    if let Ok(true) = session::within(CALL_TIMEOUT, put).await {
        if frozen != announced.frozen {
            node.events.info(&format!(
                "cluster: the node is {}: presence announced so",
                if frozen { "frozen" } else { "thawed" }
            ));
        }
        if waiting != announced.waiting {
            node.events.info(&format!(
                "cluster: presence announced waiting for {} (unowned workloads whose owner key this node did not see go)",
                if waiting.is_empty() {
                    "nothing".to_string()
                } else {
                    waiting.iter().cloned().collect::<Vec<_>>().join(" ")
                }
            ));
        }
        announced.frozen = frozen;
        announced.waiting = waiting;
    }
}

/// Tells `/v1/events` of an owner key's change.
fn tell_owner(node: &Node, workload: &str, deleted: bool, kv: &etcd_client::KeyValue) {
    let Some(api) = &node.api else { return };
    let owner = (!deleted)
        .then(|| serde_json::from_slice::<Owner>(kv.value()).ok())
        .flatten();
    api.owner_changed(crate::api::OwnerChange {
        workload: workload.to_string(),
        owner: owner.as_ref().map(|o| o.node.clone()),
        lease: (!deleted).then(|| format!("{:x}", kv.lease())),
        stop_bound_s: owner.map(|o| o.stop_bound_s),
        revision: kv.mod_revision(),
    });
}

/// Says that an owner key went, and how long its takers wait.
fn released(node: &Node, workload: &str, last: Option<&[u8]>, view: &View) {
    let last_owner = last
        .and_then(|v| serde_json::from_slice::<Owner>(v).ok())
        .map_or_else(|| "unknown".to_string(), |o| o.node);
    let wait = view
        .not_before
        .get(workload)
        .map_or(0, |t| t.saturating_sub(boottime()).as_secs());
    node.events.info(&format!(
        "cluster: the owner key of {workload} went (last owner {}); a candidate may take it in {wait} s",
        last_owner.escape_debug()
    ));
}

/// Takes what is due now: a create-if-absent transaction per workload.
/// The reconciliation starts what was taken. Whether anything was.
async fn take_due(
    client: &mut Client,
    node: &Node,
    announced_frozen: bool,
    locals: &[Local],
    view: &mut View,
    lease: i64,
) -> bool {
    // A node past its deadline is fencing, a frozen one starts nothing:
    // neither takes (frozen as its flag says, whether or not its presence
    // could say so yet).
    if !node.lease.ahead() || announced_frozen || node.frozen_now() {
        return false;
    }
    // A workload frozen here (by hand, or an object freeze) is not taken
    // here.
    let due: Vec<Local> = ownership::to_take(&node.name, locals, view, boottime())
        .into_iter()
        .filter(|l| crate::state::freeze::instance_frozen(&node.root, &l.name).is_none())
        .cloned()
        .collect();
    let mut took = false;
    for local in due {
        // A take's transaction may take one keep-alive interval: taken
        // only with that much of the deadline left.
        let limit = node.settings.keep_alive_interval();
        if node.lease.deadline().is_none_or(|d| boottime() + limit >= d) {
            return took;
        }
        let owner = Owner {
            node: node.name.clone(),
            stop_bound_s: local.stop_bound_s,
            since: rfc3339(std::time::SystemTime::now()),
            boot_id: node.boot_id.clone(),
            watchdog_s: node.watchdog_s(),
        };
        let value = serde_json::to_string(&owner).unwrap_or_default();
        let last = LastOwner {
            node: node.name.clone(),
            boot_id: node.boot_id.clone(),
            stop_bound_s: local.stop_bound_s,
        };
        let last = serde_json::to_string(&last).unwrap_or_default();
        let key = node.keys.owner(&local.name);
        // The record of the last owner goes in the same transaction: a
        // key never exists without it.
        let txn = Txn::new()
            .when(vec![Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then(vec![
                TxnOp::put(
                    key.as_str(),
                    value.as_str(),
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::put(node.keys.last_owner(&local.name), last.as_str(), None),
            ]);
        match session::txn(client, txn, limit).await {
            Ok(r) if r.succeeded() => {
                let revision = r.header().map_or(0, |h| h.revision());
                view.owner_put_key(
                    &local.name,
                    OwnerKey::read(value.as_bytes(), lease).created(revision),
                );
                node.events.info(&format!(
                    "cluster: took {} (owner key on lease {lease:x} at revision {revision}, stop bound {} s)",
                    local.name, local.stop_bound_s
                ));
                if let Some(api) = &node.api {
                    api.agent.took();
                }
                took = true;
            }
            // Someone else's key came first: the watch brings it.
            Ok(_) => {}
            // It may still have been applied: then the watch brings this
            // node's own key, and the reconciliation starts the workload.
            Err(e) => node.events.warn(&format!(
                "cluster: no answer to the take of {} ({e}); the watch tells whether it was applied",
                local.name
            )),
        }
    }
    took
}
