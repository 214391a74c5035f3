//! The node: what every part of the agent knows of this host in the
//! cluster, built once when the daemon starts (or a test, or the scale
//! benchmark's simulated node) and shared by every phase.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::keys::{Keys, NodeState, Presence};
use super::session::LeaseState;
use crate::config::{ClusterSettings, Workload};
use crate::events::Events;
use crate::paths::Root;

pub struct Node {
    pub settings: ClusterSettings,
    pub name: String,
    pub boot_id: String,
    pub root: Root,
    pub keys: Keys,
    /// The node's HA workloads, as configured.
    pub workloads: Vec<Workload>,
    /// Each HA workload and a hash of its candidate list, as the presence
    /// publishes them.
    pub ha: BTreeMap<String, String>,
    /// Every workload configured here (object freezes apply to these).
    pub configured: BTreeSet<String>,
    /// The lease as the agent keeps it: its id, the fence deadline, the
    /// agent's pulse.
    pub lease: Arc<LeaseState>,
    /// The API's shared state: `/v1/cluster` and owner events.
    pub api: Option<Arc<crate::api::Shared>>,
    pub events: Events,
    /// When this daemon's agent began: a drain by hand that came later
    /// keeps holding starts back across its rejoins.
    pub started: std::time::SystemTime,
}

impl Node {
    /// `configured`: every workload configured here; `events`: where the
    /// node's process says what it does (the daemon's, the drain's).
    pub fn new(
        settings: ClusterSettings,
        name: String,
        boot_id: String,
        root: Root,
        configured: &[Workload],
        events: Events,
    ) -> Node {
        let workloads: Vec<Workload> = configured.iter().filter(|w| w.ha.is_some()).cloned().collect();
        Node {
            keys: Keys::new(&settings.prefix),
            settings,
            name,
            boot_id,
            root,
            ha: ha_hashes(configured),
            workloads,
            configured: configured.iter().map(|w| w.name.clone()).collect(),
            lease: Arc::new(LeaseState::default()),
            api: None,
            events,
            started: std::time::SystemTime::now(),
        }
    }

    /// Whether the node is frozen now (flag or command line): announced
    /// in its presence, so that no peer places an HA workload here.
    pub fn frozen_now(&self) -> bool {
        crate::state::freeze::node_frozen(&self.root).is_some()
    }

    /// The node's presence in `state` from now on.
    pub fn presence(&self, state: NodeState) -> Presence {
        super::presence::presence(
            state,
            &self.boot_id,
            self.ha.clone(),
            self.frozen_now(),
            self.watchdog_s(),
        )
    }

    /// The timeout of the watchdog this node declares, if any.
    pub fn watchdog_s(&self) -> Option<u64> {
        self.settings.watchdog.as_ref().map(|w| w.timeout_s)
    }

    /// The HA workload called `name`.
    pub fn workload(&self, name: &str) -> Option<&Workload> {
        self.workloads.iter().find(|w| w.name == name)
    }
}

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

/// The node's HA workloads and a hash of each one's candidate list, as
/// its presence publishes them.
pub fn ha_hashes(configured: &[Workload]) -> BTreeMap<String, String> {
    configured
        .iter()
        .filter_map(|w| Some((w.name.clone(), w.ha.as_ref()?.nodes_hash())))
        .collect()
}
