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
//!
//! Nor does an etcd out of reach let an HA workload outlive the lease: the
//! drain keeps the fence deadline (`t_send + TTL − margin`, from the
//! daemon's last one and moved by each keep-alive the drain gets answered)
//! and, when it passes, stops every HA workload still running at once,
//! whatever its place in the drain order. A peer starts a workload no
//! earlier than the key's expiry plus its stop bound, so a stop begun by
//! the deadline is over before then.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::keys::{LastOwner, NodeState, Owner};
use super::node::Node;
use super::presence;
use super::session::{self, CALL_TIMEOUT, CappedDeadline, boottime, json};
use crate::config::{Loaded, Workload};
use crate::events::Events;
use crate::paths::Root;
use crate::state::drain_report::StopResult;
use crate::systemd::Ops;

/// Cluster mode's part in a drain ([`crate::drain::Companion`]): told
/// each result as the drain gets it.
pub struct Release {
    tell: UnboundedSender<StopResult>,
    task: JoinHandle<()>,
    /// The fence deadline, CLOCK_BOOTTIME ms; 0 when none is known.
    deadline: Arc<AtomicU64>,
    /// The node's HA workloads, which the fence stops.
    ha_workloads: Vec<Workload>,
    /// The lease the drain speaks for.
    lease: i64,
}

impl Release {
    /// Starts the session, or says why there is none: not in cluster
    /// mode (silently), or no lease of this boot to speak for.
    pub fn begin(root: &Root, loaded: &Loaded, events: &Events) -> Option<Release> {
        let settings = loaded.host.cluster.clone()?;
        let name = super::node::node_name(&settings)
            .map_err(|e| events.warn(&format!("cluster: {e}; the drain releases nothing")))
            .ok()?;
        let boot = crate::state::runs::boot_id().ok()?;
        // Before anything stops: a start racing the drain (`systemctl
        // start` while it runs) is refused by owner-check from here on, so
        // that nothing runs again here after its key is released.
        if let Err(e) = crate::state::cluster::write_drained(&root.runtime_dir(), &boot) {
            events.warn(&format!(
                "cluster: cannot record the drain in {} ({e}): a start racing it is not refused",
                crate::state::cluster::drained_path(&root.runtime_dir()).display()
            ));
        }
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
        // A daemon stopped on purpose left the node's presence and keys
        // on its maintenance lease: the drain speaks for that one. Some
        // keys may still be on the live lease (a move that failed), so
        // the daemon's deadline, the earlier of the two, is as far as it
        // goes.
        let maintenance = super::maintenance::maintenance_lease(&root.state_dir(), &boot);
        let lease = maintenance.unwrap_or(lease);
        // The daemon's last deadline holds until the drain's own
        // keep-alives move it.
        let known = super::fence::read_deadline(&root.runtime_dir());
        let deadline = Arc::new(AtomicU64::new(known.map_or(0, |d| d.as_millis() as u64)));
        let cap = maintenance.and(known);
        let node = Node::new(
            settings,
            name,
            boot,
            root.clone(),
            &loaded.workloads,
            Events::new("berth"),
        );
        let ha_workloads = node.workloads.clone();
        let releasing = Releasing {
            deadline: deadline.clone(),
            cap,
            frozen: node.frozen_now(),
            node,
            lease,
        };
        let (tell, results) = unbounded_channel();
        let task = tokio::spawn(releasing.run(results));
        Some(Release {
            tell,
            task,
            deadline,
            ha_workloads,
            lease,
        })
    }
}

impl crate::drain::Companion for Release {
    fn teller(&self) -> UnboundedSender<StopResult> {
        self.tell.clone()
    }

    fn fences(&self, workload: &str) -> bool {
        self.ha_workloads.iter().any(|w| w.name == workload)
    }

    /// Once the fence deadline passed, stops every HA workload still
    /// running, and looks again every second (a stop that failed is
    /// tried again); never returns. No deadline known (the runtime
    /// directory lost it) is one already passed: the lease may be
    /// expiring now.
    async fn fence<O: Ops>(&self, ops: &O, root: &Root, events: &Events) -> std::convert::Infallible {
        const LOOK: Duration = Duration::from_secs(1);
        // The deadline is on CLOCK_BOOTTIME, which a suspend moves on and
        // tokio's clock does not: passed when either says so.
        let (base, base_boot) = (Instant::now(), boottime());
        loop {
            let ms = self.deadline.load(Ordering::Relaxed);
            let at = base + Duration::from_millis(ms).saturating_sub(base_boot);
            if Instant::now() >= at || boottime().as_millis() as u64 >= ms {
                // Ahead of the drain order: it says so, with each outcome.
                super::fence::fence_now(ops, root, &self.ha_workloads, events, true).await;
                tokio::time::sleep(LOOK).await;
            } else {
                tokio::time::sleep_until(at.min(Instant::now() + LOOK)).await;
            }
        }
    }

    /// The drain is done: what is left is released and `drained` is
    /// announced, waited for until `until` at the latest.
    async fn finish(self, until: Instant, events: &Events) {
        drop(self.tell);
        let mut task = self.task;
        if tokio::time::timeout_at(until, &mut task).await.is_err() {
            task.abort();
            events.warn(&format!(
                "cluster: etcd did not answer in time; keys left to expire with lease {:x}",
                self.lease
            ));
        }
    }
}

/// The release's task: it announces, releases and keeps the lease.
struct Releasing {
    deadline: Arc<AtomicU64>,
    /// The furthest the deadline may move (the maintenance lease's).
    cap: Option<Duration>,
    node: Node,
    lease: i64,
    /// The node's freeze when the drain began.
    frozen: bool,
}

impl Releasing {
    async fn run(self, mut results: UnboundedReceiver<StopResult>) {
        let events = &self.node.events;
        let Ok(mut client) = session::within(CALL_TIMEOUT, session::connect(&self.node.settings)).await
        else {
            events
                .warn("cluster: cannot reach etcd; the drain releases nothing (keys expire with the lease)");
            return;
        };
        let keeper = tokio::spawn(session::keep_alive(
            client.clone(),
            self.node.settings.clone(),
            self.lease,
            Arc::new(CappedDeadline {
                deadline: self.deadline.clone(),
                cap: self.cap,
                runtime_dir: Some(self.node.root.runtime_dir()),
            }),
        ));
        // Unannounced, a release could hand a workload straight back to
        // this node (its presence still says up): nothing is released.
        if !self.announce(&mut client, NodeState::ShuttingDown, events).await {
            while results.recv().await.is_some() {}
            keeper.abort();
            return;
        }
        // Workloads the drain could not stop keep their key, and so do
        // those no longer configured (nothing here stopped them): it
        // expires with the lease, and the taker waits the stop bound.
        while let Some(r) = results.recv().await {
            if self.node.ha.contains_key(&r.workload) && r.outcome.is_down() {
                self.release(&mut client, &r.workload, events).await;
            }
        }
        self.announce(&mut client, NodeState::Drained, events).await;
        keeper.abort();
    }

    async fn announce(&self, client: &mut Client, state: NodeState, events: &Events) -> bool {
        let node = &self.node;
        let p = presence::presence(
            state,
            &node.boot_id,
            node.ha.clone(),
            self.frozen,
            node.watchdog_s(),
        );
        let done = session::within(
            CALL_TIMEOUT,
            presence::announce(client, &node.keys, &node.name, self.lease, p),
        )
        .await;
        match done {
            Ok(()) => {
                events.info(&format!("cluster: {} announced {}", node.name, state.as_str()));
                true
            }
            Err(session::ClusterError::Unanswered(_)) => {
                events.warn(&format!(
                    "cluster: cannot announce {}: etcd did not answer",
                    state.as_str()
                ));
                false
            }
            Err(e) => {
                events.warn(&format!("cluster: cannot announce {}: {e}", state.as_str()));
                false
            }
        }
    }

    /// Releases `workload`'s owner key if it is this node's, on this
    /// lease: bound zero, then gone.
    async fn release(&self, client: &mut Client, workload: &str, events: &Events) {
        let key = self.node.keys.owner(workload);
        let done = tokio::time::timeout(CALL_TIMEOUT, async {
            let got = client.get(key.as_str(), None).await?;
            let Some(kv) = got.kvs().first() else {
                return Ok::<_, etcd_client::Error>(false);
            };
            let Ok(mut owner) = serde_json::from_slice::<Owner>(kv.value()) else {
                return Ok(false);
            };
            if owner.node != self.node.name || kv.lease() != self.lease {
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
            // The record says so too: a node that does not see the
            // deletion takes the workload without a wait as well.
            let last = json(&LastOwner {
                node: owner.node.clone(),
                boot_id: owner.boot_id.clone(),
                stop_bound_s: 0,
            });
            let deleted = client
                .txn(
                    Txn::new()
                        .when(vec![Compare::value(
                            key.as_str(),
                            CompareOp::Equal,
                            zero.as_str(),
                        )])
                        .and_then(vec![
                            TxnOp::delete(key.as_str(), None),
                            TxnOp::put(self.node.keys.last_owner(workload), last.as_str(), None),
                        ]),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::systemd::fake::{Behaviour, FakeOps};
    use crate::testing::temp_root as setup;

    const SEC: Duration = Duration::from_secs(1);

    /// Records `lease` as the daemon's of this boot; the boot id.
    fn lease_of_this_boot(root: &Root, lease: i64) -> String {
        let boot = crate::state::runs::boot_id().unwrap();
        std::fs::create_dir_all(root.state_dir()).unwrap();
        std::fs::write(
            crate::state::cluster::lease_path(&root.state_dir()),
            format!("{{\"lease_id\": {lease}, \"boot_id\": \"{boot}\"}}"),
        )
        .unwrap();
        boot
    }

    /// A node whose daemon was stopped on purpose has its presence and
    /// keys on the maintenance lease: the drain announced and released on
    /// the revoked live lease, and so released nothing.
    #[tokio::test(start_paused = true)]
    async fn in_maintenance_the_drain_speaks_for_the_maintenance_lease() {
        let (_d, root, loaded) = setup(
            "[cluster]\nendpoints = [\"http://127.0.0.1:9\"]\nnode = \"n1\"",
            &[("db", "ha = true\nnodes = [\"n1\", \"n2\"]")],
        );
        let boot = lease_of_this_boot(&root, 7);
        let events = Events::new("test");
        let live = Release::begin(&root, &loaded, &events).unwrap();
        assert_eq!(live.lease, 7);
        std::fs::write(
            crate::state::cluster::maintenance_path(&root.state_dir()),
            format!("{{\"lease_id\": 9, \"boot_id\": \"{boot}\"}}"),
        )
        .unwrap();
        let held = Release::begin(&root, &loaded, &events).unwrap();
        assert_eq!(held.lease, 9);
        // A maintenance record of an earlier boot is not this node's now.
        std::fs::write(
            crate::state::cluster::maintenance_path(&root.state_dir()),
            "{\"lease_id\": 9, \"boot_id\": \"another boot\"}",
        )
        .unwrap();
        assert_eq!(Release::begin(&root, &loaded, &events).unwrap().lease, 7);
    }

    /// Review of issue 13: with etcd out of reach, an HA workload late in
    /// the drain order went on running past the lease's expiry, and a
    /// peer could start it after the stop bound while it still ran here.
    #[tokio::test(start_paused = true)]
    async fn an_unreachable_etcd_fences_ha_workloads_at_the_lease_deadline() {
        let (_d, root, loaded) = setup(
            // Nothing listens on port 9 of this host: refused at once.
            "drain_deadline_s = 120\n[cluster]\nendpoints = [\"http://127.0.0.1:9\"]\nnode = \"n1\"",
            &[
                ("db", "order = 0\nha = true\nnodes = [\"n1\", \"n2\"]"),
                ("web", "order = 10\nstop_delay_s = 60"),
            ],
        );
        lease_of_this_boot(&root, 7);
        std::fs::create_dir_all(root.runtime_dir()).unwrap();
        super::super::fence::write_deadline(&root.runtime_dir(), boottime() + 5 * SEC);
        let ops = FakeOps::default().unit("db", true, Behaviour::Takes(SEC)).unit(
            "web",
            true,
            Behaviour::Takes(30 * SEC),
        );
        let began = Instant::now();
        let events = Events::new("test");
        let release = Release::begin(&root, &loaded, &events);
        let report = crate::drain::run_with(&ops, &root, &loaded, &events, began, release, || {
            Instant::now() + 5 * SEC
        })
        .await;
        let (db_began, _) = ops.span("db", "stop");
        assert!(
            db_began - began <= 5 * SEC,
            "db was stopped {:?} into the drain, past its lease deadline at 5 s",
            db_began - began
        );
        let (web_began, _) = ops.span("web", "stop");
        assert!(web_began - began < SEC, "the drain order is otherwise kept");
        assert!(report.workloads.iter().all(|w| w.outcome.is_down()), "{report:?}");
        let db = crate::state::records::load(&root, "db").unwrap().unwrap();
        assert_eq!(
            db.last_transition_reason,
            crate::state::records::TransitionReason::Fence
        );
    }
}
