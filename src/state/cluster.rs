//! The files cluster mode keeps on the node.
//!
//! Under the state directory (they outlive the boot, so each says which
//! boot or etcd cluster it belongs to):
//! - `cluster-lease.json`: the live lease and the boot it was granted in;
//!   a daemon restarted in the same boot resumes it.
//! - `cluster-maintenance.json`: the maintenance lease a daemon stopped on
//!   purpose left the node's keys on, and its boot.
//! - `cluster-freeze-revision`: the etcd cluster's id and the last freeze
//!   revision this node adopted.
//!
//! Under the runtime directory (this boot only):
//! - `cluster-fence-deadline`: the last fence deadline the daemon saw,
//!   CLOCK_BOOTTIME ms, for a daemon restarted while etcd is out of reach,
//!   for `owner-check` and for `fence-arm`.
//! - `cluster-rejoined`: the boot id whose rejoin grace is over.
//! - `cluster-listing-error`: why the daemon's last listing of owners
//!   and presences failed, while it does (for `berth status`).
//! - `cluster-drained`: the boot id in which `berth drain` began here;
//!   `owner-check` refuses every start until the daemon joins again.
//! - `watchdog-armed`: the watchdog device berth-fence-watch holds and
//!   its timeout; `owner-check` starts no HA workload without it when
//!   `[cluster] watchdog` is set.
//! - `cluster-ran.json`: for each HA workload owned here, the ownership
//!   (its key's create revision) in which it has run, so that a restarted
//!   daemon does not start again what ran and was stopped since.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::atomic;

/// A lease the node holds, with the boot it was granted in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    pub lease_id: i64,
    pub boot_id: String,
}

pub fn lease_path(state_dir: &Path) -> PathBuf {
    state_dir.join("cluster-lease.json")
}

/// The live lease, as recorded.
pub fn read_lease(state_dir: &Path) -> io::Result<LeaseRecord> {
    read_json(&lease_path(state_dir))
}

pub fn write_lease(state_dir: &Path, r: &LeaseRecord) -> io::Result<()> {
    write_json(&lease_path(state_dir), r)
}

pub fn maintenance_path(state_dir: &Path) -> PathBuf {
    state_dir.join("cluster-maintenance.json")
}

/// The maintenance lease, if one is recorded and readable.
pub fn read_maintenance(state_dir: &Path) -> Option<LeaseRecord> {
    read_json(&maintenance_path(state_dir)).ok()
}

pub fn write_maintenance(state_dir: &Path, r: &LeaseRecord) -> io::Result<()> {
    write_json(&maintenance_path(state_dir), r)
}

/// The maintenance is over: its keys came back, or its lease is gone.
pub fn remove_maintenance(state_dir: &Path) {
    let _ = std::fs::remove_file(maintenance_path(state_dir));
}

/// The last freeze revision adopted, and of which etcd cluster: a store
/// rebuilt from scratch counts revisions anew.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreezeRevision {
    pub cluster_id: u64,
    pub revision: i64,
}

pub fn freeze_revision_path(state_dir: &Path) -> PathBuf {
    state_dir.join("cluster-freeze-revision")
}

pub fn read_freeze_revision(state_dir: &Path) -> Option<FreezeRevision> {
    read_json(&freeze_revision_path(state_dir)).ok()
}

pub fn write_freeze_revision(state_dir: &Path, r: FreezeRevision) -> io::Result<()> {
    write_json(&freeze_revision_path(state_dir), &r)
}

pub fn fence_deadline_path(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("cluster-fence-deadline")
}

/// The deadline a daemon of this boot last kept (CLOCK_BOOTTIME).
pub fn read_fence_deadline(runtime_dir: &Path) -> Option<Duration> {
    let text = std::fs::read_to_string(fence_deadline_path(runtime_dir)).ok()?;
    text.trim().parse::<u64>().ok().map(Duration::from_millis)
}

/// Best effort, and without a sync: it moves every keep-alive interval,
/// and the runtime directory does not outlive the boot anyway.
pub fn write_fence_deadline(runtime_dir: &Path, d: Duration) {
    let path = fence_deadline_path(runtime_dir);
    // A name of its own: the daemon and a drain may write at once, and a
    // shared one could be renamed half written (read as no deadline).
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    if std::fs::write(&tmp, format!("{}\n", d.as_millis())).is_ok() {
        let _ = std::fs::rename(&tmp, &path);
    }
}

pub fn rejoined_path(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("cluster-rejoined")
}

/// The boot whose rejoin is over, if any.
pub fn read_rejoined(runtime_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(rejoined_path(runtime_dir)).ok()?;
    Some(text.trim().to_string())
}

pub fn write_rejoined(runtime_dir: &Path, boot_id: &str) -> io::Result<()> {
    atomic::write_json(&rejoined_path(runtime_dir), boot_id.as_bytes())
}

pub fn drained_path(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("cluster-drained")
}

/// The boot in which a drain began here, if one did and the daemon has
/// not joined since.
pub fn read_drained(runtime_dir: &Path) -> Option<String> {
    read_at_most(&drained_path(runtime_dir), 256).map(|t| t.trim().to_string())
}

/// At most `max` bytes of a small file (this node's, or the kernel's): a
/// file grown huge (or replaced by one) costs no more than that.
pub fn read_at_most(path: &Path, max: u64) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(max)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

pub fn write_drained(runtime_dir: &Path, boot_id: &str) -> io::Result<()> {
    atomic::write_json(&drained_path(runtime_dir), boot_id.as_bytes())
}

/// A daemon started at `started` joined: a drain that began before it
/// no longer holds starts back (one that began later still does).
pub fn remove_drained_before(runtime_dir: &Path, started: std::time::SystemTime) {
    let path = drained_path(runtime_dir);
    if std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .is_ok_and(|written| written < started)
    {
        let _ = std::fs::remove_file(path);
    }
}

pub fn armed_path(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("watchdog-armed")
}

/// The watchdog held here, as `berth fence-watch` wrote it: its device
/// and timeout.
pub fn read_armed(runtime_dir: &Path) -> Option<(PathBuf, u64)> {
    let text = read_at_most(&armed_path(runtime_dir), 4200)?;
    let (device, timeout) = text.trim_end().rsplit_once(' ')?;
    Some((PathBuf::from(device), timeout.parse().ok()?))
}

pub fn write_armed(runtime_dir: &Path, device: &Path, timeout_s: u64) -> io::Result<()> {
    let text = format!("{} {timeout_s}\n", device.display());
    atomic::write_json(&armed_path(runtime_dir), text.as_bytes())
}

pub fn remove_armed(runtime_dir: &Path) -> io::Result<()> {
    match std::fs::remove_file(armed_path(runtime_dir)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

pub fn listing_error_path(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("cluster-listing-error")
}

/// At most this much of it is read back.
const LISTING_ERROR_MAX: u64 = 4096;

pub fn read_listing_error(runtime_dir: &Path) -> Option<String> {
    let text = read_at_most(&listing_error_path(runtime_dir), LISTING_ERROR_MAX)?;
    Some(text.trim().to_string()).filter(|t| !t.is_empty())
}

/// `None`: the listing succeeds again. Best effort (it is only shown).
pub fn write_listing_error(runtime_dir: &Path, error: Option<&str>) {
    let path = listing_error_path(runtime_dir);
    match error {
        Some(e) => {
            let _ = atomic::write_json(&path, e.as_bytes());
        }
        None => {
            let _ = std::fs::remove_file(path);
        }
    }
}

pub fn ran_path(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("cluster-ran.json")
}

/// Workload → the ownership it last ran in; unreadable reads as none.
pub fn read_ran(runtime_dir: &Path) -> std::collections::BTreeMap<String, i64> {
    read_json(&ran_path(runtime_dir)).unwrap_or_default()
}

pub fn write_ran(runtime_dir: &Path, ran: &std::collections::BTreeMap<String, i64>) -> io::Result<()> {
    write_json(&ran_path(runtime_dir), ran)
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> io::Result<T> {
    serde_json::from_slice(&std::fs::read(path)?).map_err(io::Error::from)
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    atomic::write_json(path, &serde_json::to_vec(value).map_err(io::Error::from)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_file_reads_back_what_was_written_and_garbage_reads_as_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let lease = LeaseRecord {
            lease_id: 7,
            boot_id: "b".into(),
        };
        assert!(read_lease(d).is_err());
        write_lease(d, &lease).unwrap();
        assert_eq!(read_lease(d).unwrap(), lease);
        assert_eq!(read_maintenance(d), None);
        write_maintenance(d, &lease).unwrap();
        assert_eq!(read_maintenance(d), Some(lease));
        remove_maintenance(d);
        assert_eq!(read_maintenance(d), None);
        let revision = FreezeRevision {
            cluster_id: 1,
            revision: 42,
        };
        write_freeze_revision(d, revision).unwrap();
        assert_eq!(read_freeze_revision(d), Some(revision));
        assert_eq!(read_fence_deadline(d), None);
        write_fence_deadline(d, Duration::from_millis(123_456));
        assert_eq!(read_fence_deadline(d), Some(Duration::from_millis(123_456)));
        write_rejoined(d, "b").unwrap();
        assert_eq!(read_rejoined(d).as_deref(), Some("b"));
        assert_eq!(read_armed(d), None);
        write_armed(d, Path::new("/dev/watchdog1"), 12).unwrap();
        assert_eq!(read_armed(d), Some((PathBuf::from("/dev/watchdog1"), 12)));
        remove_armed(d).unwrap();
        remove_armed(d).unwrap();
        assert_eq!(read_armed(d), None);
        std::fs::write(armed_path(d), "/dev/watchdog1 x\n").unwrap();
        assert_eq!(read_armed(d), None);
        assert!(read_ran(d).is_empty());
        assert_eq!(read_listing_error(d), None);
        write_listing_error(d, Some("too big"));
        assert_eq!(read_listing_error(d).as_deref(), Some("too big"));
        write_listing_error(d, None);
        assert_eq!(read_listing_error(d), None);
        let ran = std::collections::BTreeMap::from([("db".to_string(), 42)]);
        write_ran(d, &ran).unwrap();
        assert_eq!(read_ran(d), ran);
        for path in [
            lease_path(d),
            freeze_revision_path(d),
            fence_deadline_path(d),
            ran_path(d),
        ] {
            std::fs::write(path, "garbage").unwrap();
        }
        assert!(read_lease(d).is_err());
        assert_eq!(read_freeze_revision(d), None);
        assert_eq!(read_fence_deadline(d), None);
        assert!(read_ran(d).is_empty());
        // The drain's mark: one boot id, a huge file read only so far.
        assert_eq!(read_drained(d), None);
        write_drained(d, "boot-a").unwrap();
        assert_eq!(read_drained(d).as_deref(), Some("boot-a"));
        std::fs::write(drained_path(d), "b".repeat(1 << 20)).unwrap();
        assert_eq!(read_drained(d).map(|t| t.len()), Some(256));
        // Written after this daemon started: kept; before: removed.
        let before = std::time::SystemTime::now() - Duration::from_secs(60);
        remove_drained_before(d, before);
        assert!(read_drained(d).is_some());
        remove_drained_before(d, std::time::SystemTime::now() + Duration::from_secs(1));
        assert_eq!(read_drained(d), None);
    }
}
