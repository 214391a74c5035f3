//! Cluster mode (issue 13): several hosts share presence, maintenance,
//! freezes and HA ownership through etcd, an existing distributed engine
//! (no consensus, heartbeat or gossip of berth's own). Without `[cluster]`
//! in berth.toml nothing here runs.
//!
//! - [`keys`]: the key layout and the values stored under it (pure).
//! - [`presence`]: the node's lease, its keep-alives on a thread of their
//!   own, and the fence deadline they move.
//! - [`owner`]: the unit's own guard, `berth owner-check`: only the
//!   owner starts an HA workload.
//! - [`placement`]: who takes a workload nobody owns (pure).

pub mod keys;
pub mod owner;
pub mod placement;
pub mod presence;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::config::{ClusterSettings, Loaded};
use crate::events::Events;
use presence::{LeaseState, boottime};

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
pub fn start_agent(
    loaded: &Loaded,
    state_dir: PathBuf,
    boot_id: String,
    frozen: bool,
) -> Option<Arc<LeaseState>> {
    let settings = loaded.host.cluster.clone()?;
    let ha: BTreeMap<String, String> = loaded
        .workloads
        .iter()
        .filter_map(|w| Some((w.name.clone(), w.ha.as_ref()?.nodes_hash())))
        .collect();
    let state = Arc::new(LeaseState::default());
    state
        .progress_ms
        .store(boottime().as_millis() as u64, Ordering::Relaxed);
    let shared = state.clone();
    let spawned = std::thread::Builder::new()
        .name("berth-cluster".into())
        .spawn(move || {
            let events = Events::new("berth-daemon");
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(r) => r,
                Err(e) => return events.warn(&format!("cluster: cannot start the agent's runtime: {e}")),
            };
            runtime.block_on(agent(settings, ha, frozen, state_dir, boot_id, shared, events));
        });
    match spawned {
        Ok(_) => Some(state),
        Err(e) => {
            Events::new("berth-daemon").warn(&format!("cluster: cannot start the agent's thread: {e}"));
            None
        }
    }
}

async fn agent(
    settings: ClusterSettings,
    ha: BTreeMap<String, String>,
    frozen: bool,
    state_dir: PathBuf,
    boot_id: String,
    state: Arc<LeaseState>,
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
    let node = match node_name(&settings) {
        Ok(n) => n,
        Err(e) => return events.warn(&format!("cluster: {e}; this node stays out of the cluster")),
    };
    let interval = settings.keep_alive_interval();
    let mut said = false;
    let (client, joined) = loop {
        let attempt = async {
            let mut client = presence::connect(&settings).await?;
            let joined = presence::join(
                &mut client,
                &settings,
                &node,
                &boot_id,
                &state_dir,
                ha.clone(),
                frozen,
            )
            .await?;
            Ok::<_, presence::ClusterError>((client, joined))
        };
        match attempt.await {
            Ok(done) => break done,
            Err(e) => {
                if !said {
                    events.warn(&format!("cluster: cannot join as {node} yet ({e}); trying again"));
                    said = true;
                }
                tokio::time::sleep(interval).await;
            }
        }
    };
    events.info(&format!(
        "cluster: joined as {node} at {}, lease {:x} ({}, TTL {} s)",
        settings.endpoints.join(" "),
        joined.lease_id,
        if joined.resumed {
            "resumed: same boot"
        } else {
            "new"
        },
        joined.granted_ttl_s
    ));
    presence::keep_alive(client, settings, joined.lease_id, state).await;
}
