//! systemd over D-Bus, and nothing else talks to it.
//!
//! Every caller (autostart, drain, daemon, install, status, check --live)
//! goes through one trait, [`Ops`], so each can run against the fake
//! manager in unit tests; [`Systemd`] is the real one. Under it: typed
//! zbus proxies ([`proxies`]), one connection owner with a bound on calls
//! in flight ([`connection`]), the JobRemoved demultiplexer ([`jobs`]), the
//! drain's stops queued together in one transaction ([`together`]) and
//! the change stream the supervisor listens to ([`watch`]).
//!
//! berth uses the bus, never systemd's private socket: zbus 6 accepts
//! replies only from unique names, and systemd stamps its private-socket
//! replies with `org.freedesktop.systemd1`. The drain unit is ordered
//! `After=dbus.service`, so the bus outlives the drain at shutdown.

pub mod connection;
pub mod error;
#[cfg(test)]
pub mod fake;
mod jobs;
pub mod ops;
pub mod proxies;
mod together;
mod transient;
pub mod types;
mod watch;

pub use connection::{MAX_JOBS_IN_FLIGHT, Systemd};
pub use error::SystemdError;
pub use ops::Ops;
pub use types::{
    ActiveState, Change, ExitCode, Job, JobResult, JobType, LoadState, ServiceResult, UnitDetails,
    UnitFileState, UnitStatus, UnitTopology, WatchedPaths,
};

/// A current-thread runtime: berth's programs are sequential with a few
/// concurrent waits, and must stay small.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()
}
