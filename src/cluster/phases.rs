//! The agent's life, one phase after another. What each phase decides is
//! a pure function of its own file (`rejoin::missing`, `adoption::adopt`,
//! `ownership::to_take`, `fence::step`); here is only their order.
//!
//! ```text
//!   fence ─────────────── all along: it needs nothing from etcd ──────────►
//!
//!   join ──► adopt ──► grace ──► take ──────────────┐   (grace: first daemon
//!    ▲        freezes followed from here on         │    of a boot only)
//!    │     ∥ keep-alive ── lease lost ──────────────┤
//!    └──────────────────────────────────────────────┘
//!
//!   leave, at any time ──► depart: the keys go to a maintenance lease
//! ```
//!
//! Everything runs on one thread's `LocalSet`; systemd is reached through
//! [`Ops`] only, so that the phases run on the fake in tests.

use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use etcd_client::Client;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

use super::join::Joined;
use super::node::Node;
use super::session::{self, ClusterError, LeaseLost, LeaseState, boottime};
use super::take::Announced;
use super::{adoption, fence, join, maintenance, presence, rejoin, take, view};
use crate::systemd::Ops;

/// Where the daemon asks its agent to leave; the agent answers with what
/// it did, for the journal.
pub type Leaving = UnboundedReceiver<std::sync::mpsc::Sender<String>>;

/// The agent's whole life: until the daemon leaves, then its departure.
pub async fn live<O: Ops + 'static>(node: Rc<Node>, ops: Rc<O>, mut leaving: Leaving) {
    start_fence(&node, &ops);
    if let Some(api) = &node.api {
        view::start_keeping(
            node.settings.clone(),
            node.name.clone(),
            node.root.runtime_dir(),
            api.clone(),
        );
    }
    tokio::select! {
        _ = membership(&node, &ops) => {}
        Some(tell) = leaving.recv() => {
            let said = depart(&node, &*ops).await;
            let _ = tell.send(said);
            // The process ends; nothing more is done here.
            std::future::pending::<()>().await;
        }
    }
}

/// A node whose name is unknown never joins; only the fence runs (for a
/// deadline an earlier daemon of this boot kept).
pub async fn outside<O: Ops + 'static>(node: Rc<Node>, ops: Rc<O>, mut leaving: Leaving, why: String) {
    node.events
        .warn(&format!("cluster: {why}; this node stays out of the cluster"));
    start_fence(&node, &ops);
    while let Some(tell) = leaving.recv().await {
        let _ = tell.send("this node is not in the cluster; nothing handed over".into());
    }
}

/// The agent thread's pulse, which the daemon's watchdog depends on: it
/// stops only when the thread does.
pub fn pulse(state: Arc<LeaseState>) {
    tokio::spawn(async move {
        loop {
            state
                .progress_ms
                .store(boottime().as_millis() as u64, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
}

fn start_fence<O: Ops + 'static>(node: &Rc<Node>, ops: &Rc<O>) {
    let (node, ops) = (node.clone(), ops.clone());
    tokio::task::spawn_local(async move { fence::run(&node, ops).await });
}

/// Joins, keeps the lease and takes workloads, joining again whenever the
/// lease is lost; never ends by itself.
async fn membership<O: Ops + 'static>(node: &Node, ops: &Rc<O>) {
    let mut first_contact = None;
    let mut when = adoption::When::WhileDown;
    loop {
        let (client, joined) = join(node).await;
        // The grace counts from the first contact, over every join until
        // it is over (a lease lost during it does not skip it).
        let contact = *first_contact.get_or_insert_with(Instant::now);
        let when = std::mem::replace(&mut when, adoption::When::Now);
        // When the lease is lost (expired, or etcd silent for a TTL), the
        // phases after the join go, and the node joins again on a new
        // connection (resuming the lease if it is alive).
        let lost = tokio::select! {
            lost = session::keep_alive(client.clone(), node.settings.clone(), joined.lease_id, node.lease.clone()) => lost,
            _ = take_part(node, ops, client, &joined, when, contact) => continue,
        };
        node.events.warn(&match lost {
            LeaseLost::Expired => format!(
                "cluster: lease {:x} expired: joining again with a new one",
                joined.lease_id
            ),
            LeaseLost::Silent => format!(
                "cluster: no answer from etcd for a whole TTL on lease {:x}: joining again",
                joined.lease_id
            ),
        });
    }
}

/// Adopt, grace, take: freezes taken while this daemon was down first,
/// then (after a boot) the rejoin grace, then taking; freezes are followed
/// as they come from the adoption on, during the grace too. Never ends by
/// itself.
async fn take_part<O: Ops + 'static>(
    node: &Node,
    ops: &Rc<O>,
    client: Client,
    joined: &Joined,
    when: adoption::When,
    contact: Instant,
) {
    let mut c = client.clone();
    let from = adoption::first(&mut c, node, when).await;
    let taking = async {
        grace(&mut c, node, contact).await;
        let announced = Announced::at_join(node, joined.frozen);
        take::run(client.clone(), node, ops.clone(), joined.lease_id, announced).await
    };
    tokio::join!(adoption::watch(client.clone(), node, from), taking);
}

/// Joins, trying again every keep-alive interval while etcd cannot be
/// reached (said once); the lease becomes the fence's at once.
pub async fn join(node: &Node) -> (Client, Joined) {
    let mut said = false;
    let (client, joined) = loop {
        match join_once(node).await {
            Ok(done) => break done,
            Err(e) => {
                if !said {
                    node.events.warn(&format!(
                        "cluster: cannot join as {} yet ({e}); trying again",
                        node.name
                    ));
                    said = true;
                }
                tokio::time::sleep(node.settings.keep_alive_interval()).await;
            }
        }
    };
    node.lease.lease.store(joined.lease_id, Ordering::Relaxed);
    node.lease.set_deadline(joined.deadline);
    // At once, not at the fence's next look: `berth owner-check` refuses
    // starts past the deadline it finds there.
    fence::write_deadline(&node.root.runtime_dir(), joined.deadline);
    // A daemon started after a drain by hand puts the node back in
    // service; a rejoin of the daemon that saw the drain does not.
    crate::state::cluster::remove_drained_before(&node.root.runtime_dir(), node.started);
    node.events.info(&format!(
        "cluster: joined as {} at {}, lease {:x} ({}, TTL {} s){}",
        node.name,
        node.settings.endpoints.join(" "),
        joined.lease_id,
        if joined.resumed {
            "resumed: same boot"
        } else {
            "new"
        },
        joined.granted_ttl_s,
        match joined.taken_back {
            0 => String::new(),
            n => format!("; {n} owner keys taken back from maintenance"),
        }
    ));
    (client, joined)
}

async fn join_once(node: &Node) -> Result<(Client, Joined), ClusterError> {
    let mut client = session::connect(&node.settings).await?;
    let lease =
        presence::take_lease(&mut client, &node.settings, &node.boot_id, &node.root.state_dir()).await?;
    // A lease resumed with no hand-over pending (a crash, not a stop): the
    // owner keys on it are still this node's, and the fence (and the
    // timer the previous daemon armed) stands down now, not after the
    // join's writes. Keys on a maintenance lease come back only with the
    // join's take-back.
    if lease.resumed && maintenance::maintenance_lease(&node.root.state_dir(), &node.boot_id).is_none() {
        node.lease.lease.store(lease.id, Ordering::Relaxed);
        node.lease.set_deadline(lease.deadline);
    }
    let joined = join::join_on(&mut client, node, lease).await?;
    Ok((client, joined))
}

/// After a boot: nothing is taken until every missing peer is heard, or
/// the rejoin grace passes (then the node freezes itself). A daemon
/// restarted within the boot finds the grace done.
async fn grace(client: &mut Client, node: &Node, contact: Instant) {
    let runtime_dir = node.root.runtime_dir();
    if !rejoin::pending(&runtime_dir, &node.boot_id) {
        return;
    }
    let missing = rejoin::grace(client, node, contact).await;
    if !missing.is_empty() {
        rejoin_expired(node, &missing);
    }
    if let Err(e) = rejoin::done(&runtime_dir, &node.boot_id) {
        node.events.warn(&format!(
            "cluster: cannot mark this boot's rejoin as done ({e}): the next daemon of this boot waits the grace again"
        ));
    }
}

/// The rejoin grace passed with peers unheard: the node freezes itself
/// (unless it is frozen already), saying which.
fn rejoin_expired(node: &Node, missing: &[String]) {
    use crate::state::freeze;
    let peers = missing.join(" ");
    let grace = node.settings.rejoin_grace_period_s;
    match freeze::freeze_unless_own(&node.root, None, freeze::REJOIN_GRACE_EXPIRED) {
        Ok(Some(_)) => node.events.warn(&format!(
            "cluster: rejoin grace of {grace} s passed with peer(s) {peers} not heard (member, last state up or maintenance, no node key): local node has been frozen (reason {}); berth thaw lifts it, berth cluster forget removes a peer gone for good",
            freeze::REJOIN_GRACE_EXPIRED
        )),
        Ok(None) => node.events.warn(&format!(
            "cluster: rejoin grace of {grace} s passed with peer(s) {peers} not heard; the node has a freeze of its own already, which stays"
        )),
        Err(e) => node.events.warn(&format!(
            "cluster: rejoin grace of {grace} s passed with peer(s) {peers} not heard, and the node freeze cannot be written: {e}"
        )),
    }
}

/// The daemon leaves: unless the host is shutting down, the node's keys
/// go to a maintenance lease; the fence keeps the deadline that still
/// holds a key. What happened, for the journal.
pub async fn depart<O: Ops>(node: &Node, ops: &O) -> String {
    const STEP: Duration = Duration::from_secs(5);
    let stopping = tokio::time::timeout(STEP, ops.system_state()).await;
    if matches!(stopping, Ok(Ok(s)) if s == "stopping") {
        return "the host is shutting down: the drain speaks for this node".into();
    }
    let live = node.lease.lease_id();
    if live == 0 {
        return "not joined: nothing to hand over".into();
    }
    let handed = async {
        let mut client = session::connect(&node.settings).await?;
        maintenance::hand_over(&mut client, node, live, node.lease.deadline()).await
    };
    let h = match session::within(2 * STEP, handed).await {
        Ok(h) => h,
        Err(ClusterError::Unanswered(_)) => {
            return "etcd did not answer the maintenance hand-over: the fence keeps the live lease's deadline"
                .into();
        }
        Err(e) => {
            return format!("maintenance hand-over failed ({e}): the fence keeps the live lease's deadline");
        }
    };
    if let Some(d) = h.deadline {
        node.lease.set_deadline(d);
        fence::write_deadline(&node.root.runtime_dir(), d);
    }
    let left = if h.left > 0 {
        format!(
            ", {} could not be moved (the fence keeps the live deadline)",
            h.left
        )
    } else {
        String::new()
    };
    let revoked = if h.live_revoked {
        format!("; live lease {live:x} revoked")
    } else {
        String::new()
    };
    format!(
        "maintenance: {} owner keys moved to lease {:x} for {} s{left}{revoked}",
        h.moved, h.maintenance_lease, node.settings.maintenance_grace_period_s
    )
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use super::*;
    use crate::cluster::keys::{ClusterFreeze, LastState, Member, NodeState, Owner, Presence};
    use crate::state::freeze;
    use crate::systemd::fake::{Behaviour, FakeOps};
    use crate::testing::{etcd::etcd, temp_root};

    const SEC: Duration = Duration::from_secs(1);

    /// Runs `test` on a `LocalSet`, as the agent runs, on the real clock
    /// (etcd answers in its own time), given a fresh etcd's URL.
    fn on_etcd<F: FnOnce(String) -> Fut, Fut: Future<Output = ()>>(test: F) {
        let Some(etcd) = etcd() else { return };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        tokio::task::LocalSet::new().block_on(&runtime, test(etcd.url.clone()));
    }

    /// Node n1, of a root of its own, with `db` (HA on n1 and n2) and
    /// `settings` added to its `[cluster]` section.
    fn n1(url: &str, settings: &str) -> (tempfile::TempDir, Rc<Node>) {
        let (dir, root, loaded) = temp_root(
            &format!("[cluster]\nendpoints = [\"{url}\"]\nnode = \"n1\"\nlease_ttl_s = 10\n{settings}"),
            &[("db", "ha = true\nnodes = [\"n1\", \"n2\"]")],
        );
        let settings = loaded.host.cluster.clone().unwrap();
        let events = crate::events::Events::new("test");
        let node = Node::new(
            settings,
            "n1".into(),
            "boot-a".into(),
            root,
            &loaded.workloads,
            events,
        );
        (dir, Rc::new(node))
    }

    /// The agent's life on `ops`; what asks it to leave.
    fn start(
        node: &Rc<Node>,
        ops: &Rc<FakeOps>,
    ) -> tokio::sync::mpsc::UnboundedSender<std::sync::mpsc::Sender<String>> {
        let (leave, leaving) = tokio::sync::mpsc::unbounded_channel();
        tokio::task::spawn_local(live(node.clone(), ops.clone(), leaving));
        leave
    }

    /// A client of `url` once etcd answers (it may be starting).
    async fn client(url: &str) -> Client {
        let began = Instant::now();
        loop {
            if let Ok(mut c) = Client::connect([url], None).await
                && c.status().await.is_ok()
            {
                return c;
            }
            assert!(began.elapsed() < 20 * SEC, "etcd did not come up");
            tokio::time::sleep(SEC / 5).await;
        }
    }

    /// The value and lease of `key`.
    async fn read(c: &mut Client, key: &str) -> Option<(Vec<u8>, i64)> {
        let got = c.get(key, None).await.unwrap();
        got.kvs().first().map(|kv| (kv.value().to_vec(), kv.lease()))
    }

    /// Waits up to `limit` for `done` to give something, saying `what`
    /// when it does not.
    async fn until<T, F: std::future::Future<Output = Option<T>>>(
        limit: Duration,
        what: &str,
        mut done: impl FnMut() -> F,
    ) -> T {
        let began = Instant::now();
        loop {
            if let Some(t) = done().await {
                return t;
            }
            assert!(began.elapsed() < limit, "not within {limit:?}: {what}");
            tokio::time::sleep(SEC / 10).await;
        }
    }

    /// The node's live lease, once it joined.
    async fn joined(node: &Node) -> i64 {
        until(20 * SEC, "the node joins", || {
            let id = node.lease.lease_id();
            async move { (id != 0).then_some(id) }
        })
        .await
    }

    /// Asks the agent to leave; its answer.
    async fn leave(leave: &tokio::sync::mpsc::UnboundedSender<std::sync::mpsc::Sender<String>>) -> String {
        let (tell, told) = std::sync::mpsc::channel();
        leave.send(tell).unwrap();
        until(20 * SEC, "the agent answers the hand-over", || {
            let got = told.try_recv().ok();
            async move { got }
        })
        .await
    }

    /// Join, take (after the workload's stop bound: the node did not see
    /// its key go), start through systemd; then depart: the key goes to a
    /// maintenance lease with the presence.
    #[test]
    fn a_joined_node_takes_its_workload_and_hands_it_to_maintenance_when_it_leaves() {
        on_etcd(|url| async move {
            let (_dir, node) = n1(&url, "");
            let ops = Rc::new(FakeOps::default().unit("db", false, Behaviour::Takes(Duration::ZERO)));
            let leaving = start(&node, &ops);
            let mut c = client(&url).await;
            let key = node.keys.owner("db");
            let (value, lease) = until(20 * SEC, "db is taken", || {
                let (mut c, key) = (c.clone(), key.clone());
                async move { read(&mut c, &key).await }
            })
            .await;
            let owner: Owner = serde_json::from_slice(&value).unwrap();
            assert_eq!(owner.node, "n1");
            assert_eq!(
                owner.stop_bound_s, 5,
                "TimeoutStopSec=0 and no ExecStop=: 5 s for SIGKILL"
            );
            assert_eq!(
                lease,
                node.lease.lease_id(),
                "the key is on the node's live lease"
            );
            assert!(node.lease.ahead(), "the keep-alives keep the deadline ahead");
            until(10 * SEC, "db's unit is started", || {
                let started = ops
                    .spans
                    .borrow()
                    .iter()
                    .any(|(u, verb, _, _)| u == "berth@db.service" && *verb == "start");
                async move { started.then_some(()) }
            })
            .await;
            let record = crate::state::records::load(&node.root, "db").unwrap().unwrap();
            assert_eq!(
                record.last_transition_reason,
                crate::state::records::TransitionReason::HaTake
            );

            let said = leave(&leaving).await;
            assert!(
                said.starts_with("maintenance: 1 owner keys moved to lease"),
                "{said}"
            );
            let maintenance = crate::state::cluster::read_maintenance(&node.root.state_dir())
                .expect("the maintenance lease is recorded");
            assert_eq!(read(&mut c, &key).await.unwrap().1, maintenance.lease_id);
            let (presence, on) = read(&mut c, &node.keys.node("n1")).await.unwrap();
            let presence: Presence = serde_json::from_slice(&presence).unwrap();
            assert_eq!(
                (presence.state, on),
                (NodeState::Maintenance, maintenance.lease_id)
            );
        });
    }

    /// A daemon stopped by the host's shutdown hands nothing over: the
    /// drain speaks for the node.
    #[test]
    fn a_node_leaving_in_a_shutdown_hands_nothing_over() {
        on_etcd(|url| async move {
            let (_dir, node) = n1(&url, "");
            let ops = Rc::new(FakeOps::default().unit("db", false, Behaviour::Takes(Duration::ZERO)));
            *ops.system_state.borrow_mut() = Some("stopping".into());
            let leaving = start(&node, &ops);
            let live = joined(&node).await;
            let said = leave(&leaving).await;
            assert_eq!(said, "the host is shutting down: the drain speaks for this node");
            assert!(crate::state::cluster::read_maintenance(&node.root.state_dir()).is_none());
            let mut c = client(&url).await;
            let (presence, on) = read(&mut c, &node.keys.node("n1")).await.unwrap();
            let presence: Presence = serde_json::from_slice(&presence).unwrap();
            assert_eq!((presence.state, on), (NodeState::Up, live));
        });
    }

    /// After a boot, a member whose last state says up and that has no
    /// presence is waited for; when the grace passes without it, the node
    /// freezes itself and says so in its presence.
    #[test]
    fn a_peer_unheard_through_the_rejoin_grace_freezes_the_node() {
        on_etcd(|url| async move {
            let (_dir, node) = n1(&url, "rejoin_grace_period_s = 1");
            let mut c = client(&url).await;
            let member = Member {
                joined_at: "T".into(),
            };
            c.put(
                node.keys.member("n2"),
                serde_json::to_string(&member).unwrap(),
                None,
            )
            .await
            .unwrap();
            let up = LastState {
                state: NodeState::Up,
                boot_id: "b".into(),
                at: "T".into(),
            };
            c.put(
                node.keys.last_state("n2"),
                serde_json::to_string(&up).unwrap(),
                None,
            )
            .await
            .unwrap();
            let ops = Rc::new(FakeOps::default().unit("db", false, Behaviour::Takes(Duration::ZERO)));
            let _leaving = start(&node, &ops);
            let frozen = until(20 * SEC, "the node freezes itself", || {
                let f = freeze::current(&node.root, None);
                async move { f }
            })
            .await;
            assert_eq!(frozen.reason, freeze::REJOIN_GRACE_EXPIRED);
            assert!(
                !rejoin::pending(&node.root.runtime_dir(), "boot-a"),
                "the rejoin is done"
            );
            let key = node.keys.node("n1");
            until(20 * SEC, "the presence says frozen", || {
                let (mut c, key) = (c.clone(), key.clone());
                async move {
                    let (p, _) = read(&mut c, &key).await?;
                    serde_json::from_slice::<Presence>(&p).ok()?.frozen.then_some(())
                }
            })
            .await;
        });
    }

    /// A cluster freeze put while the daemon was down is the node's once
    /// it joins.
    #[test]
    fn a_cluster_freeze_taken_while_down_is_adopted_at_the_join() {
        on_etcd(|url| async move {
            let (_dir, node) = n1(&url, "");
            let mut c = client(&url).await;
            let taken = ClusterFreeze {
                taken_by: "n2".into(),
                frozen_at: "2026-12-05T00:00:00Z".into(),
                reason: "upgrade".into(),
            };
            c.put(
                node.keys.cluster_freeze(),
                serde_json::to_string(&taken).unwrap(),
                None,
            )
            .await
            .unwrap();
            let ops = Rc::new(FakeOps::default().unit("db", false, Behaviour::Takes(Duration::ZERO)));
            let _leaving = start(&node, &ops);
            let adopted = until(20 * SEC, "the cluster freeze is adopted", || {
                let f = freeze::current(&node.root, None);
                async move { f }
            })
            .await;
            assert!(adopted.adopted.is_some(), "{adopted:?}");
            assert_eq!(adopted.reason, "upgrade");
        });
    }

    /// Whether `unit` had a `verb` job that ended done, after `since`.
    fn did(ops: &FakeOps, verb: &str, since: Instant) -> bool {
        ops.spans
            .borrow()
            .iter()
            .any(|(u, v, _, end)| u == "berth@db.service" && *v == verb && *end >= since)
    }

    /// A take applied by etcd whose answer never came: the key names n1
    /// on its live lease, and nothing started db. The reconciliation
    /// starts it within a period.
    #[test]
    fn an_owned_workload_that_never_started_is_started_by_the_reconciliation() {
        on_etcd(|url| async move {
            // db was n2's, which may still be stopping it (for 100 s):
            // n1's own take waits, and only the reconciliation can start
            // db within the test's bound.
            let (_dir, node) = n1(&url, "");
            let mut c = client(&url).await;
            let last = crate::cluster::keys::LastOwner {
                node: "n2".into(),
                boot_id: "b".into(),
                stop_bound_s: 100,
            };
            c.put(
                node.keys.last_owner("db"),
                serde_json::to_string(&last).unwrap(),
                None,
            )
            .await
            .unwrap();
            let ops = Rc::new(FakeOps::default().unit("db", false, Behaviour::Takes(Duration::ZERO)));
            let _leaving = start(&node, &ops);
            let live = joined(&node).await;
            let owner = Owner {
                node: "n1".into(),
                stop_bound_s: 30,
                since: "T".into(),
                boot_id: String::new(),
                watchdog_s: None,
            };
            let put_at = Instant::now();
            c.put(
                node.keys.owner("db"),
                serde_json::to_string(&owner).unwrap(),
                Some(etcd_client::PutOptions::new().with_lease(live)),
            )
            .await
            .unwrap();
            until(
                crate::cluster::reconcile::PERIOD + 3 * SEC,
                "db, owned by n1 on its live lease, is started",
                || {
                    let done = did(&ops, "start", put_at);
                    async move { done.then_some(()) }
                },
            )
            .await;
            let ran = crate::state::cluster::read_ran(&node.root.runtime_dir());
            assert!(ran.contains_key("db"), "the ownership it ran in is kept: {ran:?}");
        });
    }

    /// A take applied by etcd whose answer comes late (etcd's replies to
    /// n1 held in a relay past the take's timeout): n1 learns from the
    /// watch that the key is its own, and the reconciliation starts db.
    #[test]
    fn a_take_answered_too_late_is_started_once_the_watch_shows_the_key() {
        on_etcd(|url| async move {
            let relay = crate::testing::relay::Relay::start(&url).await;
            let (_dir, node) = n1(&relay.url, "");
            let mut c = client(&url).await;
            let theirs = c.lease_grant(60, None).await.unwrap().id();
            let owner = Owner {
                node: "n2".into(),
                stop_bound_s: 1,
                since: "T".into(),
                boot_id: "b".into(),
                watchdog_s: None,
            };
            c.put(
                node.keys.owner("db"),
                serde_json::to_string(&owner).unwrap(),
                Some(etcd_client::PutOptions::new().with_lease(theirs)),
            )
            .await
            .unwrap();
            let ops = Rc::new(FakeOps::default().unit("db", false, Behaviour::Takes(Duration::ZERO)));
            let _leaving = start(&node, &ops);
            joined(&node).await;
            // The node has listed n2's key.
            tokio::time::sleep(SEC).await;
            let deleted = Instant::now();
            c.delete(node.keys.owner("db"), None).await.unwrap();
            // n1 sees the deletion, waits n2's 1 s bound and takes: its
            // request reaches etcd, the answer waits in the relay past the
            // take's timeout (one keep-alive interval, 2 s at TTL 10).
            tokio::time::sleep(SEC * 3 / 10).await;
            relay.hold_replies(true);
            tokio::time::sleep(SEC * 35 / 10).await;
            let (value, _) = read(&mut c, &node.keys.owner("db"))
                .await
                .expect("the take was applied");
            let taken: Owner = serde_json::from_slice(&value).unwrap();
            assert_eq!(taken.node, "n1");
            assert!(!did(&ops, "start", deleted), "no start while the answer is held");
            let released = Instant::now();
            relay.hold_replies(false);
            until(
                crate::cluster::reconcile::PERIOD + 3 * SEC,
                "db, taken without an answer, is started",
                || {
                    let done = did(&ops, "start", released);
                    async move { done.then_some(()) }
                },
            )
            .await;
            tokio::time::sleep(crate::cluster::reconcile::PERIOD * 2).await;
            let starts = ops
                .spans
                .borrow()
                .iter()
                .filter(|(u, v, _, _)| u == "berth@db.service" && *v == "start")
                .count();
            assert_eq!(starts, 1, "started once");
        });
    }

    /// A start that fails is tried again after the backoff, until it
    /// starts; then nothing more is started.
    #[test]
    fn a_failed_start_of_an_owned_workload_is_tried_again() {
        on_etcd(|url| async move {
            let (_dir, node) = n1(&url, "");
            let ops = Rc::new(FakeOps::default().unit("db", false, Behaviour::Takes(Duration::ZERO)));
            ops.start_failures
                .borrow_mut()
                .insert("berth@db.service".into(), 2);
            let began = Instant::now();
            let _leaving = start(&node, &ops);
            until(30 * SEC, "db starts at the third attempt", || {
                let done = did(&ops, "start", began);
                async move { done.then_some(()) }
            })
            .await;
            assert_eq!(ops.start_failures.borrow()["berth@db.service"], 0);
            // The backoff: 2 s after the first failure, 4 s after the second.
            let (_, started) = ops.span("db", "start");
            assert!(started - began >= 6 * SEC, "{:?}", started - began);
            tokio::time::sleep(3 * SEC).await;
            let starts = ops
                .spans
                .borrow()
                .iter()
                .filter(|(u, v, _, _)| u == "berth@db.service" && *v == "start")
                .count();
            assert_eq!(starts, 1, "a workload that runs is not started again");
        });
    }

    /// db runs on n1, then its key names another node (a hand-edited key,
    /// a manual drain's release racing a start): n1 fences it.
    #[test]
    fn a_workload_running_without_its_key_is_fenced() {
        on_etcd(|url| async move {
            let (_dir, node) = n1(&url, "");
            let ops = Rc::new(FakeOps::default().unit("db", false, Behaviour::Takes(Duration::ZERO)));
            let began = Instant::now();
            let _leaving = start(&node, &ops);
            until(20 * SEC, "db is taken and started", || {
                let done = did(&ops, "start", began);
                async move { done.then_some(()) }
            })
            .await;
            // Until the fence's look at the new lease is done (it disarms
            // the fence timer first): when it came after the move, it
            // stopped db at once, rightly, as a stray of an older lease,
            // and this test failed 1 run in 5.
            until(5 * SEC, "the new lease is settled", || {
                let settled = ops.stops_asked.borrow().iter().any(|u| u == "berth-fence.timer");
                async move { settled.then_some(()) }
            })
            .await;
            let mut c = client(&url).await;
            let theirs = Owner {
                node: "n2".into(),
                stop_bound_s: 5,
                since: "T".into(),
                boot_id: String::new(),
                watchdog_s: None,
            };
            let moved = Instant::now();
            c.put(
                node.keys.owner("db"),
                serde_json::to_string(&theirs).unwrap(),
                None,
            )
            .await
            .unwrap();
            let stopped = until(
                3 * crate::cluster::reconcile::PERIOD + 3 * SEC,
                "db is fenced",
                || {
                    let done = did(&ops, "stop", moved);
                    async move { done.then_some(Instant::now()) }
                },
            )
            .await;
            assert!(
                stopped - moved >= crate::cluster::reconcile::PERIOD / 2,
                "two passes, not one, see it before the fence: {:?}",
                stopped - moved
            );
            let record = crate::state::records::load(&node.root, "db").unwrap().unwrap();
            assert_eq!(
                record.last_transition_reason,
                crate::state::records::TransitionReason::Fence
            );
        });
    }

    /// More than the client's default reply limit (4 MiB) under the
    /// prefix, outside berth's directories: the node still takes.
    #[test]
    fn values_beyond_the_reply_limit_under_the_prefix_do_not_stop_takes() {
        on_etcd(|url| async move {
            let (_dir, node) = n1(&url, "");
            let mut c = client(&url).await;
            let big = "x".repeat(1_400_000);
            for i in 0..4 {
                c.put(format!("{}junk/{i}", node.settings.prefix), big.clone(), None)
                    .await
                    .unwrap();
            }
            let ops = Rc::new(FakeOps::default().unit("db", false, Behaviour::Takes(Duration::ZERO)));
            let began = Instant::now();
            let _leaving = start(&node, &ops);
            until(25 * SEC, "db is taken and started", || {
                let done = did(&ops, "start", began);
                async move { done.then_some(()) }
            })
            .await;
            assert_eq!(
                crate::state::cluster::read_listing_error(&node.root.runtime_dir()),
                None
            );
        });
    }

    /// db, down, whose unit's TimeoutStopSec= is `timeout_stop_us`: its
    /// stop bound here is that plus 5 s.
    fn db_stopping_within(timeout_stop_us: u64) -> Rc<FakeOps> {
        let ops = Rc::new(FakeOps::default().unit("db", false, Behaviour::Takes(Duration::ZERO)));
        ops.topologies.borrow_mut().insert(
            "berth@db.service".into(),
            crate::systemd::UnitTopology {
                timeout_stop_us,
                ..Default::default()
            },
        );
        ops
    }

    /// A relist with unequal bounds: the last owner's own bound is waited,
    /// whatever this candidate's unit would give.
    #[test]
    fn a_candidate_that_did_not_see_the_key_go_waits_the_last_owners_bound() {
        on_etcd(|url| async move {
            let (_dir, node) = n1(&url, "");
            // n1's own bound for db is 6 s (TimeoutStopSec=1 s + 5 s);
            // n2, db's last owner, declared 12 s, and its key went while
            // n1 was not watching (a restarted daemon lists afresh).
            let ops = db_stopping_within(1_000_000);
            let mut c = client(&url).await;
            let last = crate::cluster::keys::LastOwner {
                node: "n2".into(),
                boot_id: "b".into(),
                stop_bound_s: 12,
            };
            c.put(
                node.keys.last_owner("db"),
                serde_json::to_string(&last).unwrap(),
                None,
            )
            .await
            .unwrap();
            let _leaving = start(&node, &ops);
            joined(&node).await;
            let listed = Instant::now();
            let started = until(20 * SEC, "db is started", || {
                let done = did(&ops, "start", listed).then(|| ops.span("db", "start").0);
                async move { done }
            })
            .await;
            let waited = started.saturating_duration_since(listed);
            assert!(
                waited >= 10 * SEC,
                "n2's 12 s bound is waited, not n1's own 6 s: {waited:?}"
            );
        });
    }

    /// A new cluster: nobody ever owned db, so its first candidate takes
    /// it as soon as it joined, not after its stop bound (35 s here); the
    /// take records the last owner with its boot.
    #[test]
    fn a_workload_nobody_ever_owned_is_taken_without_the_stop_bound() {
        on_etcd(|url| async move {
            let (_dir, node) = n1(&url, "");
            let ops = db_stopping_within(30_000_000);
            let began = Instant::now();
            let _leaving = start(&node, &ops);
            joined(&node).await;
            until(3 * SEC, "db is started within 3 s of the join", || {
                let done = did(&ops, "start", began);
                async move { done.then_some(()) }
            })
            .await;
            let mut c = client(&url).await;
            let (last, lease) = read(&mut c, &node.keys.last_owner("db")).await.unwrap();
            let last: crate::cluster::keys::LastOwner = serde_json::from_slice(&last).unwrap();
            assert_eq!(
                (
                    last.node.as_str(),
                    last.boot_id.as_str(),
                    last.stop_bound_s,
                    lease
                ),
                ("n1", "boot-a", 35, 0),
                "on no lease: it outlives the owner"
            );
        });
    }
}
