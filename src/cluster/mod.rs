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

pub mod admin;
pub mod adoption;
pub mod agent;
pub mod fence;
pub mod fence_watch;
pub mod join;
pub mod keys;
pub mod maintenance;
pub mod node;
pub mod owner;
pub mod ownership;
pub mod phases;
pub mod placement;
pub mod presence;
pub mod reconcile;
pub mod rejoin;
pub mod release;
pub mod session;
pub mod take;
pub mod view;
pub mod watchdog;

pub use agent::{Agent, start_agent};
pub use node::node_name;
