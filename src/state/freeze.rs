//! Freezes: "do not start workloads here". A freeze carries its scope from
//! the start, so node and instance flags on disk today and cluster-wide or
//! per-object freezes shared through a key-value store later are one type.
//!
//! On disk (`/var/lib/berth/freeze/`): `node` and `instance/NAME`, each a
//! small JSON document. berth-autostart.service's `ConditionPathExists=`
//! names the node flag, so a node freeze skips the autostart unit visibly in
//! `systemctl status`; an instance flag is read by `berth autostart`, which
//! skips that workload. An explicit `systemctl start` is never blocked.
//!
//! In cluster mode a node flag may be a cluster freeze the daemon adopted
//! (scope `cluster`) and an instance flag an object freeze (scope
//! `object`); `adopted` then says which key, revision and node. A binary
//! older than that field refuses the document (`deny_unknown_fields`) and
//! so treats the flag as frozen: the safe direction.

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
    /// The node, because the whole cluster is frozen (`freeze/cluster`,
    /// adopted by this node's daemon).
    Cluster,
    /// One workload, because it is frozen on every node that has it
    /// (`freeze/objects/NAME`, adopted by this node's daemon).
    Object,
}

impl Scope {
    pub fn as_str(&self) -> &'static str {
        match self {
            Scope::Node => "node",
            Scope::Instance => "instance",
            Scope::Cluster => "cluster",
            Scope::Object => "object",
        }
    }
}

/// Where an adopted freeze came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Adopted {
    /// The etcd key, e.g. `/berth/freeze/cluster`.
    pub key: String,
    /// Its mod_revision when adopted.
    pub revision: i64,
    /// The node that took it (`berth freeze --cluster` ran there).
    pub taken_by: String,
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
    /// Set for scopes `cluster` and `object` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopted: Option<Adopted>,
    /// An own freeze (`node`, `instance`) over an adopted one: the adopted
    /// freeze it covers, which `berth thaw` uncovers rather than lifts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadows: Option<Box<Freeze>>,
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
            adopted: None,
            shadows: None,
        }
    }

    pub fn instance(name: &str, reason: &str, now: SystemTime) -> Self {
        Freeze {
            scope: Scope::Instance,
            target: Some(name.into()),
            frozen_at: rfc3339(now),
            reason: reason.into(),
            adopted: None,
            shadows: None,
        }
    }

    /// A freeze this node's daemon adopted from the cluster store (it
    /// goes when the key goes), as opposed to one taken here.
    pub fn is_adopted(&self) -> bool {
        matches!(self.scope, Scope::Cluster | Scope::Object)
    }

    /// As `berth status`, `berth list` and the API show it.
    pub fn summary(&self) -> serde_json::Value {
        serde_json::json!({
            "frozen_scope": self.scope.as_str(),
            "frozen_at": (!self.frozen_at.is_empty()).then_some(&self.frozen_at),
            "reason": self.reason,
            "taken_by": self.adopted.as_ref().map(|a| &a.taken_by),
            // An own freeze over an adopted one: what `berth thaw` uncovers.
            "covers": self.shadows.as_ref().map(|f| f.summary()),
        })
    }
}

/// Every freeze on this node at one moment: the node's (the command
/// line's first) and each workload's.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Freezes {
    pub node: Option<Freeze>,
    pub instances: std::collections::BTreeMap<String, Freeze>,
}

impl Freezes {
    /// What holds `name` back: its own freeze, else the node's.
    pub fn of(&self, name: &str) -> Option<&Freeze> {
        self.instances.get(name).or(self.node.as_ref())
    }
}

/// The reason of the command line's node freeze.
pub const KERNEL_CMDLINE: &str = "kernel-cmdline";
/// The reason of the node freeze a rejoin grace that passed leaves.
pub const REJOIN_GRACE_EXPIRED: &str = "rejoin-grace-expired";

/// Every freeze: the flags, and the command line's for a node without a
/// flag of its own.
pub fn all(root: &Root) -> Freezes {
    let mut f = flags(root);
    if f.node.is_none() && cmdline_freeze(&kernel_command_line()) {
        f.node = Some(Freeze {
            frozen_at: String::new(),
            ..Freeze::node(KERNEL_CMDLINE, SystemTime::now())
        });
    }
    f
}

/// The flags on disk (one directory listing for the instances).
pub fn flags(root: &Root) -> Freezes {
    let node = read(&node_flag(root), Scope::Node, None).unwrap_or_else(|e| {
        Some(Freeze {
            frozen_at: String::new(),
            ..Freeze::node(
                &format!("the node freeze flag cannot be read ({e}); treated as frozen"),
                SystemTime::now(),
            )
        })
    });
    let mut instances = std::collections::BTreeMap::new();
    let dir = root.state_dir().join("freeze/instance");
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !crate::names::is_valid_workload_name(&name) {
            continue;
        }
        if let Ok(Some(f)) = read(&entry.path(), Scope::Instance, Some(&name)) {
            instances.insert(name, f);
        }
    }
    Freezes { node, instances }
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
        adopted: None,
        shadows: None,
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
            "the node is frozen ({}, scope {}) since {}: {}",
            node_flag(root).display(),
            f.scope.as_str(),
            f.since(),
            f.why().escape_debug()
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
        Ok(Some(f)) => Some(format!("frozen since {}: {}", f.since(), f.why().escape_debug())),
        Ok(None) => None,
        Err(e) => Some(format!(
            "its freeze flag {} cannot be read ({e}); treated as frozen",
            flag.display()
        )),
    }
}

/// Writes a freeze flag (atomically, fsynced). Re-freezing keeps the
/// original `frozen_at`; a new reason replaces the old one. Over an
/// adopted freeze, the own one covers it (`shadows`).
pub fn freeze(root: &Root, name: Option<&str>, reason: &str) -> std::io::Result<Freeze> {
    let mut flag = own(name, reason);
    match current(root, name) {
        Some(old) if old.is_adopted() => flag.shadows = Some(Box::new(old)),
        Some(old) => {
            if !old.frozen_at.is_empty() {
                flag.frozen_at = old.frozen_at;
                if reason.is_empty() {
                    flag.reason = old.reason;
                }
            }
            flag.shadows = old.shadows;
        }
        None => {}
    }
    write(root, name, &flag)?;
    Ok(flag)
}

/// The daemon's own freeze (the rejoin grace, the command line): written
/// unless the node or workload has an own freeze already (which stays as
/// it is); an adopted one is covered. The flag written, if any.
pub fn freeze_unless_own(root: &Root, name: Option<&str>, reason: &str) -> io::Result<Option<Freeze>> {
    let mut flag = own(name, reason);
    match current(root, name) {
        Some(old) if !old.is_adopted() => return Ok(None),
        Some(old) => flag.shadows = Some(Box::new(old)),
        None => {}
    }
    write(root, name, &flag)?;
    Ok(Some(flag))
}

fn own(name: Option<&str>, reason: &str) -> Freeze {
    match name {
        None => Freeze::node(reason, SystemTime::now()),
        Some(n) => Freeze::instance(n, reason, SystemTime::now()),
    }
}

/// The flag as it is (an unreadable one counts as an own freeze).
pub fn current(root: &Root, name: Option<&str>) -> Option<Freeze> {
    let (path, scope) = match name {
        None => (node_flag(root), Scope::Node),
        Some(n) => (instance_flag(root, n), Scope::Instance),
    };
    read(&path, scope, name).ok().flatten()
}

/// Writes a node (`name` None) or instance flag as it is (atomically,
/// fsynced).
pub fn write(root: &Root, name: Option<&str>, flag: &Freeze) -> io::Result<()> {
    let path = match name {
        None => node_flag(root),
        Some(n) => instance_flag(root, n),
    };
    let bytes = serde_json::to_vec_pretty(flag).map_err(io::Error::from)?;
    super::atomic::write_json(&path, &bytes)
}

/// What `berth thaw` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Thawed {
    NotFrozen,
    Thawed,
    /// The own freeze is gone; the adopted one it covered holds again.
    Uncovered(Freeze),
}

/// Lifts the node's or a workload's freeze: an own freeze that covers an
/// adopted one gives way to it; any other flag is removed.
pub fn thaw(root: &Root, name: Option<&str>) -> io::Result<Thawed> {
    if let Some(old) = current(root, name)
        && let Some(covered) = old.shadows
    {
        write(root, name, &covered)?;
        return Ok(Thawed::Uncovered(*covered));
    }
    Ok(if remove(root, name)? {
        Thawed::Thawed
    } else {
        Thawed::NotFrozen
    })
}

/// Removes a freeze flag; removing what is not there is not an error.
/// Returns whether there was a flag.
pub fn remove(root: &Root, name: Option<&str>) -> std::io::Result<bool> {
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

/// An adopted freeze as the tests of several modules need one: the
/// cluster key (scope cluster) or db's object key, at `revision`.
#[cfg(test)]
pub(crate) fn adopted_for_tests(scope: Scope, revision: i64, taken_by: &str) -> Freeze {
    let (target, key) = match scope {
        Scope::Object => (Some("db".to_string()), "/berth/freeze/objects/db"),
        _ => (None, "/berth/freeze/cluster"),
    };
    Freeze {
        scope,
        target,
        frozen_at: "2026-12-03T08:00:00Z".into(),
        reason: "upgrade".into(),
        adopted: Some(Adopted {
            key: key.into(),
            revision,
            taken_by: taken_by.into(),
        }),
        shadows: None,
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
        assert_eq!(thaw(&root, Some("web")).unwrap(), Thawed::Thawed);
        assert_eq!(thaw(&root, Some("web")).unwrap(), Thawed::NotFrozen);
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

    /// Issue 14: an adopted flag carries its provenance; a flag with a
    /// field this binary does not know (a newer berth wrote it) still
    /// freezes: an older binary reads a newer flag as frozen, never thawed.
    #[test]
    fn provenance_round_trips_and_an_unknown_field_still_freezes() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let adopted = adopted_for_tests(Scope::Cluster, 42, "n2");
        write(&root, None, &adopted).unwrap();
        assert_eq!(
            read(&node_flag(&root), Scope::Node, None).unwrap(),
            Some(adopted.clone())
        );
        assert!(adopted.is_adopted() && !Freeze::node("x", std::time::UNIX_EPOCH).is_adopted());
        assert_eq!(adopted.summary()["frozen_scope"], "cluster");
        assert_eq!(adopted.summary()["taken_by"], "n2");
        fs::write(
            node_flag(&root),
            r#"{"scope":"node","frozen_at":"T","reason":"r","from_the_future":1}"#,
        )
        .unwrap();
        let f = read(&node_flag(&root), Scope::Node, None).unwrap().unwrap();
        assert!(f.reason.contains("treated as frozen"), "{}", f.reason);
        assert!(node_frozen(&root).is_some());
        // An own freeze over the adopted one covers it; thaw uncovers it,
        // a second thaw lifts it; the daemon's own freeze does likewise but
        // leaves an own freeze alone.
        write(&root, None, &adopted).unwrap();
        let own = freeze(&root, None, "disk swap").unwrap();
        assert_eq!(
            (own.scope.clone(), own.shadows.as_deref()),
            (Scope::Node, Some(&adopted))
        );
        let again = freeze(&root, None, "").unwrap();
        assert_eq!(
            (again.reason.as_str(), again.shadows.as_deref()),
            ("disk swap", Some(&adopted))
        );
        assert_eq!(thaw(&root, None).unwrap(), Thawed::Uncovered(adopted.clone()));
        assert_eq!(current(&root, None), Some(adopted.clone()));
        let expired = freeze_unless_own(&root, None, REJOIN_GRACE_EXPIRED)
            .unwrap()
            .unwrap();
        assert_eq!(expired.shadows.as_deref(), Some(&adopted));
        assert_eq!(freeze_unless_own(&root, None, KERNEL_CMDLINE).unwrap(), None);
        assert_eq!(current(&root, None).unwrap().reason, REJOIN_GRACE_EXPIRED);
        assert_eq!(thaw(&root, None).unwrap(), Thawed::Uncovered(adopted));
        assert_eq!(thaw(&root, None).unwrap(), Thawed::Thawed);
        // The flags on disk, and what freezes each workload.
        freeze(&root, Some("web"), "w").unwrap();
        let all = flags(&root);
        assert_eq!(all.node, None);
        assert_eq!(all.of("web").map(|f| f.scope.clone()), Some(Scope::Instance));
        assert_eq!(all.of("db"), None);
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
