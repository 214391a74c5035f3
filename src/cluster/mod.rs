//! Cluster mode (issue 13): several hosts share presence, maintenance,
//! freezes and HA ownership through etcd, an existing distributed engine
//! (no consensus, heartbeat or gossip of berth's own). Without `[cluster]`
//! in berth.toml nothing here runs.
//!
//! - [`phases`]: the agent's life, phase by phase (join, adopt, grace,
//!   take ∥ keep-alive, depart), with its diagram; [`agent`]: the
//!   daemon's handle on it, on a thread of its own.
//! - [`node`]: what every phase knows of this host, built once.
//! - [`keys`]: the key layout and the values stored under it (pure).
//! - [`session`]: the connection to etcd, its errors and call bound, and
//!   the one keep-alive loop, which moves the fence deadline.
//! - [`presence`]: the node's lease and the keys bound to it;
//!   [`join`]: the join, which takes back a maintenance's keys.
//! - [`owner`]: the unit's own guard, `berth owner-check`: only the
//!   owner starts an HA workload.
//! - [`placement`]: who takes a workload nobody owns (pure).
//! - [`ownership`]: what the node saw of owners and presences, and what it
//!   is to take now (pure); [`take`]: the loop that watches and takes;
//!   [`reconcile`]: what is owned here runs here, and what runs here is
//!   owned here, looked at again and again.
//! - [`fence`]: stops the HA workloads when the lease deadline passes,
//!   starts them again once the owner key is confirmed;
//!   [`fence_watch`]: its backstop, a process of its own that needs
//!   nothing from the daemon but the deadline file.
//! - [`maintenance`]: a daemon stopped or restarted on purpose hands its
//!   keys to a lease of the grace period, and takes them back at its join.
//! - [`release`]: the drain's companion: announce, release, keep the
//!   lease, fence at its deadline.
//! - [`rejoin`]: after a boot, nothing is taken until every missing peer
//!   is heard or the rejoin grace passes (then the node freezes).
//! - [`adoption`]: cluster and object freezes become this node's.
//! - [`watchdog`]: when a hardware watchdog may be petted (pure): only
//!   while no HA workload can outlive the lease here.
//! - [`view`]: peers, states, lease ages, owners and the fence deadline,
//!   for `berth status`, `berth list` and `/v1/cluster`.

// Without the `cluster` feature only the pure parts are built (the key
// layout, placement, the fence's and the watchdog's decisions): nothing
// that talks to etcd, so neither etcd-client nor protoc is needed.
pub mod fence_watch;
pub mod keys;
pub mod ownership;
pub mod placement;
pub mod watchdog;

/// The modules that talk to etcd: built with the `cluster` feature only.
macro_rules! with_etcd {
    ($($module:ident),* $(,)?) => {
        $(
            #[cfg(feature = "cluster")]
            pub mod $module;
        )*
    };
}

with_etcd!(
    admin,
    adoption,
    agent,
    fence,
    join,
    maintenance,
    node,
    owner,
    phases,
    presence,
    reconcile,
    rejoin,
    release,
    session,
    take,
    view,
);

#[cfg(not(feature = "cluster"))]
pub use absent::{Agent, start_agent};
#[cfg(feature = "cluster")]
pub use agent::{Agent, start_agent};
#[cfg(feature = "cluster")]
pub use node::node_name;

/// A build without cluster mode: the config refuses `[cluster]`, so no
/// agent ever starts, and the daemon's handle on one has no value.
#[cfg(not(feature = "cluster"))]
mod absent {
    use std::sync::Arc;
    use std::time::Duration;

    pub enum Agent {}

    impl Agent {
        pub fn alive(&self, _within: Duration) -> bool {
            match *self {}
        }

        pub fn hand_over(&self, _limit: Duration) -> String {
            match *self {}
        }
    }

    pub fn start_agent(
        _root: &crate::paths::Root,
        _loaded: &crate::config::Loaded,
        _boot_id: String,
        _api: Option<Arc<crate::api::Shared>>,
    ) -> Option<Agent> {
        None
    }
}
