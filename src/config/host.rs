//! `berth.toml` and its `berth.toml.d/*.toml` fragments.

use std::path::{Path, PathBuf};

use toml::Table;

use super::checks::{Autostart, MAX_DELAY_S, check_unit_list};
use super::cluster::{self, ClusterSettings};
use super::guests::{self, LibvirtSettings};
use super::read::{Origin, Reader, merge, parse_file};
use super::restart::{self, RestartPolicy};
use super::{ConfigError, Manager};
use crate::paths::Root;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSettings {
    /// Stops in flight at once within one drain group.
    pub drain_parallelism: u32,
    pub force_off_on_timeout: bool,
    /// Bound on the whole drain.
    pub drain_deadline_s: u64,
    pub default_stop_delay_s: u64,
    /// A workload's `autostart` when it does not say.
    pub default_autostart: Autostart,
    /// A workload's `restart`, its delay and start limit when it does not
    /// say (`default_restart`, …).
    pub default_restart: RestartPolicy,
    /// Units the drain must run before on shutdown (they stay up until the
    /// drain is done).
    pub drain_after: Vec<String>,
    pub daemon: DaemonSettings,
    /// `[cluster]`: None on a single host (and when the section has errors).
    pub cluster: Option<ClusterSettings>,
    /// `[libvirt]`: which guests are workloads, and their defaults.
    pub libvirt: LibvirtSettings,
    /// The manager these settings are for (decides defaults and limits).
    pub manager: Manager,
}

/// A user manager is stopped within user@.service's TimeoutStopSec (120 s
/// by default): a default config must fit under it.
pub const USER_DEFAULT_DRAIN_DEADLINE_S: u64 = 60;
pub const USER_DEFAULT_STOP_DELAY_S: u64 = 30;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonSettings {
    pub enabled: bool,
    /// 0 disables the watchdog.
    pub watchdog_s: u64,
    pub reconcile_interval_s: u64,
    /// 0 disables the record sweep.
    pub gc_interval_s: u64,
    pub api: bool,
    pub socket: PathBuf,
    /// The opt-in TCP listener for `/metrics` alone.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The directory where the daemon keeps `berth.prom` for
    /// node_exporter's textfile collector.
    pub metrics_textfile: Option<PathBuf>,
}

impl Default for HostSettings {
    fn default() -> Self {
        HostSettings {
            drain_parallelism: 4,
            force_off_on_timeout: true,
            drain_deadline_s: 180,
            default_stop_delay_s: 60,
            default_autostart: Autostart::Yes,
            default_restart: RestartPolicy::default(),
            drain_after: Vec::new(),
            daemon: DaemonSettings::default(),
            cluster: None,
            libvirt: LibvirtSettings::default(),
            manager: Manager::System,
        }
    }
}

impl HostSettings {
    /// The built-in defaults for the manager and paths of `root`.
    pub fn defaults_for(root: &Root) -> Self {
        let mut d = HostSettings::default();
        if root.manager() == Manager::User {
            d.manager = Manager::User;
            d.drain_deadline_s = USER_DEFAULT_DRAIN_DEADLINE_S;
            d.default_stop_delay_s = USER_DEFAULT_STOP_DELAY_S;
        }
        d.daemon.socket = root.default_socket();
        d
    }
}

impl Default for DaemonSettings {
    fn default() -> Self {
        DaemonSettings {
            enabled: true,
            watchdog_s: 30,
            reconcile_interval_s: 5,
            gc_interval_s: 0,
            api: true,
            socket: PathBuf::from("/run/berthd/api.sock"),
            metrics_listen: None,
            metrics_textfile: None,
        }
    }
}

const HOST_KEYS: &[&str] = &[
    "drain_parallelism",
    "force_off_on_timeout",
    "drain_deadline_s",
    "default_stop_delay_s",
    "default_autostart",
    "default_restart",
    "default_restart_delay_s",
    "default_start_limit_interval_s",
    "default_start_limit_burst",
    "drain_after",
    "daemon",
    "cluster",
    "libvirt",
];
const DAEMON_KEYS: &[&str] = &[
    "enabled",
    "watchdog_s",
    "reconcile_interval_s",
    "gc_interval_s",
    "api",
    "socket",
    "metrics_listen",
    "metrics_textfile",
];

/// `metrics_listen`'s value: a port alone (on loopback: 127.0.0.1), or
/// `ADDRESS:PORT` (`[V6]:PORT`) for another address, named by the admin.
fn metrics_listen(value: &toml::Value) -> Result<std::net::SocketAddr, String> {
    const WANT: &str = "a port (1 to 65535, on 127.0.0.1) or \"ADDRESS:PORT\"";
    let addr = match value {
        toml::Value::Integer(port) => match u16::try_from(*port) {
            Ok(port) if port > 0 => std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            _ => return Err(format!("must be {WANT}, not {port}")),
        },
        toml::Value::String(text) => text
            .parse::<std::net::SocketAddr>()
            .map_err(|_| format!("must be {WANT}, not {:?}", text))?,
        other => return Err(format!("must be {WANT}, not {}", other.type_str())),
    };
    if addr.port() == 0 {
        return Err(format!(
            "must be {WANT}: port 0 would be a different port at each start"
        ));
    }
    Ok(addr)
}

/// The daemon's sandbox gives it a /tmp and /var/tmp of its own and hides
/// home directories: a textfile there would never reach node_exporter.
const HIDDEN_FROM_THE_DAEMON: [&str; 5] = ["/tmp", "/var/tmp", "/home", "/root", "/run/user"];

/// `metrics_textfile`'s value: an absolute directory the daemon's sandbox
/// can make writable and node_exporter can see.
fn textfile_dir(dir: &str) -> Result<(), String> {
    if !dir.starts_with('/') || dir.split('/').any(|part| part == "..") {
        return Err(format!(
            "must be an absolute path to a directory, without \"..\", not {dir:?}"
        ));
    }
    if dir.len() > 4000 {
        return Err(format!("is {} bytes long; at most 4000", dir.len()));
    }
    let path = Path::new(dir);
    if let Some(hidden) = HIDDEN_FROM_THE_DAEMON.iter().find(|h| path.starts_with(h)) {
        return Err(format!(
            "is under {hidden}, which the daemon's sandbox keeps private (PrivateTmp=, ProtectHome=): node_exporter \
             would never see the file"
        ));
    }
    Ok(())
}

/// `sun_path` holds 108 bytes including the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;

/// Merges and validates the host files (main file first, then fragments).
///
/// Errors never discard what is valid: a setting in error, and every
/// setting of a file that cannot be parsed, takes its built-in default
/// (unless another host file sets it); every valid setting applies. An
/// admin's `force_off_on_timeout = false` must not be lost to a typo in
/// `drain_parallelism`: the workloads inherit these defaults.
pub(super) fn load(files: &[PathBuf], defaults: &HostSettings) -> (HostSettings, Vec<ConfigError>) {
    let mut errors = Vec::new();
    let mut merged = Table::new();
    let mut origin = Origin::single(
        files
            .first()
            .map(PathBuf::as_path)
            .unwrap_or(Path::new("berth.toml")),
    );
    for file in files {
        match parse_file(file) {
            Ok(table) => {
                origin.record("", &table, file);
                merge(&mut merged, table);
            }
            Err(e) => errors.push(e),
        }
    }
    let settings = validate(&merged, &origin, defaults, &mut errors);
    (settings, errors)
}

fn validate(table: &Table, origin: &Origin, d: &HostSettings, errors: &mut Vec<ConfigError>) -> HostSettings {
    let manager = d.manager;
    let mut r = Reader::new(table, "", origin);
    let drain_parallelism = r.int("drain_parallelism", d.drain_parallelism.into(), 1, 4096) as u32;
    let force_off_on_timeout = r.bool("force_off_on_timeout", d.force_off_on_timeout);
    let default_stop_delay_s = r.int(
        "default_stop_delay_s",
        d.default_stop_delay_s as i64,
        1,
        MAX_DELAY_S,
    ) as u64;
    let default_autostart = r.autostart("default_autostart", d.default_autostart);
    let default_restart = restart::read(&mut r, "default_", d.default_restart);

    let mut drain_deadline_s = r.int("drain_deadline_s", d.drain_deadline_s as i64, 1, i64::MAX) as u64;
    if let Err(reason) = check_drain_deadline(drain_deadline_s, manager) {
        r.error("drain_deadline_s", reason.to_string());
        drain_deadline_s = d.drain_deadline_s;
    }

    let mut drain_after = Vec::new();
    if let Some(list) = r.text_list("drain_after", "unit name") {
        let file = r.file_of("drain_after");
        if let Err(e) = check_unit_list(&list, file, &r.key_path("drain_after"), None) {
            r.errors.push(e);
        } else {
            drain_after = list;
        }
    }

    let mut daemon = d.daemon.clone();
    let mut daemon_errors = Vec::new();
    let mut watchdog_set = false;
    if let Some(t) = r.opt_table("daemon") {
        watchdog_set = t.contains_key("watchdog_s");
        let mut dr = Reader::new(t, "daemon", r.origin());
        daemon.enabled = dr.bool("enabled", daemon.enabled);
        daemon.watchdog_s = dr.int("watchdog_s", daemon.watchdog_s as i64, 0, 3600) as u64;
        daemon.reconcile_interval_s = dr.int(
            "reconcile_interval_s",
            daemon.reconcile_interval_s as i64,
            1,
            3600,
        ) as u64;
        daemon.gc_interval_s = dr.int("gc_interval_s", daemon.gc_interval_s as i64, 0, MAX_DELAY_S) as u64;
        daemon.api = dr.bool("api", daemon.api);
        if let Some(socket) = dr.opt_text("socket") {
            if !socket.starts_with('/') {
                dr.error("socket", format!("must be an absolute path, not {socket:?}"));
            } else if socket.len() > MAX_SOCKET_PATH {
                dr.error(
                    "socket",
                    format!(
                        "is {} bytes long; a Unix socket path holds at most {MAX_SOCKET_PATH}",
                        socket.len()
                    ),
                );
            } else {
                daemon.socket = PathBuf::from(socket);
            }
        }
        match dr.take("metrics_listen") {
            None => {}
            Some(value) => match metrics_listen(value) {
                Ok(addr) => daemon.metrics_listen = Some(addr),
                Err(reason) => dr.error("metrics_listen", reason),
            },
        }
        if let Some(dir) = dr.opt_text("metrics_textfile") {
            match textfile_dir(&dir) {
                Ok(()) => daemon.metrics_textfile = Some(PathBuf::from(dir)),
                Err(reason) => dr.error("metrics_textfile", reason),
            }
        }
        daemon_errors = dr.finish(DAEMON_KEYS);
    }
    let cluster = r.opt_table("cluster").and_then(|t| {
        if manager == Manager::User {
            r.error("cluster", "is for the system manager: a user manager's workloads are not shared between hosts");
            return None;
        }
        if !cfg!(feature = "cluster") {
            r.error(
                "cluster",
                "is cluster mode, which this build of berth leaves out (built without the cargo feature \"cluster\"): this node runs single-host, and its HA workloads are refused",
            );
            return None;
        }
        let cluster = cluster::read(t, r.origin(), &mut r.errors)?;
        // A hung daemon must be killed before its lease could outlive it:
        // WatchdogSec= below the TTL minus the margin, and on.
        let max = cluster.max_watchdog_s();
        if !watchdog_set {
            daemon.watchdog_s = daemon.watchdog_s.min(max);
        } else if daemon.watchdog_s == 0 || daemon.watchdog_s > max {
            let file = r.file_of("daemon.watchdog_s").to_path_buf();
            daemon_errors.push(ConfigError::key(
                &file,
                "daemon.watchdog_s",
                format!(
                    "is {}, but with [cluster] lease_ttl_s = {} it must be 1 to {max}: below the lease's TTL minus \
                     the fence margin ({} ms), so that a hung daemon is killed, and its node fenced, before its \
                     lease could outlive it",
                    daemon.watchdog_s,
                    cluster.lease_ttl_s,
                    cluster.fence_margin().as_millis()
                ),
            ));
        }
        Some(cluster)
    });
    let libvirt = match r.opt_table("libvirt") {
        Some(t) => {
            let origin = r.origin();
            guests::read(t, origin, manager, default_autostart, &mut r.errors)
        }
        None => d.libvirt.clone(),
    };
    errors.append(&mut r.finish(HOST_KEYS));
    errors.append(&mut daemon_errors);

    HostSettings {
        drain_parallelism,
        force_off_on_timeout,
        drain_deadline_s,
        default_stop_delay_s,
        default_autostart,
        default_restart,
        drain_after,
        daemon,
        cluster,
        libvirt,
        manager,
    }
}

// ---------------------------------------------------------------------------
// The drain deadline's bound: what the manager's own shutdown limits leave.
// ---------------------------------------------------------------------------

/// systemd's `JobTimeoutSec=` on `poweroff.target` and `reboot.target`:
/// the whole shutdown transaction must finish within it.
pub const SYSTEM_SHUTDOWN_JOB_TIMEOUT_S: u64 = 30 * 60;

/// `TimeoutStopSec=` of `user@.service`: a user manager (and the user
/// drain inside it) must be done within it when the host shuts down.
pub const USER_MANAGER_STOP_TIMEOUT_S: u64 = 120;

/// Time a user manager needs after the drain to stop the rest of its units.
pub const USER_SHUTDOWN_HEADROOM_S: u64 = 15;

/// Time the drain keeps for itself after its deadline: forcing off what is
/// left, cancelling abandoned stop jobs, writing the report. The drain
/// unit's `TimeoutStopSec=` is the deadline plus this, so systemd never
/// kills a drain that is still doing its last duties.
pub const DRAIN_EXIT_MARGIN_S: u64 = 30;

/// Time the rest of the shutdown needs after the drain (units ordered after
/// it, unmounting), kept free under the manager's shutdown limit.
pub const SHUTDOWN_HEADROOM_S: u64 = 120;

/// A drain deadline that does not fit under the manager's shutdown limit;
/// the message names every number involved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadlineTooLong(String);

impl std::fmt::Display for DeadlineTooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DeadlineTooLong {}

/// Whether a drain deadline fits under the manager's own shutdown limit.
pub fn check_drain_deadline(deadline_s: u64, manager: Manager) -> Result<(), DeadlineTooLong> {
    let (limit, headroom, what) = match manager {
        Manager::System => (
            SYSTEM_SHUTDOWN_JOB_TIMEOUT_S,
            SHUTDOWN_HEADROOM_S,
            "the JobTimeoutSec of poweroff.target and reboot.target",
        ),
        Manager::User => (
            USER_MANAGER_STOP_TIMEOUT_S,
            USER_SHUTDOWN_HEADROOM_S,
            "the TimeoutStopSec of user@.service, which bounds a user manager's shutdown",
        ),
    };
    let unit_timeout = deadline_s.saturating_add(DRAIN_EXIT_MARGIN_S);
    let needed = unit_timeout.saturating_add(headroom);
    if needed > limit {
        return Err(DeadlineTooLong(format!(
            "{deadline_s} s does not fit: the drain unit's TimeoutStopSec would be {unit_timeout} s \
             (deadline + {DRAIN_EXIT_MARGIN_S} s margin), and with {headroom} s for the rest \
             of the shutdown that is {needed} s, over the {limit} s of {what}; use at most {} s",
            limit - DRAIN_EXIT_MARGIN_S - headroom
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<HostSettings, Vec<ConfigError>> {
        let table: Table = text.parse().unwrap();
        let origin = Origin::single(Path::new("/etc/berth/berth.toml"));
        let mut errors = Vec::new();
        let s = validate(&table, &origin, &HostSettings::default(), &mut errors);
        if errors.is_empty() { Ok(s) } else { Err(errors) }
    }

    fn messages(text: &str) -> Vec<String> {
        check(text).unwrap_err().iter().map(|e| e.to_string()).collect()
    }

    #[test]
    fn empty_file_gives_the_documented_defaults() {
        let s = check("").unwrap();
        assert_eq!(s, HostSettings::default());
        assert_eq!(s.drain_parallelism, 4);
        assert_eq!(s.drain_deadline_s, 180);
        assert_eq!(s.default_stop_delay_s, 60);
        assert!(s.daemon.enabled);
        assert_eq!(s.daemon.socket, Path::new("/run/berthd/api.sock"));
    }

    #[test]
    fn every_key_is_read() {
        let s = check(
            r#"
            drain_parallelism = 8
            force_off_on_timeout = false
            drain_deadline_s = 600
            default_stop_delay_s = 20
            default_autostart = "last-state"
            drain_after = ["libvirtd.service"]
            [daemon]
            enabled = false
            watchdog_s = 0
            reconcile_interval_s = 9
            gc_interval_s = 3600
            api = false
            socket = "/run/berthd/other.sock"
            "#,
        )
        .unwrap();
        assert_eq!(s.drain_parallelism, 8);
        assert!(!s.force_off_on_timeout);
        assert_eq!(s.drain_deadline_s, 600);
        assert_eq!(s.default_stop_delay_s, 20);
        assert_eq!(s.default_autostart, Autostart::LastState);
        assert_eq!(s.drain_after, vec!["libvirtd.service"]);
        assert!(!s.daemon.enabled);
        assert_eq!(s.daemon.watchdog_s, 0);
        assert_eq!(s.daemon.reconcile_interval_s, 9);
        assert_eq!(s.daemon.gc_interval_s, 3600);
        assert!(!s.daemon.api);
        assert_eq!(s.daemon.socket, Path::new("/run/berthd/other.sock"));
    }

    /// A build without cluster mode refuses `[cluster]`, naming the
    /// feature, and keeps the rest of berth.toml.
    #[cfg(not(feature = "cluster"))]
    #[test]
    fn cluster_mode_is_refused_by_a_build_without_it() {
        let table: Table =
            "drain_deadline_s = 40\n[cluster]\nnode = \"n1\"\nendpoints = [\"http://10.0.0.1:2379\"]\n"
                .parse()
                .unwrap();
        let origin = Origin::single(Path::new("/etc/berth/berth.toml"));
        let mut errors = Vec::new();
        let host = validate(&table, &origin, &HostSettings::default(), &mut errors);
        assert!(host.cluster.is_none());
        assert_eq!(host.drain_deadline_s, 40);
        assert_eq!(errors.len(), 1, "{errors:?}");
        let said = errors[0].to_string();
        assert!(
            said.contains("cluster") && said.contains("cargo feature \"cluster\""),
            "{said}"
        );
    }

    /// Issue 13: `[cluster]`, each input with what it must give.
    #[cfg(feature = "cluster")]
    #[test]
    fn cluster_settings_and_the_watchdog_they_need() {
        const EP: &str = "endpoints = [\"http://127.0.0.1:2379\"]";
        let s = check(&format!("[cluster]\n{EP}")).unwrap();
        let c = s.cluster.as_ref().unwrap();
        assert_eq!(
            (
                c.node.as_deref(),
                c.prefix.as_str(),
                c.lease_ttl_s,
                c.maintenance_grace_period_s,
                c.rejoin_grace_period_s
            ),
            (None, "/berth/", 10, 60, 90)
        );
        assert_eq!(
            s.daemon.watchdog_s, 5,
            "the default watchdog shrinks below TTL minus margin"
        );
        let s = check(&format!(
            "[daemon]\nwatchdog_s = 3\n[cluster]\n{EP}\nlease_ttl_s = 20"
        ))
        .unwrap();
        assert_eq!(s.daemon.watchdog_s, 3);
        let s = check(
            "[cluster]\nendpoints = [\"https://a:2379\"]\ntls_ca = \"/etc/ssl/ca.pem\"\n\
             tls_cert = \"/etc/berth/c.pem\"\ntls_key = \"/etc/berth/c.key\"\nnode = \"n-1.example\"",
        )
        .unwrap();
        assert!(s.cluster.unwrap().tls.unwrap().key.is_some());

        let f = "/etc/berth/berth.toml";
        for (text, want) in [
            (
                format!("[daemon]\nwatchdog_s = 30\n[cluster]\n{EP}"),
                format!(
                    "{f}: daemon.watchdog_s: is 30, but with [cluster] lease_ttl_s = 10 it must be 1 to 5"
                ),
            ),
            (
                format!("[daemon]\nwatchdog_s = 0\n[cluster]\n{EP}"),
                format!(
                    "{f}: daemon.watchdog_s: is 0, but with [cluster] lease_ttl_s = 10 it must be 1 to 5"
                ),
            ),
            ("[cluster]".into(), format!("{f}: cluster.endpoints: missing")),
            (
                "[cluster]\nendpoints = [\"10.0.0.1:2379\"]".into(),
                format!("{f}: cluster.endpoints[0]: \"10.0.0.1:2379\" must begin with http:// or https://"),
            ),
            (
                format!("[cluster]\n{EP}\nlease_ttl_s = 2"),
                format!("{f}: cluster.lease_ttl_s: must be from 3 to 3600, not 2"),
            ),
            (
                format!("[cluster]\n{EP}\nprefix = \"berth\""),
                format!("{f}: cluster.prefix: \"berth\" must begin and end with '/'"),
            ),
            (
                format!("[cluster]\n{EP}\nnode = \"a/b\""),
                format!("{f}: cluster.node: \"a/b\" may hold only"),
            ),
            (
                "[cluster]\nendpoints = [\"https://a:2379\"]".into(),
                format!("{f}: cluster.tls_ca: missing: https:// endpoints need the CA"),
            ),
            (
                format!("[cluster]\n{EP}\ntls_ca = \"/ca.pem\""),
                format!("{f}: cluster.tls_ca: is set, but the endpoints are http://"),
            ),
            (
                "[cluster]\nendpoints = [\"https://a:2379\"]\ntls_ca = \"/ca\"\ntls_cert = \"/c\"".into(),
                format!("{f}: cluster.tls_key: missing: a client certificate needs its key"),
            ),
            (
                format!("[cluster]\nendpoints = [\"http://{}:1\"]", "h".repeat(100_000)),
                format!("{f}: cluster.endpoints[0]: \"http://hhhh"),
            ),
            (
                format!(
                    "[cluster]\nendpoints = [\"https://a:2379\"]\ntls_ca = \"/{}\"",
                    "p".repeat(100_000)
                ),
                format!("{f}: cluster.tls_ca: is 100001 bytes long; at most 4095"),
            ),
            (
                format!("[cluster]\n{EP}\nlease = 3"),
                format!("{f}: cluster.lease: unknown key"),
            ),
        ] {
            let got = messages(&text);
            assert_eq!(got.len(), 1, "{text}: {got:?}");
            assert!(
                got[0].starts_with(&want),
                "{text}:\n got  {}\n want {want}",
                got[0]
            );
        }
        // A section with errors leaves the node single-host.
        let table: Table = "[cluster]\nlease_ttl_s = 1".parse().unwrap();
        let mut errors = Vec::new();
        let s = validate(
            &table,
            &Origin::single(Path::new(f)),
            &HostSettings::default(),
            &mut errors,
        );
        assert!(s.cluster.is_none() && errors.len() == 2, "{errors:?}");
    }

    #[test]
    fn errors_name_file_key_reason_and_numbers() {
        assert_eq!(
            messages("drain_parallelism = 0"),
            ["/etc/berth/berth.toml: drain_parallelism: must be from 1 to 4096, not 0"]
        );
        assert_eq!(
            messages("drain_parallelism = \"4\""),
            ["/etc/berth/berth.toml: drain_parallelism: must be an integer, not string"]
        );
        assert_eq!(
            messages("default_autostart = \"always\""),
            [
                "/etc/berth/berth.toml: default_autostart: must be true, false or \"last-state\", not \"always\""
            ]
        );
        let m = messages("[daemon]\nwatchdog = 3");
        assert_eq!(m.len(), 1);
        assert!(
            m[0].starts_with("/etc/berth/berth.toml: daemon.watchdog: unknown key"),
            "{m:?}"
        );
        let m = messages("drain_deadline_s = 1790");
        assert_eq!(m.len(), 1);
        assert!(m[0].contains("drain_deadline_s"), "{m:?}");
        assert!(
            m[0].contains("1820") && m[0].contains("1800") && m[0].contains("1650"),
            "{m:?}"
        );
    }

    #[test]
    fn a_setting_in_error_takes_its_default_and_the_rest_apply() {
        let table: Table = "force_off_on_timeout = false\ndefault_stop_delay_s = 600\ndrain_parallelism = 0"
            .parse()
            .unwrap();
        let mut errors = Vec::new();
        let origin = Origin::single(Path::new("/etc/berth/berth.toml"));
        let s = validate(&table, &origin, &HostSettings::default(), &mut errors);
        assert_eq!(errors.len(), 1);
        assert_eq!(s.drain_parallelism, 4);
        assert!(!s.force_off_on_timeout);
        assert_eq!(s.default_stop_delay_s, 600);
        let table: Table = "drain_deadline_s = 100000".parse().unwrap();
        let s = validate(&table, &origin, &HostSettings::default(), &mut errors);
        assert_eq!(
            s.drain_deadline_s, 180,
            "a deadline that does not fit takes the default"
        );
    }

    #[test]
    fn several_errors_are_all_reported() {
        let m = messages("drain_parallelism = -1\ndefault_stop_delay_s = 0\nbogus = 1");
        assert_eq!(m.len(), 3, "{m:?}");
    }

    #[test]
    fn drain_after_rejects_units_the_drain_stops() {
        let m = messages(r#"drain_after = ["berth@web.service"]"#);
        assert_eq!(m.len(), 1);
        assert!(
            m[0].contains("drain_after[0]") && m[0].contains("deadlock"),
            "{m:?}"
        );
        let m = messages(r#"drain_after = ["not a unit"]"#);
        assert!(m[0].contains("not a valid unit name"), "{m:?}");
    }

    #[test]
    fn socket_path_must_fit_sun_path() {
        let long = format!("[daemon]\nsocket = \"/{}\"", "x".repeat(120));
        assert!(messages(&long)[0].contains("at most 107"));
        assert!(messages("[daemon]\nsocket = \"rel.sock\"")[0].contains("absolute"));
    }

    #[test]
    fn metrics_listen_and_textfile() {
        let listen = |v: &str| {
            check(&format!("[daemon]\nmetrics_listen = {v}"))
                .map(|s| s.daemon.metrics_listen.unwrap().to_string())
        };
        assert_eq!(
            listen("9750").unwrap(),
            "127.0.0.1:9750",
            "a port alone is loopback's"
        );
        assert_eq!(listen("\"0.0.0.0:9750\"").unwrap(), "0.0.0.0:9750");
        assert_eq!(listen("\"[::1]:9750\"").unwrap(), "[::1]:9750");
        for bad in [
            "0",
            "65536",
            "-1",
            "\"localhost:9750\"",
            "\"9750\"",
            "\"1.2.3.4:0\"",
            "true",
        ] {
            let m = messages(&format!("[daemon]\nmetrics_listen = {bad}"));
            assert!(
                m.len() == 1 && m[0].contains("daemon.metrics_listen") && m[0].contains("a port (1 to 65535"),
                "{bad}: {m:?}"
            );
        }
        let s = check("[daemon]\nmetrics_textfile = \"/var/lib/prometheus/node-exporter\"").unwrap();
        assert_eq!(
            s.daemon.metrics_textfile.as_deref(),
            Some(Path::new("/var/lib/prometheus/node-exporter"))
        );
        for bad in [
            "\"relative\"",
            "\"/a/../etc\"",
            "\"/a\\nb\"",
            "1",
            "\"/tmp/prom\"",
            "\"/var/tmp\"",
            "\"/home/me/prom\"",
        ] {
            let m = messages(&format!("[daemon]\nmetrics_textfile = {bad}"));
            assert!(
                m.len() == 1 && m[0].contains("daemon.metrics_textfile"),
                "{bad}: {m:?}"
            );
        }
        assert_eq!(check("").unwrap().daemon.metrics_listen, None);
        // A huge value is refused with its size, not carried to the unit.
        let m = messages(&format!("[daemon]\nmetrics_textfile = \"/{}\"", "x".repeat(5000)));
        assert!(m.len() == 1 && m[0].contains("at most 4000"), "{m:?}");
        let m = messages(&format!("[daemon]\nmetrics_listen = \"{}\"", "9".repeat(5000)));
        assert!(m.len() == 1 && m[0].contains("daemon.metrics_listen"), "{m:?}");
    }

    #[test]
    fn merge_tracks_which_fragment_set_a_key() {
        let dir = std::env::temp_dir().join(format!("berth-host-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let main = dir.join("berth.toml");
        let frag = dir.join("10-x.toml");
        std::fs::write(&main, "drain_parallelism = 2\n[daemon]\nwatchdog_s = 10\n").unwrap();
        std::fs::write(&frag, "[daemon]\napi = \"no\"\n").unwrap();
        let (s, errs) = load(&[main.clone(), frag.clone()], &HostSettings::default());
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].file, frag);
        assert_eq!(errs[0].key.as_deref(), Some("daemon.api"));
        assert_eq!(s.daemon.watchdog_s, 10, "valid settings apply despite the error");
        assert!(s.daemon.api, "the setting in error takes its default");
        std::fs::write(&frag, "[daemon]\napi = false\n").unwrap();
        let (s, errs) = load(&[main, frag], &HostSettings::default());
        assert!(errs.is_empty());
        assert_eq!(s.drain_parallelism, 2);
        assert_eq!(s.daemon.watchdog_s, 10, "fragment merges key by key");
        assert!(!s.daemon.api);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn deadline_limit_names_the_numbers() {
        assert!(check_drain_deadline(1650, Manager::System).is_ok());
        let e = check_drain_deadline(1651, Manager::System)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("1681 s") && e.contains("1801 s") && e.contains("1800 s"),
            "{e}"
        );
        assert!(e.contains("at most 1650 s"), "{e}");
        assert!(check_drain_deadline(u64::MAX, Manager::System).is_err());
        // A user manager's default deadline fits; 76 s does not.
        let user_default = USER_DEFAULT_DRAIN_DEADLINE_S;
        assert!(check_drain_deadline(user_default, Manager::User).is_ok());
        assert!(check_drain_deadline(75, Manager::User).is_ok());
        let e = check_drain_deadline(76, Manager::User).unwrap_err().to_string();
        assert!(e.contains("user@.service") && e.contains("at most 75 s"), "{e}");
    }
}
