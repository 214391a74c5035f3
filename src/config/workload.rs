//! `workloads/NAME.toml`: one workload per file, NAME is the file stem.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use toml::Value;

pub use super::checks::Autostart;
use super::checks::{MAX_DELAY_S, SHUTDOWN_AND_MODE_UNITS, check_unit_list, is_valid_unit_name};
use super::guests::{self, ShutdownMode};
use super::host::HostSettings;
use super::passthrough::{self, ServiceSetting};
use super::read::{Origin, Reader, control_char, describe_control, parse_file, parse_text};
use super::restart::{self, RestartPolicy};
use super::{ConfigError, Manager};
use crate::names::{PACKAGED_UNITS, instance_of, unit_name};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopAction {
    /// Ask the workload to stop (its `stop_exec`, else the unit's
    /// KillSignal) and wait up to its stop delay.
    GuestShutdown,
    /// Kill it at once: for workloads whose state is disposable.
    PowerOff,
    /// A libvirt guest: managed save (`virsh managedsave`), resumed from
    /// its saved state at its next start; a save that fails or outlives
    /// the stop delay falls back to guest_shutdown.
    Save,
}

impl StopAction {
    pub fn as_str(self) -> &'static str {
        match self {
            StopAction::GuestShutdown => "guest_shutdown",
            StopAction::PowerOff => "power_off",
            StopAction::Save => "save",
        }
    }
}

/// `ha = true`: one node of the cluster runs it at a time, the first of
/// `nodes` (in that order) that can; the others take it over when it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaPolicy {
    /// Candidate nodes, in order of preference.
    pub nodes: Vec<String>,
}

impl HaPolicy {
    /// A hash of the candidate list (FNV-1a, hex), published with the
    /// node's presence: peers see who has it configured, and with which
    /// list. Not a secret, only a comparison.
    pub fn nodes_hash(&self) -> String {
        let joined: Vec<u8> = self.nodes.iter().flat_map(|n| n.bytes().chain([0])).collect();
        format!("{:016x}", crate::unit_text::fnv1a(&joined))
    }
}

const MAX_HA_NODES: usize = 64;

/// When a workload counts as started: what `berth autostart` waits for
/// before it starts the next group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Readiness {
    /// Once its program runs (`Type=exec`).
    Exec,
    /// Once its main process sends READY=1 (`Type=notify`,
    /// `NotifyAccess=main`).
    Notify,
}

impl Readiness {
    pub fn as_str(self) -> &'static str {
        match self {
            Readiness::Exec => "exec",
            Readiness::Notify => "notify",
        }
    }
}

/// How the workload's process comes to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkloadKind {
    /// `berth@NAME.service` runs `exec` as its main process.
    Command {
        exec: Vec<String>,
        /// A graceful stop command that blocks until the workload is down.
        stop_exec: Option<Vec<String>>,
    },
    /// An existing service unit, put under berth's rules by a drop-in: it
    /// keeps its own command, type, stop and readiness.
    Existing { unit: String },
    /// A libvirt domain (`qemu:///system`): `berth@NAME.service` runs
    /// `berth guest`, which starts or adopts the guest, follows it, and
    /// stops it by ACPI or destroys it as the workload says. QEMU itself
    /// runs in libvirt's machine scope.
    Libvirt {
        domain: String,
        /// How a graceful stop asks it to shut down.
        shutdown_mode: Vec<ShutdownMode>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub name: String,
    pub source: PathBuf,
    pub description: Option<String>,
    pub kind: WorkloadKind,
    pub autostart: Autostart,
    pub order: i64,
    pub start_delay_s: u64,
    pub stop_action: StopAction,
    pub ready: Readiness,
    /// A probe run until it succeeds once the workload runs (and, with
    /// `ready = "notify"`, is ready): the start completes only then.
    pub ready_exec: Option<Vec<String>>,
    /// Resolved: the workload's own or the host default.
    pub stop_delay_s: u64,
    /// Resolved: the workload's own or the host default.
    pub force_off_on_timeout: bool,
    pub after: Vec<String>,
    pub wants: Vec<String>,
    pub environment: BTreeMap<String, String>,
    pub user: Option<String>,
    pub group: Option<String>,
    /// `ha = true` and its `nodes`; None for a workload of this node only.
    pub ha: Option<HaPolicy>,
    /// `[service]` pass-through, validated, in key order.
    pub service: Vec<ServiceSetting>,
    /// Resolved: the workload's own or the host default. None for an
    /// existing unit whose file sets none of the restart keys: it keeps
    /// its own `Restart=`.
    pub restart: Option<RestartPolicy>,
    /// A guest covered by `[libvirt] guests = "all"`: `source` is its
    /// domain's definition, not a workload file.
    pub from_all_guests: bool,
}

impl Workload {
    pub fn unit_name(&self) -> String {
        match &self.kind {
            WorkloadKind::Command { .. } | WorkloadKind::Libvirt { .. } => unit_name(&self.name),
            WorkloadKind::Existing { unit } => unit.clone(),
        }
    }

    /// The existing unit this workload names (`unit =`), if it does.
    pub fn existing_unit(&self) -> Option<&str> {
        match &self.kind {
            WorkloadKind::Existing { unit } => Some(unit),
            _ => None,
        }
    }

    /// The libvirt domain this workload is (`libvirt =`), if it is one.
    pub fn libvirt_domain(&self) -> Option<&str> {
        match &self.kind {
            WorkloadKind::Libvirt { domain, .. } => Some(domain),
            _ => None,
        }
    }
}

/// Keys of how berth runs a command itself: its stop, its readiness, its
/// environment and account. Refused for an existing unit (which keeps its
/// own) and for a libvirt guest (QEMU runs in libvirt's machine scope,
/// readiness is the domain running), each with one more key.
const PROCESS_KEYS: &[&str] = &["stop_exec", "ready", "ready_exec", "environment", "user", "group"];

/// The longest libvirt domain name berth accepts.
pub const MAX_DOMAIN_LEN: usize = 128;

/// A libvirt domain name as berth accepts it: `[A-Za-z0-9][A-Za-z0-9_.+:-]*`,
/// at most [`MAX_DOMAIN_LEN`] bytes. libvirt allows more (spaces, most
/// punctuation), but the name goes on command lines and into messages;
/// never a leading `-`, which virsh would read as an option.
fn libvirt_domain(r: &mut Reader, domain: String) -> Option<String> {
    let ok = domain.starts_with(|c: char| c.is_ascii_alphanumeric())
        && domain.len() <= MAX_DOMAIN_LEN
        && domain
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '+' | ':' | '-'));
    if !ok {
        r.error(
            "libvirt",
            format!(
                "{domain:?} is not a domain name berth accepts: 1-{MAX_DOMAIN_LEN} characters from A-Z a-z 0-9 _ . + : -, \
                 starting with a letter or digit"
            ),
        );
        return None;
    }
    // virsh looks a --domain up by ID, then UUID, then name: `3` could be
    // another guest's ID, and a UUID another guest's.
    if domain.bytes().all(|b| b.is_ascii_digit()) || is_uuid_shaped(&domain) {
        r.error(
            "libvirt",
            format!(
                "{domain:?} reads as a domain {} to virsh, which would look it up as one (another guest's, maybe) \
                 before its name: rename the domain (virsh domrename)",
                if domain.contains('-') || domain.len() == 32 { "UUID" } else { "ID" }
            ),
        );
        return None;
    }
    Some(domain)
}

/// 32 hex digits, with or without the dashes of 8-4-4-4-12: what virsh
/// takes for a UUID.
fn is_uuid_shaped(s: &str) -> bool {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    let dashes_ok = !s.contains('-') || s.split('-').map(str::len).eq([8, 4, 4, 4, 12]);
    hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()) && dashes_ok
}

/// Units a workload may not take over with `unit =`: what the service
/// manager, the bus and berth itself are made of. The drain needs them
/// until it is done, and DefaultDependencies=no would take them out of
/// the boot's order.
fn is_reserved_unit(unit: &str) -> bool {
    unit.starts_with("systemd-")
        || unit.starts_with("user@")
        || unit.starts_with("user-runtime-dir@")
        || unit.starts_with("berth-")
        || matches!(unit, "dbus.service" | "dbus-broker.service")
}

/// The `unit` key: an existing service, not a template, not one of
/// berth's own, not the manager's or the bus's.
fn existing_unit(r: &mut Reader, unit: String) -> Option<String> {
    let why = if !unit.ends_with(".service") || !is_valid_unit_name(&unit) {
        Some(format!(
            "{unit:?} is not a service unit name; name an existing service, e.g. unit = \"postgresql.service\""
        ))
    } else if instance_of(&unit).is_some() || PACKAGED_UNITS.contains(&unit.as_str()) {
        Some(format!("{unit} is one of berth's own units"))
    } else if SHUTDOWN_AND_MODE_UNITS.contains(&unit.as_str()) || is_reserved_unit(&unit) {
        Some(format!(
            "{unit} is part of the service manager, the bus or the shutdown; berth cannot take it over"
        ))
    } else {
        None
    };
    match why {
        Some(why) => {
            r.error("unit", why);
            None
        }
        None => Some(unit),
    }
}

const WORKLOAD_KEYS: &[&str] = &[
    "exec",
    "unit",
    "libvirt",
    "description",
    "autostart",
    "order",
    "start_delay_s",
    "stop_action",
    "stop_delay_s",
    "force_off_on_timeout",
    "stop_exec",
    "ready",
    "ready_exec",
    "after",
    "wants",
    "environment",
    "user",
    "group",
    "service",
    "ha",
    "nodes",
    "restart",
    "restart_delay_s",
    "start_limit_interval_s",
    "start_limit_burst",
    "shutdown_mode",
];

pub(super) fn load(name: &str, path: &Path, host: &HostSettings) -> Result<Workload, Vec<ConfigError>> {
    let table = parse_file(path).map_err(|e| vec![e])?;
    from_table(name, path, &table, host)
}

/// A workload made of `table`, as if read from `path`.
pub(super) fn load_table(
    name: &str,
    path: &Path,
    table: &toml::Table,
    host: &HostSettings,
) -> Result<Workload, Vec<ConfigError>> {
    from_table(name, path, table, host)
}

/// `text` as the workload file `path` would be read, before it is there.
pub(super) fn load_text(
    name: &str,
    path: &Path,
    text: &str,
    host: &HostSettings,
) -> Result<Workload, Vec<ConfigError>> {
    let table = parse_text(path, text).map_err(|e| vec![e])?;
    from_table(name, path, &table, host)
}

fn from_table(
    name: &str,
    path: &Path,
    table: &toml::Table,
    host: &HostSettings,
) -> Result<Workload, Vec<ConfigError>> {
    let origin = Origin::single(path);
    let mut r = Reader::new(table, "", &origin);
    let errors = Vec::new();

    let libvirt = r.opt_text("libvirt");
    if let Some(domain) = libvirt {
        let kind = libvirt_kind(&mut r, domain, host);
        return finish(name, path, r, errors, kind, host, true);
    }
    if r.take("shutdown_mode").is_some() {
        r.error(
            "shutdown_mode",
            "is for a libvirt guest (libvirt = \"DOMAIN\"): how its watcher asks the guest to shut down",
        );
    }
    let unit = r.opt_text("unit");
    let kind = match (r.take("exec"), unit) {
        // A `unit` or `libvirt` of the wrong type is reported as such,
        // not as a missing exec.
        (None, None) if table.contains_key("unit") || table.contains_key("libvirt") => None,
        (None, None) => {
            r.error(
                "exec",
                "missing; every workload needs the command to run, as a list: exec = [\"/usr/bin/prog\", \"arg\"], \
                 or an existing unit to take over: unit = \"NAME.service\"",
            );
            None
        }
        (Some(_), Some(_)) => {
            r.error(
                "unit",
                "and exec are both set: a workload is either a command berth runs (exec) or an existing unit (unit)",
            );
            r.take("stop_exec");
            None
        }
        (Some(v), None) => {
            let exec = argv(&mut r, "exec", v);
            let stop_exec = r.take("stop_exec").and_then(|v| argv(&mut r, "stop_exec", v));
            exec.map(|exec| WorkloadKind::Command { exec, stop_exec })
        }
        (None, Some(unit)) => {
            for key in PROCESS_KEYS.iter().chain(&["description"]) {
                if r.take(key).is_some() {
                    r.error(
                        key,
                        "is for a command berth runs (exec); an existing unit keeps its own: change it in the unit (systemctl edit)",
                    );
                }
            }
            existing_unit(&mut r, unit).map(|unit| WorkloadKind::Existing { unit })
        }
    };

    finish(name, path, r, errors, kind, host, restart::any_set(table))
}

/// The keys every kind shares, and the workload.
fn finish(
    name: &str,
    path: &Path,
    mut r: Reader,
    mut errors: Vec<ConfigError>,
    kind: Option<WorkloadKind>,
    host: &HostSettings,
    restart_set: bool,
) -> Result<Workload, Vec<ConfigError>> {
    let description = description(&mut r);
    let autostart = r.autostart("autostart", host.default_autostart);
    let order = r.int("order", 0, -1_000_000, 1_000_000);
    let start_delay_s = r.int("start_delay_s", 0, 0, 3600) as u64;
    let stop_action = stop_action(&mut r, kind.as_ref());
    let stop_delay_s = r.int("stop_delay_s", host.default_stop_delay_s as i64, 1, MAX_DELAY_S) as u64;
    let ready = readiness(&mut r);
    let ready_exec = r.take("ready_exec").and_then(|v| argv(&mut r, "ready_exec", v));
    let force_off_on_timeout = r.bool("force_off_on_timeout", host.force_off_on_timeout);
    let (after, wants) = dependencies(&mut r, path, name, kind.as_ref());
    let environment = environment(&mut r);
    let (user, group) = accounts(&mut r, host);
    let mut service = Vec::new();
    if let Some(t) = r.opt_table("service") {
        service = passthrough::validate(t, path, &mut r.errors);
    }
    let ha = ha_policy(&mut r, host, force_off_on_timeout);
    let restart = restart::read(&mut r, "", host.default_restart);
    let restart = match &kind {
        Some(WorkloadKind::Existing { .. }) if !restart_set => None,
        _ => Some(restart),
    };
    if let Some(WorkloadKind::Command { exec, stop_exec }) = &kind {
        check_execve(
            &mut r,
            exec,
            stop_exec.as_deref(),
            ready_exec.as_deref(),
            &environment,
            &service,
        );
    }
    errors.append(&mut r.finish(WORKLOAD_KEYS));
    match kind {
        Some(kind) if errors.is_empty() => Ok(Workload {
            name: name.to_string(),
            source: path.to_path_buf(),
            description,
            kind,
            autostart,
            order,
            start_delay_s,
            stop_action,
            ready,
            ready_exec,
            stop_delay_s,
            force_off_on_timeout,
            after,
            wants,
            environment,
            user,
            group,
            service,
            ha,
            restart,
            from_all_guests: false,
        }),
        _ => Err(errors),
    }
}

/// `description`: what systemd keeps of it must stay one line.
fn description(r: &mut Reader) -> Option<String> {
    r.opt_text("description").and_then(|d| {
        // systemd strips ASCII whitespace around a value; what remains is
        // what must not end in a backslash (that would continue the line).
        let d = d.trim_matches([' ', '\t']).to_string();
        if d.len() > 512 {
            r.error("description", format!("is {} bytes long; at most 512", d.len()));
            None
        } else if d.ends_with('\\') {
            r.error("description", "must not end with a backslash");
            None
        } else {
            Some(d)
        }
    })
}

/// `stop_action`; `save` only for a libvirt guest (or a kind unknown
/// for its own errors).
fn stop_action(r: &mut Reader, kind: Option<&WorkloadKind>) -> StopAction {
    match r.opt_text("stop_action").as_deref() {
        None | Some("guest_shutdown") => StopAction::GuestShutdown,
        Some("power_off") => StopAction::PowerOff,
        Some("save") if matches!(kind, Some(WorkloadKind::Libvirt { .. }) | None) => StopAction::Save,
        Some("save") => {
            r.error(
                "stop_action",
                "\"save\" is for libvirt guests (a managed save); use \"guest_shutdown\" or \"power_off\"",
            );
            StopAction::GuestShutdown
        }
        Some(other) => {
            r.error(
                "stop_action",
                format!("must be \"guest_shutdown\", \"power_off\" or \"save\", not {other:?}"),
            );
            StopAction::GuestShutdown
        }
    }
}

fn readiness(r: &mut Reader) -> Readiness {
    match r.opt_text("ready").as_deref() {
        None | Some("exec") => Readiness::Exec,
        Some("notify") => Readiness::Notify,
        Some(other) => {
            r.error("ready", format!("must be \"exec\" or \"notify\", not {other:?}"));
            Readiness::Exec
        }
    }
}

/// `after` and `wants`: unit names, none of them the workload itself.
fn dependencies(
    r: &mut Reader,
    path: &Path,
    name: &str,
    kind: Option<&WorkloadKind>,
) -> (Vec<String>, Vec<String>) {
    let mut after = Vec::new();
    let mut wants = Vec::new();
    for (key, out) in [("after", &mut after), ("wants", &mut wants)] {
        if let Some(list) = r.text_list(key, "unit name") {
            let itself = match kind {
                Some(WorkloadKind::Existing { unit }) => list.iter().position(|u| u == unit),
                _ => None,
            };
            match check_unit_list(&list, path, key, Some(name)) {
                Ok(()) if itself.is_some() => r.errors.push(ConfigError::key(
                    path,
                    format!("{key}[{}]", itself.unwrap_or_default()),
                    "a workload cannot depend on itself",
                )),
                Ok(()) => *out = list,
                Err(e) => r.errors.push(e),
            }
        }
    }
    (after, wants)
}

/// `[environment]`: variable names and values a unit file can carry.
fn environment(r: &mut Reader) -> BTreeMap<String, String> {
    let mut environment = BTreeMap::new();
    if let Some(env) = r.opt_table("environment") {
        for (var, value) in env {
            let key = format!("environment.{var}");
            if !is_env_name(var) {
                r.error(
                    &key,
                    "variable names use A-Z a-z 0-9 _ and do not start with a digit",
                );
                continue;
            }
            match value {
                Value::String(s) if s.len() > MAX_VALUE_LEN => r.error(
                    &key,
                    format!("is {} bytes long; at most {MAX_VALUE_LEN}", s.len()),
                ),
                Value::String(s) => match control_char(s) {
                    Some(c) => r.error(&key, describe_control(c)),
                    None => {
                        environment.insert(var.clone(), s.clone());
                    }
                },
                other => r.error(&key, format!("must be a string, not {}", other.type_str())),
            }
        }
    }
    environment
}

/// `user` and `group`, which only the system manager may switch to.
fn accounts(r: &mut Reader, host: &HostSettings) -> (Option<String>, Option<String>) {
    let user = r.opt_text("user").filter(|u| account_name_ok(r, "user", u));
    let group = r.opt_text("group").filter(|g| account_name_ok(r, "group", g));
    if host.manager == Manager::User {
        // A user manager runs everything as its user; systemd would fail
        // the start with "Operation not permitted" (216/GROUP).
        for (key, set) in [("user", user.is_some()), ("group", group.is_some())] {
            if set {
                r.error(
                    key,
                    "is for the system manager: a user manager runs workloads as its own user",
                );
            }
        }
    }
    (user, group)
}

/// Each command, with the environment, within what execve(2) takes.
fn check_execve(
    r: &mut Reader,
    exec: &[String],
    stop_exec: Option<&[String]>,
    ready_exec: Option<&[String]>,
    environment: &BTreeMap<String, String>,
    service: &[ServiceSetting],
) {
    let commands = [
        ("exec", Some(exec)),
        ("stop_exec", stop_exec),
        ("ready_exec", ready_exec),
    ];
    let stack = service
        .iter()
        .find(|s| s.key == "LimitSTACK")
        .map(|s| s.value.as_str());
    for (key, argv) in commands {
        let Some(argv) = argv else { continue };
        match execve_fits(argv, environment, stack) {
            Ok(()) => {}
            Err(ExecveTooBig::Variable { name, bytes }) => {
                r.error(
                    &format!("environment.{name}"),
                    format!(
                        "is {bytes} bytes as NAME=VALUE with its NUL; Linux takes at most {MAX_ARG_STRLEN} per string"
                    ),
                );
                // The same for every command: said once.
                break;
            }
            Err(ExecveTooBig::Total { bytes, limit }) => r.error(
                if environment.is_empty() {
                    key
                } else {
                    "environment"
                },
                too_big_for_execve(key, bytes, limit),
            ),
        }
    }
}

/// `ha` and `nodes`: None, with errors, when they do not hold together.
fn ha_policy(r: &mut Reader, host: &HostSettings, force_off_on_timeout: bool) -> Option<HaPolicy> {
    let ha = r.bool("ha", false);
    let nodes = r.text_list("nodes", "node name").unwrap_or_default();
    if !ha {
        if !nodes.is_empty() {
            r.error("nodes", "is for ha = true: the nodes that may run an HA workload");
        }
        return None;
    }
    if host.cluster.is_none() {
        r.error(
            "ha",
            "needs a valid [cluster] section in berth.toml: HA ownership is shared through etcd",
        );
    }
    if !force_off_on_timeout {
        r.error(
            "ha",
            "needs a bounded stop: with force_off_on_timeout = false the unit's TimeoutStopSec= is infinity, \
             and a peer could never know when it is down to take it over",
        );
    }
    if nodes.is_empty() {
        r.error(
            "nodes",
            "missing: the nodes that may run it, in order of preference, e.g. nodes = [\"n1\", \"n2\"]",
        );
    } else if nodes.len() > MAX_HA_NODES {
        r.error(
            "nodes",
            format!("has {} names; at most {MAX_HA_NODES}", nodes.len()),
        );
    }
    for (i, n) in nodes.iter().enumerate() {
        if let Err(why) = super::cluster::check_node_name(n) {
            r.error(
                &format!("nodes[{i}]"),
                format!("{:?} {why}", n.escape_debug().to_string()),
            );
        } else if nodes[..i].contains(n) {
            r.error(&format!("nodes[{i}]"), format!("{n:?} is listed twice"));
        }
    }
    Some(HaPolicy { nodes })
}

/// A `libvirt =` workload: its domain, with the keys that do not apply
/// refused.
fn libvirt_kind(r: &mut Reader, domain: String, host: &HostSettings) -> Option<WorkloadKind> {
    for key in ["exec", "unit"] {
        if r.take(key).is_some() {
            r.error(
                key,
                "and libvirt are both set: a workload is one of a command (exec), an existing unit (unit) or a libvirt guest (libvirt)",
            );
        }
    }
    for key in PROCESS_KEYS.iter().chain(&["service"]) {
        if r.take(key).is_some() {
            r.error(
                key,
                "does not apply to a libvirt guest: QEMU runs in libvirt's machine scope; set it in the domain (virsh edit)",
            );
        }
    }
    if host.manager == Manager::User {
        r.error(
            "libvirt",
            "is for the system manager: a user manager's qemu:///session has no machine scopes to order",
        );
    }
    let shutdown_mode =
        guests::shutdown_modes(r, "shutdown_mode").unwrap_or_else(|| host.libvirt.shutdown_mode.clone());
    libvirt_domain(r, domain).map(|domain| WorkloadKind::Libvirt {
        domain,
        shutdown_mode,
    })
}

/// An argv for `exec`/`stop_exec`: a non-empty list of strings whose first
/// item is an absolute path or a bare command name (which systemd looks up
/// in its fixed search path).
fn argv(r: &mut Reader, key: &str, value: &Value) -> Option<Vec<String>> {
    let Value::Array(items) = value else {
        r.error(
            key,
            format!(
                "must be a list of strings (the argv), not {}; e.g. {key} = [\"/usr/bin/prog\", \"--flag\"]",
                value.type_str()
            ),
        );
        return None;
    };
    if items.is_empty() {
        r.error(key, "must not be empty: the first item is the program to run");
        return None;
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Value::String(s) = item else {
            r.error(
                &format!("{key}[{i}]"),
                format!("must be a string, not {}", item.type_str()),
            );
            return None;
        };
        if let Some(c) = control_char(s) {
            r.error(&format!("{key}[{i}]"), describe_control(c));
            return None;
        }
        out.push(s.clone());
    }
    let total: usize = out.iter().map(String::len).sum();
    if total > MAX_VALUE_LEN {
        r.error(
            key,
            format!("is {total} bytes long in all; at most {MAX_VALUE_LEN}"),
        );
        return None;
    }
    // Quoting adds bytes the sum above does not count (an empty argument
    // takes three): bound the line systemd will read.
    let line = crate::unit_text::exec_line(&out).len();
    if line > MAX_EXEC_LINE {
        r.error(
            key,
            format!("renders to a command line of {line} bytes; at most {MAX_EXEC_LINE}"),
        );
        return None;
    }
    if let Err(why) = check_program(&out[0]) {
        r.error(&format!("{key}[0]"), format!("{:?} {why}", out[0]));
        return None;
    }
    Some(out)
}

/// Why a command and the environment would not pass `execve`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ExecveTooBig {
    /// Argument and environment strings together, with their pointers.
    Total { bytes: usize, limit: usize },
    /// One `NAME=VALUE` string, with its NUL.
    Variable { name: String, bytes: usize },
}

/// Why a command and the environment together are too big for execve.
fn too_big_for_execve(command: &str, bytes: usize, limit: usize) -> String {
    format!(
        "with {command} takes {bytes} bytes of execve's arguments and environment (strings, NULs and \
         pointers); at most {limit}: Linux's limit at the workload's LimitSTACK= (8M when not set), less \
         {EXECVE_RESERVE} for the variables systemd adds"
    )
}

/// Linux's limit on one argument or environment string, NUL included.
const MAX_ARG_STRLEN: usize = 32 * 4096;
/// Room left for what systemd and the manager add to the environment
/// (INVOCATION_ID, NOTIFY_SOCKET, PATH, the manager's DefaultEnvironment=).
const EXECVE_RESERVE: usize = 32 * 1024;

/// Linux's bound on execve's strings and pointers (fs/exec.c): a quarter
/// of the stack limit, at most three quarters of 8 MiB, at least 32 pages.
fn execve_limit(limit_stack: Option<&str>) -> usize {
    const DEFAULT_STACK: u64 = 8 << 20;
    let stack = match limit_stack {
        None => DEFAULT_STACK,
        Some(v) => passthrough::rlimit_bytes(v).unwrap_or(u64::MAX),
    };
    let quarter = usize::try_from(stack / 4).unwrap_or(usize::MAX);
    quarter.clamp(MAX_ARG_STRLEN, 6 << 20)
}

/// Whether `argv` run with `environment` stays within what execve takes.
fn execve_fits(
    argv: &[String],
    environment: &BTreeMap<String, String>,
    limit_stack: Option<&str>,
) -> Result<(), ExecveTooBig> {
    const POINTER: usize = std::mem::size_of::<usize>();
    let mut bytes: usize = argv.iter().map(|a| a.len() + 1 + POINTER).sum();
    for (name, value) in environment {
        let string = name.len() + 1 + value.len() + 1;
        if string > MAX_ARG_STRLEN {
            return Err(ExecveTooBig::Variable {
                name: name.clone(),
                bytes: string,
            });
        }
        bytes += string + POINTER;
    }
    let limit = execve_limit(limit_stack).saturating_sub(EXECVE_RESERVE);
    if bytes > limit {
        return Err(ExecveTooBig::Total { bytes, limit });
    }
    Ok(())
}

/// The longest argv (all words together) or environment value. Escaping
/// at most doubles it, which keeps every generated line far below the
/// 1 MiB at which systemd stops reading a unit file.
pub const MAX_VALUE_LEN: usize = 128 * 1024;

/// The longest `ExecStart=`/`ExecStop=` value once quoted: a quarter of
/// the 1 MiB line at which systemd stops reading a unit file.
pub const MAX_EXEC_LINE: usize = 256 * 1024;

/// What systemd accepts as the program of ExecStart=: an absolute,
/// normalized path to a file (not a directory), or a bare name that systemd
/// looks up in its fixed search path.
fn check_program(program: &str) -> Result<(), &'static str> {
    let Some(rest) = program.strip_prefix('/') else {
        let bare = program.starts_with(|c: char| c.is_ascii_alphanumeric())
            && program.len() <= 255
            && program
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '+'));
        return if bare {
            Ok(())
        } else {
            Err("must be an absolute path or a plain command name")
        };
    };
    if program.contains(['"', '\'', '\\']) {
        // systemd refuses these in the program path ("special characters").
        return Err("must not contain quotes or backslashes (systemd refuses such a program path)");
    }
    if program.len() >= 4096 {
        return Err("is longer than a path may be (4095 bytes)");
    }
    if rest.is_empty() || rest.ends_with('/') {
        return Err("names a directory; it must name the program file");
    }
    if rest.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err("must be a normalized path (no //, . or .. components)");
    }
    if rest.split('/').any(|c| c.len() > 255) {
        return Err("has a path component longer than 255 bytes");
    }
    Ok(())
}

fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// User and group names as Debian's adduser accepts them, or a numeric id.
fn account_name_ok(r: &mut Reader, key: &str, name: &str) -> bool {
    // systemd drops User= with an id it cannot use (65535 and 4294967295
    // are reserved, leading zeros are refused): the workload would run as
    // root. Only canonical ids in range pass.
    let numeric = name
        .parse::<u32>()
        .is_ok_and(|id| id.to_string() == name && id != 65_535 && id != u32::MAX);
    let body = name.strip_suffix('$').unwrap_or(name);
    let named = (1..=32).contains(&body.len())
        && body.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && body
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if numeric || named {
        true
    } else {
        r.error(key, format!("{name:?} is not a valid {key} name or numeric id"));
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_text(text: &str) -> Result<Workload, Vec<String>> {
        let dir = std::env::temp_dir().join(format!(
            "berth-wl-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("web.toml");
        std::fs::write(&path, text).unwrap();
        let out = load("web", &path, &HostSettings::default()).map_err(|es| {
            es.iter()
                .map(|e| e.to_string().replace(&*dir.to_string_lossy(), "D"))
                .collect()
        });
        std::fs::remove_dir_all(&dir).unwrap();
        out
    }

    #[test]
    fn minimal_workload_takes_host_defaults() {
        let w = load_text(r#"exec = ["/bin/sleep", "infinity"]"#).unwrap();
        assert_eq!(w.name, "web");
        assert_eq!(w.unit_name(), "berth@web.service");
        assert_eq!(w.autostart, super::Autostart::Yes);
        assert_eq!(w.order, 0);
        assert_eq!(w.stop_delay_s, 60);
        assert!(w.force_off_on_timeout);
        assert_eq!(w.stop_action, StopAction::GuestShutdown);
        assert_eq!(
            w.kind,
            WorkloadKind::Command {
                exec: vec!["/bin/sleep".into(), "infinity".into()],
                stop_exec: None
            }
        );
    }

    /// `autostart`: each input and what it gives (Err: the message).
    #[test]
    fn autostart_is_true_false_or_last_state_and_defaults_to_the_hosts() {
        let cases: &[(&str, Result<Autostart, &str>)] = &[
            ("autostart = true", Ok(Autostart::Yes)),
            ("autostart = false", Ok(Autostart::No)),
            ("autostart = \"last-state\"", Ok(Autostart::LastState)),
            (
                "autostart = \"last_state\"",
                Err("D/web.toml: autostart: must be true, false or \"last-state\", not \"last_state\""),
            ),
            (
                "autostart = \"yes\\n\"",
                Err("D/web.toml: autostart: must be true, false or \"last-state\", not \"yes\\n\""),
            ),
            (
                "autostart = 1",
                Err("D/web.toml: autostart: must be true, false or \"last-state\", not integer"),
            ),
        ];
        for (line, want) in cases {
            let got = load_text(&format!("exec = [\"/bin/x\"]\n{line}"));
            match want {
                Ok(mode) => assert_eq!(got.map(|w| w.autostart).as_ref(), Ok(mode), "{line}"),
                Err(message) => assert_eq!(got.unwrap_err(), vec![message.to_string()], "{line}"),
            }
        }
        let host = HostSettings {
            default_autostart: Autostart::LastState,
            ..HostSettings::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vm.toml");
        std::fs::write(&path, "exec = [\"/bin/x\"]").unwrap();
        assert_eq!(load("vm", &path, &host).unwrap().autostart, Autostart::LastState);
        std::fs::write(&path, "exec = [\"/bin/x\"]\nautostart = true").unwrap();
        assert_eq!(load("vm", &path, &host).unwrap().autostart, Autostart::Yes);
    }

    #[test]
    fn missing_exec_and_bad_values_are_all_named() {
        let e = load_text("order = \"first\"\nstop_action = \"halt\"\nfoo = 1").unwrap_err();
        assert_eq!(e.len(), 4, "{e:?}");
        assert!(e.iter().any(|m| m.starts_with("D/web.toml: exec: missing")));
        assert!(
            e.iter()
                .any(|m| m == "D/web.toml: order: must be an integer, not string")
        );
        assert!(e.iter().any(|m| {
            m.contains("stop_action: must be \"guest_shutdown\", \"power_off\" or \"save\", not \"halt\"")
        }));
        assert!(e.iter().any(|m| m.starts_with("D/web.toml: foo: unknown key")));
    }

    /// `unit =`: each input carries what it must give.
    #[test]
    fn existing_units() {
        let w = load_text(
            "unit = \"postgresql@15-main.service\"\norder = 2\nafter = [\"network-online.target\"]",
        )
        .unwrap();
        assert_eq!(w.unit_name(), "postgresql@15-main.service");
        assert_eq!(w.existing_unit(), Some("postgresql@15-main.service"));
        assert_eq!(w.after, ["network-online.target"]);
        let w = load_text("unit = \"db.service\"\n[service]\nMemoryMax = \"1G\"").unwrap();
        assert_eq!(w.service.len(), 1);
        for (text, message) in [
            (
                "unit = \"db.service\"\nexec = [\"/bin/true\"]\nstop_exec = [\"/bin/true\"]",
                "D/web.toml: unit: and exec are both set: a workload is either a command berth runs (exec) or an existing unit (unit)",
            ),
            (
                "unit = \"db.socket\"",
                "D/web.toml: unit: \"db.socket\" is not a service unit name; name an existing service, e.g. unit = \"postgresql.service\"",
            ),
            (
                "unit = \"getty@.service\"",
                "D/web.toml: unit: \"getty@.service\" is not a service unit name; name an existing service, e.g. unit = \"postgresql.service\"",
            ),
            (
                "unit = \"berth@db.service\"",
                "D/web.toml: unit: berth@db.service is one of berth's own units",
            ),
            (
                "unit = \"berth-drain.service\"",
                "D/web.toml: unit: berth-drain.service is one of berth's own units",
            ),
            (
                "unit = \"dbus.service\"",
                "D/web.toml: unit: dbus.service is part of the service manager, the bus or the shutdown; berth cannot take it over",
            ),
            (
                "unit = \"systemd-journald.service\"",
                "D/web.toml: unit: systemd-journald.service is part of the service manager, the bus or the shutdown; berth cannot take it over",
            ),
            (
                "unit = \"systemd-poweroff.service\"",
                "D/web.toml: unit: systemd-poweroff.service is part of the service manager, the bus or the shutdown; berth cannot take it over",
            ),
            (
                "unit = \"db.service\"\nready = \"notify\"",
                "D/web.toml: ready: is for a command berth runs (exec); an existing unit keeps its own: change it in the unit (systemctl edit)",
            ),
            (
                "unit = \"db.service\"\nstop_exec = [\"/bin/kill\"]",
                "D/web.toml: stop_exec: is for a command berth runs (exec); an existing unit keeps its own: change it in the unit (systemctl edit)",
            ),
            (
                "unit = \"db.service\"\n[environment]\nA = \"b\"",
                "D/web.toml: environment: is for a command berth runs (exec); an existing unit keeps its own: change it in the unit (systemctl edit)",
            ),
            (
                "unit = \"db.service\"\nwants = [\"x.target\", \"db.service\"]",
                "D/web.toml: wants[1]: a workload cannot depend on itself",
            ),
            ("unit = 3", "D/web.toml: unit: must be a string, not integer"),
        ] {
            let e = load_text(text).unwrap_err();
            assert_eq!(e, [message], "{text}");
        }
    }

    /// `libvirt =`: each input carries what it must give.
    #[test]
    fn libvirt_guests() {
        let w = load_text("libvirt = \"vm-1.prod\"\nstop_delay_s = 120\norder = 3").unwrap();
        assert_eq!(w.libvirt_domain(), Some("vm-1.prod"));
        assert_eq!(w.unit_name(), "berth@web.service");
        assert_eq!(w.existing_unit(), None);
        for (text, message) in [
            (
                "libvirt = \"-c\"",
                "D/web.toml: libvirt: \"-c\" is not a domain name berth accepts: 1-128 characters from A-Z a-z 0-9 _ . + : -, starting with a letter or digit",
            ),
            (
                "libvirt = \"a b\"",
                "D/web.toml: libvirt: \"a b\" is not a domain name berth accepts: 1-128 characters from A-Z a-z 0-9 _ . + : -, starting with a letter or digit",
            ),
            (
                "libvirt = \"3\"",
                "D/web.toml: libvirt: \"3\" reads as a domain ID to virsh, which would look it up as one (another guest's, maybe) before its name: rename the domain (virsh domrename)",
            ),
            (
                "libvirt = \"4dea22b3-1d52-d8f3-2516-782e98ab3fa0\"",
                "D/web.toml: libvirt: \"4dea22b3-1d52-d8f3-2516-782e98ab3fa0\" reads as a domain UUID to virsh, which would look it up as one (another guest's, maybe) before its name: rename the domain (virsh domrename)",
            ),
            (
                "libvirt = \"4dea22b31d52d8f32516782e98ab3fa0\"",
                "D/web.toml: libvirt: \"4dea22b31d52d8f32516782e98ab3fa0\" reads as a domain UUID to virsh, which would look it up as one (another guest's, maybe) before its name: rename the domain (virsh domrename)",
            ),
            (
                "libvirt = \"vm\"\nexec = [\"/bin/true\"]",
                "D/web.toml: exec: and libvirt are both set: a workload is one of a command (exec), an existing unit (unit) or a libvirt guest (libvirt)",
            ),
            (
                "libvirt = \"vm\"\nuser = \"nobody\"",
                "D/web.toml: user: does not apply to a libvirt guest: QEMU runs in libvirt's machine scope; set it in the domain (virsh edit)",
            ),
            (
                "libvirt = \"vm\"\n[service]\nMemoryMax = \"1G\"",
                "D/web.toml: service: does not apply to a libvirt guest: QEMU runs in libvirt's machine scope; set it in the domain (virsh edit)",
            ),
            (
                "libvirt = 7",
                "D/web.toml: libvirt: must be a string, not integer",
            ),
            (
                "unit = \"db.service\"\nstop_action = \"save\"",
                "D/web.toml: stop_action: \"save\" is for libvirt guests (a managed save); use \"guest_shutdown\" or \"power_off\"",
            ),
        ] {
            let e = load_text(text).unwrap_err();
            assert_eq!(e, [message], "{text}");
        }
        let w = load_text("libvirt = \"vm\"\nstop_action = \"save\"").unwrap();
        assert_eq!(w.stop_action, StopAction::Save);
        let long = format!("libvirt = \"{}\"", "v".repeat(MAX_DOMAIN_LEN + 1));
        assert!(load_text(&long).is_err());
        // Hostile values for both names: a newline, a specifier, a huge one.
        for key in ["libvirt", "unit"] {
            for value in ["vm\\n[Service]", "vm%h.service", &"v".repeat(100_000)] {
                let text = format!("{key} = \"{value}\"");
                let e = load_text(&text).unwrap_err();
                assert_eq!(e.len(), 1, "{text:.60}: {e:?}");
                assert!(e[0].starts_with(&format!("D/web.toml: {key}: ")), "{e:?}");
                assert!(e[0].len() < 100_200, "the message stays bounded");
            }
        }
    }

    #[test]
    fn readiness_keys() {
        let w = load_text(r#"exec = ["/bin/true"]"#).unwrap();
        assert_eq!((w.ready, w.ready_exec), (Readiness::Exec, None));
        let w =
            load_text("exec = [\"/bin/true\"]\nready = \"notify\"\nready_exec = [\"pg_isready\", \"-q\"]")
                .unwrap();
        assert_eq!(w.ready, Readiness::Notify);
        assert_eq!(
            w.ready_exec,
            Some(vec!["pg_isready".to_string(), "-q".to_string()])
        );
        let e = load_text("exec = [\"/bin/true\"]\nready = \"sometimes\"\nready_exec = [\"rel/probe\"]")
            .unwrap_err();
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(
            e.iter()
                .any(|m| m == "D/web.toml: ready: must be \"exec\" or \"notify\", not \"sometimes\""),
            "{e:?}"
        );
        assert!(
            e.iter().any(|m| m.starts_with("D/web.toml: ready_exec[0]:")),
            "{e:?}"
        );
    }

    /// Issue 31, item 6: 30 values of 100 kB passed, the drop-in was 3 MB
    /// and the start failed with 203/EXEC (E2BIG).
    #[test]
    fn what_execve_takes_is_bounded() {
        let env = |n: usize, len: usize| {
            let mut t = String::from("exec = [\"/bin/x\", \"a\"]\n[environment]\n");
            for i in 0..n {
                t.push_str(&format!("V{i} = \"{}\"\n", "x".repeat(len)));
            }
            t
        };
        let e = load_text(&env(30, 100_000)).unwrap_err();
        assert!(
            e[0].contains("D/web.toml: environment: with exec takes 3000")
                && e[0].contains("at most 2064384"),
            "{e:?}"
        );
        assert!(
            load_text(&env(10, 100_000)).is_ok(),
            "1 MB fits the default 2 MiB"
        );
        // A smaller stack limit lowers Linux's bound: a quarter of it.
        let small = format!("{}[service]\nLimitSTACK = \"1M\"\n", env(3, 100_000));
        let e = load_text(&small).unwrap_err();
        assert!(e[0].contains("at most 229376"), "{e:?}");
        // One string is at most 32 pages, NUL included.
        let e = load_text(&env(1, MAX_VALUE_LEN - 1)).unwrap_err();
        assert!(
            e[0].contains("environment.V0: is 131075 bytes as NAME=VALUE with its NUL"),
            "{e:?}"
        );
        // The stop command is counted with the same environment.
        let stop = format!(
            "exec = [\"/bin/x\"]\nstop_exec = [\"/bin/y\", \"{}\"]\n",
            "s".repeat(100_000)
        );
        assert!(load_text(&stop).is_ok());
        assert_eq!(execve_limit(Some("infinity")), 6 << 20);
        assert_eq!(execve_limit(Some("64K")), MAX_ARG_STRLEN);
    }

    #[test]
    fn argv_rules() {
        assert!(
            load_text(r#"exec = "/bin/true""#).unwrap_err()[0].contains("exec: must be a list of strings")
        );
        assert!(load_text("exec = []").unwrap_err()[0].contains("must not be empty"));
        assert!(load_text(r#"exec = ["bin/x"]"#).unwrap_err()[0].contains("exec[0]"));
        assert!(load_text(r#"exec = ["-x"]"#).unwrap_err()[0].contains("absolute path or a plain command"));
        assert!(
            load_text(r#"exec = ["/bin/x", "a\nb"]"#).unwrap_err()[0]
                .contains("exec[1]: contains the control character U+000A")
        );
        assert!(
            load_text(r#"exec = ["/bin/x", 3]"#).unwrap_err()[0]
                .contains("exec[1]: must be a string, not integer")
        );
        assert!(load_text(r#"exec = ["sleep", "1"]"#).is_ok());
        for bad in [
            "/bin/sleep/",
            "/",
            "/a//b",
            "/a/./b",
            "/a/../b",
            "/a\"b",
            "/a'b",
            "/a\\b",
        ] {
            let e = load_text(&format!("exec = [{bad:?}]")).unwrap_err();
            assert!(e[0].contains("exec[0]"), "{bad}: {e:?}");
        }
        let long = format!("exec = [\"/x\", \"{}\"]", "a".repeat(MAX_VALUE_LEN));
        assert!(load_text(&long).unwrap_err()[0].contains("at most 131072"));
        // Issue 10, defect 6: 400,000 empty words are 0 bytes of argument
        // and a 1.2 MB line.
        let empties = format!("exec = [\"/usr/bin/app\"{}]", ", \"\"".repeat(400_000));
        let e = load_text(&empties).unwrap_err();
        assert!(
            e[0].contains("renders to a command line of 12") && e[0].contains("bytes; at most 262144"),
            "{e:?}"
        );
        let long_name = format!("exec = [\"/{}\"]", "a".repeat(256));
        assert!(load_text(&long_name).unwrap_err()[0].contains("longer than 255"));
    }

    #[test]
    fn dependency_rules() {
        let e = load_text("exec = [\"/x\"]\nafter = [\"berth-drain.service\"]").unwrap_err();
        assert!(
            e[0].contains("after[0]: berth-drain.service is one of berth's own units"),
            "{e:?}"
        );
        let e = load_text("exec = [\"/x\"]\nwants = [\"poweroff.target\"]").unwrap_err();
        assert!(
            e[0].contains("wants[0]: poweroff.target is a shutdown or rescue unit"),
            "{e:?}"
        );
        let e = load_text("exec = [\"/x\"]\nwants = [\"berth@web.service\"]").unwrap_err();
        assert!(
            e[0].contains("wants[0]: a workload cannot depend on itself"),
            "{e:?}"
        );
        let w =
            load_text("exec = [\"/x\"]\nafter = [\"berth@db.service\", \"network-online.target\"]").unwrap();
        assert_eq!(w.after, ["berth@db.service", "network-online.target"]);
    }

    #[test]
    fn environment_user_group() {
        let w = load_text(
            "exec = [\"/x\"]\nuser = \"nobody\"\ngroup = \"65534\"\n[environment]\nA_1 = \"x y %h $Z\"",
        )
        .unwrap();
        assert_eq!(w.environment["A_1"], "x y %h $Z");
        assert_eq!(w.user.as_deref(), Some("nobody"));
        assert_eq!(w.group.as_deref(), Some("65534"));
        let e = load_text("exec = [\"/x\"]\nuser = \"bad name\"\n[environment]\n\"1X\" = \"v\"\nY = 2")
            .unwrap_err();
        assert_eq!(e.len(), 3, "{e:?}");
        for bad in ["65535", "4294967295", "0001", "4294967296", "-1"] {
            let e = load_text(&format!("exec = [\"/x\"]\nuser = {bad:?}")).unwrap_err();
            assert!(
                e[0].contains("not a valid user name or numeric id"),
                "{bad}: {e:?}"
            );
        }
        assert!(load_text("exec = [\"/x\"]\nuser = \"0\"\ngroup = \"4294967294\"").is_ok());
    }

    #[test]
    fn description_trailing_backslash_is_found_after_trimming() {
        let e = load_text("exec = [\"/x\"]\ndescription = 'ends with \\  '").unwrap_err();
        assert!(e[0].contains("backslash"), "{e:?}");
        let w = load_text("exec = [\"/x\"]\ndescription = '  padded  '").unwrap();
        assert_eq!(w.description.as_deref(), Some("padded"));
    }

    #[test]
    fn description_limits() {
        assert!(
            load_text("exec = [\"/x\"]\ndescription = 'ends with \\'").unwrap_err()[0].contains("backslash")
        );
        assert_eq!(
            load_text("exec = [\"/x\"]\ndescription = \"Web 100%\"")
                .unwrap()
                .description
                .as_deref(),
            Some("Web 100%")
        );
    }
}
