//! Per-workload records in `/var/lib/berth/records/NAME.json`: what the
//! helpers (and later the supervisor) did to each workload and when.
//!
//! Writes are atomic (temporary file, fsync, rename, fsync of the
//! directory) and happen under the workload's lock, `/run/berthd/locks/NAME`
//! (flock), which the CLI, the helpers and the supervisor share.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::freeze::rfc3339;
use crate::paths::Root;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub name: String,
    /// running, stopped, failed or unknown.
    pub state: String,
    /// +1 per committed transition, never reused.
    pub transition_generation: u64,
    /// boot, drain, … (what made the last transition).
    pub last_transition_reason: String,
    pub last_transition_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<String>,
    /// The last helper outcome (Started, StartFailed, GracefulOff, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// When a boot last found it running and left it alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopted_at: Option<String>,
    /// Why it last stopped, as systemd tells it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_cause: Option<ExitCause>,
    /// `scan` when the supervisor found the transition on a pass (e.g. it
    /// happened while the supervisor was down): dated at detection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detected_by: Option<String>,
    /// Fingerprint of the definition the running instance was started
    /// with; a different current one means a restart is pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definition: Option<String>,
    /// systemd's InvocationID of the running instance, once seen: a new one
    /// means it was restarted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation_id: Option<String>,
}

/// The exit as systemd recorded it for the service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitCause {
    /// The unit's Result: success, exit-code, signal, core-dump, timeout, …
    pub result: String,
    /// exited, killed or dumped (from ExecMainCode).
    pub code: String,
    /// The exit status, or the signal number when killed or dumped.
    pub status: i32,
}

const LOCK_ATTEMPTS: u32 = 50;
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(20);

pub fn records_dir(root: &Root) -> PathBuf {
    root.state_dir().join("records")
}

pub fn record_path(root: &Root, name: &str) -> PathBuf {
    records_dir(root).join(format!("{name}.json"))
}

/// The workload's lock, held while its record is read and rewritten.
pub fn lock(root: &Root, name: &str) -> io::Result<File> {
    lock_within(root, name, LOCK_ATTEMPTS)
}

fn lock_within(root: &Root, name: &str, attempts: u32) -> io::Result<File> {
    let dir = root.runtime_dir().join("locks");
    fs::create_dir_all(&dir)?;
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(name))?;
    // Bounded: a holder that never lets go must not hang a drain.
    for attempt in 0..attempts {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) if attempt + 1 < attempts => {
                std::thread::sleep(LOCK_RETRY)
            }
            Err(std::fs::TryLockError::WouldBlock) => break,
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::WouldBlock,
        format!("{name}: its lock is held by another process"),
    ))
}

pub fn load(root: &Root, name: &str) -> io::Result<Option<Record>> {
    match fs::read(record_path(root, name)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Applies `change` to the workload's record under its lock and writes it
/// back atomically. `change` returns whether this is a transition (the
/// generation and transition time then advance). A record that cannot be
/// parsed is moved aside as `NAME.json.corrupt` and started afresh.
pub fn update(root: &Root, name: &str, change: impl FnOnce(&mut Record) -> bool) -> io::Result<Record> {
    let lock = lock(root, name)?;
    update_locked(root, name, &lock, change)
}

/// Like [`update`], but never waits: `Ok(None)` when another process holds
/// the workload's lock (the supervisor defers to its next pass).
pub fn try_update(
    root: &Root,
    name: &str,
    change: impl FnOnce(&mut Record) -> bool,
) -> io::Result<Option<Record>> {
    match lock_within(root, name, 1) {
        Ok(lock) => update_locked(root, name, &lock, change).map(Some),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

/// [`update`] for a caller that already holds the workload's lock (a
/// helper holds it across its start or stop job).
pub fn update_locked(
    root: &Root,
    name: &str,
    _lock: &File,
    change: impl FnOnce(&mut Record) -> bool,
) -> io::Result<Record> {
    let mut record = match load(root, name) {
        Ok(Some(r)) => r,
        Ok(None) => Record {
            name: name.into(),
            state: "unknown".into(),
            ..Default::default()
        },
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            let path = record_path(root, name);
            let aside = path.with_extension("json.corrupt");
            let _ = fs::rename(&path, &aside);
            eprintln!(
                "berth: {}: corrupt record ({e}); kept as {} and rebuilt from systemd's live state",
                path.display(),
                aside.display()
            );
            Record {
                name: name.into(),
                state: "unknown".into(),
                ..Default::default()
            }
        }
        Err(e) => return Err(e),
    };
    let before = record.clone();
    if change(&mut record) {
        record.transition_generation += 1;
        record.last_transition_at = rfc3339(SystemTime::now());
    }
    // Unchanged records are not rewritten: a supervisor pass over idle
    // workloads writes nothing.
    if record != before || !record_path(root, name).exists() {
        write_atomic(&record_path(root, name), &serde_json::to_vec_pretty(&record)?)?;
    }
    Ok(record)
}

/// Writes a JSON document (`bytes` and a newline) to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut line = Vec::with_capacity(bytes.len() + 1);
    line.extend_from_slice(bytes);
    line.push(b'\n');
    replace(path, &Replacement::File(&line, 0o644))
}

/// What [`replace`] puts at a path.
pub enum Replacement<'a> {
    /// Contents and permission bits.
    File(&'a [u8], u32),
    /// A symbolic link to this target.
    Symlink(&'a str),
}

/// Replaces `path` so that readers see the old or the new file, never a
/// torn one, also across a power failure: a temporary file in the same
/// directory, fsync, rename, fsync of the directory.
pub fn replace(path: &Path, with: &Replacement) -> io::Result<()> {
    let dir = path.parent().expect("path has a directory");
    fs::create_dir_all(dir)?;
    // Per process, so that two writers never share a temporary file.
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("record"),
        std::process::id()
    ));
    let _ = fs::remove_file(&tmp);
    match with {
        Replacement::File(bytes, mode) => {
            let mut f = File::create(&tmp)?;
            f.write_all(bytes)?;
            f.set_permissions(fs::Permissions::from_mode(*mode))?;
            f.sync_all()?;
        }
        Replacement::Symlink(target) => std::os::unix::fs::symlink(target, &tmp)?,
    }
    fs::rename(&tmp, path)?;
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions_advance_the_generation_and_observations_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let r = update(&root, "web", |r| {
            r.state = "running".into();
            r.last_transition_reason = "boot".into();
            true
        })
        .unwrap();
        assert_eq!(r.transition_generation, 1);
        let r = update(&root, "web", |r| {
            r.adopted_at = Some("now".into());
            false
        })
        .unwrap();
        assert_eq!(r.transition_generation, 1);
        assert_eq!(
            load(&root, "web").unwrap().unwrap().adopted_at.as_deref(),
            Some("now")
        );
    }

    #[test]
    fn a_corrupt_record_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        fs::create_dir_all(records_dir(&root)).unwrap();
        fs::write(record_path(&root, "db"), "{not json").unwrap();
        let r = update(&root, "db", |_| true).unwrap();
        assert_eq!(r.transition_generation, 1);
        assert!(record_path(&root, "db").with_extension("json.corrupt").exists());
    }
}
