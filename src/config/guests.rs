//! `[libvirt]` in berth.toml: which libvirt guests are workloads, and
//! what a guest is stopped with. With `guests = "all"` every persistent
//! domain of qemu:///system is one, without a file of its own, unless a
//! workload file names the domain, the exclude list matches it, or its
//! name is masked. The domains are read from libvirt's definitions on
//! disk (the file names: libvirt names each `NAME.xml` and refuses a file
//! that does not match), since no libvirt daemon runs when generators do.

use std::collections::BTreeSet;
use std::path::PathBuf;

use toml::{Table, Value};

use super::StopAction;
use super::checks::{Autostart, MAX_DELAY_S};
use super::read::{Origin, Reader};
use super::{ConfigError, Manager};
use crate::paths::Root;

/// Where libvirt's QEMU driver keeps its persistent domains.
pub const DOMAIN_DIR: &str = "/etc/libvirt/qemu";

/// Which guests are workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GuestCoverage {
    /// Those a workload file names (`libvirt = "DOMAIN"`).
    Listed,
    /// Every persistent domain, as libvirt-guests covers them.
    All,
}

/// How the watcher asks a guest to shut down (`virsh shutdown --mode`):
/// libvirt tries its guest agent first when both are allowed, and ACPI
/// when the agent is not there or does not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShutdownMode {
    Agent,
    Acpi,
}

impl ShutdownMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ShutdownMode::Agent => "agent",
            ShutdownMode::Acpi => "acpi",
        }
    }

    fn parse(s: &str) -> Option<ShutdownMode> {
        match s {
            "agent" => Some(ShutdownMode::Agent),
            "acpi" => Some(ShutdownMode::Acpi),
            _ => None,
        }
    }

    /// As `virsh shutdown --mode` and `berth guest --shutdown-mode` take
    /// them: comma-separated.
    pub fn join(modes: &[ShutdownMode]) -> String {
        modes.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(",")
    }

    /// `berth guest --shutdown-mode`'s value back.
    pub fn split(text: &str) -> Result<Vec<ShutdownMode>, String> {
        let modes: Option<Vec<ShutdownMode>> = text.split(',').map(ShutdownMode::parse).collect();
        match modes {
            Some(m) if !m.is_empty() => Ok(m),
            _ => Err(format!("{:?}: a list of agent and acpi, comma-separated", text)),
        }
    }
}

/// The guest agent, then ACPI: libvirt's own order when both are allowed.
pub const DEFAULT_SHUTDOWN_MODES: [ShutdownMode; 2] = [ShutdownMode::Agent, ShutdownMode::Acpi];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibvirtSettings {
    pub guests: GuestCoverage,
    /// Domain names, or patterns with `*`, left alone by `guests = "all"`.
    pub exclude: Vec<String>,
    /// What a guest covered by `guests = "all"` gets, as its workload
    /// file would say it (None: the workload default; for `autostart`,
    /// false).
    pub order: Option<i64>,
    pub stop_action: Option<StopAction>,
    pub stop_delay_s: Option<u64>,
    pub autostart: Option<Autostart>,
    /// Every guest's default `shutdown_mode`.
    pub shutdown_mode: Vec<ShutdownMode>,
}

impl Default for LibvirtSettings {
    fn default() -> Self {
        LibvirtSettings {
            guests: GuestCoverage::Listed,
            exclude: Vec::new(),
            order: None,
            stop_action: None,
            stop_delay_s: None,
            autostart: None,
            shutdown_mode: DEFAULT_SHUTDOWN_MODES.to_vec(),
        }
    }
}

pub(super) const LIBVIRT_KEYS: &[&str] = &[
    "guests",
    "exclude",
    "order",
    "stop_action",
    "stop_delay_s",
    "autostart",
    "shutdown_mode",
];

/// `[libvirt]`; a key in error keeps its default.
pub(super) fn read(
    table: &Table,
    origin: &Origin,
    manager: Manager,
    default_autostart: Autostart,
    errors: &mut Vec<ConfigError>,
) -> LibvirtSettings {
    let mut s = LibvirtSettings::default();
    let mut r = Reader::new(table, "libvirt", origin);
    let errors_before = errors.len();
    match r.opt_text("guests").as_deref() {
        None | Some("listed") => {}
        Some("all") if manager == Manager::User => r.error(
            "guests",
            "\"all\" is for the system manager: qemu:///system's guests are the system's",
        ),
        Some("all") => s.guests = GuestCoverage::All,
        Some(other) => r.error(
            "guests",
            format!("must be \"listed\" or \"all\", not \"{}\"", other.escape_debug()),
        ),
    }
    if let Some(list) = r.text_list("exclude", "domain name or pattern") {
        s.exclude = list;
    }
    s.order = r.opt_int("order", -1_000_000, 1_000_000);
    match r.opt_text("stop_action").as_deref() {
        None => {}
        Some("guest_shutdown") => s.stop_action = Some(StopAction::GuestShutdown),
        Some("power_off") => s.stop_action = Some(StopAction::PowerOff),
        Some("save") => s.stop_action = Some(StopAction::Save),
        Some(other) => r.error(
            "stop_action",
            format!(
                "must be \"guest_shutdown\", \"power_off\" or \"save\", not \"{}\"",
                other.escape_debug()
            ),
        ),
    }
    s.stop_delay_s = r.opt_int("stop_delay_s", 1, MAX_DELAY_S).map(|d| d as u64);
    let before = r.errors.len();
    let autostart = r.autostart("autostart", default_autostart);
    if r.errors.len() == before && table.contains_key("autostart") {
        s.autostart = Some(autostart);
    }
    if let Some(modes) = shutdown_modes(&mut r, "shutdown_mode") {
        s.shutdown_mode = modes;
    }
    errors.append(&mut r.finish(LIBVIRT_KEYS));
    // An exclude list or a default in error must not widen what berth
    // starts and stops: every guest would be covered, with defaults.
    if s.guests == GuestCoverage::All && errors.len() > errors_before {
        s.guests = GuestCoverage::Listed;
        let file = origin.file_of("libvirt.guests").to_path_buf();
        errors.push(ConfigError::key(
            &file,
            "libvirt.guests",
            "stays \"listed\" while [libvirt] has errors: an exclude list or a default in error would cover guests \
             it was meant to leave alone",
        ));
    }
    s
}

/// `shutdown_mode`: a non-empty list of "agent" and "acpi", each once.
pub(super) fn shutdown_modes(r: &mut Reader, key: &str) -> Option<Vec<ShutdownMode>> {
    r.take(key)?;
    let list = r.text_list(key, "shutdown mode")?;
    if list.is_empty() {
        r.error(key, "must name at least one of \"agent\" and \"acpi\"");
        return None;
    }
    let mut modes = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        match ShutdownMode::parse(m) {
            Some(mode) if modes.contains(&mode) => {
                r.error(&format!("{key}[{i}]"), format!("{m:?} is listed twice"));
                return None;
            }
            Some(mode) => modes.push(mode),
            None => {
                r.error(
                    &format!("{key}[{i}]"),
                    format!(
                        "must be \"agent\" (the QEMU guest agent) or \"acpi\" (the power button), not \"{}\"",
                        m.escape_debug()
                    ),
                );
                return None;
            }
        }
    }
    Some(modes)
}

/// Whether `pattern` (`*` for any run of characters, nothing else
/// special) matches all of `name`.
pub fn matches(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for p in middle {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// One persistent domain found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainFile {
    pub domain: String,
    pub path: PathBuf,
}

/// The most domain files read: more is a mistake, not a host.
const MAX_DOMAIN_FILES: usize = 4096;

/// The persistent domains of qemu:///system under `root`, by name; a
/// missing directory is none. A file name that is not UTF-8 is an error
/// (libvirt writes none such).
pub fn domains_on_disk(root: &Root) -> (Vec<DomainFile>, Vec<ConfigError>) {
    let dir = root.join(DOMAIN_DIR);
    let mut found = Vec::new();
    let mut errors = Vec::new();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (found, errors),
        Err(e) => {
            errors.push(ConfigError::file(
                &dir,
                format!("cannot list libvirt's domains for guests = \"all\": {e}"),
            ));
            return (found, errors);
        }
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(stem) = path
            .file_name()
            .and_then(|n| n.to_str().map(|n| n.strip_suffix(".xml")))
        else {
            if path.extension().is_some_and(|e| e == "xml") {
                errors.push(ConfigError::file(
                    &path,
                    "file name is not UTF-8: not a libvirt domain",
                ));
            }
            continue;
        };
        // Hidden files are editors' and packagers' leftovers.
        let Some(domain) = stem.filter(|s| !s.is_empty() && !s.starts_with('.')) else {
            continue;
        };
        if !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            continue;
        }
        found.push(DomainFile {
            domain: domain.to_string(),
            path,
        });
    }
    // Sorted first: which ones are left out does not depend on the
    // directory's order.
    found.sort_by(|a, b| a.domain.cmp(&b.domain));
    if found.len() > MAX_DOMAIN_FILES {
        errors.push(ConfigError::file(
            &dir,
            format!(
                "holds {} domains, more than {MAX_DOMAIN_FILES}; those after {} are not covered",
                found.len(),
                found[MAX_DOMAIN_FILES - 1].domain.escape_debug()
            ),
        ));
        found.truncate(MAX_DOMAIN_FILES);
    }
    (found, errors)
}

/// What a domain covered by `guests = "all"` is made of: the workload
/// file it would have, as a table (never text: a domain name is only
/// ever a value).
pub(super) fn covered_table(settings: &LibvirtSettings, domain: &str) -> Table {
    let mut t = Table::new();
    t.insert("libvirt".into(), Value::String(domain.to_string()));
    if let Some(o) = settings.order {
        t.insert("order".into(), Value::Integer(o));
    }
    if let Some(a) = settings.stop_action {
        t.insert("stop_action".into(), Value::String(a.as_str().into()));
    }
    if let Some(d) = settings.stop_delay_s {
        t.insert("stop_delay_s".into(), Value::Integer(d as i64));
    }
    // Unset: none at boot, as Debian's libvirt-guests (ON_BOOT=ignore);
    // not the host's default_autostart, which would start every defined
    // domain, templates and all.
    match settings.autostart.unwrap_or(Autostart::No) {
        Autostart::Yes => t.insert("autostart".into(), Value::Boolean(true)),
        Autostart::No => t.insert("autostart".into(), Value::Boolean(false)),
        Autostart::LastState => t.insert("autostart".into(), Value::String("last-state".into())),
    };
    t
}

/// Why a domain on disk gets no workload of its own; None: it gets one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotCovered {
    /// A workload file names it, or is masked or broken under its name.
    HasFile,
    Excluded,
    /// Its name is taken by a workload file that is something else.
    NameTaken(PathBuf),
    /// Its name is a domain name but not a workload name (`+`, `:`, or
    /// longer than 64).
    NoWorkloadName,
}

/// The decision for one domain. `files` are the names of every workload
/// file found, with the file when it loaded (None: masked or broken);
/// `named` the domains workload files name.
pub fn decide(
    settings: &LibvirtSettings,
    domain: &str,
    files: &std::collections::BTreeMap<String, Option<PathBuf>>,
    named: &BTreeSet<&str>,
) -> Option<NotCovered> {
    if named.contains(domain) {
        return Some(NotCovered::HasFile);
    }
    if settings.exclude.iter().any(|p| matches(p, domain)) {
        return Some(NotCovered::Excluded);
    }
    match files.get(domain) {
        // Masked, or broken: the admin meant something by that name.
        Some(None) => return Some(NotCovered::HasFile),
        Some(Some(path)) => return Some(NotCovered::NameTaken(path.clone())),
        None => {}
    }
    if !crate::names::is_valid_workload_name(domain) {
        return Some(NotCovered::NoWorkloadName);
    }
    None
}

/// The error a domain that cannot be covered gets, if any.
pub(super) fn not_covered_error(domain: &DomainFile, why: &NotCovered) -> Option<ConfigError> {
    let d = domain.domain.escape_debug();
    let reason = match why {
        NotCovered::HasFile | NotCovered::Excluded => return None,
        NotCovered::NameTaken(file) => format!(
            "libvirt domain \"{d}\" is not covered by guests = \"all\": workload {d} ({}) is something else; \
             rename that file, give the guest a file of its own with libvirt = \"{d}\", or add it to \
             [libvirt] exclude",
            super::shown_path(file)
        ),
        NotCovered::NoWorkloadName => format!(
            "libvirt domain \"{d}\" is not covered by guests = \"all\": its name is not a workload name \
             (1-64 characters from A-Z a-z 0-9 _ . -, starting with a letter or digit); give it a workload \
             file, e.g. /etc/berth/workloads/NAME.toml with libvirt = \"{d}\", or add it to [libvirt] exclude"
        ),
    };
    Some(ConfigError::file(&domain.path, reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_whole_names() {
        for (pattern, name, want) in [
            ("vm1", "vm1", true),
            ("vm1", "vm10", false),
            ("vm*", "vm10", true),
            ("vm*", "xvm1", false),
            ("*-test", "db-test", true),
            ("*-test", "db-test2", false),
            ("*", "anything", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "acb", false),
            ("a*a", "a", false),
            ("a*a", "aa", true),
            ("", "", true),
            ("", "x", false),
        ] {
            assert_eq!(matches(pattern, name), want, "{pattern:?} {name:?}");
        }
    }

    #[test]
    fn modes_round_trip_and_refuse_the_rest() {
        assert_eq!(ShutdownMode::join(&DEFAULT_SHUTDOWN_MODES), "agent,acpi");
        assert_eq!(ShutdownMode::split("acpi").unwrap(), vec![ShutdownMode::Acpi]);
        assert_eq!(
            ShutdownMode::split("agent,acpi").unwrap(),
            DEFAULT_SHUTDOWN_MODES.to_vec()
        );
        for bad in ["", "initctl", "acpi,", "ACPI"] {
            assert!(ShutdownMode::split(bad).is_err(), "{bad:?}");
        }
    }

    /// Each domain with the workload files around it: what it gets.
    #[test]
    fn which_domains_are_covered() {
        let settings = LibvirtSettings {
            guests: GuestCoverage::All,
            exclude: vec!["scratch-*".into(), "win11".into()],
            ..Default::default()
        };
        let mut files = std::collections::BTreeMap::new();
        files.insert(
            "db".to_string(),
            Some(PathBuf::from("/etc/berth/workloads/db.toml")),
        );
        files.insert(
            "web".to_string(),
            Some(PathBuf::from("/etc/berth/workloads/web.toml")),
        );
        files.insert("masked".to_string(), None);
        let named: BTreeSet<&str> = ["web", "legacy-vm"].into_iter().collect();
        let long = "v".repeat(65);
        for (domain, want) in [
            ("vm1", None),
            ("web", Some(NotCovered::HasFile)),
            ("legacy-vm", Some(NotCovered::HasFile)),
            ("masked", Some(NotCovered::HasFile)),
            ("scratch-3", Some(NotCovered::Excluded)),
            ("win11", Some(NotCovered::Excluded)),
            ("win111", None),
            (
                "db",
                Some(NotCovered::NameTaken(PathBuf::from(
                    "/etc/berth/workloads/db.toml",
                ))),
            ),
            ("a:b", Some(NotCovered::NoWorkloadName)),
            (long.as_str(), Some(NotCovered::NoWorkloadName)),
        ] {
            assert_eq!(decide(&settings, domain, &files, &named), want, "{domain}");
        }
    }

    #[test]
    fn domains_are_the_xml_file_names() {
        let dir = tempfile::tempdir().unwrap();
        let qemu = dir.path().join("etc/libvirt/qemu");
        std::fs::create_dir_all(qemu.join("autostart")).unwrap();
        std::fs::create_dir_all(qemu.join("networks")).unwrap();
        for f in [
            "vm2.xml",
            "vm1.xml",
            ".hidden.xml",
            "notes.txt",
            "vm3.xml.bak",
            "a b.xml",
        ] {
            std::fs::write(qemu.join(f), "<domain/>").unwrap();
        }
        std::fs::create_dir_all(qemu.join("dir.xml")).unwrap();
        std::os::unix::fs::symlink("../vm1.xml", qemu.join("autostart/vm1.xml")).unwrap();
        let (found, errors) = domains_on_disk(&Root::new(dir.path()));
        let names: Vec<&str> = found.iter().map(|d| d.domain.as_str()).collect();
        assert_eq!(names, ["a b", "vm1", "vm2"]);
        assert!(errors.is_empty(), "{errors:?}");
        let (none, errors) = domains_on_disk(&Root::new(dir.path().join("nothing")));
        assert!(none.is_empty() && errors.is_empty());
    }
}
