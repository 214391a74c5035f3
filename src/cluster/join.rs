//! The join: the node's lease taken (or resumed), recorded, the keys a
//! maintenance of this boot left taken back onto it, and the presence,
//! last state and (once) member key put. Its own file because it is the
//! one step that uses both the presence and the maintenance hand-over.

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};

use super::keys::{Member, NodeState};
use super::maintenance;
use super::node::Node;
use super::presence;
use super::session::{ClusterError, json};
use crate::time::rfc3339;

/// What a node joined with.
#[derive(Debug, Clone)]
pub struct Joined {
    pub lease_id: i64,
    /// The lease of this boot was still alive: a restart, not a new boot.
    pub resumed: bool,
    pub granted_ttl_s: i64,
    /// Owner keys moved back from the maintenance lease.
    pub taken_back: usize,
    /// The fence deadline the grant (or the renewal of a resumed lease)
    /// gives, counted from before the request was sent.
    pub deadline: Duration,
    /// The frozen flag of the presence put.
    pub frozen: bool,
}

/// Takes the node's lease ([`presence::take_lease`]) and joins on it ([`join_on`]).
pub async fn join(client: &mut Client, node: &Node) -> Result<Joined, ClusterError> {
    let lease = presence::take_lease(client, &node.settings, &node.boot_id, &node.root.state_dir()).await?;
    join_on(client, node, lease).await
}

/// Records `lease` as the node's, and puts its presence, its last state
/// and, the first time, its member key.
pub async fn join_on(
    client: &mut Client,
    node: &Node,
    lease: presence::Lease,
) -> Result<Joined, ClusterError> {
    let (keys, state_dir) = (&node.keys, node.root.state_dir());
    let lease_id = lease.id;
    presence::write_lease_record(
        &state_dir,
        &crate::state::cluster::LeaseRecord {
            lease_id,
            boot_id: node.boot_id.clone(),
        },
    )?;
    // Back from maintenance: the keys it left on its maintenance lease
    // come back onto the live one, and the grace ends now.
    let taken_back = maintenance::take_back(client, node, lease_id).await?;
    // Until its first listing says otherwise, the node waits for every
    // HA workload it has (it did not see any owner key go): a peer that
    // did see one go takes it first (placement).
    let mut joining = node.presence(NodeState::Up);
    let frozen = joining.frozen;
    joining.waiting = joining.ha.keys().cloned().collect();
    presence::announce(client, keys, &node.name, lease_id, joining).await?;
    let member = Member {
        joined_at: rfc3339(std::time::SystemTime::now()),
    };
    // The member key is written once: its creation is the join.
    client
        .txn(
            Txn::new()
                .when(vec![Compare::create_revision(
                    keys.member(&node.name),
                    CompareOp::Equal,
                    0,
                )])
                .and_then(vec![TxnOp::put(keys.member(&node.name), json(&member), None)]),
        )
        .await?;
    Ok(Joined {
        lease_id,
        resumed: lease.resumed,
        granted_ttl_s: lease.granted_ttl_s,
        taken_back,
        deadline: lease.deadline,
        frozen,
    })
}
