//! systemd over D-Bus: the one place that owns the connection, its signal
//! stream and the job waits.
//!
//! - As root, try systemd's private socket first (peer-to-peer; it keeps
//!   answering while dbus-daemon stops during a shutdown), then the system
//!   bus; see [`Systemd::connect`] for why the bus is what answers today.
//! - One task owns the JobRemoved stream and never blocks: a signal queue
//!   that nobody polls fills up and stalls every later call on the
//!   connection. Waiters register by job path; a job that finishes before
//!   its waiter registers is kept in a short cache, so no JobRemoved is
//!   missed. The stream exists and `Subscribe` is called before any job is
//!   queued.
//! - Calls are hand-written, typed, for just the methods berth uses (the
//!   reference XML dumped from systemd 252 is in `dbus/`). Not `#[proxy]`
//!   traits: a zbus proxy insists on a destination name, and the
//!   peer-to-peer private socket has no bus to route one.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::paths::Manager;
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use tokio::sync::oneshot;
use zbus::{Connection, MatchRule, MessageStream, OwnedObjectPath, OwnedVariant};

const SYSTEMD: &str = "org.freedesktop.systemd1";
const PRIVATE_SOCKET: &str = "/run/systemd/private";
/// Method calls in flight at once; well under dbus-daemon's 128 pending
/// replies per connection. Stop and start jobs run in parallel regardless:
/// a call returns as soon as the job is queued.
const MAX_PENDING_CALLS: usize = 64;
/// No call may hang a shutdown: systemd answers in milliseconds, so a
/// reply later than this means the bus or the manager is gone. Well under
/// the drain unit's 30 s margin.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";

/// One row of ListUnitsByPatterns.
type UnitRow = (
    String,
    String,
    String,
    String,
    String,
    String,
    OwnedObjectPath,
    u32,
    String,
    OwnedObjectPath,
);

/// A failed call, with the D-Bus error name and the unit it was about.
#[derive(Debug, Clone)]
pub struct SystemdError {
    pub operation: &'static str,
    pub unit: String,
    /// e.g. `org.freedesktop.systemd1.NoSuchUnit`; empty for transport errors.
    pub error_name: String,
    pub message: String,
}

impl fmt::Display for SystemdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if self.error_name.is_empty() {
            "transport"
        } else {
            &self.error_name
        };
        write!(f, "{} {}: {} ({})", self.operation, self.unit, self.message, name)
    }
}

impl std::error::Error for SystemdError {}

impl SystemdError {
    /// The job or the unit's processes were already gone: what the call
    /// wanted had happened.
    pub fn is_gone(&self) -> bool {
        matches!(
            self.error_name.as_str(),
            "org.freedesktop.systemd1.NoSuchJob" | "org.freedesktop.systemd1.NoSuchProcess"
        )
    }
}

impl SystemdError {
    /// Worth another try: the call timed out or the connection broke (a
    /// bus restarting, a manager busy reloading), as opposed to an answer
    /// that says no (access denied, no such unit, …).
    pub fn is_transient(&self) -> bool {
        self.error_name.is_empty()
            || matches!(
                self.error_name.as_str(),
                "org.freedesktop.DBus.Error.NoReply"
                    | "org.freedesktop.DBus.Error.Timeout"
                    | "org.freedesktop.DBus.Error.TimedOut"
                    | "org.freedesktop.DBus.Error.Disconnected"
                    | "org.freedesktop.DBus.Error.LimitsExceeded"
            )
    }
}

fn error(operation: &'static str, unit: &str, e: zbus::Error) -> SystemdError {
    let (error_name, message) = match &e {
        zbus::Error::MethodError(name, detail, _) => (name.to_string(), detail.clone().unwrap_or_default()),
        zbus::Error::FDO(fdo) => (zbus::DBusError::name(fdo.as_ref()).to_string(), fdo.to_string()),
        other => (String::new(), other.to_string()),
    };
    SystemdError {
        operation,
        unit: unit.to_string(),
        error_name,
        message,
    }
}

/// How a job ended (the JobRemoved `result`): done, canceled, timeout,
/// failed, dependency, skipped; `disconnected` if the connection closed.
pub type JobResult = String;

enum Slot {
    Waiting(oneshot::Sender<JobResult>),
    Done(JobResult),
}

/// Job results by job path, filled by the signal task.
#[derive(Default)]
struct Jobs {
    slots: HashMap<String, Slot>,
    /// Finished jobs nobody waited for yet, oldest first, for eviction.
    done_order: VecDeque<String>,
    closed: bool,
}

/// Finished jobs kept for waiters that register late; other clients' jobs
/// arrive here too, so the cache is bounded.
const DONE_CACHE: usize = 4096;

impl Jobs {
    fn complete(&mut self, path: String, result: JobResult) {
        let result = match self.slots.remove(&path) {
            // A waiter that gave up (timed out) dropped its receiver: keep
            // the result for the next wait on the same job.
            Some(Slot::Waiting(tx)) => match tx.send(result) {
                Ok(()) => return,
                Err(result) => result,
            },
            _ => result,
        };
        self.slots.insert(path.clone(), Slot::Done(result));
        self.done_order.push_back(path);
        while self.done_order.len() > DONE_CACHE {
            if let Some(old) = self.done_order.pop_front()
                && matches!(self.slots.get(&old), Some(Slot::Done(_)))
            {
                self.slots.remove(&old);
            }
        }
    }

    fn close(&mut self) {
        self.closed = true;
        for (_, slot) in self.slots.drain() {
            if let Slot::Waiting(tx) = slot {
                let _ = tx.send("disconnected".into());
            }
        }
    }
}

/// A live connection to the service manager.
#[derive(Clone)]
pub struct Systemd {
    conn: Connection,
    /// Bounds the method calls awaiting a reply: dbus-daemon refuses more
    /// than 128 per connection (LimitsExceeded, seen with a drain of 200).
    calls: Arc<tokio::sync::Semaphore>,
    jobs: Arc<Mutex<Jobs>>,
    /// "private socket" or "system bus", for messages.
    pub via: &'static str,
}

/// A unit as ListUnitsByPatterns reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitStatus {
    pub name: String,
    pub load_state: String,
    pub active_state: String,
    pub sub_state: String,
    pub path: OwnedObjectPath,
}

impl UnitStatus {
    /// Running or about to: berth leaves these alone at boot and stops
    /// them at shutdown.
    pub fn is_running(&self) -> bool {
        matches!(
            self.active_state.as_str(),
            "active" | "activating" | "reloading" | "deactivating"
        )
    }
}

impl Systemd {
    /// Connects to the system manager: the private socket as root, else (or
    /// when that fails) the system bus.
    ///
    /// Measured with systemd 252 and zbus 6.2: systemd's private socket
    /// stamps its messages with the sender `org.freedesktop.systemd1`, a
    /// well-known name where zbus requires a unique one, so zbus rejects
    /// every reply there and the bus is what works. The drain unit is
    /// therefore ordered `After=dbus.service`: the bus stays up until the
    /// drain is done.
    pub async fn connect(manager: Manager) -> Result<Systemd, SystemdError> {
        match tokio::time::timeout(CALL_TIMEOUT * 2, Self::connect_inner(manager)).await {
            Ok(result) => result,
            Err(_) => Err(SystemdError {
                operation: "connect to",
                unit: "systemd".into(),
                error_name: String::new(),
                message: format!("no answer within {} s", (CALL_TIMEOUT * 2).as_secs()),
            }),
        }
    }

    /// A user manager: `$XDG_RUNTIME_DIR/systemd/private` first, then the
    /// user bus (`$DBUS_SESSION_BUS_ADDRESS`, else `$XDG_RUNTIME_DIR/bus`).
    async fn connect_inner(manager: Manager) -> Result<Systemd, SystemdError> {
        let runtime_dir = std::env::var_os("XDG_RUNTIME_DIR").map(std::path::PathBuf::from);
        let private = match manager {
            Manager::System => is_root().then(|| std::path::PathBuf::from(PRIVATE_SOCKET)),
            Manager::User => runtime_dir.as_ref().map(|d| d.join("systemd/private")),
        };
        if let Some(private) = private
            && let Ok(stream) = std::os::unix::net::UnixStream::connect(private)
            && let Ok(conn) = zbus::connection::Builder::unix_stream(stream)
                .p2p()
                .method_timeout(CALL_TIMEOUT)
                .build()
                .await
            && let Ok(systemd) = Self::setup(conn, "private socket").await
        {
            return Ok(systemd);
        }
        let (builder, bus) = match manager {
            Manager::System => (zbus::connection::Builder::system(), "system bus"),
            Manager::User => (user_bus(runtime_dir.as_deref()), "user bus"),
        };
        let conn = builder
            .method_timeout(CALL_TIMEOUT)
            .build()
            .await
            .map_err(|e| error("connect to", bus, e))?;
        Self::setup(conn, bus).await
    }

    async fn setup(conn: Connection, via: &'static str) -> Result<Systemd, SystemdError> {
        let mut rule = MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .interface("org.freedesktop.systemd1.Manager")
            .member("JobRemoved");
        // A peer-to-peer message carries no sender; on the bus, only
        // systemd's own signals count.
        if conn.is_bus() {
            rule = rule.sender(SYSTEMD);
        }
        let rule = rule.build().map_err(|e| error("match", "JobRemoved", e))?;
        let stream = MessageStream::for_match_rule(rule, &conn, std::num::NonZeroUsize::new(1024))
            .await
            .map_err(|e| error("listen for", "JobRemoved", e))?;
        let jobs = Arc::new(Mutex::new(Jobs::default()));
        tokio::spawn(read_job_signals(stream, jobs.clone()));

        let systemd = Systemd {
            conn,
            calls: Arc::new(tokio::sync::Semaphore::new(MAX_PENDING_CALLS)),
            jobs,
            via,
        };
        systemd
            .call::<_, ()>(MANAGER_PATH, MANAGER, "Subscribe", &())
            .await
            .map_err(|e| error("Subscribe", "the manager", e))?;
        Ok(systemd)
    }

    /// Calls `method` on systemd; the destination is named only on a bus.
    async fn call<B, R>(&self, path: &str, interface: &str, method: &str, body: &B) -> zbus::Result<R>
    where
        B: serde::Serialize + zbus::DynamicType,
        R: DeserializeOwned + zbus::Type,
    {
        let destination = if self.conn.is_bus() { Some(SYSTEMD) } else { None };
        let _permit = self
            .calls
            .acquire()
            .await
            .expect("the call semaphore is never closed");
        let reply = self
            .conn
            .call_method(destination, path, Some(interface), method, body)
            .await?;
        reply.body().deserialize::<R>()
    }

    async fn property<R>(&self, unit: &str, interface: &str, name: &str) -> Result<R, SystemdError>
    where
        R: TryFrom<OwnedVariant>,
        R::Error: Into<zbus::Error>,
    {
        let path = self.load(unit).await?;
        let value: OwnedVariant = self
            .call(
                path.as_str(),
                "org.freedesktop.DBus.Properties",
                "Get",
                &(interface, name),
            )
            .await
            .map_err(|e| error("Get property of", unit, e))?;
        R::try_from(value).map_err(|e| error("Get property of", unit, e.into()))
    }

    /// Every loaded unit matching `pattern` (e.g. `berth@*.service`).
    pub async fn list_units(&self, pattern: &str) -> Result<Vec<UnitStatus>, SystemdError> {
        let none: &[&str] = &[];
        let units: Vec<UnitRow> = self
            .call(
                MANAGER_PATH,
                MANAGER,
                "ListUnitsByPatterns",
                &(none, &[pattern][..]),
            )
            .await
            .map_err(|e| error("ListUnitsByPatterns", pattern, e))?;
        Ok(units
            .into_iter()
            .map(|u| UnitStatus {
                name: u.0,
                load_state: u.2,
                active_state: u.3,
                sub_state: u.4,
                path: u.6,
            })
            .collect())
    }

    pub async fn start_unit(&self, unit: &str) -> Result<Job, SystemdError> {
        let path: OwnedObjectPath = self
            .call(MANAGER_PATH, MANAGER, "StartUnit", &(unit, "replace"))
            .await
            .map_err(|e| error("StartUnit", unit, e))?;
        Ok(Job::new(path))
    }

    pub async fn stop_unit(&self, unit: &str) -> Result<Job, SystemdError> {
        let path: OwnedObjectPath = self
            .call(MANAGER_PATH, MANAGER, "StopUnit", &(unit, "replace"))
            .await
            .map_err(|e| error("StopUnit", unit, e))?;
        Ok(Job::new(path))
    }

    /// SIGKILL to every process of the unit.
    pub async fn kill_all(&self, unit: &str) -> Result<(), SystemdError> {
        self.call(MANAGER_PATH, MANAGER, "KillUnit", &(unit, "all", 9i32))
            .await
            .map_err(|e| error("KillUnit", unit, e))
    }

    pub async fn cancel_job(&self, unit: &str, job: &Job) -> Result<(), SystemdError> {
        self.call(MANAGER_PATH, MANAGER, "CancelJob", &(job.id,))
            .await
            .map_err(|e| error("CancelJob", unit, e))
    }

    /// Waits for a job to finish, up to `limit`; `None` on timeout.
    pub async fn wait(&self, job: &Job, limit: Option<Duration>) -> Option<JobResult> {
        let rx = {
            let mut jobs = self.jobs.lock().expect("job table lock");
            match jobs.slots.remove(&job.path) {
                Some(Slot::Done(result)) => return Some(result),
                _ if jobs.closed => return Some("disconnected".into()),
                _ => {
                    let (tx, rx) = oneshot::channel();
                    jobs.slots.insert(job.path.clone(), Slot::Waiting(tx));
                    rx
                }
            }
        };
        let result = match limit {
            Some(limit) => tokio::time::timeout(limit, rx).await.ok()?,
            None => rx.await,
        };
        Some(result.unwrap_or_else(|_| "disconnected".into()))
    }

    /// The unit's ActiveState.
    pub async fn active_state(&self, unit: &str) -> Result<String, SystemdError> {
        self.property(unit, "org.freedesktop.systemd1.Unit", "ActiveState")
            .await
    }

    /// The service's Result (success, timeout, signal, exit-code, …).
    pub async fn service_result(&self, unit: &str) -> Result<String, SystemdError> {
        self.property(unit, "org.freedesktop.systemd1.Service", "Result")
            .await
    }

    /// `systemctl daemon-reload`: re-runs the generators and reloads units.
    pub async fn reload(&self) -> Result<(), SystemdError> {
        self.call(MANAGER_PATH, MANAGER, "Reload", &())
            .await
            .map_err(|e| error("Reload", "the manager", e))
    }

    /// What the supervisor needs to know about a workload unit.
    pub async fn details(&self, unit: &str) -> Result<UnitDetails, SystemdError> {
        const U: &str = "org.freedesktop.systemd1.Unit";
        const S: &str = "org.freedesktop.systemd1.Service";
        Ok(UnitDetails {
            active_state: self.property(unit, U, "ActiveState").await?,
            result: self.property(unit, S, "Result").await?,
            exec_main_code: self.property(unit, S, "ExecMainCode").await?,
            exec_main_status: self.property(unit, S, "ExecMainStatus").await?,
            main_pid: self.property(unit, S, "MainPID").await?,
            invocation_id: self
                .property::<Vec<u8>>(unit, U, "InvocationID")
                .await?
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        })
    }

    /// The JobType of a job (start, stop, restart, …), if it still exists.
    pub async fn job_type(&self, job: &str) -> Option<String> {
        let value: OwnedVariant = self
            .call(
                job,
                "org.freedesktop.DBus.Properties",
                "Get",
                &("org.freedesktop.systemd1.Job", "JobType"),
            )
            .await
            .ok()?;
        String::try_from(value).ok()
    }

    /// Unit state changes and new jobs, as they happen. A task drains the
    /// stream into an unbounded channel at once, so that a slow consumer
    /// never stalls the connection (an unpolled stream blocks every later
    /// call on it).
    pub async fn watch(&self) -> Result<tokio::sync::mpsc::UnboundedReceiver<Change>, SystemdError> {
        let mut changed = MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .interface("org.freedesktop.DBus.Properties")
            .member("PropertiesChanged")
            .path_namespace("/org/freedesktop/systemd1/unit");
        let mut jobs = MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .interface("org.freedesktop.systemd1.Manager")
            .member("JobNew");
        if self.conn.is_bus() {
            changed = changed.sender(SYSTEMD);
            jobs = jobs.sender(SYSTEMD);
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for rule in [changed, jobs] {
            let rule = rule.build().map_err(|e| error("match", "unit changes", e))?;
            let mut stream =
                MessageStream::for_match_rule(rule, &self.conn, std::num::NonZeroUsize::new(1024))
                    .await
                    .map_err(|e| error("listen for", "unit changes", e))?;
            let tx = tx.clone();
            tokio::spawn(async move {
                while let Some(Ok(message)) = stream.next().await {
                    let header = message.header();
                    let change = match header.member().map(|m| m.as_str()) {
                        Some("JobNew") => message
                            .body()
                            .deserialize::<(u32, OwnedObjectPath, String)>()
                            .ok()
                            .map(|(_, job, unit)| Change::JobNew {
                                job: job.as_str().into(),
                                unit,
                            }),
                        _ => header.path().map(|p| Change::Properties {
                            unit: unit_from_path(p.as_str()),
                        }),
                    };
                    if let Some(change) = change
                        && tx.send(change).is_err()
                    {
                        return;
                    }
                }
            });
        }
        Ok(rx)
    }

    /// One property of a unit by interface (`Unit`, `Service`, …) and name.
    pub async fn unit_property<R>(&self, unit: &str, interface: &str, name: &str) -> Result<R, SystemdError>
    where
        R: TryFrom<OwnedVariant>,
        R::Error: Into<zbus::Error>,
    {
        self.property(unit, &format!("org.freedesktop.systemd1.{interface}"), name)
            .await
    }

    /// The unit's pending job id, 0 when none.
    pub async fn pending_job(&self, unit: &str) -> Result<u32, SystemdError> {
        let (id, _): (u32, OwnedObjectPath) = self.unit_property(unit, "Unit", "Job").await?;
        Ok(id)
    }

    /// `systemctl is-enabled` for a unit file name (`enabled`, `disabled`, …).
    pub async fn unit_file_state(&self, unit: &str) -> Result<String, SystemdError> {
        self.call(MANAGER_PATH, MANAGER, "GetUnitFileState", &(unit,))
            .await
            .map_err(|e| error("GetUnitFileState", unit, e))
    }

    /// `systemctl enable` without the reload: the symlinks its [Install]
    /// section asks for, as (type, link, target) changes.
    pub async fn enable_unit_file(&self, unit: &str) -> Result<Vec<(String, String, String)>, SystemdError> {
        let (_, changes): (bool, Vec<(String, String, String)>) = self
            .call(
                MANAGER_PATH,
                MANAGER,
                "EnableUnitFiles",
                &(vec![unit], false, false),
            )
            .await
            .map_err(|e| error("EnableUnitFiles", unit, e))?;
        Ok(changes)
    }

    /// `systemctl disable` without the reload.
    pub async fn disable_unit_file(&self, unit: &str) -> Result<Vec<(String, String, String)>, SystemdError> {
        self.call(MANAGER_PATH, MANAGER, "DisableUnitFiles", &(vec![unit], false))
            .await
            .map_err(|e| error("DisableUnitFiles", unit, e))
    }

    async fn load(&self, unit: &str) -> Result<OwnedObjectPath, SystemdError> {
        self.call(MANAGER_PATH, MANAGER, "LoadUnit", &(unit,))
            .await
            .map_err(|e| error("LoadUnit", unit, e))
    }
}

/// A unit's live state, for the supervisor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitDetails {
    pub active_state: String,
    pub result: String,
    /// CLD_EXITED (1), CLD_KILLED (2), CLD_DUMPED (3); 0 before any exit.
    pub exec_main_code: i32,
    pub exec_main_status: i32,
    pub main_pid: u32,
    pub invocation_id: String,
}

/// Something that changed in the manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Properties { unit: String },
    JobNew { job: String, unit: String },
}

/// `/org/freedesktop/systemd1/unit/berth_40web_2eservice` → `berth@web.service`
/// (systemd escapes every byte outside `[A-Za-z0-9]` as `_XX`).
pub fn unit_from_path(path: &str) -> String {
    let escaped = path.rsplit('/').next().unwrap_or("");
    let bytes = escaped.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'_'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&escaped[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A queued job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub path: String,
    pub id: u32,
}

impl Job {
    fn new(path: OwnedObjectPath) -> Job {
        let path = path.as_str().to_string();
        let id = path.rsplit('/').next().and_then(|n| n.parse().ok()).unwrap_or(0);
        Job { path, id }
    }
}

async fn read_job_signals(mut stream: MessageStream, jobs: Arc<Mutex<Jobs>>) {
    while let Some(message) = stream.next().await {
        let Ok(message) = message else { continue };
        let body = message.body();
        let Ok((_id, path, _unit, result)) = body.deserialize::<(u32, OwnedObjectPath, String, String)>()
        else {
            continue;
        };
        jobs.lock()
            .expect("job table lock")
            .complete(path.as_str().to_string(), result);
    }
    jobs.lock().expect("job table lock").close();
}

/// The user bus: `$DBUS_SESSION_BUS_ADDRESS`, else the socket systemd's
/// dbus.socket (dbus-user-session) listens on.
fn user_bus(runtime_dir: Option<&std::path::Path>) -> zbus::connection::Builder<'static> {
    match (std::env::var_os("DBUS_SESSION_BUS_ADDRESS"), runtime_dir) {
        (None, Some(dir)) => {
            zbus::connection::Builder::address(format!("unix:path={}/bus", dir.display()).as_str())
        }
        _ => zbus::connection::Builder::session(),
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// What the helpers need from the manager; [`Systemd`] is the real one,
/// tests use a fake to check scheduling without a bus.
#[allow(async_fn_in_trait)]
pub trait Ops {
    async fn list_workloads(&self) -> Result<Vec<UnitStatus>, SystemdError>;
    async fn start(&self, unit: &str) -> Result<Job, SystemdError>;
    async fn stop(&self, unit: &str) -> Result<Job, SystemdError>;
    /// SIGKILL to every process of the unit.
    async fn kill(&self, unit: &str) -> Result<(), SystemdError>;
    async fn cancel(&self, unit: &str, job: &Job) -> Result<(), SystemdError>;
    async fn wait(&self, job: &Job, limit: Option<Duration>) -> Option<JobResult>;
    async fn active_state(&self, unit: &str) -> Result<String, SystemdError>;
}

impl Ops for Systemd {
    async fn list_workloads(&self) -> Result<Vec<UnitStatus>, SystemdError> {
        self.list_units("berth@*.service").await
    }
    async fn start(&self, unit: &str) -> Result<Job, SystemdError> {
        self.start_unit(unit).await
    }
    async fn stop(&self, unit: &str) -> Result<Job, SystemdError> {
        self.stop_unit(unit).await
    }
    async fn kill(&self, unit: &str) -> Result<(), SystemdError> {
        self.kill_all(unit).await
    }
    async fn cancel(&self, unit: &str, job: &Job) -> Result<(), SystemdError> {
        self.cancel_job(unit, job).await
    }
    async fn wait(&self, job: &Job, limit: Option<Duration>) -> Option<JobResult> {
        Systemd::wait(self, job, limit).await
    }
    async fn active_state(&self, unit: &str) -> Result<String, SystemdError> {
        Systemd::active_state(self, unit).await
    }
}

/// A current-thread runtime for the helpers: they are sequential programs
/// with a few concurrent waits, and must stay small.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn early_results_are_kept_for_late_waiters() {
        let mut jobs = Jobs::default();
        jobs.complete("/org/freedesktop/systemd1/job/7".into(), "done".into());
        assert!(
            matches!(jobs.slots.get("/org/freedesktop/systemd1/job/7"), Some(Slot::Done(r)) if r == "done")
        );
        let (tx, mut rx) = oneshot::channel();
        jobs.slots.insert("/j/8".into(), Slot::Waiting(tx));
        jobs.complete("/j/8".into(), "canceled".into());
        assert_eq!(rx.try_recv().unwrap(), "canceled");
    }

    #[test]
    fn a_result_for_a_waiter_that_gave_up_is_kept() {
        let mut jobs = Jobs::default();
        let (tx, rx) = oneshot::channel();
        jobs.slots.insert("/j/9".into(), Slot::Waiting(tx));
        drop(rx); // the wait timed out
        jobs.complete("/j/9".into(), "done".into());
        assert!(matches!(jobs.slots.get("/j/9"), Some(Slot::Done(r)) if r == "done"));
    }

    #[test]
    fn the_done_cache_is_bounded() {
        let mut jobs = Jobs::default();
        for i in 0..(DONE_CACHE + 10) {
            jobs.complete(format!("/j/{i}"), "done".into());
        }
        assert_eq!(jobs.slots.len(), DONE_CACHE);
        assert!(!jobs.slots.contains_key("/j/0"));
    }

    #[test]
    fn unit_names_from_object_paths() {
        assert_eq!(
            unit_from_path("/org/freedesktop/systemd1/unit/berth_40web_2d1_2eservice"),
            "berth@web-1.service"
        );
        assert_eq!(
            unit_from_path("/org/freedesktop/systemd1/unit/dbus_2eservice"),
            "dbus.service"
        );
    }

    #[test]
    fn job_ids_come_from_the_path() {
        let path = OwnedObjectPath::try_from("/org/freedesktop/systemd1/job/4242").unwrap();
        assert_eq!(Job::new(path).id, 4242);
    }
}
