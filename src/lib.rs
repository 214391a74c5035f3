//! berth: workloads that outlive their control plane and drain on real
//! shutdown, encoded in systemd unit topology.
//!
//! Data flows `config` (load, merge, validate) → `plan` (pure ordering and
//! budgets) → `render` (unit text, the one escaper) → `generator` (writes
//! it). The `berth` binary's verbs live in `cli`.

pub mod api;
pub mod autostart;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod drain;
#[cfg(test)]
pub mod fake;
pub mod freeze;
pub mod generator;
pub mod install;
pub mod live;
pub mod log;
pub mod paths;
pub mod plan;
pub mod records;
pub mod render;
pub mod report;
pub mod status;
pub mod systemd;
pub mod units;
