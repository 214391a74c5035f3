//! Cluster mode (issue 13): several hosts share presence, maintenance,
//! freezes and HA ownership through etcd, an existing distributed engine
//! (no consensus, heartbeat or gossip of berth's own). Without `[cluster]`
//! in berth.toml nothing here runs.
//!
//! - [`keys`]: the key layout and the values stored under it (pure).
//! - [`session`]: the connection to etcd, its errors and call timeout,
//!   and the one keep-alive loop, which moves the fence deadline.
//! - [`presence`]: the node's lease and the keys bound to it;
//!   [`join`]: the join, which takes back a maintenance's keys.
//! - [`owner`]: the unit's own guard, `berth owner-check`: only the
//!   owner starts an HA workload.
//! - [`placement`]: who takes a workload nobody owns (pure).
//! - [`ownership`]: what the node saw of owners and presences, and what it
//!   is to take now (pure); [`take`]: the loop that watches and takes.
//! - [`fence`]: stops the HA workloads when the lease deadline passes,
//!   starts them again once the owner key is confirmed.
//! - [`maintenance`]: a daemon stopped or restarted on purpose hands its
//!   keys to a lease of the grace period, and takes them back at its join.
//! - [`release`]: the drain's part: announce, release, keep the lease.
//! - [`rejoin`]: after a boot, nothing is taken until every missing peer
//!   is heard or the rejoin grace passes (then the node freezes).
//! - [`adoption`]: cluster and object freezes become this node's.
//! - [`view`]: peers, states, lease ages, owners and the fence deadline,
//!   for `berth status`, `berth list` and `/v1/cluster`.

pub mod admin;
pub mod adoption;
pub mod fence;
pub mod join;
pub mod keys;
pub mod maintenance;
pub mod owner;
pub mod ownership;
pub mod placement;
pub mod presence;
pub mod rejoin;
pub mod release;
pub mod session;
pub mod take;
pub mod view;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::config::{ClusterSettings, Loaded, Workload};
use crate::events::Events;
use crate::paths::Root;
use session::{LeaseState, boottime};

/// This node's name: `[cluster] node`, else the hostname (which must then
/// be a valid node name).
pub fn node_name(settings: &ClusterSettings) -> Result<String, String> {
    if let Some(n) = &settings.node {
        return Ok(n.clone());
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_err(|e| format!("cannot read the hostname: {e}; set [cluster] node"))?;
    let host = host.trim().to_string();
    crate::config::cluster::check_node_name(&host).map_err(|why| {
        format!(
            "the hostname {:?} {why}; set [cluster] node",
            host.escape_debug().to_string()
        )
    })?;
    Ok(host)
}

/// The daemon's cluster agent: on a thread and a runtime of its own, so
/// that keep-alives never wait behind the supervisor's D-Bus calls or
/// disk writes. It joins (retrying while etcd cannot be reached), then
/// keeps the lease alive. What it shares tells the fence deadline and
/// whether the thread still runs (the daemon's watchdog depends on it).
/// The daemon's handle on its agent.
pub struct Agent {
    /// The lease deadline and the thread's pulse (the watchdog's gate).
    pub state: Arc<LeaseState>,
    leave: tokio::sync::mpsc::UnboundedSender<std::sync::mpsc::Sender<String>>,
}

impl Agent {
    /// The daemon is leaving (a stop, a restart, a relaunch): the agent
    /// stops keeping the live lease and hands the node's keys to a
    /// maintenance lease, unless the host is shutting down. Waits at most
    /// `limit`; what happened, for the journal.
    pub fn hand_over(&self, limit: Duration) -> String {
        let (tell, told) = std::sync::mpsc::channel();
        if self.leave.send(tell).is_err() {
            return "the agent's thread is gone; nothing handed over".into();
        }
        told.recv_timeout(limit).unwrap_or_else(|_| {
            format!(
                "no maintenance hand-over within {} s: the fence keeps the live lease's deadline",
                limit.as_secs()
            )
        })
    }
}

pub fn start_agent(
    root: &Root,
    loaded: &Loaded,
    boot_id: String,
    api: Option<Arc<crate::api::Shared>>,
) -> Option<Agent> {
    let settings = loaded.host.cluster.clone()?;
    let ha = ha_hashes(loaded);
    let events = Events::new("berth-daemon");
    // The first daemon of a boot rejoins (a restart within the boot finds
    // the rejoin done).
    let rejoin = rejoin::pending(&root.runtime_dir(), &boot_id);
    // A boot with berth.freeze on the command line: the node's own freeze,
    // kept past this boot (peers must not see it thaw by a mere reboot);
    // written once per boot, so that `berth thaw` lifts it for the next.
    if rejoin && crate::state::freeze::cmdline_freeze(&crate::state::freeze::kernel_command_line()) {
        let reason = crate::state::freeze::KERNEL_CMDLINE;
        match crate::state::freeze::freeze_unless_own(root, None, reason) {
            Ok(Some(_)) => events.info(
                "cluster: berth.freeze is on the kernel command line: local node has been frozen (reason kernel-cmdline)",
            ),
            Ok(None) => {}
            Err(e) => events.warn(&format!(
                "cluster: cannot write the node freeze for berth.freeze: {e}"
            )),
        }
    }
    let configured = loaded.workloads.iter().map(|w| w.name.clone()).collect();
    let workloads: Vec<Workload> = loaded
        .workloads
        .iter()
        .filter(|w| w.ha.is_some())
        .cloned()
        .collect();
    let root = root.clone();
    let state = Arc::new(LeaseState::default());
    // A deadline a previous daemon of this boot saw holds until this one
    // joins: the fence below keeps it.
    if let Some(d) = fence::read_deadline(&root.runtime_dir()) {
        state.set_deadline(d);
    }
    state
        .progress_ms
        .store(boottime().as_millis() as u64, Ordering::Relaxed);
    let shared = state.clone();
    let (leave, leaving) = tokio::sync::mpsc::unbounded_channel();
    let spawned = std::thread::Builder::new()
        .name("berth-cluster".into())
        .spawn(move || {
            let events = Events::new("berth-daemon");
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(r) => r,
                Err(e) => return events.warn(&format!("cluster: cannot start the agent's runtime: {e}")),
            };
            let joining = Joining {
                settings,
                ha,
                boot_id,
                api,
                configured,
            };
            runtime.block_on(agent(joining, root, workloads, shared, leaving, events));
        });
    match spawned {
        Ok(_) => Some(Agent { state, leave }),
        Err(e) => {
            Events::new("berth-daemon").warn(&format!("cluster: cannot start the agent's thread: {e}"));
            None
        }
    }
}

/// A systemd connection for one of the agent's tasks, tried again every
/// `every` until it comes (said each time: the task is idle meanwhile).
pub(crate) async fn systemd_for(
    root: &Root,
    events: &Events,
    task: &str,
    every: Duration,
) -> crate::systemd::Systemd {
    loop {
        match crate::systemd::Systemd::connect(root.manager()).await {
            Ok(sd) => return sd,
            Err(e) => {
                events.warn(&format!(
                    "cluster: {task} cannot reach systemd ({e}); trying again"
                ));
                tokio::time::sleep(every).await;
            }
        }
    }
}

/// The node's HA workloads and a hash of each one's candidate list, as
/// its presence publishes them.
pub fn ha_hashes(loaded: &Loaded) -> BTreeMap<String, String> {
    loaded
        .workloads
        .iter()
        .filter_map(|w| Some((w.name.clone(), w.ha.as_ref()?.nodes_hash())))
        .collect()
}

/// What a join needs.
struct Joining {
    settings: ClusterSettings,
    ha: BTreeMap<String, String>,
    boot_id: String,
    /// The API's shared state: `/v1/cluster` and owner events.
    api: Option<Arc<crate::api::Shared>>,
    /// Every workload configured here (object freezes apply to these).
    configured: std::collections::BTreeSet<String>,
}

/// Whether the node is frozen now (flag or command line): announced in
/// its presence, so that no peer places an HA workload here.
pub(crate) fn frozen_now(root: &Root) -> bool {
    crate::state::freeze::node_frozen(root).is_some()
}

async fn agent(
    joining: Joining,
    root: Root,
    workloads: Vec<Workload>,
    state: Arc<LeaseState>,
    mut leaving: tokio::sync::mpsc::UnboundedReceiver<std::sync::mpsc::Sender<String>>,
    events: Events,
) {
    // The thread's pulse: it stops only when the thread does.
    let pulse_state = state.clone();
    tokio::spawn(async move {
        loop {
            pulse_state
                .progress_ms
                .store(boottime().as_millis() as u64, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let settings = &joining.settings;
    // The fence needs nothing from etcd: it runs from the start.
    tokio::spawn(fence::run(fence::Context {
        settings: settings.clone(),
        root: root.clone(),
        workloads: workloads.clone(),
        state: state.clone(),
        events: Events::new("berth-daemon"),
    }));
    let node = match node_name(settings) {
        Ok(n) => n,
        Err(e) => {
            events.warn(&format!("cluster: {e}; this node stays out of the cluster"));
            while let Some(tell) = leaving.recv().await {
                let _ = tell.send("this node is not in the cluster; nothing handed over".into());
            }
            return;
        }
    };
    if let Some(api) = &joining.api {
        view::start_keeping(settings.clone(), node.clone(), root.runtime_dir(), api.clone());
    }
    // Until the daemon leaves: then keep-alives and taking stop, and the
    // keys go to the maintenance lease.
    tokio::select! {
        _ = membership(&joining, &node, &root, &workloads, &state, &events) => {}
        Some(tell) = leaving.recv() => {
            let said = depart(&joining, &node, &root, &state).await;
            let _ = tell.send(said);
            // The process ends; nothing more is done here.
            std::future::pending::<()>().await;
        }
    }
}

/// Joins, keeps the lease and takes workloads, joining again whenever the
/// lease is lost; never ends by itself.
async fn membership(
    joining: &Joining,
    node: &str,
    root: &Root,
    workloads: &[Workload],
    state: &Arc<LeaseState>,
    events: &Events,
) {
    let settings = &joining.settings;
    let node = node.to_string();
    let mut first = true;
    let mut first_contact = None;
    loop {
        let (client, joined) = join_until_joined(joining, &node, root, state, events).await;
        // The grace counts from the first contact, over every join until
        // it is over (a lease lost during it does not skip it).
        let contact = *first_contact.get_or_insert_with(tokio::time::Instant::now);
        let rejoin = rejoin::pending(&root.runtime_dir(), &joining.boot_id);
        let when = match std::mem::replace(&mut first, false) {
            true => adoption::When::WhileDown,
            false => adoption::When::Now,
        };
        state.lease.store(joined.lease_id, Ordering::Relaxed);
        state.set_deadline(joined.deadline);
        // At once, not at the fence's next look: `berth owner-check`
        // refuses starts past the deadline it finds there.
        fence::write_deadline(&root.runtime_dir(), joined.deadline);
        events.info(&format!(
            "cluster: joined as {node} at {}, lease {:x} ({}, TTL {} s){}",
            settings.endpoints.join(" "),
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
        let taking = take::Context {
            settings: settings.clone(),
            node: node.clone(),
            root: root.clone(),
            workloads: workloads.to_vec(),
            state: state.clone(),
            events: Events::new("berth-daemon"),
            api: joining.api.clone(),
            boot_id: joining.boot_id.clone(),
            ha: joining.ha.clone(),
            announced_frozen: joined.frozen,
            announced_waiting: joining.ha.keys().cloned().collect(),
        };
        let adopting = adoption::Context {
            settings: settings.clone(),
            root: root.clone(),
            configured: joining.configured.clone(),
            events: Events::new("berth-daemon"),
            api: joining.api.clone(),
        };
        // Freezes first (taken while this daemon was down), then, after a
        // boot, the rejoin grace; then taking, and freezes as they come.
        let orchestrate = async {
            let mut c = client.clone();
            let from = adoption::first(&mut c, &adopting, when).await;
            let taking_part = async {
                if rejoin {
                    let missing = rejoin::grace(&mut c, settings, &node, contact, events).await;
                    if !missing.is_empty() {
                        rejoin_expired(root, settings, &missing, events);
                    }
                    if let Err(e) = rejoin::done(&root.runtime_dir(), &joining.boot_id) {
                        events.warn(&format!(
                            "cluster: cannot mark this boot's rejoin as done ({e}): the next daemon of this boot waits the grace again"
                        ));
                    }
                }
                take::run(client.clone(), taking, joined.lease_id).await
            };
            // Freezes are followed during the grace too.
            tokio::join!(adoption::watch(client.clone(), adopting, from), taking_part);
        };
        // The ownership loop never ends by itself: when the lease is lost
        // (expired, or etcd silent for a TTL), both go, and the node joins
        // again on a new connection (resuming the lease if it is alive).
        let lost = tokio::select! {
            lost = session::keep_alive(client.clone(), settings.clone(), joined.lease_id, state.clone()) => lost,
            _ = orchestrate => continue,
        };
        events.warn(&match lost {
            session::LeaseLost::Expired => format!(
                "cluster: lease {:x} expired: joining again with a new one",
                joined.lease_id
            ),
            session::LeaseLost::Silent => format!(
                "cluster: no answer from etcd for a whole TTL on lease {:x}: joining again",
                joined.lease_id
            ),
        });
    }
}

/// The rejoin grace passed with peers unheard: the node freezes itself
/// (unless it is frozen already), saying which.
fn rejoin_expired(root: &Root, settings: &ClusterSettings, missing: &[String], events: &Events) {
    use crate::state::freeze;
    let peers = missing.join(" ");
    let grace = settings.rejoin_grace_period_s;
    match freeze::freeze_unless_own(root, None, freeze::REJOIN_GRACE_EXPIRED) {
        Ok(Some(_)) => events.warn(&format!(
            "cluster: rejoin grace of {grace} s passed with peer(s) {peers} not heard (member, last state up or maintenance, no node key): local node has been frozen (reason {}); berth thaw lifts it, berth cluster forget removes a peer gone for good",
            freeze::REJOIN_GRACE_EXPIRED
        )),
        Ok(None) => events.warn(&format!(
            "cluster: rejoin grace of {grace} s passed with peer(s) {peers} not heard; the node has a freeze of its own already, which stays"
        )),
        Err(e) => events.warn(&format!(
            "cluster: rejoin grace of {grace} s passed with peer(s) {peers} not heard, and the node freeze cannot be written: {e}"
        )),
    }
}

/// The daemon leaves: unless the host is shutting down, the node's keys
/// go to a maintenance lease; the fence keeps the deadline that still
/// holds a key. What happened, for the journal.
async fn depart(joining: &Joining, node: &str, root: &Root, state: &LeaseState) -> String {
    use crate::systemd::Ops;
    const STEP: Duration = Duration::from_secs(5);
    let stopping = async {
        let sd = crate::systemd::Systemd::connect(root.manager()).await.ok()?;
        sd.system_state().await.ok()
    };
    if tokio::time::timeout(STEP, stopping)
        .await
        .ok()
        .flatten()
        .as_deref()
        == Some("stopping")
    {
        return "the host is shutting down: the drain speaks for this node".into();
    }
    let live = state.lease_id();
    if live == 0 {
        return "not joined: nothing to hand over".into();
    }
    let settings = &joining.settings;
    let handed = async {
        let mut client = session::connect(settings).await?;
        maintenance::hand_over(
            &mut client,
            maintenance::Leaving {
                settings,
                node,
                boot_id: &joining.boot_id,
                state_dir: &root.state_dir(),
                live_lease: live,
                live_deadline: state.deadline(),
                presence: presence::presence(
                    keys::NodeState::Maintenance,
                    &joining.boot_id,
                    joining.ha.clone(),
                    frozen_now(root),
                ),
            },
        )
        .await
    };
    match tokio::time::timeout(2 * STEP, handed).await {
        Ok(Ok(h)) => {
            if let Some(d) = h.deadline {
                state.set_deadline(d);
                fence::write_deadline(&root.runtime_dir(), d);
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
                h.moved, h.maintenance_lease, settings.maintenance_grace_period_s
            )
        }
        Ok(Err(e)) => {
            format!("maintenance hand-over failed ({e}): the fence keeps the live lease's deadline")
        }
        Err(_) => {
            "etcd did not answer the maintenance hand-over: the fence keeps the live lease's deadline".into()
        }
    }
}

/// Joins, trying again every keep-alive interval while etcd cannot be
/// reached; says so once.
async fn join_until_joined(
    joining: &Joining,
    node: &str,
    root: &Root,
    state: &LeaseState,
    events: &Events,
) -> (etcd_client::Client, join::Joined) {
    let settings = &joining.settings;
    let mut said = false;
    loop {
        let attempt = async {
            let mut client = session::connect(settings).await?;
            let lease =
                presence::take_lease(&mut client, settings, &joining.boot_id, &root.state_dir()).await?;
            // A lease resumed with no hand-over pending (a crash, not a
            // stop): the owner keys on it are still this node's, and the
            // fence (and the timer the previous daemon armed) stands down
            // now, not after the join's writes. Keys on a maintenance
            // lease come back only with the join's take-back.
            if lease.resumed && maintenance::maintenance_lease(&root.state_dir(), &joining.boot_id).is_none()
            {
                state.lease.store(lease.id, Ordering::Relaxed);
                state.set_deadline(lease.deadline);
            }
            let joined = join::join_on(
                &mut client,
                settings,
                node,
                &joining.boot_id,
                &root.state_dir(),
                joining.ha.clone(),
                frozen_now(root),
                lease,
            )
            .await?;
            Ok::<_, session::ClusterError>((client, joined))
        };
        match attempt.await {
            Ok(done) => return done,
            Err(e) => {
                if !said {
                    events.warn(&format!("cluster: cannot join as {node} yet ({e}); trying again"));
                    said = true;
                }
                tokio::time::sleep(settings.keep_alive_interval()).await;
            }
        }
    }
}
