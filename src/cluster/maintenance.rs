//! Maintenance (issue 13, point 5): a daemon stopped or restarted on
//! purpose (`systemctl stop`/`restart`, its own exit-75 relaunch) hands
//! its keys to a lease of `maintenance_grace_period_s` before it exits, so
//! that peers move nothing while it is away for less than that.
//!
//! On the way out: a maintenance lease is granted; the presence goes onto
//! it as `maintenance`; each owner key moves onto it in transactions of at
//! most 64 keys, each key compared on its lease (the live one) and its
//! value (`If(lease == live ∧ value == self) Then Put(key, lease =
//! maintenance)`: two compares a key, and etcd 3.4 allows 128 operations);
//! a chunk whose compare fails is retried key by key. The live lease is
//! revoked only when every key moved; the fence deadline kept for
//! `berth fence-arm` is the earlier of the deadlines that still hold a key.
//!
//! On the way back ([`take_back`], at the join): the keys on the
//! maintenance lease move onto the new live lease the same way, and the
//! maintenance lease is revoked: the grace ends as soon as the daemon is
//! back.

use std::path::Path;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::keys::{Keys, NodeState, Owner};
use super::node::Node;
use super::presence;
use super::session::{ClusterError, boottime};
use crate::state::cluster::{self as cluster_files, LeaseRecord};

/// Keys per transaction: two compares each, within etcd 3.4's 128
/// operations.
pub const KEYS_PER_TXN: usize = 64;

/// The maintenance lease of boot `boot_id` that holds this node's keys
/// (the daemon has not taken them back), if any.
pub fn maintenance_lease(state_dir: &Path, boot_id: &str) -> Option<i64> {
    cluster_files::read_maintenance(state_dir)
        .filter(|r| r.boot_id == boot_id)
        .map(|r| r.lease_id)
}

/// The deadline the fence keeps once the daemon is gone (pure): the
/// earlier of the live and maintenance deadlines that still hold a key of
/// this node; when neither holds one, the live deadline (or the
/// maintenance one when the live lease is gone).
pub fn fence_deadline(
    live: Option<Duration>,
    keys_on_live: usize,
    maintenance: Option<Duration>,
    keys_on_maintenance: usize,
) -> Option<Duration> {
    let holding = [(live, keys_on_live), (maintenance, keys_on_maintenance)]
        .into_iter()
        .filter(|(d, n)| d.is_some() && *n > 0)
        .filter_map(|(d, _)| d)
        .min();
    holding.or(live).or(maintenance)
}

/// An owner key of this node, as read.
#[derive(Debug, Clone)]
struct Held {
    key: String,
    value: Vec<u8>,
}

/// The owner keys naming `node` on `lease`.
async fn held(client: &mut Client, keys: &Keys, node: &str, lease: i64) -> Result<Vec<Held>, ClusterError> {
    let listing = super::session::list_dir(client, &keys.owners()).await?;
    Ok(listing
        .kvs()
        .iter()
        .filter(|kv| kv.lease() == lease)
        .filter(|kv| serde_json::from_slice::<Owner>(kv.value()).is_ok_and(|o| o.node == node))
        .filter_map(|kv| {
            Some(Held {
                key: kv.key_str().ok()?.to_string(),
                value: kv.value().to_vec(),
            })
        })
        .collect())
}

/// Moves `keys` from lease `from` onto lease `to`, each only while it is
/// still on `from` with the value read; how many moved.
async fn move_keys(client: &mut Client, keys: &[Held], from: i64, to: i64) -> usize {
    let mut moved = 0;
    for chunk in keys.chunks(KEYS_PER_TXN) {
        let txn = |part: &[Held]| {
            let mut compares = Vec::with_capacity(part.len() * 2);
            let mut puts = Vec::with_capacity(part.len());
            for h in part {
                compares.push(Compare::lease(h.key.as_str(), CompareOp::Equal, from));
                compares.push(Compare::value(h.key.as_str(), CompareOp::Equal, h.value.clone()));
                puts.push(TxnOp::put(
                    h.key.as_str(),
                    h.value.clone(),
                    Some(PutOptions::new().with_lease(to)),
                ));
            }
            Txn::new().when(compares).and_then(puts)
        };
        match client.txn(txn(chunk)).await {
            Ok(r) if r.succeeded() => moved += chunk.len(),
            // A compare failed (or the call did): the chunk did nothing;
            // each key on its own.
            _ => {
                for one in chunk.chunks(1) {
                    if client.txn(txn(one)).await.is_ok_and(|r| r.succeeded()) {
                        moved += 1;
                    }
                }
            }
        }
    }
    moved
}

/// What the hand-over did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandedOver {
    pub maintenance_lease: i64,
    pub moved: usize,
    pub left: usize,
    pub live_revoked: bool,
    /// The deadline the fence now keeps.
    pub deadline: Option<Duration>,
}

/// Hands the node's keys on `live_lease` (whose deadline is
/// `live_deadline`) to a maintenance lease (see the module's text).
pub async fn hand_over(
    client: &mut Client,
    node: &Node,
    live_lease: i64,
    live_deadline: Option<Duration>,
) -> Result<HandedOver, ClusterError> {
    let (settings, keys, state_dir) = (&node.settings, &node.keys, node.root.state_dir());
    let sent = boottime();
    let grant = client
        .lease_grant(settings.maintenance_grace_period_s as i64, None)
        .await?;
    let maintenance = grant.id();
    let maintenance_deadline =
        (sent + Duration::from_secs(grant.ttl().max(0) as u64)).saturating_sub(settings.fence_margin());
    let record = LeaseRecord {
        lease_id: maintenance,
        boot_id: node.boot_id.clone(),
    };
    cluster_files::write_maintenance(&state_dir, &record)
        .map_err(|e| ClusterError::Local(cluster_files::maintenance_path(&state_dir), e))?;
    let presence = node.presence(NodeState::Maintenance);
    presence::announce(client, keys, &node.name, maintenance, presence).await?;
    let mine = held(client, keys, &node.name, live_lease).await?;
    let moved = move_keys(client, &mine, live_lease, maintenance).await;
    let left = mine.len() - moved;
    let live_revoked = left == 0 && client.lease_revoke(live_lease).await.is_ok();
    Ok(HandedOver {
        maintenance_lease: maintenance,
        moved,
        left,
        live_revoked,
        deadline: fence_deadline(
            (!live_revoked).then_some(live_deadline).flatten(),
            left,
            Some(maintenance_deadline),
            moved,
        ),
    })
}

/// At the join: the keys a maintenance of this boot left move onto the
/// live lease, and the maintenance lease goes. How many moved back.
pub async fn take_back(client: &mut Client, node: &Node, live_lease: i64) -> Result<usize, ClusterError> {
    let state_dir = node.root.state_dir();
    let Some(record) = cluster_files::read_maintenance(&state_dir) else {
        return Ok(0);
    };
    let mut moved = 0;
    if record.boot_id == node.boot_id {
        let mine = held(client, &node.keys, &node.name, record.lease_id).await?;
        moved = move_keys(client, &mine, record.lease_id, live_lease).await;
    }
    // Gone already when the grace ran out; revoked now otherwise.
    let _ = client.lease_revoke(record.lease_id).await;
    cluster_files::remove_maintenance(&state_dir);
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// (live deadline, keys on it, maintenance deadline, keys on it) →
    /// the deadline the fence keeps.
    #[test]
    fn the_fence_keeps_the_earlier_deadline_that_holds_a_key() {
        let cases = [
            // Every key moved, the live lease revoked: the grace.
            (None, 0, Some(60 * S), 3, Some(60 * S)),
            // Nothing moved (etcd unreachable): the live deadline.
            (Some(6 * S), 3, Some(60 * S), 0, Some(6 * S)),
            // Some moved, some not: the earlier holds.
            (Some(6 * S), 1, Some(60 * S), 2, Some(6 * S)),
            // A node that owns nothing keeps the live deadline.
            (Some(6 * S), 0, Some(60 * S), 0, Some(6 * S)),
            (None, 0, Some(60 * S), 0, Some(60 * S)),
            (None, 0, None, 0, None),
        ];
        for (live, on_live, maintenance, on_maintenance, want) in cases {
            assert_eq!(
                fence_deadline(live, on_live, maintenance, on_maintenance),
                want,
                "{live:?} {on_live} {maintenance:?} {on_maintenance}"
            );
        }
    }
}
