//! Freezes: "do not start workloads here". A freeze carries its scope from
//! the start, so node and instance flags on disk today and cluster-wide or
//! per-object freezes shared through a key-value store later are one type.
//!
//! On disk (`/var/lib/berth/freeze/`): `node` and `instance/NAME`, each a
//! small JSON document. berth-autostart.service's `ConditionPathExists=`
//! names the node flag, so a node freeze skips the autostart unit visibly in
//! `systemctl status`; an instance flag is read by `berth autostart`, which
//! skips that workload. An explicit `systemctl start` is never blocked.

use std::fs;
use std::io;
use std::path::PathBuf;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::paths::Root;
use crate::time::rfc3339;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// This host: no workload starts at boot.
    Node,
    /// One workload on this host.
    Instance,
    /// Every host sharing the cluster store (later).
    Cluster,
    /// One object across the cluster, e.g. a workload that may run on
    /// several hosts (later).
    Object,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Freeze {
    pub scope: Scope,
    /// The workload (instance scope) or object key (object scope).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// RFC 3339, UTC, whole seconds. Re-freezing keeps the first one.
    pub frozen_at: String,
    #[serde(default)]
    pub reason: String,
}

impl Freeze {
    /// `frozen_at` for messages: `?` when unknown (an unreadable flag).
    pub fn since(&self) -> &str {
        if self.frozen_at.is_empty() {
            "?"
        } else {
            &self.frozen_at
        }
    }

    /// The reason for messages.
    pub fn why(&self) -> &str {
        if self.reason.is_empty() {
            "no reason given"
        } else {
            &self.reason
        }
    }

    pub fn node(reason: &str, now: SystemTime) -> Self {
        Freeze {
            scope: Scope::Node,
            target: None,
            frozen_at: rfc3339(now),
            reason: reason.into(),
        }
    }

    pub fn instance(name: &str, reason: &str, now: SystemTime) -> Self {
        Freeze {
            scope: Scope::Instance,
            target: Some(name.into()),
            frozen_at: rfc3339(now),
            reason: reason.into(),
        }
    }
}

pub fn node_flag(root: &Root) -> PathBuf {
    root.node_freeze_flag()
}

pub fn instance_flag(root: &Root, name: &str) -> PathBuf {
    root.state_dir().join("freeze/instance").join(name)
}

/// Reads a flag. `Ok(None)`: not frozen. A flag that exists but cannot be
/// parsed still freezes (the admin's intent was to freeze), with the
/// problem as the reason.
pub fn read(path: &std::path::Path, scope: Scope, target: Option<&str>) -> io::Result<Option<Freeze>> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(Some(serde_json::from_str(&text).unwrap_or_else(|e| Freeze {
        scope,
        target: target.map(str::to_string),
        frozen_at: String::new(),
        reason: format!(
            "unreadable freeze flag {} ({e}); treated as frozen",
            path.display()
        ),
    })))
}

/// The kernel command line as systemd reads it: `$SYSTEMD_PROC_CMDLINE` if
/// set, PID 1's own command line in a container (systemd treats that as
/// the kernel's there), else /proc/cmdline.
pub fn kernel_command_line() -> String {
    if let Some(line) = std::env::var_os("SYSTEMD_PROC_CMDLINE") {
        return line.to_string_lossy().into_owned();
    }
    let in_container = std::path::Path::new("/run/systemd/container").exists();
    let source = if in_container {
        "/proc/1/cmdline"
    } else {
        "/proc/cmdline"
    };
    fs::read(source)
        .map(|bytes| String::from_utf8_lossy(&bytes).replace('\0', " "))
        .unwrap_or_default()
}

/// Whether `berth.freeze` is on the command line, alone or as an
/// assignment: what `ConditionKernelCommandLine=!berth.freeze` tests.
pub fn cmdline_freeze(line: &str) -> bool {
    line.split_whitespace()
        .any(|w| w == "berth.freeze" || w.starts_with("berth.freeze="))
}

/// Why the node is frozen, if it is: the command-line flag or the node flag.
pub fn node_frozen(root: &Root) -> Option<String> {
    if cmdline_freeze(&kernel_command_line()) {
        return Some("berth.freeze is on the kernel command line".into());
    }
    match read(&node_flag(root), Scope::Node, None) {
        Ok(Some(f)) => Some(format!(
            "the node is frozen ({}) since {}: {}",
            node_flag(root).display(),
            f.since(),
            f.why()
        )),
        Ok(None) => None,
        Err(e) => Some(format!(
            "the node freeze flag cannot be read ({e}); treated as frozen"
        )),
    }
}

/// Why a workload is frozen, if it is.
pub fn instance_frozen(root: &Root, name: &str) -> Option<String> {
    let flag = instance_flag(root, name);
    match read(&flag, Scope::Instance, Some(name)) {
        Ok(Some(f)) => Some(format!("frozen since {}: {}", f.since(), f.why())),
        Ok(None) => None,
        Err(e) => Some(format!(
            "its freeze flag {} cannot be read ({e}); treated as frozen",
            flag.display()
        )),
    }
}

/// Writes a freeze flag (atomically, fsynced). Re-freezing keeps the
/// original `frozen_at`; a new reason replaces the old one.
pub fn freeze(root: &Root, name: Option<&str>, reason: &str) -> std::io::Result<Freeze> {
    let (path, mut flag) = match name {
        None => (node_flag(root), Freeze::node(reason, SystemTime::now())),
        Some(n) => (
            instance_flag(root, n),
            Freeze::instance(n, reason, SystemTime::now()),
        ),
    };
    let scope = flag.scope.clone();
    if let Ok(Some(old)) = read(&path, scope, name)
        && !old.frozen_at.is_empty()
    {
        flag.frozen_at = old.frozen_at;
        if reason.is_empty() {
            flag.reason = old.reason;
        }
    }
    let bytes = serde_json::to_vec_pretty(&flag).map_err(std::io::Error::from)?;
    super::atomic::write_json(&path, &bytes)?;
    Ok(flag)
}

/// Removes a freeze flag; thawing what is not frozen is not an error.
/// Returns whether there was a flag.
pub fn thaw(root: &Root, name: Option<&str>) -> std::io::Result<bool> {
    let path = match name {
        None => node_flag(root),
        Some(n) => instance_flag(root, n),
    };
    match fs::remove_file(&path) {
        Ok(()) => {
            if let Some(dir) = path.parent() {
                fs::File::open(dir)?.sync_all()?;
            }
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_freeze_matches_the_unit_condition() {
        assert!(cmdline_freeze("quiet berth.freeze splash"));
        assert!(cmdline_freeze("berth.freeze=1"));
        assert!(!cmdline_freeze("berth.freezer berth.frozen"));
        assert!(!cmdline_freeze(""));
    }

    #[test]
    fn refreezing_keeps_frozen_at_and_thaw_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let first = freeze(&root, Some("web"), "maintenance").unwrap();
        assert_eq!(first.scope, Scope::Instance);
        let path = instance_flag(&root, "web");
        let mut doc: Freeze = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        doc.frozen_at = "2020-01-01T00:00:00Z".into();
        fs::write(&path, serde_json::to_vec(&doc).unwrap()).unwrap();
        let again = freeze(&root, Some("web"), "").unwrap();
        assert_eq!(again.frozen_at, "2020-01-01T00:00:00Z");
        assert_eq!(again.reason, "maintenance");
        assert!(thaw(&root, Some("web")).unwrap());
        assert!(!thaw(&root, Some("web")).unwrap());
        let node = freeze(&root, None, "disk swap").unwrap();
        assert_eq!(node.scope, Scope::Node);
        assert!(node_flag(&root).exists());
    }

    #[test]
    fn json_round_trip_carries_the_scope() {
        let f = Freeze::instance("web", "maintenance", std::time::UNIX_EPOCH);
        let text = serde_json::to_string(&f).unwrap();
        assert_eq!(
            text,
            r#"{"scope":"instance","target":"web","frozen_at":"1970-01-01T00:00:00Z","reason":"maintenance"}"#
        );
        assert_eq!(serde_json::from_str::<Freeze>(&text).unwrap(), f);
        let node: Freeze = serde_json::from_str(r#"{"scope":"node","frozen_at":"x"}"#).unwrap();
        assert_eq!(node.scope, Scope::Node);
    }

    #[test]
    fn missing_flag_is_not_frozen_and_a_garbled_one_still_freezes() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        assert_eq!(read(&node_flag(&root), Scope::Node, None).unwrap(), None);
        fs::create_dir_all(node_flag(&root).parent().unwrap()).unwrap();
        fs::write(node_flag(&root), "{oops").unwrap();
        let f = read(&node_flag(&root), Scope::Node, None).unwrap().unwrap();
        assert_eq!(f.scope, Scope::Node);
        assert!(f.reason.contains("treated as frozen"), "{}", f.reason);
        assert_eq!(
            instance_flag(&root, "web"),
            dir.path().join("var/lib/berth/freeze/instance/web")
        );
    }
}
