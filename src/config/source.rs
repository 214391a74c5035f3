//! Finding config files across the config directories.
//!
//! The rules are systemd's for unit files: directories are searched highest
//! precedence first; a file in a higher directory masks a same-named file in
//! a lower one; a symlink to /dev/null masks without replacing. Only
//! `*.toml` files count, hidden files (editor and package-manager leftovers
//! often start with a dot) are ignored.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::ConfigError;
use crate::names::is_valid_workload_name;
use crate::paths::{HOST_FILE, HOST_FRAGMENT_DIR, Root, WORKLOAD_DIR};

#[derive(Debug, Default)]
pub struct Discovered {
    /// `berth.toml` (if any), then fragments in lexical order of file name.
    pub host_files: Vec<PathBuf>,
    /// Workload name → its winning file, sorted by name.
    pub workloads: Vec<(String, PathBuf)>,
    pub masked: Vec<String>,
    /// Problems finding the host files; the settings those files would
    /// make take their built-in defaults.
    pub host_errors: Vec<ConfigError>,
    pub errors: Vec<ConfigError>,
}

pub fn discover(root: &Root) -> Discovered {
    let mut found = discover_host(root);
    let dirs = usable_dirs(root, &mut found.errors);

    let (workloads, masked) = winners(
        &dirs.iter().map(|d| d.join(WORKLOAD_DIR)).collect::<Vec<_>>(),
        &mut found.errors,
    );
    for (file_name, path) in workloads {
        let name = file_name.trim_end_matches(".toml");
        if is_valid_workload_name(name) {
            found.workloads.push((name.to_string(), path));
        } else {
            found.errors.push(ConfigError::file(
                &path,
                format!(
                    "{name:?} is not a valid workload name (the file stem is the name): use 1-64 \
                     characters from A-Z a-z 0-9 _ . - starting with a letter or digit"
                ),
            ));
        }
    }
    found.masked = masked
        .into_iter()
        .map(|n| n.trim_end_matches(".toml").to_string())
        .collect();
    found
}

/// Device number of /dev/null (major 1, minor 3).
const DEV_NULL: u64 = (1 << 8) | 3;

/// The host files only.
pub fn discover_host(root: &Root) -> Discovered {
    let mut found = Discovered::default();
    let dirs = usable_dirs(root, &mut found.host_errors);
    for dir in &dirs {
        let path = dir.join(HOST_FILE);
        match entry_state(&path) {
            Entry::Missing => continue,
            Entry::Masked => break,
            Entry::File => {
                found.host_files.push(path);
                break;
            }
            Entry::Unreadable(e) => {
                found.host_errors.push(ConfigError::file(&path, e));
                break;
            }
        }
    }

    let (fragments, _) = winners(
        &dirs.iter().map(|d| d.join(HOST_FRAGMENT_DIR)).collect::<Vec<_>>(),
        &mut found.host_errors,
    );
    found.host_files.extend(fragments.into_values());

    found
}

/// The config directories whose paths can go into unit files; another
/// (a user's `XDG_CONFIG_HOME` with a newline in it) is refused, once.
fn usable_dirs(root: &Root, errors: &mut Vec<ConfigError>) -> Vec<PathBuf> {
    root.config_dirs()
        .into_iter()
        .filter(|dir| {
            let inside = dir.strip_prefix(root.dir()).unwrap_or(dir);
            let usable = super::is_representable(inside);
            if !usable {
                errors.push(ConfigError::file(
                    dir,
                    "directory path is not UTF-8 or contains a control character; its files are ignored",
                ));
            }
            usable
        })
        .collect()
}

/// The winning file of one workload, without listing every directory.
pub fn find_workload(root: &Root, name: &str) -> Option<PathBuf> {
    for dir in root.config_dirs() {
        let path = dir.join(WORKLOAD_DIR).join(format!("{name}.toml"));
        match entry_state(&path) {
            Entry::Missing => continue,
            Entry::File => return Some(path),
            Entry::Masked | Entry::Unreadable(_) => return None,
        }
    }
    None
}

enum Entry {
    Missing,
    Masked,
    File,
    Unreadable(String),
}

fn entry_state(path: &Path) -> Entry {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Entry::Missing,
        Err(e) => Entry::Unreadable(format!("cannot read: {e}")),
        Ok(meta) => {
            // A mask is a symlink to /dev/null, however it is spelled
            // (systemd checks the device, not the link text).
            if meta.file_type().is_symlink()
                && fs::metadata(path).is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == DEV_NULL)
            {
                return Entry::Masked;
            }
            match fs::metadata(path) {
                Ok(m) if m.is_file() => Entry::File,
                Ok(_) => Entry::Unreadable("not a regular file".into()),
                Err(e) => Entry::Unreadable(format!("cannot read: {e}")),
            }
        }
    }
}

enum Winner {
    File(PathBuf),
    Masked,
    Broken,
}

/// For each `*.toml` name across `dirs`, the file from the highest directory.
/// Returns (winners by file name, masked file names).
fn winners(dirs: &[PathBuf], errors: &mut Vec<ConfigError>) -> (BTreeMap<String, PathBuf>, Vec<String>) {
    // Lowest precedence first, so that higher directories overwrite.
    let mut by_name: BTreeMap<String, Winner> = BTreeMap::new();
    for dir in dirs.iter().rev() {
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => {
                errors.push(ConfigError::file(dir, format!("cannot list directory: {e}")));
                continue;
            }
        };
        for entry in entries.flatten() {
            let Ok(file_name) = entry.file_name().into_string() else {
                errors.push(ConfigError::file(
                    &entry.path(),
                    "file name is not valid UTF-8; ignored",
                ));
                continue;
            };
            if file_name.starts_with('.') || !file_name.ends_with(".toml") {
                continue;
            }
            let path = entry.path();
            // Its path goes into unit files (SourcePath=, headers) and log
            // lines: a control character there would forge lines.
            if file_name.chars().any(char::is_control) {
                errors.push(ConfigError::file(
                    &path,
                    "file name contains a control character; ignored",
                ));
                continue;
            }
            match entry_state(&path) {
                Entry::Missing => {}
                Entry::Masked => {
                    by_name.insert(file_name, Winner::Masked);
                }
                Entry::File => {
                    by_name.insert(file_name, Winner::File(path));
                }
                Entry::Unreadable(e) => {
                    errors.push(ConfigError::file(&path, e));
                    // A broken higher file still hides the lower one: never
                    // silently fall back to a definition the admin overrode.
                    by_name.insert(file_name, Winner::Broken);
                }
            }
        }
    }
    let mut live = BTreeMap::new();
    let mut masked = Vec::new();
    for (name, winner) in by_name {
        match winner {
            Winner::File(p) => {
                live.insert(name, p);
            }
            Winner::Masked => masked.push(name),
            Winner::Broken => {}
        }
    }
    (live, masked)
}
