//! berth's state on disk, and the two primitives every writer shares.
//!
//! - [`records`]: one JSON record per workload (what happened to it, when,
//!   and why), under the workload's lock.
//! - [`freeze`]: node and instance freeze flags.
//! - [`drain_report`]: the last drain's report (`last-drain.json`).
//! - [`autostart_report`]: the last autostart's summary
//!   (`last-autostart.json`).
//! - [`runs`]: this run of the manager and the one before (`runs.json`).
//! - [`manifest`]: what `berth install` did (`install.json`).
//! - [`cluster`]: cluster mode's files: leases, fence deadline, rejoin
//!   mark, last adopted freeze revision.
//! - [`atomic`]: the one atomic replace (temporary file, fsync, rename,
//!   fsync of the directory) that all of the above write through.
//! - [`lock`]: the one lock primitive: a workload's lock and the daemon's
//!   single-instance lock.

pub mod atomic;
pub mod autostart_report;
pub mod cluster;
pub mod drain_report;
pub mod freeze;
pub mod lock;
pub mod manifest;
pub mod records;
pub mod runs;
