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
pub mod host;
mod passthrough;
mod read;
pub mod restart;
mod source;
mod workload;

pub use crate::names::{is_valid_workload_name, unit_name};
pub use cluster::{ClusterSettings, Watchdog};
pub use error::{ConfigError, is_representable, shown_path};
pub use host::{DaemonSettings, HostSettings};
pub use passthrough::{ACCEPTED_SAMPLES, PassthroughKind, TYPED_SETTINGS, passthrough_rule};
pub use restart::{Restart, RestartPolicy};
pub use source::Discovered;
pub use workload::{Autostart, HaPolicy, Readiness, StopAction, Workload, WorkloadKind};

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
    load_discovered(found, &HostSettings::defaults_for(root))
}

fn load_discovered(found: Discovered, defaults: &HostSettings) -> Loaded {
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

/// One workload's current definition, reading only its file and the host
/// files (what the supervisor needs on a transition).
pub fn load_workload(root: &Root, name: &str) -> Option<Workload> {
    let path = source::find_workload(root, name)?;
    let host = source::discover_host(root);
    let (host, _) = host::load(&host.host_files, &HostSettings::defaults_for(root));
    workload::load(name, &path, &host).ok()
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
}
