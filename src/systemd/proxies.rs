//! Typed proxies for the parts of systemd's D-Bus API berth uses, checked
//! against the introspection XML of systemd 252 in `dbus/` (the oldest
//! manager berth supports: nothing newer is called).
//!
//! Properties are read whole per interface with `GetAll` into the structs
//! below (one round trip for what used to take one `Get` each), and every
//! proxy is built with property caching off: a caching proxy adds a match
//! rule per object, and a host with a thousand workloads would reach the
//! bus's per-connection limit on match rules.

use serde::Deserialize;
use zbus::{DeserializeDict, OwnedObjectPath, Type, proxy};

pub const SERVICE: &str = "org.freedesktop.systemd1";
pub const UNIT_INTERFACE: &str = "org.freedesktop.systemd1.Unit";
pub const SERVICE_INTERFACE: &str = "org.freedesktop.systemd1.Service";

#[proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1"
)]
pub trait Manager {
    /// Without it, systemd sends no JobRemoved/JobNew/PropertiesChanged.
    fn subscribe(&self) -> zbus::Result<()>;

    fn list_units_by_patterns(&self, states: &[&str], patterns: &[&str]) -> zbus::Result<Vec<ListedUnit>>;

    /// A path even for a unit that does not exist (LoadState=not-found).
    fn load_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;

    fn start_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

    fn kill_unit(&self, name: &str, whom: &str, signal: i32) -> zbus::Result<()>;

    /// A unit that lives until it stops (the cluster's fence timer and
    /// its service): properties, then the units that go with it.
    #[allow(clippy::type_complexity)]
    fn start_transient_unit(
        &self,
        name: &str,
        mode: &str,
        properties: &[(&str, zbus::Variant<'_>)],
        aux: &[(&str, &[(&str, zbus::Variant<'_>)])],
    ) -> zbus::Result<OwnedObjectPath>;

    fn cancel_job(&self, id: u32) -> zbus::Result<()>;

    /// Every job queued: id, unit, type, state, job path, unit path.
    fn list_jobs(&self) -> zbus::Result<Vec<ListedJob>>;

    /// `systemctl daemon-reload`: reruns the generators, reloads units.
    fn reload(&self) -> zbus::Result<()>;

    fn get_unit_file_state(&self, file: &str) -> zbus::Result<String>;

    fn enable_unit_files(
        &self,
        files: &[&str],
        runtime: bool,
        force: bool,
    ) -> zbus::Result<(bool, Vec<UnitFileChange>)>;

    fn disable_unit_files(&self, files: &[&str], runtime: bool) -> zbus::Result<Vec<UnitFileChange>>;

    #[zbus(property)]
    fn system_state(&self) -> zbus::Result<String>;

    /// When this manager's userspace began (CLOCK_MONOTONIC, µs): a new
    /// value for each start of a user manager.
    #[zbus(property)]
    fn userspace_timestamp_monotonic(&self) -> zbus::Result<u64>;

    #[zbus(signal)]
    fn job_new(&self, id: u32, job: OwnedObjectPath, unit: String) -> zbus::Result<()>;

    #[zbus(signal)]
    fn job_removed(&self, id: u32, job: OwnedObjectPath, unit: String, result: String) -> zbus::Result<()>;
}

/// A ListJobs entry: id, unit, type ("stop", …), state, job path, unit
/// path.
pub type ListedJob = (u32, String, String, String, OwnedObjectPath, OwnedObjectPath);

/// `org.freedesktop.DBus.Properties.GetAll` on a unit object, once per
/// interface, each into its own typed struct.
#[proxy(
    interface = "org.freedesktop.DBus.Properties",
    default_service = "org.freedesktop.systemd1"
)]
pub trait UnitProperties {
    /// `GetAll("org.freedesktop.systemd1.Unit")`.
    #[zbus(name = "GetAll")]
    fn unit(&self, interface: &str) -> zbus::Result<UnitProps>;

    /// `GetAll("org.freedesktop.systemd1.Service")`.
    #[zbus(name = "GetAll")]
    fn service(&self, interface: &str) -> zbus::Result<ServiceProps>;
}

#[proxy(
    interface = "org.freedesktop.systemd1.Unit",
    default_service = "org.freedesktop.systemd1"
)]
pub trait Unit {
    #[zbus(property)]
    fn active_state(&self) -> zbus::Result<String>;
}

/// The Service properties a state observation needs, read one by one:
/// `GetAll` on the Service interface makes systemd read the unit's cgroup
/// counters (MemoryCurrent, CPUUsageNSec, IO and IP accounting) for the
/// answer, which made an exit's observation ~1 ms slower.
#[proxy(
    interface = "org.freedesktop.systemd1.Service",
    default_service = "org.freedesktop.systemd1"
)]
pub trait Service {
    #[zbus(property)]
    fn result(&self) -> zbus::Result<String>;
    #[zbus(property)]
    fn exec_main_code(&self) -> zbus::Result<i32>;
    #[zbus(property)]
    fn exec_main_status(&self) -> zbus::Result<i32>;
    #[zbus(property, name = "MainPID")]
    fn main_pid(&self) -> zbus::Result<u32>;
    #[zbus(property, name = "NRestarts")]
    fn n_restarts(&self) -> zbus::Result<u32>;
}

#[proxy(
    interface = "org.freedesktop.systemd1.Job",
    default_service = "org.freedesktop.systemd1"
)]
pub trait Job {
    #[zbus(property)]
    fn job_type(&self) -> zbus::Result<String>;
}

/// One row of `ListUnitsByPatterns` (`(ssssssouso)`).
#[derive(Debug, Clone, Deserialize, Type)]
pub struct ListedUnit {
    pub name: String,
    pub description: String,
    pub load_state: String,
    pub active_state: String,
    pub sub_state: String,
    pub following: String,
    pub path: OwnedObjectPath,
    pub job_id: u32,
    pub job_type: String,
    pub job_path: OwnedObjectPath,
}

/// One change `EnableUnitFiles`/`DisableUnitFiles` made: (type, link, target).
#[derive(Debug, Clone, Deserialize, Type)]
pub struct UnitFileChange {
    pub kind: String,
    pub file: String,
    pub destination: String,
}

/// The Unit interface's properties berth reads.
#[derive(Debug, Clone, DeserializeDict, Type)]
#[zbus(signature = "a{sv}", rename_all = "PascalCase")]
pub struct UnitProps {
    pub load_state: String,
    pub active_state: String,
    pub sub_state: String,
    #[zbus(rename = "InvocationID")]
    pub invocation_id: Vec<u8>,
    pub job: (u32, OwnedObjectPath),
    pub requires: Vec<String>,
    pub requisite: Vec<String>,
    /// Newer than some managers berth may meet: absent there.
    pub stop_propagated_from: Option<Vec<String>>,
    pub binds_to: Vec<String>,
    pub part_of: Vec<String>,
    pub conflicts: Vec<String>,
    pub conflicted_by: Vec<String>,
    pub after: Vec<String>,
    pub drop_in_paths: Vec<String>,
    pub refuse_manual_stop: bool,
    pub ignore_on_isolate: bool,
    pub id: String,
    pub before: Vec<String>,
    pub triggered_by: Vec<String>,
    pub fragment_path: String,
    /// What a generator made the unit from (a quadlet's `.container`,
    /// an fstab line's /etc/fstab).
    pub source_path: String,
    pub wanted_by: Vec<String>,
    pub required_by: Vec<String>,
    /// CLOCK_MONOTONIC µs when it last left active (0: never).
    pub active_exit_timestamp_monotonic: u64,
}

/// The Service interface's properties berth reads.
#[derive(Debug, Clone, DeserializeDict, Type)]
#[zbus(signature = "a{sv}", rename_all = "PascalCase")]
pub struct ServiceProps {
    pub result: String,
    pub exec_main_code: i32,
    pub exec_main_status: i32,
    #[zbus(rename = "MainPID")]
    pub main_pid: u32,
    pub slice: String,
    #[zbus(rename = "TimeoutStopUSec")]
    pub timeout_stop_usec: u64,
    pub exec_start: Vec<ExecCommand>,
    pub exec_stop: Vec<ExecCommand>,
    pub control_group: String,
}

/// One `ExecStop=` (or other Exec*) entry: `(sasbttttuii)`.
#[derive(Debug, Clone, Deserialize, Type)]
pub struct ExecCommand {
    pub path: String,
    pub argv: Vec<String>,
    pub ignore_errors: bool,
    pub start_realtime: u64,
    pub start_monotonic: u64,
    pub exit_realtime: u64,
    pub exit_monotonic: u64,
    pub pid: u32,
    pub code: i32,
    pub status: i32,
}
