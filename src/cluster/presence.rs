//! A node's presence in the cluster: its lease (taken, or resumed after a
//! restart in the same boot), its join, and the keys bound to the lease:
//! the node's presence and last state, and its member key.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::keys::{Keys, LastState, NodeState, Presence};
use super::session::{CALL_TIMEOUT, ClusterError, boottime, json};
use crate::config::ClusterSettings;
use crate::state::cluster::{self as cluster_files, LeaseRecord};
use crate::time::rfc3339;

/// The lease this node recorded (`cluster-lease.json`), as it is on disk.
pub fn read_lease_record(state_dir: &Path) -> Result<LeaseRecord, ClusterError> {
    cluster_files::read_lease(state_dir)
        .map_err(|e| ClusterError::Local(cluster_files::lease_path(state_dir), e))
}

pub(super) fn write_lease_record(state_dir: &Path, r: &LeaseRecord) -> Result<(), ClusterError> {
    cluster_files::write_lease(state_dir, r)
        .map_err(|e| ClusterError::Local(cluster_files::lease_path(state_dir), e))
}

/// The lease a join is made on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub id: i64,
    /// The lease of this boot was still alive: a restart, not a new boot.
    pub resumed: bool,
    pub granted_ttl_s: i64,
    /// The fence deadline the grant (or the renewal of a resumed lease)
    /// gives, counted from before the request was sent.
    pub deadline: Duration,
}

/// Takes the node's lease: the one of this boot when etcd still has it,
/// renewed at once (a daemon that restarted within its lease moves its
/// fence deadline before the join's writes, which wait on etcd's disk);
/// otherwise a new one, the lease of an earlier boot revoked.
pub async fn take_lease(
    client: &mut Client,
    settings: &ClusterSettings,
    boot_id: &str,
    state_dir: &Path,
) -> Result<Lease, ClusterError> {
    let margin = settings.fence_margin();
    let deadline =
        |sent: Duration, ttl: i64| (sent + Duration::from_secs(ttl.max(0) as u64)).saturating_sub(margin);
    if let Ok(old) = read_lease_record(state_dir) {
        if old.boot_id == boot_id {
            let granted = client.lease_time_to_live(old.lease_id, None).await?;
            // etcd rounds the remaining TTL down to whole seconds: a lease
            // in its last second says 0. A lease it does not have says
            // granted 0; the keep-alive decides for any other.
            if granted.granted_ttl() > 0 {
                // Reading the TTL renews nothing: a keep-alive does, to the
                // granted TTL, from no earlier than `sent`.
                let sent = boottime();
                let renewed = tokio::time::timeout(CALL_TIMEOUT, client.lease_keep_alive(old.lease_id))
                    .await
                    .map_err(|_| {
                        ClusterError::Etcd(format!("no answer to a keep-alive within {CALL_TIMEOUT:?}"))
                    })?;
                match renewed {
                    Ok(_) => {
                        return Ok(Lease {
                            id: old.lease_id,
                            resumed: true,
                            granted_ttl_s: granted.granted_ttl(),
                            deadline: deadline(sent, granted.granted_ttl()),
                        });
                    }
                    // It expired between the two calls.
                    Err(etcd_client::Error::LeaseKeepAliveError(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        } else {
            // A lease of an earlier boot: nothing of that boot runs any
            // more; its keys go now rather than at its expiry.
            let _ = client.lease_revoke(old.lease_id).await;
        }
    }
    let sent = boottime();
    let g = client.lease_grant(settings.lease_ttl_s as i64, None).await?;
    Ok(Lease {
        id: g.id(),
        resumed: false,
        granted_ttl_s: g.ttl(),
        deadline: deadline(sent, g.ttl()),
    })
}

/// A presence in `state` from now on.
pub fn presence(
    state: NodeState,
    boot_id: &str,
    ha: BTreeMap<String, String>,
    frozen: bool,
    watchdog_s: Option<u64>,
) -> Presence {
    Presence {
        state,
        boot_id: boot_id.to_string(),
        since: rfc3339(std::time::SystemTime::now()),
        ha,
        version: env!("CARGO_PKG_VERSION").to_string(),
        frozen,
        waiting: BTreeSet::new(),
        watchdog_s,
    }
}

/// Puts the node's presence on its lease and its last state (which
/// outlives the lease), in one transaction.
pub async fn announce(
    client: &mut Client,
    keys: &Keys,
    node: &str,
    lease_id: i64,
    presence: Presence,
) -> Result<(), ClusterError> {
    client
        .txn(Txn::new().and_then(announcing(keys, node, lease_id, &presence)))
        .await?;
    Ok(())
}

/// As [`announce`], only while the presence key is still at
/// `mod_revision`; whether it was put.
pub async fn announce_if_unchanged(
    client: &mut Client,
    keys: &Keys,
    node: &str,
    lease_id: i64,
    presence: Presence,
    mod_revision: i64,
) -> Result<bool, ClusterError> {
    let unchanged = Compare::mod_revision(keys.node(node), CompareOp::Equal, mod_revision);
    let r = client
        .txn(
            Txn::new()
                .when(vec![unchanged])
                .and_then(announcing(keys, node, lease_id, &presence)),
        )
        .await?;
    Ok(r.succeeded())
}

/// The presence on the lease and the last state beside it.
fn announcing(keys: &Keys, node: &str, lease_id: i64, presence: &Presence) -> Vec<TxnOp> {
    let last = LastState {
        state: presence.state,
        boot_id: presence.boot_id.clone(),
        at: presence.since.clone(),
    };
    vec![
        TxnOp::put(
            keys.node(node),
            json(presence),
            Some(PutOptions::new().with_lease(lease_id)),
        ),
        TxnOp::put(keys.last_state(node), json(&last), None),
    ]
}
