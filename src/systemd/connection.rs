//! The one connection to the manager: connect (bus only), the proxies,
//! and the bound on calls in flight that every call goes through.

use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{Semaphore, oneshot};
use zbus::Connection;
use zbus::proxy::CacheProperties;

use super::error::SystemdError;
use super::jobs::Jobs;
use super::proxies::{ManagerProxy, UnitPropertiesProxy};
use super::types::JobResult;
use crate::paths::Manager;

/// Method calls in flight at once; well under dbus-daemon's 128 pending
/// replies per connection (LimitsExceeded, seen with a drain of 200).
/// Stop and start jobs run in parallel regardless: a call returns as soon
/// as the job is queued.
const MAX_PENDING_CALLS: usize = 64;
/// Jobs this connection has queued and systemd has not finished, at once.
/// systemd tracks the sender of every job queued over the bus with a
/// match rule on its own bus connection, and dbus-daemon allows 512 per
/// connection. Past that (measured: an autostart or a drain of 2000
/// workloads on systemd 252) PID 1's AddMatch fails and systemd drops
/// its bus connection ("Got disconnect on API bus"): calls in flight
/// fail and JobRemoved signals are lost. Half of it is berth's, the rest
/// stays for PID 1's own rules and other clients. systemctl, as root,
/// uses systemd's private socket, where jobs are not tracked that way;
/// zbus cannot talk to it (systemd sends its well-known name as the
/// sender there, which zbus rejects as a unique name).
pub const MAX_JOBS_IN_FLIGHT: usize = 256;
/// No call may hang a shutdown: systemd answers in milliseconds, so a
/// reply later than this means the bus or the manager is gone. Well under
/// the drain unit's 30 s margin.
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// Signals queued per stream before zbus stops reading the socket; the
/// readers never block, so this only absorbs bursts (a drain of 200 ends
/// 200 jobs at once).
const SIGNAL_QUEUE: NonZeroUsize = NonZeroUsize::new(1024).unwrap();

/// A live connection to the service manager.
#[derive(Clone)]
pub struct Systemd {
    pub(super) conn: Connection,
    pub(super) manager: ManagerProxy<'static>,
    calls: Arc<Semaphore>,
    /// A permit per job queued and not yet finished: see
    /// [`MAX_JOBS_IN_FLIGHT`]. Each is handed to [`Jobs`] with its job and
    /// dropped when the job's JobRemoved arrives.
    job_slots: Arc<Semaphore>,
    pub(super) jobs: Arc<Mutex<Jobs>>,
    /// Set on a connection whose stops are queued together.
    pub(super) together: Option<Arc<Together>>,
}

impl Systemd {
    /// Connects to `manager`'s bus: the system bus, or the user bus
    /// (`$DBUS_SESSION_BUS_ADDRESS`, else `$XDG_RUNTIME_DIR/bus`).
    pub async fn connect(manager: Manager) -> Result<Systemd, SystemdError> {
        match tokio::time::timeout(CONNECT_TIMEOUT, Self::connect_inner(manager)).await {
            Ok(result) => result,
            Err(_) => Err(SystemdError::local(
                "connect to",
                "systemd",
                format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()),
            )),
        }
    }

    async fn connect_inner(manager: Manager) -> Result<Systemd, SystemdError> {
        let (builder, bus) = match manager {
            Manager::System => (zbus::connection::Builder::system(), "system bus"),
            Manager::User => (user_bus(), "user bus"),
        };
        let conn = builder
            .method_timeout(CALL_TIMEOUT)
            .max_queued(SIGNAL_QUEUE)
            .build()
            .await
            .map_err(|e| SystemdError::new("connect to", bus, e))?;
        let manager = ManagerProxy::builder(&conn)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| SystemdError::new("connect to", "the manager", e))?;
        // The stream exists, and Subscribe is called, before any job is
        // queued: no JobRemoved can be missed.
        let removed = manager
            .receive_job_removed()
            .await
            .map_err(|e| SystemdError::new("listen for", "JobRemoved", e))?;
        let jobs = Arc::new(Mutex::new(Jobs::default()));
        tokio::spawn(read_job_signals(removed, jobs.clone()));
        let systemd = Systemd {
            conn,
            manager,
            calls: Arc::new(Semaphore::new(MAX_PENDING_CALLS)),
            job_slots: Arc::new(Semaphore::new(MAX_JOBS_IN_FLIGHT)),
            jobs,
            together: None,
        };
        systemd
            .bounded("Subscribe", "the manager", systemd.manager.subscribe())
            .await?;
        Ok(systemd)
    }

    /// Runs one proxy call under the bound on calls in flight. The call's
    /// future sends nothing until polled, so creating it first is free.
    pub(super) async fn bounded<T>(
        &self,
        operation: &'static str,
        unit: &str,
        call: impl Future<Output = zbus::Result<T>>,
    ) -> Result<T, SystemdError> {
        let _permit = self
            .calls
            .acquire()
            .await
            .map_err(|_| SystemdError::local(operation, unit, "the connection is closing"))?;
        call.await.map_err(|e| SystemdError::new(operation, unit, e))
    }

    /// Queues a job with `call` (StartUnit, StopUnit) once fewer than
    /// [`MAX_JOBS_IN_FLIGHT`] of this connection's jobs are unfinished;
    /// the job holds its slot until systemd says it finished.
    pub(super) async fn queue_job(
        &self,
        operation: &'static str,
        unit: &str,
        call: impl Future<Output = zbus::Result<zbus::OwnedObjectPath>>,
    ) -> Result<String, SystemdError> {
        let slot = self
            .job_slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| SystemdError::local(operation, unit, "the connection is closing"))?;
        let path = self.bounded(operation, unit, call).await?.as_str().to_string();
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.hold(&path, slot);
        }
        Ok(path)
    }

    /// The properties proxy of one unit, by its object path.
    pub(super) async fn unit_properties(
        &self,
        unit: &str,
    ) -> Result<UnitPropertiesProxy<'static>, SystemdError> {
        let path = self
            .bounded("LoadUnit", unit, self.manager.load_unit(unit))
            .await?;
        UnitPropertiesProxy::builder(&self.conn)
            .path(path)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| SystemdError::new("LoadUnit", unit, e))
    }
}

/// The stops waiting for the next batch (see `together`), and whether a task is sending
/// batches (at most one: batches go one after the other).
#[derive(Default)]
pub(super) struct Together {
    pub(super) state: Mutex<Waiting>,
    pub(super) batches: AtomicU64,
}

#[derive(Default)]
pub(super) struct Waiting {
    pub(super) stops: Vec<(String, oneshot::Sender<Result<String, SystemdError>>)>,
    pub(super) sending: bool,
}

async fn read_job_signals(mut removed: super::proxies::JobRemovedStream, jobs: Arc<Mutex<Jobs>>) {
    while let Some(signal) = removed.next().await {
        let Ok(args) = signal.args() else { continue };
        let path = args.job.as_str().to_string();
        let result = JobResult::from(args.result.as_str());
        if let Ok(mut jobs) = jobs.lock() {
            jobs.removed(args.id, path, &args.unit, result);
        }
    }
    if let Ok(mut jobs) = jobs.lock() {
        jobs.close();
    }
}

/// The user bus: `$DBUS_SESSION_BUS_ADDRESS`, else the socket systemd's
/// dbus.socket (dbus-user-session) listens on.
fn user_bus() -> zbus::connection::Builder<'static> {
    let runtime_dir = std::env::var_os("XDG_RUNTIME_DIR").map(std::path::PathBuf::from);
    match (std::env::var_os("DBUS_SESSION_BUS_ADDRESS"), runtime_dir) {
        (None, Some(dir)) => {
            zbus::connection::Builder::address(format!("unix:path={}/bus", dir.display()).as_str())
        }
        _ => zbus::connection::Builder::session(),
    }
}
