//! berth: workloads that outlive their control plane and drain on real
//! shutdown, encoded in systemd unit topology.
//!
//! Data flows `config` (load, merge, validate) → `plan` (pure ordering and
//! budgets) → `render` (the drop-ins' text) → `generator` (writes it);
//! `unit_text`, the one escaper, lies below them all. The helpers
//! (`autostart`, `drain`, `install`, `live`, `status`), the supervisor
//! (`daemon`, `api`) and the cluster agent (`cluster`) reach systemd only
//! through `systemd::Ops` and keep their state through `state`. Cluster
//! mode joins a drain through `drain::Companion` and stops through
//! `drain::stop_at_once`, nothing else of the drain's. The `berth`
//! binary's verbs live in `cli`, one file per verb family.

mod macros;

pub mod api;
pub mod autostart;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod daemon;
pub mod drain;
pub mod events;
pub mod generator;
pub mod install;
pub mod libvirt;
pub mod live;
pub mod log;
pub mod manage;
pub mod names;
pub mod paths;
pub mod plan;
pub mod render;
pub mod state;
pub mod status;
pub mod systemd;
#[cfg(test)]
pub(crate) mod testing;
pub mod time;
pub mod unit_text;
pub mod units;
