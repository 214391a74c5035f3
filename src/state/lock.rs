//! The one lock primitive: `flock` on a file under the runtime directory,
//! never waited on past a bound (a holder that never lets go must not hang
//! a drain).
//!
//! - A workload's lock (`locks/NAME`), held while its record is read and
//!   rewritten, and by a helper across the start or stop job it records.
//! - The daemon's single-instance lock (`lock`), holding its pid.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::paths::Root;

const ATTEMPTS: u32 = 50;
const RETRY: Duration = Duration::from_millis(20);

fn open(path: &Path) -> io::Result<File> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
}

/// Takes `path`'s lock, trying `attempts` times `RETRY` apart.
fn take(path: &Path, attempts: u32) -> io::Result<File> {
    let file = open(path)?;
    for attempt in 0..attempts {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(fs::TryLockError::WouldBlock) if attempt + 1 < attempts => std::thread::sleep(RETRY),
            Err(fs::TryLockError::WouldBlock) => break,
            Err(fs::TryLockError::Error(e)) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::WouldBlock,
        format!("{}: held by another process", path.display()),
    ))
}

fn workload_lock_path(root: &Root, name: &str) -> PathBuf {
    root.runtime_dir().join("locks").join(name)
}

/// The workload's lock, waiting up to about a second.
pub fn workload(root: &Root, name: &str) -> io::Result<File> {
    take(&workload_lock_path(root, name), ATTEMPTS)
}

/// The workload's lock if it is free now; `WouldBlock` otherwise.
pub fn try_workload(root: &Root, name: &str) -> io::Result<File> {
    take(&workload_lock_path(root, name), 1)
}

/// Another daemon holds the single-instance lock.
#[derive(Debug)]
pub enum InstanceError {
    Held { pid: String, path: PathBuf },
    Io { path: PathBuf, error: io::Error },
}

impl std::fmt::Display for InstanceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InstanceError::Held { pid, path } => write!(
                f,
                "another berth daemon is running (pid {pid}, lock {}); not starting",
                path.display()
            ),
            InstanceError::Io { path, error } => write!(f, "cannot lock {}: {error}", path.display()),
        }
    }
}

impl std::error::Error for InstanceError {}

/// The daemon's single-instance lock, held for the life of the process;
/// it holds the holder's pid for the message a second instance prints.
pub fn single_instance(root: &Root) -> Result<File, InstanceError> {
    let path = root.runtime_dir().join("lock");
    let io_error = |error| InstanceError::Io {
        path: path.clone(),
        error,
    };
    let mut file = open(&path).map_err(io_error)?;
    match file.try_lock() {
        Ok(()) => {
            let _ = file.set_len(0);
            let _ = file.rewind();
            let _ = writeln!(file, "{}", std::process::id());
            Ok(file)
        }
        Err(fs::TryLockError::WouldBlock) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            Err(InstanceError::Held {
                pid: pid.trim().to_string(),
                path,
            })
        }
        Err(fs::TryLockError::Error(e)) => Err(io_error(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_is_refused_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let held = workload(&root, "web").unwrap();
        let e = try_workload(&root, "web").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        drop(held);
        assert!(try_workload(&root, "web").is_ok());
        let _daemon = single_instance(&root).unwrap();
        let second = single_instance(&root).unwrap_err().to_string();
        assert!(
            second.contains(&format!("pid {}", std::process::id())),
            "{second}"
        );
    }
}
