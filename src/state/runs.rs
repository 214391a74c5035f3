//! `runs.json` in the state directory: the run of the service manager
//! berth last saw and the one before it, so that `autostart =
//! "last-state"` can tell a drain of the previous run from an older one.
//!
//! A run is a boot id (`/proc/sys/kernel/random/boot_id`) and the
//! manager's start (its UserspaceTimestampMonotonic): a user manager that
//! exits and comes back, or a soft reboot that starts the manager anew,
//! is a new run within one boot. Neither the kernel nor systemd keeps a
//! history of them, so berth notes each run it works in: the autostart,
//! the daemon and the drain each call [`note`]. A run in which none of
//! them ran (booted with `berth.freeze`, no daemon, and then power lost)
//! leaves no trace.

use std::io;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::paths::Root;

const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// This boot's id, as the kernel tells it (a UUID, lower case).
pub fn boot_id() -> io::Result<String> {
    let text = std::fs::read_to_string(BOOT_ID)?;
    let id = text.trim().to_ascii_lowercase();
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') || id.len() > 64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{BOOT_ID}: not a boot id"),
        ));
    }
    Ok(id)
}

/// A run's id: `BOOT_ID/MANAGER_START_US`.
pub fn run_id(boot_id: &str, manager_started_us: u64) -> String {
    format!("{boot_id}/{manager_started_us}")
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Runs {
    /// The run berth last worked in.
    #[serde(default)]
    pub current: String,
    /// The run before that one; empty when none was seen.
    #[serde(default)]
    pub previous: String,
}

impl Runs {
    /// The ledger once `now` is noted: a run seen for the first time
    /// pushes the last one back; seeing it again changes nothing.
    pub fn after(self, now: &str) -> Runs {
        if self.current == now {
            self
        } else {
            Runs {
                previous: self.current,
                current: now.to_string(),
            }
        }
    }
}

pub fn path(root: &Root) -> PathBuf {
    root.state_dir().join("runs.json")
}

/// What the ledger says; empty when it is missing or unreadable (a run
/// then has no known predecessor, which makes no report count).
pub fn read(root: &Root) -> Runs {
    std::fs::read(path(root))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Notes run `now` and returns the ledger after it. Two writers at once
/// (the autostart and the daemon at boot) write the same content.
pub fn note(root: &Root, now: &str) -> io::Result<Runs> {
    let before = read(root);
    let after = before.clone().after(now);
    if after != before {
        let bytes = serde_json::to_vec_pretty(&after).map_err(io::Error::from)?;
        super::atomic::write_json(&path(root), &bytes)?;
    }
    Ok(after)
}

/// Notes this run (of the manager that started at `manager_started_us`);
/// what goes wrong is only worth a warning (the last state is then
/// unknown, and last-state workloads start).
pub fn note_current(root: &Root, manager_started_us: u64) -> Result<Runs, String> {
    let boot = boot_id().map_err(|e| format!("cannot read this boot's id: {e}"))?;
    note_run(root, &boot, manager_started_us)
}

/// Notes the run of boot `boot` whose manager started at
/// `manager_started_us`.
pub fn note_run(root: &Root, boot: &str, manager_started_us: u64) -> Result<Runs, String> {
    note(root, &run_id(boot, manager_started_us))
        .map_err(|e| format!("cannot write {}: {e}", path(root).display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_run_pushes_the_last_one_back_and_a_second_look_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        assert_eq!(read(&root), Runs::default());
        let a = note(&root, "a").unwrap();
        assert_eq!((a.current.as_str(), a.previous.as_str()), ("a", ""));
        note(&root, "b").unwrap();
        let b = note(&root, "b").unwrap();
        assert_eq!((b.current.as_str(), b.previous.as_str()), ("b", "a"));
        assert_eq!(read(&root), b);
    }

    #[test]
    fn an_unreadable_ledger_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        std::fs::create_dir_all(root.state_dir()).unwrap();
        std::fs::write(path(&root), "{not json").unwrap();
        assert_eq!(read(&root), Runs::default());
        assert_eq!(note(&root, "c").unwrap().previous, "");
    }

    #[test]
    fn this_machine_has_a_boot_id() {
        let id = boot_id().unwrap();
        assert_eq!(id.len(), 36, "{id}");
    }
}
