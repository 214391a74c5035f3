//! The agent's ownership loop: it lists the presences and owner keys,
//! watches them from that revision (with each deleted key's last value),
//! and takes the HA workloads [`ownership::to_take`] gives this node: a
//! create-if-absent transaction puts the owner key on the node's lease,
//! and only a transaction that succeeded starts the unit (whose own
//! `berth owner-check` confirms it once more).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions};

use super::keys::{Keys, Owner};
use super::ownership::{self, Local, OwnerKey, View};
use super::session::{LeaseState, boottime};
use crate::config::{ClusterSettings, Workload};
use crate::events::Events;
use crate::paths::Root;
use crate::state::records::TransitionReason;
use crate::systemd::{Ops, Systemd};
use crate::time::rfc3339;

use super::session::CALL_TIMEOUT;

/// What the loop works with.
pub struct Context {
    pub settings: ClusterSettings,
    pub node: String,
    pub root: Root,
    /// This node's HA workloads, as configured.
    pub workloads: Vec<Workload>,
    /// The fence deadline: nothing is taken unless it is ahead.
    pub state: Arc<LeaseState>,
    pub events: Events,
    /// Where ownership changes are told (`/v1/events`).
    pub api: Option<Arc<crate::api::Shared>>,
    /// What the presence is re-announced with when the node's freeze
    /// changes (a freeze by hand, adopted, or at the rejoin grace).
    pub boot_id: String,
    pub ha: BTreeMap<String, String>,
    /// The frozen flag the presence was last put with.
    pub announced_frozen: bool,
    /// The `waiting` set the presence was last put with (at the join:
    /// every HA workload).
    pub announced_waiting: BTreeSet<String>,
}

/// The stop bound of each HA workload, from its live unit: a workload
/// whose unit systemd cannot describe, or whose stop is unbounded, is not
/// taken (its bound could not be written).
async fn locals(sd: &Systemd, ctx: &Context) -> Vec<Local> {
    let mut out = Vec::new();
    for w in &ctx.workloads {
        let Some(policy) = w.ha.clone() else { continue };
        let bound = match sd.topology(&w.unit_name()).await {
            Ok(t) => {
                let timeout = (t.timeout_stop_us != u64::MAX).then(|| t.timeout_stop_us.div_ceil(1_000_000));
                super::keys::stop_bound_s(t.exec_stop.len(), timeout)
            }
            Err(e) => {
                ctx.events.warn(&format!(
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
            None => ctx.events.warn(&format!(
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
pub trait Starter: Send + Sync + 'static {
    fn start(&self, workload: &Workload);
}

/// Starts the unit through systemd, recorded as an HA take.
struct SystemdStarter {
    sd: Arc<Systemd>,
    root: Root,
}

impl Starter for SystemdStarter {
    fn start(&self, workload: &Workload) {
        let (sd, root, w, events) = (
            self.sd.clone(),
            self.root.clone(),
            workload.clone(),
            Events::new("berth-daemon"),
        );
        tokio::spawn(async move {
            crate::autostart::start_one(&*sd, &root, &w, TransitionReason::HaTake, &events).await;
        });
    }
}

/// Runs until the process ends. `lease` is the live lease the keys go on.
pub async fn run(client: Client, ctx: Context, lease: i64) {
    let sd = Arc::new(super::systemd_for(&ctx.root, &ctx.events, "taking", Duration::from_secs(5)).await);
    let locals = locals(&sd, &ctx).await;
    let starter = Arc::new(SystemdStarter {
        sd,
        root: ctx.root.clone(),
    });
    run_with(client, ctx, lease, locals, starter).await
}

/// The loop itself, given this node's HA workloads with their stop bounds
/// and what starts one.
pub async fn run_with(
    mut client: Client,
    mut ctx: Context,
    lease: i64,
    locals: Vec<Local>,
    starter: Arc<dyn Starter>,
) {
    let keys = Keys::new(&ctx.settings.prefix);
    let mut view = View::default();
    // A workload this node has but cannot take (no bounded stop, or
    // systemd cannot describe it) is waited for for good, so that
    // placement passes over this node for it.
    let untakeable: BTreeSet<String> = ctx
        .ha
        .keys()
        .filter(|w| !locals.iter().any(|l| &l.name == *w))
        .cloned()
        .collect();
    loop {
        let listed = tokio::time::timeout(
            CALL_TIMEOUT,
            client.get(
                ctx.settings.prefix.as_str(),
                Some(GetOptions::new().with_prefix()),
            ),
        )
        .await;
        let Ok(Ok(listing)) = listed else {
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
        let options = WatchOptions::new()
            .with_prefix()
            .with_prev_key()
            .with_start_revision(revision + 1);
        let watched = tokio::time::timeout(
            CALL_TIMEOUT,
            client.watch(ctx.settings.prefix.as_str(), Some(options)),
        )
        .await;
        let Ok(Ok(mut stream)) = watched else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        loop {
            let mut waiting = view.waiting(&locals, boottime());
            waiting.extend(untakeable.iter().cloned());
            reannounce(&mut client, &mut ctx, &keys, lease, waiting).await;
            take_due(&mut client, &ctx, &keys, &*starter, &locals, &mut view, lease).await;
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
                                tell_owner(&ctx, w, deleted, kv);
                                if deleted {
                                    let fallback = locals.iter().find(|l| l.name == w).map_or(0, |l| l.stop_bound_s);
                                    let last = ev.prev_kv().map(|p| p.value());
                                    view.owner_deleted(w, last, fallback, boottime());
                                    released(&ctx, w, last, &view);
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
    ctx: &mut Context,
    keys: &Keys,
    lease: i64,
    waiting: BTreeSet<String>,
) {
    use super::keys::{NodeState, Presence};
    let frozen = super::frozen_now(&ctx.root);
    if frozen == ctx.announced_frozen && waiting == ctx.announced_waiting {
        return;
    }
    // Only over a presence that says up: a drain's shutting-down or
    // drained is never turned back into up.
    let key = keys.node(&ctx.node);
    let Ok(Ok(now)) = tokio::time::timeout(CALL_TIMEOUT, client.get(key.as_str(), None)).await else {
        return;
    };
    let Some(kv) = now.kvs().first() else { return };
    let Some(was) = serde_json::from_slice::<Presence>(kv.value())
        .ok()
        .filter(|p| p.state == NodeState::Up)
    else {
        ctx.announced_frozen = frozen;
        ctx.announced_waiting = waiting;
        return;
    };
    let mut p = super::presence::presence(NodeState::Up, &ctx.boot_id, ctx.ha.clone(), frozen);
    // Still up since then: a change of flags is no new state.
    p.since = was.since;
    p.waiting = waiting.clone();
    let put = super::presence::announce_if_unchanged(client, keys, &ctx.node, lease, p, kv.mod_revision());
    if let Ok(Ok(true)) = tokio::time::timeout(CALL_TIMEOUT, put).await {
        if frozen != ctx.announced_frozen {
            ctx.events.info(&format!(
                "cluster: the node is {}: presence announced so",
                if frozen { "frozen" } else { "thawed" }
            ));
        }
        if waiting != ctx.announced_waiting {
            ctx.events.info(&format!(
                "cluster: presence announced waiting for {} (unowned workloads whose owner key this node did not see go)",
                if waiting.is_empty() {
                    "nothing".to_string()
                } else {
                    waiting.iter().cloned().collect::<Vec<_>>().join(" ")
                }
            ));
        }
        ctx.announced_frozen = frozen;
        ctx.announced_waiting = waiting;
    }
}

/// Tells `/v1/events` of an owner key's change.
fn tell_owner(ctx: &Context, workload: &str, deleted: bool, kv: &etcd_client::KeyValue) {
    let Some(api) = &ctx.api else { return };
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
fn released(ctx: &Context, workload: &str, last: Option<&[u8]>, view: &View) {
    let last_owner = last
        .and_then(|v| serde_json::from_slice::<Owner>(v).ok())
        .map_or_else(|| "unknown".to_string(), |o| o.node);
    let wait = view
        .not_before
        .get(workload)
        .map_or(0, |t| t.saturating_sub(boottime()).as_secs());
    ctx.events.info(&format!(
        "cluster: the owner key of {workload} went (last owner {}); a candidate may take it in {wait} s",
        last_owner.escape_debug()
    ));
}

/// Takes what is due now: a create-if-absent transaction per workload,
/// then its start.
async fn take_due(
    client: &mut Client,
    ctx: &Context,
    keys: &Keys,
    starter: &dyn Starter,
    locals: &[Local],
    view: &mut View,
    lease: i64,
) {
    // A node past its deadline is fencing, a frozen one starts nothing:
    // neither takes (frozen as its flag says, whether or not its presence
    // could say so yet).
    if !ctx.state.ahead() || ctx.announced_frozen || super::frozen_now(&ctx.root) {
        return;
    }
    // A workload frozen here (by hand, or an object freeze) is not taken
    // here.
    let due: Vec<Local> = ownership::to_take(&ctx.node, locals, view, boottime())
        .into_iter()
        .filter(|l| crate::state::freeze::instance_frozen(&ctx.root, &l.name).is_none())
        .cloned()
        .collect();
    for local in due {
        // A take's transaction may take one keep-alive interval: taken
        // only with that much of the deadline left.
        let limit = ctx.settings.keep_alive_interval();
        if ctx.state.deadline().is_none_or(|d| boottime() + limit >= d) {
            return;
        }
        let owner = Owner {
            node: ctx.node.clone(),
            stop_bound_s: local.stop_bound_s,
            since: rfc3339(std::time::SystemTime::now()),
        };
        let value = serde_json::to_string(&owner).unwrap_or_default();
        let key = keys.owner(&local.name);
        let txn = Txn::new()
            .when(vec![Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then(vec![TxnOp::put(
                key.as_str(),
                value.as_str(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        match tokio::time::timeout(limit, client.txn(txn)).await {
            Ok(Ok(r)) if r.succeeded() => {
                view.owner_put(&local.name, value.as_bytes(), lease);
                ctx.events.info(&format!(
                    "cluster: took {} (owner key on lease {lease:x}, stop bound {} s); starting it",
                    local.name, local.stop_bound_s
                ));
                if let Some(w) = ctx.workloads.iter().find(|w| w.name == local.name) {
                    starter.start(w);
                }
            }
            // Someone else's key came first: the watch brings it.
            Ok(Ok(_)) => {}
            Ok(Err(e)) => ctx
                .events
                .warn(&format!("cluster: cannot take {}: {e}", local.name)),
            Err(_) => ctx.events.warn(&format!(
                "cluster: cannot take {}: etcd did not answer within {} ms",
                local.name,
                limit.as_millis()
            )),
        }
    }
}
