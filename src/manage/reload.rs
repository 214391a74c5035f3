//! One daemon-reload for many concurrent adds and removes.
//!
//! Every writer counts its file under the write lock (`written`, a
//! generation). To return, it needs a reload that began after its file was
//! in place: under the reload lock it reads `reloaded`, and if that covers
//! its generation another writer's reload did the job; otherwise it reads
//! `written` (every file in place by now), reloads, and records that
//! number as `reloaded`. A burst of writers queues on the reload lock
//! while one reloads, and most find their file covered when their turn
//! comes.

use std::time::Duration;

use crate::paths::Root;
use crate::state::atomic::{self, Replacement};
use crate::state::lock::{self, ConfigLock};
use crate::systemd::{Ops, SystemdError};

/// How long a writer waits for another writer's lock: a daemon-reload of
/// a big host takes seconds, and a burst queues behind a few of them.
const LOCK_WAIT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Generations {
    written: u64,
    reloaded: u64,
}

#[derive(Debug)]
pub enum ReloadError {
    Lock(std::io::Error),
    /// A per-user install's units could not be written.
    Render(String),
    Systemd(SystemdError),
}

impl std::fmt::Display for ReloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReloadError::Lock(e) => write!(f, "cannot take the configuration lock: {e}"),
            ReloadError::Render(e) => write!(f, "the per-user units could not be written: {e}"),
            ReloadError::Systemd(e) => write!(f, "systemd could not be reloaded: {e}"),
        }
    }
}

/// Unreadable or garbled counts read as none written and none reloaded:
/// the next writer reloads, which is always safe.
fn read(root: &Root) -> Generations {
    let text = std::fs::read_to_string(lock::config_generations_path(root)).unwrap_or_default();
    let mut numbers = text.split_whitespace().map(|n| n.parse::<u64>());
    match (numbers.next(), numbers.next()) {
        (Some(Ok(written)), Some(Ok(reloaded))) => Generations { written, reloaded },
        _ => Generations::default(),
    }
}

/// Replaced whole (a temporary file renamed over it): a writer killed
/// halfway never leaves counts that read lower than they were.
fn write(root: &Root, g: Generations) -> std::io::Result<()> {
    atomic::replace(
        &lock::config_generations_path(root),
        &Replacement::File(format!("{} {}\n", g.written, g.reloaded).as_bytes(), 0o600),
    )
}

/// Runs `change` (writing or removing a workload file) under the write
/// lock and counts it; returns its generation, or why it was refused.
pub async fn counted<E>(
    root: &Root,
    change: impl FnOnce() -> Result<(), E>,
) -> Result<Result<u64, E>, ReloadError> {
    let _write = lock::config_within(root, ConfigLock::Write, LOCK_WAIT)
        .await
        .map_err(ReloadError::Lock)?;
    if let Err(e) = change() {
        return Ok(Err(e));
    }
    let mut g = read(root);
    g.written += 1;
    write(root, g).map_err(ReloadError::Lock)?;
    Ok(Ok(g.written))
}

/// Returns once a daemon-reload that began after generation `mine` was
/// written has completed; true when this call ran it.
pub async fn reload_covering<O: Ops>(ops: &O, root: &Root, mine: u64) -> Result<bool, ReloadError> {
    let _reload = lock::config_within(root, ConfigLock::Reload, LOCK_WAIT)
        .await
        .map_err(ReloadError::Lock)?;
    let target = {
        let _write = lock::config_within(root, ConfigLock::Write, LOCK_WAIT)
            .await
            .map_err(ReloadError::Lock)?;
        let g = read(root);
        if g.reloaded >= mine {
            return Ok(false);
        }
        g.written
    };
    // A per-user install has no generator to run at the reload: its
    // output is written here, from every file in place by now.
    crate::install::render_per_user(root).map_err(|e| ReloadError::Render(e.to_string()))?;
    reload(ops).await.map_err(ReloadError::Systemd)?;
    // The supervisor reads the workload definitions at its start and at
    // SIGHUP: told once per reload, it knows of every file this reload
    // covered (a daemon not running makes the call fail: nothing to tell).
    let _ = ops.hang_up(DAEMON_UNIT).await;
    let _write = lock::config_within(root, ConfigLock::Write, LOCK_WAIT)
        .await
        .map_err(ReloadError::Lock)?;
    let mut g = read(root);
    g.reloaded = g.reloaded.max(target);
    write(root, g).map_err(ReloadError::Lock)?;
    Ok(true)
}

/// The supervisor's unit, told of every reload a writer runs.
const DAEMON_UNIT: &str = "berth-daemon.service";

/// How many times a reload that outlasts a call's timeout is waited for.
const SLOW_RELOAD_CHECKS: u32 = 12;

/// A daemon-reload, waited for to its end. On a big host it outlasts a
/// call's 10 s timeout; systemd answers nothing else until it is done,
/// so once a read of its state is answered again, the reload is over.
async fn reload<O: Ops>(ops: &O) -> Result<(), SystemdError> {
    let Err(e) = ops.reload().await else {
        return Ok(());
    };
    if !e.is_transient() {
        return Err(e);
    }
    for _ in 0..SLOW_RELOAD_CHECKS {
        match ops.system_state().await {
            Ok(_) => return Ok(()),
            Err(again) if again.is_transient() => continue,
            Err(other) => return Err(other),
        }
    }
    Err(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::systemd::fake::FakeOps;

    /// Writers whose files a reload already covered do not reload again;
    /// a file written after a reload began gets one of its own.
    #[tokio::test]
    async fn a_reload_covers_every_file_written_before_it_began() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let ops = FakeOps::default();
        let mut gens = Vec::new();
        for _ in 0..3 {
            gens.push(counted::<()>(&root, || Ok(())).await.unwrap().unwrap());
        }
        assert_eq!(gens, [1, 2, 3]);
        assert!(
            reload_covering(&ops, &root, 2).await.unwrap(),
            "the first reloads"
        );
        assert!(!reload_covering(&ops, &root, 1).await.unwrap(), "covered");
        assert!(
            !reload_covering(&ops, &root, 3).await.unwrap(),
            "3 was in place when it began"
        );
        assert_eq!(*ops.reloads.borrow(), 1);
        let g = counted::<()>(&root, || Ok(())).await.unwrap().unwrap();
        assert!(
            reload_covering(&ops, &root, g).await.unwrap(),
            "written after: reloads"
        );
        assert_eq!(*ops.reloads.borrow(), 2);
        assert_eq!(
            *ops.hung_up.borrow(),
            [DAEMON_UNIT, DAEMON_UNIT],
            "the daemon is told once per reload, to read the definitions again"
        );
    }

    #[tokio::test]
    async fn a_refused_change_is_not_counted() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        assert_eq!(counted::<&str>(&root, || Err("no")).await.unwrap(), Err("no"));
        assert_eq!(read(&root), Generations::default());
        std::fs::write(lock::config_generations_path(&root), "garbage").unwrap();
        assert_eq!(
            read(&root),
            Generations::default(),
            "garbled counts: the next writer reloads"
        );
    }
}
