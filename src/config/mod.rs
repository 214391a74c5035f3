//! Configuration: find the files (with masking across the config
//! directories), parse and merge them, then validate into typed settings.
//!
//! Every problem becomes a [`ConfigError`] naming the file, the key and the
//! reason. Loading never stops at the first problem: a broken workload file
//! is reported and left out, a broken host file falls back to built-in
//! defaults, and everything else is still returned.

mod checks;
pub mod cluster;
mod error;
pub mod guests;
pub mod host;
mod passthrough;
mod read;
pub mod restart;
mod source;
mod workload;

pub use crate::names::{is_valid_workload_name, unit_name};
pub use cluster::{ClusterSettings, Watchdog};
pub use error::{ConfigError, is_representable, shown_path};
pub use guests::{GuestCoverage, LibvirtSettings, ShutdownMode};
pub use host::{DaemonSettings, HostSettings};
pub use passthrough::{ACCEPTED_SAMPLES, PassthroughKind, TYPED_SETTINGS, passthrough_rule};
pub use restart::{Restart, RestartPolicy};
pub use source::Discovered;
pub use workload::{Autostart, HaPolicy, Readiness, StopAction, Workload, WorkloadKind};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::paths::{Root, WORKLOAD_DIR};

pub use crate::paths::Manager;

/// Everything berth knows from config, good and bad.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub host: HostSettings,
    /// The host files that were read, main file first, then fragments in
    /// merge order. Empty when there is no host config at all.
    pub host_files: Vec<PathBuf>,
    /// True when the host config had errors: each setting in error (and
    /// each setting of an unreadable host file) holds its built-in default.
    pub host_has_errors: bool,
    /// Valid workloads, sorted by name.
    pub workloads: Vec<Workload>,
    /// Names whose workload file was masked (a symlink to /dev/null).
    pub masked: Vec<String>,
    pub errors: Vec<ConfigError>,
}

impl Loaded {
    pub fn is_clean(&self) -> bool {
        self.errors.is_empty()
    }

    /// Which unit each workload is, both ways.
    pub fn workload_units(&self) -> crate::names::WorkloadUnits {
        crate::names::WorkloadUnits::new(
            self.workloads
                .iter()
                .filter_map(|w| w.existing_unit().map(|u| (w.name.as_str(), u))),
        )
    }

    /// By name: `workloads` is sorted by name (the daemon asks once per
    /// listed unit per pass).
    pub fn workload(&self, name: &str) -> Option<&Workload> {
        let i = self
            .workloads
            .binary_search_by(|w| w.name.as_str().cmp(name))
            .ok()?;
        Some(&self.workloads[i])
    }
}

/// Loads and validates everything under `root`.
pub fn load(root: &Root) -> Loaded {
    let found = source::discover(root);
    load_discovered(root, found, &HostSettings::defaults_for(root))
}

fn load_discovered(root: &Root, found: Discovered, defaults: &HostSettings) -> Loaded {
    let mut errors = found.errors;

    let (host, mut host_errors) = host::load(&found.host_files, defaults);
    let host_has_errors = !(found.host_errors.is_empty() && host_errors.is_empty());
    errors.extend(found.host_errors);
    errors.append(&mut host_errors);

    let mut workloads = Vec::with_capacity(found.workloads.len());
    for (name, path) in &found.workloads {
        match workload::load(name, path, &host) {
            Ok(w) => workloads.push(w),
            Err(mut e) => errors.append(&mut e),
        }
    }
    if host.libvirt.guests == GuestCoverage::All {
        let files: BTreeMap<String, Option<PathBuf>> = found
            .workloads
            .iter()
            .map(|(name, _)| (name.clone(), None))
            .chain(found.masked.iter().map(|name| (name.clone(), None)))
            .chain(workloads.iter().map(|w| (w.name.clone(), Some(w.source.clone()))))
            .collect();
        let (mut covered, mut covered_errors) = all_guests(root, &host, &files, &workloads);
        workloads.append(&mut covered);
        errors.append(&mut covered_errors);
    }
    // Found in file-name order ("a-b.toml" before "a.toml"); by name here.
    workloads.sort_by(|a, b| a.name.cmp(&b.name));
    errors.extend(refuse_shared_units(&mut workloads, &host));

    Loaded {
        host,
        host_files: found.host_files,
        host_has_errors,
        workloads,
        masked: found.masked,
        errors,
    }
}

/// `guests = "all"`: a workload for each domain on disk that no workload
/// file names, the exclude list leaves in, and whose name is free.
fn all_guests(
    root: &Root,
    host: &HostSettings,
    files: &BTreeMap<String, Option<PathBuf>>,
    workloads: &[Workload],
) -> (Vec<Workload>, Vec<ConfigError>) {
    let (domains, mut errors) = guests::domains_on_disk(root);
    let named: std::collections::BTreeSet<&str> =
        workloads.iter().filter_map(|w| w.libvirt_domain()).collect();
    let mut covered = Vec::new();
    for d in &domains {
        if let Some(why) = guests::decide(&host.libvirt, &d.domain, files, &named) {
            errors.extend(guests::not_covered_error(d, &why));
            continue;
        }
        let table = guests::covered_table(&host.libvirt, &d.domain);
        match workload::load_table(&d.domain, &d.path, &table, host) {
            Ok(mut w) => {
                w.from_all_guests = true;
                covered.push(w);
            }
            Err(mut e) => errors.append(&mut e),
        }
    }
    (covered, errors)
}

/// Rules across files for `unit =` workloads: one workload per unit (the
/// first by name keeps it), and none that the host's `drain_after` names
/// (the drain would wait for a unit it stops itself). The refused are
/// taken out, each with an error naming its file.
fn refuse_shared_units(workloads: &mut Vec<Workload>, host: &HostSettings) -> Vec<ConfigError> {
    let mut owners: std::collections::BTreeMap<&str, &Workload> = Default::default();
    let mut refused = std::collections::BTreeSet::new();
    let mut errors = Vec::new();
    for w in workloads.iter() {
        let Some(unit) = w.existing_unit() else { continue };
        match shared_unit(w, host, owners.get(unit).copied()) {
            Some(e) => {
                errors.push(e);
                refused.insert(w.name.clone());
            }
            None => {
                owners.insert(unit, w);
            }
        }
    }
    // `berth@X.service` of a workload X that is an existing unit is no
    // workload's unit: a Wants= on it would start a stray instance.
    for w in workloads.iter() {
        for (key, list) in [("after", &w.after), ("wants", &w.wants)] {
            for (i, u) in list.iter().enumerate() {
                let Some(other) = crate::names::instance_of(u) else {
                    continue;
                };
                // Sorted by name: a search, not a scan per entry.
                let Some(unit) = workloads
                    .binary_search_by(|o| o.name.as_str().cmp(other))
                    .ok()
                    .and_then(|i| workloads[i].existing_unit())
                else {
                    continue;
                };
                errors.push(ConfigError::key(
                    &w.source,
                    format!("{key}[{i}]"),
                    format!("workload {other} is the existing unit {unit}: name {unit}, not {u}"),
                ));
                refused.insert(w.name.clone());
            }
        }
    }
    workloads.retain(|w| !refused.contains(&w.name));
    errors
}

/// Why `w` may not take its `unit =` when `owner` already holds it.
fn shared_unit(w: &Workload, host: &HostSettings, owner: Option<&Workload>) -> Option<ConfigError> {
    let unit = w.existing_unit()?;
    let why = if host.drain_after.iter().any(|u| u == unit) {
        format!(
            "{unit} is in the host's drain_after, so the drain waits for it; it cannot also be a \
             workload the drain stops (take it out of drain_after)"
        )
    } else {
        let owner = owner?;
        format!(
            "{unit} is already the unit of workload {} ({}); one workload per unit",
            owner.name,
            shown_path(&owner.source)
        )
    };
    Some(ConfigError::key(&w.source, "unit", why))
}

/// Whether the host files say `[libvirt] guests = "all"`.
fn guests_all(root: &Root) -> bool {
    let host = source::discover_host(root);
    host::load(&host.host_files, &HostSettings::defaults_for(root))
        .0
        .libvirt
        .guests
        == GuestCoverage::All
}

/// One workload's current definition, reading only its file and the host
/// files (what the supervisor needs on a transition).
pub fn load_workload(root: &Root, name: &str) -> Option<Workload> {
    let path = source::find_workload(root, name);
    let host = source::discover_host(root);
    let (host, _) = host::load(&host.host_files, &HostSettings::defaults_for(root));
    match path {
        Some(path) => workload::load(name, &path, &host).ok(),
        // A guest `guests = "all"` covers has no file: what the whole
        // load makes of it.
        None if host.libvirt.guests == GuestCoverage::All => load(root).workload(name).cloned(),
        None => None,
    }
}

/// The workload file of `name` that wins (None: none, or masked).
pub fn find_workload_file(root: &Root, name: &str) -> Option<PathBuf> {
    source::find_workload(root, name)
}

/// `text` checked as the workload file `path` would be, before it is
/// written there (`berth add`): the same rules and messages as the
/// generator's, naming `path`.
pub fn check_workload_text(
    root: &Root,
    name: &str,
    path: &Path,
    text: &str,
) -> Result<Workload, Vec<ConfigError>> {
    if !is_valid_workload_name(name) {
        return Err(vec![ConfigError::file(
            path,
            format!(
                "{name:?} is not a valid workload name: use 1-64 characters from A-Z a-z 0-9 _ . - starting with a letter or digit"
            ),
        )]);
    }
    let host = source::discover_host(root);
    let (host, _) = host::load(&host.host_files, &HostSettings::defaults_for(root));
    let w = workload::load_text(name, path, text, &host)?;
    check_against_others(root, &w)?;
    Ok(w)
}

/// The rules across files for `w` against the workloads configured now
/// (another of the same name is the one it replaces): one workload per
/// unit, and no `berth@X` for a workload X that is an existing unit, in
/// its lists or, when it is such a unit, in theirs. Read only when one
/// can apply, so that a burst of plain adds stays cheap. A writer runs it
/// again under the configuration lock, where no other writer can change
/// the answer before its file is in place.
pub fn check_against_others(root: &Root, w: &Workload) -> Result<(), Vec<ConfigError>> {
    // A guest `guests = "all"` covers under its own name would be
    // followed by two units at once, the covered one until the reload
    // and the new one from its start.
    // And a file of a covered guest's name must be that guest: anything
    // else would take over its running unit.
    if guests_all(root) {
        let loaded = load(root);
        let covered = |name: &str| loaded.workload(name).filter(|c| c.from_all_guests);
        if let Some(d) = w.libvirt_domain()
            && w.name != d
            && covered(d).is_some()
        {
            return Err(vec![ConfigError::key(
                &w.source,
                "libvirt",
                format!(
                    "domain {d} is covered by [libvirt] guests = \"all\" as workload {d} (berth@{d}.service): name \
                     this workload {d}, so that its file takes the covered one's place in the same unit; or stop \
                     berth@{d}.service, exclude {d} and `berth reload` first"
                ),
            )]);
        }
        if let Some(c) = covered(&w.name)
            && w.libvirt_domain() != c.libvirt_domain()
        {
            return Err(vec![ConfigError::file(
                &w.source,
                format!(
                    "{n} is the libvirt guest {n} that [libvirt] guests = \"all\" covers (berth@{n}.service): its \
                     file must say libvirt = \"{n}\"; give this workload another name",
                    n = w.name
                ),
            )]);
        }
    }
    let names_an_instance = w
        .after
        .iter()
        .chain(&w.wants)
        .any(|u| crate::names::instance_of(u).is_some());
    if w.existing_unit().is_none() && !names_an_instance {
        return Ok(());
    }
    let loaded = load(root);
    let owner = loaded
        .workloads
        .iter()
        .find(|o| o.name != w.name && w.existing_unit().is_some() && o.existing_unit() == w.existing_unit());
    if let Some(e) = shared_unit(w, &loaded.host, owner) {
        return Err(vec![e]);
    }
    let mut all: Vec<Workload> = loaded
        .workloads
        .into_iter()
        .filter(|o| o.name != w.name)
        .collect();
    all.push(w.clone());
    all.sort_by(|a, b| a.name.cmp(&b.name));
    let errors = refuse_shared_units(&mut all, &loaded.host);
    if errors.is_empty() { Ok(()) } else { Err(errors) }
}

/// Loads one workload by name the way the generator would, for the
/// template's fallback message and for helpers that need one definition.
pub fn load_one(root: &Root, name: &str) -> Result<Workload, Vec<ConfigError>> {
    let loaded = load(root);
    if let Some(w) = loaded.workload(name) {
        return Ok(w.clone());
    }
    let file_name = format!("{name}.toml");
    let mine: Vec<ConfigError> = loaded
        .errors
        .into_iter()
        .filter(|e| {
            e.file.file_name().and_then(|f| f.to_str()) == Some(file_name.as_str())
                && e.file.parent().and_then(|p| p.file_name()) == Some(std::ffi::OsStr::new(WORKLOAD_DIR))
        })
        .collect();
    Err(mine)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    /// File-name order ("a-b.toml" < "a.toml") is not name order ("a" <
    /// "a-b"); `workload()` searches by name.
    #[test]
    fn workloads_are_sorted_by_name_and_found_by_it() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc/berth/workloads");
        std::fs::create_dir_all(&etc).unwrap();
        for name in ["a", "a-b", "a.c", "b_1", "B"] {
            std::fs::write(etc.join(format!("{name}.toml")), "exec = [\"/bin/x\"]\n").unwrap();
        }
        let loaded = load(&Root::new(dir.path()));
        let names: Vec<&str> = loaded.workloads.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["B", "a", "a-b", "a.c", "b_1"]);
        for name in names {
            assert_eq!(loaded.workload(name).map(|w| w.name.as_str()), Some(name));
        }
        assert!(loaded.workload("a-").is_none());
    }

    /// Two workloads naming one unit: the first by name keeps it. A unit
    /// the drain waits for is no workload.
    #[test]
    fn one_workload_per_existing_unit() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc/berth/workloads");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(
            dir.path().join("etc/berth/berth.toml"),
            "drain_after = [\"nfs.service\"]\n",
        )
        .unwrap();
        for (name, unit) in [
            ("b", "pg.service"),
            ("a", "pg.service"),
            ("c", "nfs.service"),
            ("d", "web.service"),
        ] {
            std::fs::write(etc.join(format!("{name}.toml")), format!("unit = \"{unit}\"\n")).unwrap();
        }
        // Review of issue 11: a Wants= on berth@d.service would start a
        // stray instance of a workload that is an existing unit.
        std::fs::write(
            etc.join("e.toml"),
            "exec = [\"/x\"]\nwants = [\"berth@d.service\"]\n",
        )
        .unwrap();
        let loaded = load(&Root::new(dir.path()));
        let names: Vec<&str> = loaded.workloads.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["a", "d"]);
        let errors: Vec<String> = loaded
            .errors
            .iter()
            .map(|e| format!("{}: {}", e.key.as_deref().unwrap_or(""), e.reason))
            .collect();
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(
            errors.contains(
                &"wants[0]: workload d is the existing unit web.service: name web.service, not berth@d.service"
                    .to_string()
            ),
            "{errors:?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("unit: pg.service is already the unit of workload a (")),
            "{errors:?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("unit: nfs.service is in the host's drain_after")),
            "{errors:?}"
        );
        let map = loaded.workload_units();
        assert_eq!(map.unit_of("a"), "pg.service");
        assert_eq!(map.workload_of("web.service"), Some("d"));
    }

    /// `guests = "all"`: every domain on disk but those a file names,
    /// excludes, masks or takes the name of; the host's guest defaults on
    /// the covered ones, its shutdown modes on every guest.
    #[test]
    fn all_guests_cover_every_domain_without_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc/berth/workloads");
        let qemu = dir.path().join("etc/libvirt/qemu");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::create_dir_all(qemu.join("autostart")).unwrap();
        std::fs::write(
            dir.path().join("etc/berth/berth.toml"),
            "[libvirt]\nguests = \"all\"\nexclude = [\"scratch-*\"]\norder = 20\nstop_delay_s = 120\n\
             autostart = \"last-state\"\nshutdown_mode = [\"acpi\"]\n",
        )
        .unwrap();
        std::fs::write(etc.join("web.toml"), "exec = [\"/bin/web\"]\n").unwrap();
        std::fs::write(etc.join("db.toml"), "exec = [\"/bin/db\"]\n").unwrap();
        std::fs::write(
            etc.join("legacy.toml"),
            "libvirt = \"old-vm\"\nshutdown_mode = [\"agent\"]\n",
        )
        .unwrap();
        std::fs::write(etc.join("broken.toml"), "exec = 1\n").unwrap();
        std::os::unix::fs::symlink("/dev/null", etc.join("quiet.toml")).unwrap();
        for d in [
            "vm1",
            "vm2",
            "old-vm",
            "scratch-1",
            "db",
            "quiet",
            "broken",
            "a:b",
            "x\"y",
        ] {
            std::fs::write(qemu.join(format!("{d}.xml")), "<domain/>").unwrap();
        }
        let loaded = load(&Root::new(dir.path()));
        let got: Vec<(&str, Option<&str>, bool)> = loaded
            .workloads
            .iter()
            .map(|w| (w.name.as_str(), w.libvirt_domain(), w.from_all_guests))
            .collect();
        assert_eq!(
            got,
            [
                ("db", None, false),
                ("legacy", Some("old-vm"), false),
                ("vm1", Some("vm1"), true),
                ("vm2", Some("vm2"), true),
                ("web", None, false),
            ]
        );
        let vm1 = loaded.workload("vm1").unwrap();
        assert_eq!(
            (vm1.order, vm1.stop_delay_s, vm1.autostart),
            (20, 120, Autostart::LastState)
        );
        assert_eq!(vm1.source, qemu.join("vm1.xml"));
        let modes = |w: &Workload| match &w.kind {
            WorkloadKind::Libvirt { shutdown_mode, .. } => shutdown_mode.clone(),
            _ => Vec::new(),
        };
        assert_eq!(modes(vm1), [ShutdownMode::Acpi]);
        assert_eq!(modes(loaded.workload("legacy").unwrap()), [ShutdownMode::Agent]);
        let legacy = loaded.workload("legacy").unwrap();
        assert_eq!(
            (legacy.order, legacy.autostart),
            (0, Autostart::Yes),
            "a file keeps the workload defaults"
        );
        let errors: Vec<String> = loaded.errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(errors.len(), 4, "{errors:#?}");
        for want in [
            "broken.toml: exec: must be a list",
            "db.xml: libvirt domain \"db\" is not covered by guests = \"all\": workload db (",
            "a:b.xml: libvirt domain \"a:b\" is not covered by guests = \"all\": its name is not a workload name",
            "x\"y.xml: libvirt domain \"x\\\"y\" is not covered",
        ] {
            assert!(
                errors.iter().any(|e| e.contains(want)),
                "{want:?} not in {errors:#?}"
            );
        }
        // `berth add` of another name for a covered guest: refused.
        let other = check_workload_text(
            &Root::new(dir.path()),
            "vm1-db",
            &etc.join("vm1-db.toml"),
            "libvirt = \"vm1\"\n",
        )
        .unwrap_err();
        assert!(
            other[0]
                .to_string()
                .contains("domain vm1 is covered by [libvirt] guests = \"all\" as workload vm1"),
            "{other:?}"
        );
        assert!(
            check_workload_text(
                &Root::new(dir.path()),
                "vm1",
                &etc.join("vm1.toml"),
                "libvirt = \"vm1\"\n"
            )
            .is_ok()
        );
        let taken = check_workload_text(
            &Root::new(dir.path()),
            "vm2",
            &etc.join("vm2.toml"),
            "exec = [\"/bin/x\"]\n",
        )
        .unwrap_err();
        assert!(
            taken[0]
                .to_string()
                .contains("vm2 is the libvirt guest vm2 that [libvirt] guests = \"all\" covers"),
            "{taken:?}"
        );
        // The supervisor's one-workload read finds a covered guest too.
        assert_eq!(
            load_workload(&Root::new(dir.path()), "vm2").map(|w| w.from_all_guests),
            Some(true)
        );
        assert!(load_workload(&Root::new(dir.path()), "scratch-1").is_none());
    }

    /// A domain file name is hostile like any other: a newline or an
    /// escape sequence in it reaches no message raw, and no such domain
    /// becomes a workload.
    #[test]
    fn hostile_domain_file_names_are_refused_and_shown_escaped() {
        let dir = tempfile::tempdir().unwrap();
        let qemu = dir.path().join("etc/libvirt/qemu");
        std::fs::create_dir_all(&qemu).unwrap();
        std::fs::create_dir_all(dir.path().join("etc/berth")).unwrap();
        std::fs::write(
            dir.path().join("etc/berth/berth.toml"),
            "[libvirt]\nguests = \"all\"\n",
        )
        .unwrap();
        for name in ["ok", "evil\n[Service]\nExecStart=x", "esc\x1b[2J", "-c", "a%b"] {
            std::fs::write(qemu.join(format!("{name}.xml")), "").unwrap();
        }
        std::fs::write(qemu.join(std::ffi::OsStr::from_bytes(b"bad\xff.xml")), "").unwrap();
        let loaded = load(&Root::new(dir.path()));
        let names: Vec<&str> = loaded.workloads.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["ok"]);
        assert_eq!(loaded.errors.len(), 5, "{:#?}", loaded.errors);
        for e in &loaded.errors {
            let shown = e.to_string();
            assert!(!shown.chars().any(char::is_control), "{shown:?}");
        }
    }

    /// `[libvirt]` in error: each key named, its default kept.
    #[test]
    fn libvirt_settings_in_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc/berth")).unwrap();
        std::fs::write(
            dir.path().join("etc/berth/berth.toml"),
            "[libvirt]\nguests = \"some\"\nstop_action = \"halt\"\nshutdown_mode = [\"agent\", \"agent\"]\n\
             exclude = \"vm\"\nautostart = 3\norder = 2000000\nguest = 1\n",
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("etc/libvirt/qemu")).unwrap();
        std::fs::write(dir.path().join("etc/libvirt/qemu/vm.xml"), "").unwrap();
        let loaded = load(&Root::new(dir.path()));
        assert!(loaded.workloads.is_empty(), "guests stays \"listed\"");
        assert_eq!(loaded.host.libvirt, LibvirtSettings::default());
        let errors: Vec<String> = loaded.errors.iter().map(|e| e.to_string()).collect();
        for want in [
            "libvirt.guests: must be \"listed\" or \"all\", not \"some\"",
            "libvirt.stop_action: must be \"guest_shutdown\", \"power_off\" or \"save\", not \"halt\"",
            "libvirt.shutdown_mode[1]: \"agent\" is listed twice",
            "libvirt.exclude: must be a list of domain name or patterns, not string",
            "libvirt.autostart: must be true, false or \"last-state\", not integer",
            "libvirt.order: must be from -1000000 to 1000000, not 2000000",
            "libvirt.guest: unknown key (did you mean \"guests\"?)",
        ] {
            assert!(
                errors.iter().any(|e| e.contains(want)),
                "{want:?} not in {errors:#?}"
            );
        }
        assert_eq!(errors.len(), 7, "{errors:#?}");
        let texts = |loaded: &Loaded| loaded.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>();
        let host = dir.path().join("etc/berth/berth.toml");
        std::fs::write(&host, "[libvirt]\nshutdown_mode = []\n").unwrap();
        let errors = texts(&load(&Root::new(dir.path())));
        assert!(
            errors[0].contains("libvirt.shutdown_mode: must name at least one"),
            "{errors:?}"
        );
        // An exclude list in error does not cover what it meant to leave out.
        std::fs::write(&host, "[libvirt]\nguests = \"all\"\nexclude = \"vm\"\n").unwrap();
        let loaded = load(&Root::new(dir.path()));
        assert!(loaded.workloads.is_empty(), "{:?}", loaded.workloads);
        assert_eq!(loaded.host.libvirt.guests, GuestCoverage::Listed);
        let errors = texts(&loaded);
        assert!(
            errors
                .iter()
                .any(|e| e.contains("libvirt.guests: stays \"listed\" while [libvirt] has errors")),
            "{errors:#?}"
        );
        // shutdown_mode is a guest's key only.
        std::fs::write(&host, "").unwrap();
        std::fs::create_dir_all(dir.path().join("etc/berth/workloads")).unwrap();
        std::fs::write(
            dir.path().join("etc/berth/workloads/web.toml"),
            "exec = [\"/x\"]\nshutdown_mode = [\"acpi\"]\n",
        )
        .unwrap();
        let errors = texts(&load(&Root::new(dir.path())));
        assert!(
            errors[0].contains("shutdown_mode: is for a libvirt guest"),
            "{errors:?}"
        );
    }
}
