//! The agent's ownership loop: it lists the presences and owner keys,
//! watches them from that revision (with each deleted key's last value),
//! and takes the HA workloads [`ownership::to_take`] gives this node: a
//! create-if-absent transaction puts the owner key on the node's lease,
//! and only a transaction that succeeded starts the unit (whose own
//! `berth owner-check` confirms it once more).

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, EventType, PutOptions, Txn, TxnOp};

use super::keys::Owner;
use super::node::Node;
use super::ownership::{self, Local, OwnerKey, View};
use super::session::{self, CALL_TIMEOUT, boottime};
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
                super::keys::stop_bound_s(t.exec_stop.len(), timeout)
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

/// What a take does once its transaction succeeded: start the unit. The
/// daemon starts it through systemd; the scale benchmark's simulated
/// nodes only record it.
pub trait Starter: 'static {
    fn start(&self, workload: &Workload);
}

/// Starts the unit through the service manager, recorded as an HA take,
/// on a task of its own (a start may take long).
struct OpsStarter<O> {
    ops: Rc<O>,
    root: crate::paths::Root,
}

impl<O: Ops + 'static> Starter for OpsStarter<O> {
    fn start(&self, workload: &Workload) {
        let (ops, root, w) = (self.ops.clone(), self.root.clone(), workload.clone());
        tokio::task::spawn_local(async move {
            let events = Events::new("berth-daemon");
            crate::autostart::start_one(&*ops, &root, &w, TransitionReason::HaTake, &events).await;
        });
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
    let starter = Rc::new(OpsStarter {
        ops,
        root: node.root.clone(),
    });
    run_with(client, node, lease, announced, locals, starter).await
}

/// The loop itself, given this node's HA workloads with their stop bounds
/// and what starts one.
pub async fn run_with(
    mut client: Client,
    node: &Node,
    lease: i64,
    mut announced: Announced,
    locals: Vec<Local>,
    starter: Rc<dyn Starter>,
) {
    let keys = &node.keys;
    let mut view = View::default();
    // A workload this node has but cannot take (no bounded stop, or
    // systemd cannot describe it) is waited for for good, so that
    // placement passes over this node for it.
    let untakeable: BTreeSet<String> = node
        .ha
        .keys()
        .filter(|w| !locals.iter().any(|l| &l.name == *w))
        .cloned()
        .collect();
    loop {
        let Ok(listing) = session::list(&mut client, &node.settings.prefix).await else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        let revision = listing.header().map_or(0, |h| h.revision());
        let mut presences = BTreeMap::new();
        let mut owners = BTreeMap::new();
        for kv in listing.kvs() {
            let Ok(key) = kv.key_str() else { continue };
            if let Some(n) = keys.name_in(&keys.nodes(), key) {
                if let Ok(p) = serde_json::from_slice(kv.value()) {
                    presences.insert(n.to_string(), p);
                }
            } else if let Some(w) = keys.name_in(&keys.owners(), key) {
                owners.insert(w.to_string(), OwnerKey::read(kv.value(), kv.lease()));
            }
        }
        // Every listing is treated as the first: a key created and deleted
        // while no watch ran is invisible, so an unowned workload waits
        // this node's bound from now.
        view.relisted(presences, owners, &locals, true, boottime());
        let Ok(mut stream) = session::watch(&mut client, &node.settings.prefix, revision + 1, true).await
        else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        loop {
            let mut waiting = view.waiting(&locals, boottime());
            waiting.extend(untakeable.iter().cloned());
            reannounce(&mut client, node, &mut announced, lease, waiting).await;
            take_due(
                &mut client,
                node,
                announced.frozen,
                &*starter,
                &locals,
                &mut view,
                lease,
            )
            .await;
            let now = boottime();
            let wake = ownership::next_wake(&locals, &view, now).map_or(Duration::from_secs(1), |t| t - now);
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
                                if deleted {
                                    let fallback = locals.iter().find(|l| l.name == w).map_or(0, |l| l.stop_bound_s);
                                    let last = ev.prev_kv().map(|p| p.value());
                                    view.owner_deleted(w, last, fallback, boottime());
                                    released(node, w, last, &view);
                                } else {
                                    view.owner_put(w, kv.value(), kv.lease());
                                }
                            }
                        }
                    }
                    // Broken or cancelled (a compacted revision): list again.
                    _ => break,
                },
                _ = tokio::time::sleep(wake.min(Duration::from_secs(1))) => {}
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
    let mut p = super::presence::presence(NodeState::Up, &node.boot_id, node.ha.clone(), frozen);
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

/// Takes what is due now: a create-if-absent transaction per workload,
/// then its start.
async fn take_due(
    client: &mut Client,
    node: &Node,
    announced_frozen: bool,
    starter: &dyn Starter,
    locals: &[Local],
    view: &mut View,
    lease: i64,
) {
    // A node past its deadline is fencing, a frozen one starts nothing:
    // neither takes (frozen as its flag says, whether or not its presence
    // could say so yet).
    if !node.lease.ahead() || announced_frozen || node.frozen_now() {
        return;
    }
    // A workload frozen here (by hand, or an object freeze) is not taken
    // here.
    let due: Vec<Local> = ownership::to_take(&node.name, locals, view, boottime())
        .into_iter()
        .filter(|l| crate::state::freeze::instance_frozen(&node.root, &l.name).is_none())
        .cloned()
        .collect();
    for local in due {
        // A take's transaction may take one keep-alive interval: taken
        // only with that much of the deadline left.
        let limit = node.settings.keep_alive_interval();
        if node.lease.deadline().is_none_or(|d| boottime() + limit >= d) {
            return;
        }
        let owner = Owner {
            node: node.name.clone(),
            stop_bound_s: local.stop_bound_s,
            since: rfc3339(std::time::SystemTime::now()),
        };
        let value = serde_json::to_string(&owner).unwrap_or_default();
        let key = node.keys.owner(&local.name);
        let txn = Txn::new()
            .when(vec![Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then(vec![TxnOp::put(
                key.as_str(),
                value.as_str(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        match session::txn(client, txn, limit).await {
            Ok(r) if r.succeeded() => {
                view.owner_put(&local.name, value.as_bytes(), lease);
                node.events.info(&format!(
                    "cluster: took {} (owner key on lease {lease:x}, stop bound {} s); starting it",
                    local.name, local.stop_bound_s
                ));
                if let Some(w) = node.workload(&local.name) {
                    starter.start(w);
                }
            }
            // Someone else's key came first: the watch brings it.
            Ok(_) => {}
            Err(e) => node
                .events
                .warn(&format!("cluster: cannot take {}: {e}", local.name)),
        }
    }
}
