//! What `berth check --live` warns about on a host with libvirt guests:
//! the parts of libvirt that act on the same guests at boot or shutdown
//! outside berth's order, freezes and deadline, and guests whose state
//! berth does not follow. Reading is [`gather`]; the judgement
//! ([`warnings`]) is pure.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::{CALL_LIMIT, events, run_within, virsh};
use crate::config::Autostart;
use crate::paths::Root;
use std::process::Command;

/// One configured guest.
#[derive(Debug, Clone)]
pub struct Guest {
    pub workload: String,
    pub unit: String,
    pub domain: String,
    pub autostart: Autostart,
    pub force_off_on_timeout: bool,
    /// Its unit is active (or activating, deactivating).
    pub unit_active: bool,
    /// An HA workload (`ha = true`, cluster mode): one node at a time.
    pub ha: bool,
    /// Covered by `[libvirt] guests = "all"` (no file of its own).
    pub from_all_guests: bool,
    /// systemd has berth's generated drop-in for its unit loaded: false
    /// for a domain defined since the last daemon-reload.
    pub drop_in_loaded: bool,
}

/// libvirt-guests.service, when it is enabled: its settings, the script's
/// defaults overridden by its settings file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestsService {
    /// The settings file, or the script when no file sets anything.
    pub file: PathBuf,
    pub on_boot: String,
    pub on_shutdown: String,
    pub shutdown_timeout: String,
}

/// What libvirt says of its domains, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Domains {
    pub autostart: BTreeSet<String>,
    pub managed_save: BTreeSet<String>,
    pub active: BTreeSet<String>,
}

#[derive(Debug, Clone)]
pub struct HostView {
    /// `[libvirt] guests = "all"`: every guest is berth's, and whatever
    /// else acts on guests at boot or shutdown is a problem, not a
    /// warning.
    pub all_guests: bool,
    /// libvirt-guests.service, enabled or active.
    pub guests_service: Option<GuestsService>,
    /// Enabled: it acts at the next boot and shutdown too.
    pub guests_service_enabled: bool,
    /// `(file, key, value)`: qemu.conf's auto_shutdown_* actions that are
    /// not "none".
    pub auto_shutdown: Vec<(PathBuf, String, String)>,
    /// A settings file that exists but cannot be read (qemu.conf is
    /// root's alone on Debian).
    pub unreadable: Option<String>,
    /// From libvirt (berth-libvirt, else virsh), or why it could not be
    /// asked.
    pub domains: Result<Domains, String>,
}

/// libvirt-guests' defaults (libvirt 9.0 and 11.3, as Debian ships them).
const GUESTS_DEFAULTS: [(&str, &str); 3] = [
    ("ON_BOOT", "ignore"),
    ("ON_SHUTDOWN", "shutdown"),
    ("SHUTDOWN_TIMEOUT", "300"),
];
/// Where distributions keep its script and its settings.
const GUESTS_SCRIPTS: [&str; 2] = [
    "/usr/lib/libvirt/libvirt-guests.sh",
    "/usr/libexec/libvirt-guests.sh",
];
const GUESTS_FILES: [&str; 2] = ["/etc/default/libvirt-guests", "/etc/sysconfig/libvirt-guests"];
const QEMU_CONF: &str = "/etc/libvirt/qemu.conf";
/// The QEMU driver's own shutdown actions (libvirt 11 and later); "none"
/// is the system daemon's default.
const AUTO_SHUTDOWN_KEYS: [&str; 3] = [
    "auto_shutdown_try_save",
    "auto_shutdown_try_shutdown",
    "auto_shutdown_poweroff",
];

/// A value as a shell or libvirt's parser reads it: up to its closing
/// quote when quoted, else up to the first blank (a comment may follow).
fn value_of(raw: &str) -> String {
    let raw = raw.trim_start();
    for q in ['"', '\''] {
        if let Some(rest) = raw.strip_prefix(q) {
            return rest.split(q).next().unwrap_or("").to_string();
        }
    }
    raw.split(|c: char| c.is_whitespace() || c == '#' || c == ';')
        .next()
        .unwrap_or("")
        .to_string()
}

/// `KEY=value`, `KEY="value"` and `export KEY=value` lines of a shell
/// settings file; comments and anything else are skipped.
pub fn shell_settings(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        let line = line
            .strip_prefix("export")
            .filter(|l| l.starts_with([' ', '\t']))
            .unwrap_or(line)
            .trim_start();
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if key.is_empty()
            || !key
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        {
            continue;
        }
        out.insert(key.to_string(), value_of(value));
    }
    out
}

/// `key = "value"` and `key = 1` lines of a libvirt configuration file.
pub fn conf_settings(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        out.insert(key.trim().to_string(), value_of(value));
    }
    out
}

/// The warnings for `guests` on a host that looks like `host`.
pub fn warnings(guests: &[Guest], host: &HostView) -> Vec<String> {
    let mut out = Vec::new();
    if guests.is_empty() && !host.all_guests {
        return out;
    }
    for g in guests.iter().filter(|g| g.from_all_guests && !g.drop_in_loaded) {
        out.push(format!(
            "libvirt domain {d} is covered by [libvirt] guests = \"all\", but systemd has not loaded the drop-in \
             berth generates for {u}: the domain was defined after the last daemon-reload, so berth neither starts \
             nor drains it yet; `berth reload` covers it",
            d = g.domain,
            u = g.unit
        ));
    }
    // With every guest berth's, these are problems (`problems`).
    let all_guests_service = host.all_guests && host.guests_service_enabled;
    if let Some(s) = host.guests_service.as_ref().filter(|_| !all_guests_service) {
        if s.on_boot == "start" {
            out.push(format!(
                "libvirt-guests.service is enabled with ON_BOOT=start ({}): at boot it starts again the guests \
                 it found running when it stopped (after berth's drain, those the drain left running), outside \
                 berth's order and freezes; set ON_BOOT=ignore",
                s.file.display()
            ));
        }
        let left_running: Vec<&str> = guests
            .iter()
            .filter(|g| !g.force_off_on_timeout)
            .map(|g| g.workload.as_str())
            .collect();
        if s.on_shutdown != "shutdown" {
            out.push(format!(
                "libvirt-guests.service is enabled with ON_SHUTDOWN={} ({}): it runs after berth's drain and \
                 acts on every guest still running{}; set ON_SHUTDOWN=shutdown, and stop_action = \"save\" \
                 on the workloads to save",
                s.on_shutdown.escape_debug(),
                s.file.display(),
                if left_running.is_empty() {
                    String::new()
                } else {
                    format!(
                        ", such as those the drain leaves running at their stop delay (force_off_on_timeout = \
                         false: {})",
                        left_running.join(", ")
                    )
                }
            ));
        } else if !left_running.is_empty() {
            out.push(format!(
                "libvirt-guests.service is enabled ({}): after berth's drain it shuts down the guests the drain \
                 left running at their stop delay (force_off_on_timeout = false: {}) for up to \
                 SHUTDOWN_TIMEOUT={} s more, which the power-off waits for",
                s.file.display(),
                left_running.join(", "),
                s.shutdown_timeout.escape_debug()
            ));
        }
    }
    for (file, key, value) in host.auto_shutdown.iter().filter(|_| !host.all_guests) {
        out.push(format!(
            "{} sets {key} = \"{}\": libvirt's QEMU driver then saves, shuts down or powers off guests itself \
             when the host shuts down, outside berth's drain, its order, deadline and outcomes; set it to \
             \"none\" (the default of the system daemon)",
            file.display(),
            value.escape_debug()
        ));
    }
    if let Some(e) = &host.unreadable {
        out.push(format!(
            "cannot read {}: its auto_shutdown_* settings are not checked (run as root)",
            e.escape_debug()
        ));
    }
    let domains = match &host.domains {
        Ok(d) => d,
        Err(e) => {
            out.push(format!(
                "cannot ask libvirt about the guests' domains ({}): their autostart flags, managed-save \
                 images and states are not checked",
                e.escape_debug()
            ));
            return out;
        }
    };
    for g in guests {
        let d = &g.domain;
        // An HA guest's flag is a problem, not a warning (`problems`).
        if domains.autostart.contains(d) && !g.ha {
            out.push(format!(
                "libvirt domain {d} (workload {}) has libvirt's autostart flag: libvirt starts it whenever its \
                 daemon starts, outside berth's order and freezes; clear it with `virsh autostart --disable {d}`",
                g.workload
            ));
        }
        if domains.managed_save.contains(d) && g.autostart != Autostart::Yes && !g.unit_active {
            let (mode, then) = match g.autostart {
                Autostart::LastState => (
                    "\"last-state\"",
                    "the next boot resumes it only if its unit runs at the next shutdown",
                ),
                _ => ("false", "no boot resumes it"),
            };
            out.push(format!(
                "libvirt domain {d} has a managed-save image, but {} is down and workload {} has autostart = \
                 {mode}: {then}; `systemctl start {}` resumes it, `virsh managedsave-remove {d}` discards it",
                g.unit, g.workload, g.unit
            ));
        }
        if domains.active.contains(d) && !g.unit_active {
            out.push(format!(
                "libvirt domain {d} runs, but {} is not active: berth does not follow it and the drain does \
                 not stop it (AlreadyOff); `systemctl start {}` adopts it",
                g.unit, g.unit
            ));
        }
    }
    out
}

/// What breaks an invariant outright: an HA guest whose domain has
/// libvirt's autostart flag is started by libvirtd on every node that
/// has the domain, past `berth owner-check`: two nodes may run it. And
/// with `guests = "all"`, libvirt-guests enabled or the QEMU driver's own
/// shutdown actions: they act on the same guests as berth, at boot and
/// at shutdown, outside its order, freezes, deadline and outcomes.
pub fn problems(guests: &[Guest], host: &HostView) -> Vec<String> {
    let mut out = Vec::new();
    if host.all_guests {
        if let Some(s) = host
            .guests_service
            .as_ref()
            .filter(|_| host.guests_service_enabled)
        {
            out.push(format!(
                "libvirt-guests.service is enabled while [libvirt] guests = \"all\" makes every guest berth's: it \
                 starts guests at boot (ON_BOOT={}) and saves or shuts them down at shutdown (ON_SHUTDOWN={}, \
                 {}) outside berth's order, freezes and deadline; run `systemctl disable libvirt-guests.service` \
                 (without --now: stopping it now would run its shutdown action on the running guests)",
                s.on_boot.escape_debug(),
                s.on_shutdown.escape_debug(),
                s.file.display()
            ));
        }
        for (file, key, value) in &host.auto_shutdown {
            out.push(format!(
                "{f} sets {key} = \"{v}\" while [libvirt] guests = \"all\" makes every guest berth's: libvirt's \
                 QEMU driver would save, shut down or power off the guests itself at shutdown, outside berth's \
                 drain; set {key} = \"none\" in {f}, then `systemctl try-restart virtqemud.service` (running guests \
                 keep running)",
                f = file.display(),
                v = value.escape_debug()
            ));
        }
    }
    let Ok(domains) = &host.domains else {
        return out;
    };
    out.extend(guests
        .iter()
        .filter(|g| g.ha && domains.autostart.contains(&g.domain))
        .map(|g| {
            format!(
                "libvirt domain {d} (workload {w}, ha = true) has libvirt's autostart flag: libvirtd starts it \
                 on this node whether or not the node owns {w}, past berth owner-check, so two nodes may run it; \
                 clear it with `virsh autostart --disable {d}`",
                d = g.domain,
                w = g.workload
            )
        }));
    out
}

/// Reads the host's libvirt settings (under `root`) and asks libvirt.
/// libvirt-guests.service is `enabled`, or at least `active`.
pub fn gather(root: &Root, all_guests: bool, enabled: bool, active: bool) -> HostView {
    let guests_service = (enabled || active).then(|| guests_service(root));
    let mut unreadable = None;
    let auto_shutdown = match std::fs::read_to_string(root.join(QEMU_CONF)) {
        Ok(text) => {
            let settings = conf_settings(&text);
            AUTO_SHUTDOWN_KEYS
                .iter()
                .filter_map(|k| {
                    let v = settings.get(*k)?;
                    (v != "none").then(|| (PathBuf::from(QEMU_CONF), k.to_string(), v.clone()))
                })
                .collect()
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            unreadable = Some(format!("{QEMU_CONF}: {e}"));
            Vec::new()
        }
    };
    HostView {
        all_guests,
        guests_service,
        guests_service_enabled: enabled,
        auto_shutdown,
        unreadable,
        domains: domains(),
    }
}

fn guests_service(root: &Root) -> GuestsService {
    let read = |paths: &[&str]| {
        paths.iter().find_map(|p| {
            std::fs::read_to_string(root.join(p))
                .ok()
                .map(|t| (Path::new(p).to_path_buf(), shell_settings(&t)))
        })
    };
    let mut settings: BTreeMap<String, String> = GUESTS_DEFAULTS
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut file = PathBuf::from(GUESTS_FILES[0]);
    if let Some((script, defaults)) = read(&GUESTS_SCRIPTS) {
        file = script;
        settings.extend(defaults);
    }
    if let Some((conf, set)) = read(&GUESTS_FILES) {
        if !set.is_empty() {
            file = conf;
        }
        settings.extend(set);
    }
    let get = |k: &str| settings.get(k).cloned().unwrap_or_default();
    GuestsService {
        file,
        on_boot: get("ON_BOOT"),
        on_shutdown: get("ON_SHUTDOWN"),
        shutdown_timeout: get("SHUTDOWN_TIMEOUT"),
    }
}

fn domains() -> Result<Domains, String> {
    if let Some(helper) = events::helper() {
        let mut command = Command::new(helper);
        command.arg("list");
        return run_within(command, "list", CALL_LIMIT)
            .map(|out| domains_listed(&out))
            .map_err(|e| e.to_string());
    }
    let names = |flags: &[&str]| -> Result<BTreeSet<String>, String> {
        let mut args = vec!["list", "--name"];
        args.extend_from_slice(flags);
        let out = virsh(&args, CALL_LIMIT).map_err(|e| e.to_string())?;
        Ok(out
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect())
    };
    Ok(Domains {
        autostart: names(&["--all", "--autostart"])?,
        managed_save: names(&["--all", "--with-managed-save"])?,
        active: names(&[])?,
    })
}

/// `berth-libvirt list`'s lines: `domain ACTIVE AUTOSTART MANAGEDSAVE
/// NAME`, the name the rest of the line (it may hold blanks). A line of
/// another shape is none of the helper's and is skipped.
fn domains_listed(out: &str) -> Domains {
    let mut domains = Domains::default();
    for line in out.lines() {
        let mut fields = line.splitn(5, ' ');
        let (Some("domain"), Some(active), Some(autostart), Some(saved), Some(name)) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            continue;
        };
        let flag = |f: &str| match f {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        };
        let (Some(active), Some(autostart), Some(saved)) = (flag(active), flag(autostart), flag(saved))
        else {
            continue;
        };
        if name.is_empty() {
            continue;
        }
        for (set, on) in [
            (&mut domains.active, active),
            (&mut domains.autostart, autostart),
            (&mut domains.managed_save, saved),
        ] {
            if on {
                set.insert(name.to_string());
            }
        }
    }
    domains
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domains_as_the_helper_lists_them() {
        let out = "domain 1 0 0 web\n\
                   domain 0 1 1 db one\n\
                   domain 0 0 0 idle\n\
                   domain 2 0 0 odd\n\
                   domain 1 0 0 \n\
                   domain 1 1\n\
                   state 1 1\n";
        let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(
            domains_listed(out),
            Domains {
                autostart: set(&["db one"]),
                managed_save: set(&["db one"]),
                active: set(&["web"]),
            }
        );
    }

    fn guest(name: &str, autostart: Autostart, force: bool, active: bool) -> Guest {
        Guest {
            workload: name.into(),
            unit: format!("berth@{name}.service"),
            domain: format!("dom-{name}"),
            autostart,
            force_off_on_timeout: force,
            unit_active: active,
            ha: false,
            from_all_guests: false,
            drop_in_loaded: true,
        }
    }

    fn service(on_boot: &str, on_shutdown: &str) -> Option<GuestsService> {
        Some(GuestsService {
            file: "/etc/default/libvirt-guests".into(),
            on_boot: on_boot.into(),
            on_shutdown: on_shutdown.into(),
            shutdown_timeout: "300".into(),
        })
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn host(guests_service: Option<GuestsService>, domains: Domains) -> HostView {
        HostView {
            all_guests: false,
            guests_service_enabled: guests_service.is_some(),
            guests_service,
            auto_shutdown: Vec::new(),
            unreadable: None,
            domains: Ok(domains),
        }
    }

    /// Each case: the guests, the host, and the fragments the warnings
    /// must hold, in order (none: no warning).
    #[test]
    fn each_fight_is_named() {
        let plain = guest("vm", Autostart::Yes, true, true);
        let cases: Vec<(&str, Vec<Guest>, HostView, Vec<&str>)> = vec![
            (
                "Debian's defaults and berth's guests running: nothing to say",
                vec![plain.clone()],
                host(
                    service("ignore", "shutdown"),
                    Domains {
                        active: set(&["dom-vm"]),
                        ..Default::default()
                    },
                ),
                vec![],
            ),
            (
                "ON_BOOT=start",
                vec![plain.clone()],
                host(service("start", "shutdown"), Domains::default()),
                vec!["ON_BOOT=start (/etc/default/libvirt-guests)"],
            ),
            (
                "ON_SHUTDOWN=suspend",
                vec![plain.clone()],
                host(service("ignore", "suspend"), Domains::default()),
                vec!["ON_SHUTDOWN=suspend"],
            ),
            (
                "a guest the drain may leave running, default libvirt-guests",
                vec![guest("slow", Autostart::Yes, false, true)],
                host(service("ignore", "shutdown"), Domains::default()),
                vec!["(force_off_on_timeout = false: slow) for up to SHUTDOWN_TIMEOUT=300 s"],
            ),
            (
                "libvirt-guests disabled",
                vec![guest("slow", Autostart::Yes, false, true)],
                host(None, Domains::default()),
                vec![],
            ),
            (
                "libvirt's autostart flag",
                vec![plain.clone()],
                host(
                    None,
                    Domains {
                        autostart: set(&["dom-vm", "other"]),
                        active: set(&["dom-vm"]),
                        ..Default::default()
                    },
                ),
                vec!["dom-vm (workload vm) has libvirt's autostart flag"],
            ),
            (
                "a managed save no boot resumes",
                vec![
                    guest("off", Autostart::No, true, false),
                    guest("on", Autostart::Yes, true, false),
                    guest("last", Autostart::LastState, true, false),
                ],
                host(
                    None,
                    Domains {
                        managed_save: set(&["dom-off", "dom-on", "dom-last"]),
                        ..Default::default()
                    },
                ),
                vec![
                    "dom-off has a managed-save image, but berth@off.service is down and workload off has autostart = false: no boot",
                    "dom-last has a managed-save image, but berth@last.service is down and workload last has autostart = \"last-state\": the next boot resumes it only if",
                ],
            ),
            (
                "a guest running without its unit",
                vec![guest("stray", Autostart::Yes, true, false)],
                host(
                    None,
                    Domains {
                        active: set(&["dom-stray"]),
                        ..Default::default()
                    },
                ),
                vec!["dom-stray runs, but berth@stray.service is not active"],
            ),
            (
                "virsh unanswered",
                vec![plain.clone()],
                HostView {
                    all_guests: false,
                    guests_service: None,
                    guests_service_enabled: false,
                    auto_shutdown: vec![(
                        "/etc/libvirt/qemu.conf".into(),
                        "auto_shutdown_try_shutdown".into(),
                        "all".into(),
                    )],
                    unreadable: Some("/etc/libvirt/qemu.conf: Permission denied (os error 13)".into()),
                    domains: Err("failed to connect".into()),
                },
                vec![
                    "/etc/libvirt/qemu.conf sets auto_shutdown_try_shutdown = \"all\"",
                    "cannot read /etc/libvirt/qemu.conf: Permission denied",
                    "cannot ask libvirt about the guests' domains (failed to connect)",
                ],
            ),
            (
                "no guest configured",
                vec![],
                host(service("start", "suspend"), Domains::default()),
                vec![],
            ),
        ];
        for (what, guests, host, want) in cases {
            let got = warnings(&guests, &host);
            assert_eq!(got.len(), want.len(), "{what}: {got:#?}");
            for (g, w) in got.iter().zip(&want) {
                assert!(g.contains(w), "{what}: {g:?} lacks {w:?}");
            }
        }
    }

    /// An HA guest's autostart flag is a problem (not a warning too); a
    /// plain guest's stays a warning; virsh unanswered says nothing here
    /// (the warnings say virsh could not be asked).
    #[test]
    fn an_ha_guest_with_libvirts_autostart_flag_is_a_problem() {
        let ha = Guest {
            ha: true,
            ..guest("db", Autostart::Yes, true, true)
        };
        let plain = guest("vm", Autostart::Yes, true, true);
        let flagged = host(
            None,
            Domains {
                autostart: set(&["dom-db", "dom-vm"]),
                active: set(&["dom-db", "dom-vm"]),
                ..Default::default()
            },
        );
        let guests = [ha.clone(), plain];
        let found = problems(&guests, &flagged);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(found[0].contains("dom-db (workload db, ha = true) has libvirt's autostart flag"));
        let warnings = warnings(&guests, &flagged);
        assert_eq!(warnings.len(), 1, "{warnings:#?}");
        assert!(warnings[0].contains("dom-vm (workload vm)"));
        let unanswered = HostView {
            domains: Err("failed to connect".into()),
            ..flagged
        };
        assert!(problems(&[ha], &unanswered).is_empty());
    }

    /// With every guest berth's, libvirt-guests enabled and the QEMU
    /// driver's shutdown actions are problems with their fix, not
    /// warnings; libvirt-guests only active (disabled, not yet stopped)
    /// stays a warning. A domain defined since the last reload is named.
    #[test]
    fn all_guests_make_the_other_shutdown_paths_problems() {
        let covered = Guest {
            from_all_guests: true,
            ..guest("vm", Autostart::Yes, true, true)
        };
        let new = Guest {
            from_all_guests: true,
            drop_in_loaded: false,
            ..guest("new", Autostart::Yes, true, false)
        };
        let mut view = host(service("ignore", "shutdown"), Domains::default());
        view.all_guests = true;
        view.auto_shutdown = vec![(
            "/etc/libvirt/qemu.conf".into(),
            "auto_shutdown_try_shutdown".into(),
            "persistent".into(),
        )];
        let guests = [covered.clone(), new];
        let found = problems(&guests, &view);
        assert_eq!(found.len(), 2, "{found:#?}");
        assert!(
            found[0].contains("run `systemctl disable libvirt-guests.service` (without --now"),
            "{}",
            found[0]
        );
        assert!(
            found[1].contains("set auto_shutdown_try_shutdown = \"none\" in /etc/libvirt/qemu.conf, then `systemctl try-restart virtqemud.service`"),
            "{}",
            found[1]
        );
        let said = warnings(&guests, &view);
        assert_eq!(said.len(), 1, "{said:#?}");
        assert!(said[0].contains(
            "libvirt domain dom-new is covered by [libvirt] guests = \"all\", but systemd has not loaded"
        ));
        assert!(said[0].contains("`berth reload` covers it"));

        // Disabled, still active until the next shutdown: as before.
        view.guests_service_enabled = false;
        view.auto_shutdown.clear();
        assert!(problems(std::slice::from_ref(&covered), &view).is_empty());
        view.guests_service = service("start", "shutdown");
        let said = warnings(std::slice::from_ref(&covered), &view);
        assert_eq!(said.len(), 1, "{said:#?}");
        assert!(said[0].contains("ON_BOOT=start"));
        // No guest defined yet: still checked.
        view.guests_service_enabled = true;
        assert_eq!(problems(&[], &view).len(), 1);
        // Listed guests: warnings, as before.
        view.all_guests = false;
        assert!(problems(&[covered], &view).is_empty());
    }

    /// Review of issue 12: `export`, tabs before comments and comments
    /// after libvirt values were misread.
    #[test]
    fn settings_files_read_as_the_shell_and_libvirt_read_them() {
        let s = shell_settings(
            "# comment\n#ON_BOOT=start\nON_BOOT=start\nON_SHUTDOWN=\"suspend\" # why\n  SHUTDOWN_TIMEOUT=120\t# s\n\
             export PARALLEL_SHUTDOWN=2\nURIS=default\nnot a line\n",
        );
        assert_eq!(s["ON_BOOT"], "start");
        assert_eq!(s["ON_SHUTDOWN"], "suspend");
        assert_eq!(s["SHUTDOWN_TIMEOUT"], "120");
        assert_eq!(s["PARALLEL_SHUTDOWN"], "2");
        assert!(!s.contains_key("#ON_BOOT"));
        let c = conf_settings(
            "#auto_shutdown_try_save = \"persistent\"\nauto_shutdown_poweroff = \"all\"\n\
             auto_shutdown_try_shutdown = \"none\"  # off\nauto_shutdown_wait = 30 # s\n",
        );
        assert_eq!(c.get("auto_shutdown_try_save"), None);
        assert_eq!(c["auto_shutdown_poweroff"], "all");
        assert_eq!(c["auto_shutdown_try_shutdown"], "none");
        assert_eq!(c["auto_shutdown_wait"], "30");
    }

    /// Hostile settings never reach the terminal as control characters.
    #[test]
    fn settings_are_escaped_in_warnings() {
        let host = HostView {
            all_guests: false,
            guests_service_enabled: true,
            guests_service: Some(GuestsService {
                file: "/etc/default/libvirt-guests".into(),
                on_boot: "ignore".into(),
                on_shutdown: "\x1b[2Jsuspend".into(),
                shutdown_timeout: "\x1b]0;x\x07".into(),
            }),
            auto_shutdown: vec![(
                "/etc/libvirt/qemu.conf".into(),
                "auto_shutdown_poweroff".into(),
                "\x1b[1m".into(),
            )],
            unreadable: None,
            domains: Err("\x1b[31mred".into()),
        };
        let got = warnings(&[guest("slow", Autostart::Yes, false, true)], &host);
        assert_eq!(got.len(), 3, "{got:#?}");
        for w in got {
            assert!(!w.chars().any(char::is_control), "{w:?}");
        }
    }
}
