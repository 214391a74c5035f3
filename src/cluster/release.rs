//! The drain's part in cluster mode (issue 13, point 6): it announces
//! `shutting-down`, keeps the node's lease alive by its id while it drains
//! (the daemon may be gone already), releases each HA workload's owner key
//! as soon as that workload is down, and announces `drained`.
//!
//! A release first puts the key again with a stop bound of zero, then
//! deletes it: the deletion event carries that last value, so the taker
//! starts at once instead of waiting for a stop that already happened.
//! Each step compares the value it read, so a key that changed hands
//! meanwhile is left alone.
//!
//! etcd never holds up the drain: every call here runs on its own task
//! with a timeout, and the drain waits for this one only within a bound
//! it gives.

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::keys::{Keys, NodeState, Owner};
use super::presence::{self, json};
use crate::config::{ClusterSettings, Loaded};
use crate::events::Events;
use crate::paths::Root;
use crate::state::drain_report::StopResult;

/// How long one etcd call may take during the drain.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// A drain's cluster session; feed it each result as the drain gets it.
pub struct Release {
    tell: UnboundedSender<StopResult>,
    task: JoinHandle<()>,
}

impl Release {
    /// Starts the session, or says why there is none: not in cluster
    /// mode (silently), or no lease of this boot to speak for.
    pub fn begin(root: &Root, loaded: &Loaded, events: &Events) -> Option<Release> {
        let settings = loaded.host.cluster.clone()?;
        let node = super::node_name(&settings)
            .map_err(|e| events.warn(&format!("cluster: {e}; the drain releases nothing")))
            .ok()?;
        let boot = crate::state::runs::boot_id().ok()?;
        let lease = match presence::read_lease_record(&root.state_dir()) {
            Ok(r) if r.boot_id == boot => r.lease_id,
            Ok(_) => {
                events.info("cluster: this node holds no lease of this boot; the drain releases nothing");
                return None;
            }
            Err(e) => {
                events.info(&format!(
                    "cluster: no lease to speak for ({e}); the drain releases nothing"
                ));
                return None;
            }
        };
        let session = Session {
            keys: Keys::new(&settings.prefix),
            node,
            lease,
            boot,
            ha: super::ha_hashes(loaded),
            frozen: crate::state::freeze::node_frozen(root).is_some(),
            settings,
        };
        let (tell, results) = unbounded_channel();
        let task = tokio::spawn(session.run(results));
        Some(Release { tell, task })
    }

    pub fn teller(&self) -> UnboundedSender<StopResult> {
        self.tell.clone()
    }

    /// The drain is done: what is left is released and `drained` is
    /// announced, waited for until `until` at the latest.
    pub async fn finish(self, until: Instant, events: &Events) {
        drop(self.tell);
        let mut task = self.task;
        if tokio::time::timeout_at(until, &mut task).await.is_err() {
            task.abort();
            events.warn("cluster: etcd did not answer in time; keys left to expire with the lease");
        }
    }
}

struct Session {
    settings: ClusterSettings,
    keys: Keys,
    node: String,
    lease: i64,
    boot: String,
    ha: BTreeMap<String, String>,
    frozen: bool,
}

impl Session {
    async fn run(self, mut results: UnboundedReceiver<StopResult>) {
        let events = Events::new("berth");
        let Ok(Ok(mut client)) = tokio::time::timeout(CALL_TIMEOUT, presence::connect(&self.settings)).await
        else {
            events
                .warn("cluster: cannot reach etcd; the drain releases nothing (keys expire with the lease)");
            return;
        };
        let keeper = tokio::spawn(keep_alive_by_id(
            client.clone(),
            self.lease,
            self.settings.keep_alive_interval(),
        ));
        // Unannounced, a release could hand a workload straight back to
        // this node (its presence still says up): nothing is released.
        if !self.announce(&mut client, NodeState::ShuttingDown, &events).await {
            while results.recv().await.is_some() {}
            keeper.abort();
            return;
        }
        // Workloads the drain could not stop keep their key, and so do
        // those no longer configured (nothing here stopped them): it
        // expires with the lease, and the taker waits the stop bound.
        while let Some(r) = results.recv().await {
            if self.ha.contains_key(&r.workload) && r.outcome.is_down() {
                self.release(&mut client, &r.workload, &events).await;
            }
        }
        self.announce(&mut client, NodeState::Drained, &events).await;
        keeper.abort();
    }

    async fn announce(&self, client: &mut Client, state: NodeState, events: &Events) -> bool {
        let p = presence::presence(state, &self.boot, self.ha.clone(), self.frozen);
        let done = tokio::time::timeout(
            CALL_TIMEOUT,
            presence::announce(client, &self.keys, &self.node, self.lease, p),
        )
        .await;
        match done {
            Ok(Ok(())) => {
                events.info(&format!("cluster: {} announced {}", self.node, state.as_str()));
                true
            }
            Ok(Err(e)) => {
                events.warn(&format!("cluster: cannot announce {}: {e}", state.as_str()));
                false
            }
            Err(_) => {
                events.warn(&format!(
                    "cluster: cannot announce {}: etcd did not answer",
                    state.as_str()
                ));
                false
            }
        }
    }

    /// Releases `workload`'s owner key if it is this node's, on this
    /// lease: bound zero, then gone.
    async fn release(&self, client: &mut Client, workload: &str, events: &Events) {
        let key = self.keys.owner(workload);
        let done = tokio::time::timeout(CALL_TIMEOUT, async {
            let got = client.get(key.as_str(), None).await?;
            let Some(kv) = got.kvs().first() else {
                return Ok::<_, etcd_client::Error>(false);
            };
            let Ok(mut owner) = serde_json::from_slice::<Owner>(kv.value()) else {
                return Ok(false);
            };
            if owner.node != self.node || kv.lease() != self.lease {
                return Ok(false);
            }
            let old = kv.value().to_vec();
            owner.stop_bound_s = 0;
            let zero = json(&owner);
            let put = client
                .txn(
                    Txn::new()
                        .when(vec![Compare::value(key.as_str(), CompareOp::Equal, old)])
                        .and_then(vec![TxnOp::put(
                            key.as_str(),
                            zero.as_str(),
                            Some(PutOptions::new().with_lease(self.lease)),
                        )]),
                )
                .await?;
            if !put.succeeded() {
                return Ok(false);
            }
            let deleted = client
                .txn(
                    Txn::new()
                        .when(vec![Compare::value(
                            key.as_str(),
                            CompareOp::Equal,
                            zero.as_str(),
                        )])
                        .and_then(vec![TxnOp::delete(key.as_str(), None)]),
                )
                .await?;
            Ok(deleted.succeeded())
        })
        .await;
        match done {
            Ok(Ok(true)) => events.info(&format!("cluster: released {workload}: it is down")),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => events.warn(&format!("cluster: cannot release {workload}: {e}")),
            Err(_) => events.warn(&format!(
                "cluster: cannot release {workload}: etcd did not answer"
            )),
        }
    }
}

/// Keeps `lease` alive while the drain runs: any client may, by id. A
/// broken stream is opened again; a lease etcd no longer has ends it.
async fn keep_alive_by_id(mut client: Client, lease: i64, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let (mut keeper, mut stream) =
            match tokio::time::timeout(CALL_TIMEOUT, client.lease_keep_alive(lease)).await {
                Ok(Ok(opened)) => opened,
                // The lease is gone: nothing left to keep.
                Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => return,
                _ => {
                    tick.tick().await;
                    continue;
                }
            };
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if keeper.keep_alive().await.is_err() {
                        break;
                    }
                }
                answer = stream.message() => match answer {
                    Ok(Some(r)) if r.ttl() <= 0 => return,
                    Ok(Some(_)) => {}
                    _ => break,
                },
            }
        }
    }
}
