//! The one lock primitive: `flock` on a file in a directory only the
//! manager's user can enter, never waited on past a bound (a holder that
//! never lets go must not hang a drain).
//!
//! `flock` works on a read-only descriptor, so whoever can open a lock file
//! can hold it: the locks live in `locks/` under the runtime directory,
//! mode 0700, files 0600, while the API socket beside it stays reachable by
//! group `berth`.
//!
//! - A workload's lock (`locks/workloads/NAME`), held while its record is
//!   read and rewritten, and by a helper across the start or stop job it
//!   records.
//! - The daemon's single-instance lock (`locks/daemon`), holding its pid.
//! - The configuration writers' locks (`locks/config-write`,
//!   `locks/config-reload`), taken by `berth add` and `berth remove`.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::paths::Root;

const ATTEMPTS: u32 = 50;
const RETRY: Duration = Duration::from_millis(20);

/// `<runtime>/locks`: created 0700, and made 0700 again if found wider
/// (it is berth's own directory).
fn locks_dir(root: &Root) -> PathBuf {
    root.runtime_dir().join("locks")
}

fn private_dir(dir: &Path) -> io::Result<()> {
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent)?;
    }
    match DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let meta = fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!("{}: not a directory", dir.display())));
    }
    if meta.mode() & 0o7077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

fn open(path: &Path) -> io::Result<File> {
    if let Some(dir) = path.parent() {
        private_dir(dir)?;
    }
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
}

/// Takes `path`'s lock, trying `attempts` times `RETRY` apart. Blocks the
/// thread: for callers outside an async runtime's hot path only.
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
    Err(held(path))
}

fn held(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::WouldBlock,
        format!("{}: held by another process", path.display()),
    )
}

fn workload_lock_path(root: &Root, name: &str) -> PathBuf {
    locks_dir(root).join("workloads").join(name)
}

/// The workload's lock, waiting up to about a second.
pub fn workload(root: &Root, name: &str) -> io::Result<File> {
    take(&workload_lock_path(root, name), ATTEMPTS)
}

/// The workload's lock, waiting up to `limit` without blocking the
/// runtime's thread (the drain stops other workloads meanwhile).
pub async fn workload_within(root: &Root, name: &str, limit: Duration) -> io::Result<File> {
    take_within(&workload_lock_path(root, name), limit).await
}

/// Takes `path`'s lock, waiting up to `limit` on the runtime's clock.
async fn take_within(path: &Path, limit: Duration) -> io::Result<File> {
    let file = open(path)?;
    let until = tokio::time::Instant::now() + limit;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(fs::TryLockError::WouldBlock) if tokio::time::Instant::now() < until => {
                tokio::time::sleep(RETRY).await;
            }
            Err(fs::TryLockError::WouldBlock) => return Err(held(path)),
            Err(fs::TryLockError::Error(e)) => return Err(e),
        }
    }
}

/// One of the locks that serialize `berth add` and `berth remove`
/// (`locks/config-write`, held while a file and the counter are written;
/// `locks/config-reload`, held across a daemon-reload), waiting up to
/// `limit` without blocking the runtime's thread.
pub async fn config_within(root: &Root, which: ConfigLock, limit: Duration) -> io::Result<File> {
    take_within(&locks_dir(root).join(which.file_name()), limit).await
}

/// Which of the configuration writers' locks.
#[derive(Debug, Clone, Copy)]
pub enum ConfigLock {
    Write,
    Reload,
}

impl ConfigLock {
    fn file_name(self) -> &'static str {
        match self {
            ConfigLock::Write => "config-write",
            ConfigLock::Reload => "config-reload",
        }
    }
}

/// Where the writers of workload files count what they wrote and what a
/// daemon-reload covered (under [`ConfigLock::Write`]).
pub fn config_generations_path(root: &Root) -> PathBuf {
    locks_dir(root).join("config-generations")
}

/// Whether another process holds the workload's lock now. Creates
/// nothing: a lock file that does not exist is held by nobody, and a name
/// that is not a workload's has none.
pub fn workload_held(root: &Root, name: &str) -> bool {
    if !crate::names::is_valid_workload_name(name) {
        return false;
    }
    OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(workload_lock_path(root, name))
        .is_ok_and(|file| matches!(file.try_lock(), Err(fs::TryLockError::WouldBlock)))
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
    let path = locks_dir(root).join("daemon");
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
    fn locks_are_private_to_the_manager_user() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        // A directory left wide open (by an older berth or an admin).
        fs::create_dir_all(locks_dir(&root).join("workloads")).unwrap();
        fs::set_permissions(locks_dir(&root), fs::Permissions::from_mode(0o755)).unwrap();
        let _web = workload(&root, "web").unwrap();
        let _daemon = single_instance(&root).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(mode(&locks_dir(&root)), 0o700);
        assert_eq!(mode(&locks_dir(&root).join("workloads")), 0o700);
        assert_eq!(mode(&workload_lock_path(&root, "web")), 0o600);
        assert_eq!(mode(&locks_dir(&root).join("daemon")), 0o600);
    }

    /// A read-only `berth` group member can neither hold the writers'
    /// locks (and so stall every `berth add`) nor touch their counts.
    #[tokio::test]
    async fn the_configuration_writers_locks_are_private_too() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        fs::create_dir_all(locks_dir(&root)).unwrap();
        fs::set_permissions(locks_dir(&root), fs::Permissions::from_mode(0o775)).unwrap();
        let _write = config_within(&root, ConfigLock::Write, Duration::ZERO)
            .await
            .unwrap();
        let _reload = config_within(&root, ConfigLock::Reload, Duration::ZERO)
            .await
            .unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(mode(&locks_dir(&root)), 0o700);
        assert_eq!(mode(&locks_dir(&root).join("config-write")), 0o600);
        assert_eq!(mode(&locks_dir(&root).join("config-reload")), 0o600);
        let e = config_within(&root, ConfigLock::Write, Duration::from_millis(50))
            .await
            .unwrap_err();
        assert_eq!(
            e.kind(),
            io::ErrorKind::WouldBlock,
            "held: refused within its bound"
        );
    }

    #[tokio::test]
    async fn the_async_wait_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let _held = workload(&root, "web").unwrap();
        let t = std::time::Instant::now();
        let e = workload_within(&root, "web", Duration::from_millis(100))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    }

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
