//! What an admin changes in etcd by hand: cluster and object freezes
//! (`berth freeze [NAME] --cluster`, `berth thaw [NAME] --cluster`) and
//! forgetting a member gone for good (`berth cluster forget N`). Each is
//! one request or one transaction; the daemons do the rest.

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::keys::{ClusterFreeze, Keys};
use super::session::{ClusterError, connect, json};
use crate::config::ClusterSettings;
use crate::time::rfc3339;

/// The key a cluster (None) or object freeze lives at.
pub fn freeze_key(settings: &ClusterSettings, workload: Option<&str>) -> String {
    let keys = Keys::new(&settings.prefix);
    match workload {
        None => keys.cluster_freeze(),
        Some(w) => keys.object_freeze(w),
    }
}

/// Puts the freeze key, taken by `node`; a freeze taken again keeps its
/// first `frozen_at`. Returns the value and the key's new revision.
pub async fn freeze(
    settings: &ClusterSettings,
    node: &str,
    workload: Option<&str>,
    reason: &str,
) -> Result<(ClusterFreeze, i64), ClusterError> {
    let mut client = connect(settings).await?;
    let key = freeze_key(settings, workload);
    let old = client.get(key.as_str(), None).await?;
    let frozen_at = old
        .kvs()
        .first()
        .and_then(|kv| serde_json::from_slice::<ClusterFreeze>(kv.value()).ok())
        .and_then(|f| super::adoption::plausible_time(&f.frozen_at))
        .unwrap_or_else(|| rfc3339(std::time::SystemTime::now()));
    let value = ClusterFreeze {
        taken_by: node.to_string(),
        frozen_at,
        reason: reason.to_string(),
    };
    let put = client.put(key.as_str(), json(&value), None).await?;
    Ok((value, put.header().map_or(0, |h| h.revision())))
}

/// Deletes the freeze key; whether there was one.
pub async fn thaw(settings: &ClusterSettings, workload: Option<&str>) -> Result<bool, ClusterError> {
    let mut client = connect(settings).await?;
    let deleted = client.delete(freeze_key(settings, workload), None).await?;
    Ok(deleted.deleted() > 0)
}

/// What `forget` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Forgot {
    /// members/N and last-state/N are gone (`false`: there was none).
    Done(bool),
    /// The node has a presence: it is up or in maintenance.
    Present,
}

/// Removes `members/N` and `last-state/N`, only if N has no presence:
/// a node that is there is not forgotten.
pub async fn forget(settings: &ClusterSettings, node: &str) -> Result<Forgot, ClusterError> {
    let mut client = connect(settings).await?;
    let keys = Keys::new(&settings.prefix);
    let txn = Txn::new()
        .when(vec![Compare::create_revision(
            keys.node(node),
            CompareOp::Equal,
            0,
        )])
        .and_then(vec![
            TxnOp::delete(keys.member(node), None),
            TxnOp::delete(keys.last_state(node), None),
        ]);
    let r = client.txn(txn).await?;
    if !r.succeeded() {
        return Ok(Forgot::Present);
    }
    let deleted = r.op_responses().iter().any(|op| match op {
        etcd_client::TxnOpResponse::Delete(d) => d.deleted() > 0,
        _ => false,
    });
    Ok(Forgot::Done(deleted))
}
