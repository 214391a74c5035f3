//! `berth daemon`: the optional resident supervisor. It adopts the live
//! workloads, notices exits as they happen (systemd's PropertiesChanged
//! signals, no polling), records every transition with its cause, and keeps
//! systemd's watchdog fed only while its loop runs. It never starts, stops
//! or kills a workload, except in cluster mode, where its agent (on a
//! thread of its own, `crate::cluster`) starts the HA workloads this node
//! takes and fences them at the lease deadline.
//!
//! [`classify`] holds the transition rules as pure functions with a table
//! test; [`supervisor`] feeds them what systemd shows and writes records;
//! [`crate::api::health`] is the one aggregate for the journal, the status
//! file and `/healthz`; this file is the select loop and the ways out of it.
//!
//! Transitions a helper made are recorded by that helper under the
//! workload's lock, which it holds across the job; the supervisor never
//! waits for a lock (a busy one defers to the next pass), and records only
//! what nobody else did: `start-user`, `stop-user` and `unexpected-exit`.

pub mod classify;
mod messages;
mod supervisor;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};

use crate::api::{self, Shared};
use crate::autostart::MESSAGE_ID as ADOPTED_MESSAGE_ID;
use crate::config;
use crate::events::Events;
use crate::paths::Root;
use crate::state::atomic;
use crate::state::lock::{self, InstanceError};
use crate::systemd::{Change, Ops, Systemd, SystemdError};
use crate::time::rfc3339;
use supervisor::Supervisor;

/// `berth daemon --foreground` relaunches itself on this exit status; under
/// systemd, `SuccessExitStatus=75` and `Restart=always` do.
pub const EXIT_RELAUNCH: i32 = 75;

pub struct Options {
    pub reconcile_interval: Option<Duration>,
    /// No API socket, whatever `[daemon] api` says.
    pub no_api: bool,
    /// Seconds between sweeps of records of workloads that are neither
    /// configured nor loaded (default: `[daemon] gc_interval_s`; 0: never).
    pub gc_interval: Option<Duration>,
}

/// Why the daemon could not start.
#[derive(Debug)]
pub enum StartError {
    RuntimeDir(std::io::Error),
    Instance(InstanceError),
    Runtime(std::io::Error),
    Connect(SystemdError),
    Watch(SystemdError),
    Signals(std::io::Error),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::RuntimeDir(e) => write!(f, "cannot prepare the runtime directory: {e}"),
            StartError::Instance(e) => write!(f, "{e}"),
            StartError::Runtime(e) => write!(f, "cannot start the async runtime: {e}"),
            StartError::Connect(e) => write!(f, "cannot reach systemd: {e}"),
            StartError::Watch(e) => write!(f, "cannot watch the units: {e}"),
            StartError::Signals(e) => write!(f, "cannot install signal handlers: {e}"),
        }
    }
}

impl std::error::Error for StartError {}

/// How the daemon ended: a clean stop, or a request to be relaunched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Stopped,
    Relaunch,
}

impl Exit {
    pub fn code(self) -> i32 {
        match self {
            Exit::Stopped => 0,
            Exit::Relaunch => EXIT_RELAUNCH,
        }
    }
}

/// berth's runtime directory (`/run/berthd`): 0750, group `berth` when
/// that group exists, so its members reach the API socket inside; the
/// locks beside it sit in a 0700 directory of their own.
fn own_runtime_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    crate::paths::share_with_berth_group(dir, 0o750)
}

/// Runs the supervisor until SIGTERM or a relaunch.
pub fn main(root: &Root, options: Options) -> Result<Exit, StartError> {
    own_runtime_dir(&root.runtime_dir()).map_err(StartError::RuntimeDir)?;
    let _instance = lock::single_instance(root).map_err(StartError::Instance)?;
    let rt = crate::systemd::runtime().map_err(StartError::Runtime)?;
    rt.block_on(async {
        let sd = Systemd::connect(root.manager())
            .await
            .map_err(StartError::Connect)?;
        run(sd, root.clone(), options).await
    })
}

/// The config read again, on SIGHUP or at the end of a daemon-reload
/// (`reload_first`: only SIGHUP reloads systemd itself). Some when the
/// daemon must leave to be relaunched: a new binary, or new daemon
/// settings, which the generator turns into unit settings (WatchdogSec).
async fn reread<O: Ops>(
    sup: &mut Supervisor<O>,
    socket: Option<&api::Bound>,
    reload_first: bool,
) -> Option<Exit> {
    let fresh = config::load(&sup.root);
    if binary_replaced() {
        return Some(leave(
            sup,
            socket,
            Exit::Relaunch,
            "the berth binary was replaced: relaunching (exit 75)",
        ));
    }
    if fresh.host.daemon != sup.host.daemon {
        if !reload_first {
            return Some(leave(
                sup,
                socket,
                Exit::Relaunch,
                "daemon settings changed at a daemon-reload: relaunching (exit 75)",
            ));
        }
        if let Err(e) = sup.sd.reload().await {
            sup.events.warn(&format!(
                "daemon settings changed, but systemd could not be reloaded: {e}"
            ));
        }
        return Some(leave(
            sup,
            socket,
            Exit::Relaunch,
            "daemon settings changed: systemd reloaded, relaunching (exit 75)",
        ));
    }
    sup.configure(fresh);
    release_free_memory();
    sup.events.info("reloaded the workload definitions");
    None
}

async fn run<O: Ops>(sd: O, root: Root, options: Options) -> Result<Exit, StartError> {
    let events = Events::new("berth-daemon");
    // Filled with the `unit =` workloads' paths once the config is read:
    // the watch starts first so that no change is missed.
    let watched = crate::systemd::WatchedPaths::default();
    let mut changes = sd.watch(watched.clone()).await.map_err(StartError::Watch)?;
    let (Ok(mut sigterm), Ok(mut sighup)) = (signal(SignalKind::terminate()), signal(SignalKind::hangup()))
    else {
        return Err(StartError::Signals(std::io::Error::last_os_error()));
    };
    let loaded = config::load(&root);
    // A run of the manager the daemon worked in is one berth saw, even
    // when the autostart did not run (`autostart = "last-state"` counts
    // runs).
    let noted = match sd.manager_started_us().await {
        Ok(started) => crate::state::runs::note_current(&root, started),
        Err(e) => Err(format!("cannot ask when the manager started: {e}")),
    };
    if let Err(e) = noted {
        events.warn(&e);
    }
    let interval = options
        .reconcile_interval
        .unwrap_or(Duration::from_secs(loaded.host.daemon.reconcile_interval_s));
    let (api, socket) = serve_api(&root, &loaded, &options, interval, &events);
    let socket = socket.as_ref();
    // Cluster mode: the agent's own thread joins and keeps the lease.
    let cluster = crate::state::runs::boot_id()
        .ok()
        .and_then(|boot| crate::cluster::start_agent(&root, &loaded, boot, api.clone()));
    let textfile = api
        .as_ref()
        .and(loaded.host.daemon.metrics_textfile.as_deref())
        .map(|dir| api::metrics::textfile::Textfile::new(&root.join(dir)));
    let mut sup = Supervisor::new(sd, root, loaded, events, api);
    sup.textfile = textfile;
    sup.share_watched(watched);
    sup.cluster = cluster;

    adopt_then_ready(&mut sup).await;

    let watchdog = sd_notify::watchdog_enabled().map(|t| t / 2);
    let mut watchdog_tick = tokio::time::interval(watchdog.unwrap_or(Duration::from_secs(3600)));
    let mut reconcile_tick = tokio::time::interval(interval);
    let mut fill_tick = tokio::time::interval(Duration::from_millis(2));
    let mut after_ready_tick = tokio::time::interval(Duration::from_millis(2));
    let mut sync_tick = tokio::time::interval(supervisor::SYNC_EVERY);
    let mut deferred_tick = tokio::time::interval(Duration::from_secs(1));
    let (synced_tx, mut synced) = tokio::sync::mpsc::unbounded_channel();
    let gc_every = options
        .gc_interval
        .unwrap_or(Duration::from_secs(sup.host.daemon.gc_interval_s));
    let mut gc_tick = tokio::time::interval(if gc_every.is_zero() {
        Duration::from_secs(86_400)
    } else {
        gc_every
    });
    gc_tick.reset();
    reconcile_tick.reset();
    // Test hook, inert unless set: hang the loop so the watchdog fires.
    let fault_hang = std::env::var("BERTH_DAEMON_FAULT").is_ok_and(|v| v == "hang");
    // Until the work the first pass left for after READY is done.
    let mut settling = settled(&sup, true);

    loop {
        tokio::select! {
            Some(change) = changes.recv() => {
                if change == Change::Reloaded {
                    if let Some(exit) = reread(&mut sup, socket, false).await {
                        return Ok(exit);
                    }
                } else {
                    sup.on_change(change).await;
                }
            }
            _ = fill_tick.tick(), if !sup.fill.is_empty() => {
                sup.fill_one().await;
                settling = settled(&sup, settling);
            }
            _ = after_ready_tick.tick(), if !sup.after_ready.is_empty() => {
                sup.look_closer_next().await;
                settling = settled(&sup, settling);
            }
            _ = sync_tick.tick(), if sup.wants_sync() => sup.sync_records(synced_tx.clone()),
            _ = deferred_tick.tick(), if !sup.deferred.is_empty() => sup.retry_deferred().await,
            Some(result) = synced.recv() => sup.synced(result),
            _ = gc_tick.tick(), if !gc_every.is_zero() => sup.sweep(),
            _ = reconcile_tick.tick() => {
                // A package upgrade (or make install) replaced the binary
                // under us: noticed within one interval, no signal needed.
                if binary_replaced() {
                    return Ok(leave(&mut sup, socket, Exit::Relaunch, "the berth binary was replaced: relaunching (exit 75)"));
                }
                pass(&mut sup).await;
            }
            _ = watchdog_tick.tick() => {
                if fault_hang {
                    sup.events.warn("BERTH_DAEMON_FAULT=hang: the loop stops here (test hook)");
                    loop { std::thread::sleep(Duration::from_secs(3600)); }
                }
                ping_watchdog(&sup, watchdog);
            }
            _ = sigterm.recv() => return Ok(leave(&mut sup, socket, Exit::Stopped, "")),
            _ = sighup.recv() => {
                if let Some(exit) = reread(&mut sup, socket, true).await {
                    return Ok(exit);
                }
            }
        }
    }
}

/// The API on its socket, unless turned off (or it cannot bind: said,
/// and the daemon goes on without it).
fn serve_api(
    root: &Root,
    loaded: &config::Loaded,
    options: &Options,
    interval: Duration,
    events: &Events,
) -> (Option<Arc<Shared>>, Option<api::Bound>) {
    if !loaded.host.daemon.api || options.no_api {
        return (None, None);
    }
    let socket = root.join(&loaded.host.daemon.socket);
    let shared = Shared::new(interval * 3 + Duration::from_secs(5));
    match api::start(&socket, shared.clone()) {
        Ok(bound) => {
            if let Some(addr) = loaded.host.daemon.metrics_listen {
                match api::start_metrics(addr, shared.clone()) {
                    Ok(bound) => events.info(&format!("metrics served over TCP on {bound}")),
                    Err(e) => events.warn(&format!("no metrics over TCP: cannot listen on {addr}: {e}")),
                }
            }
            (Some(shared), Some(bound))
        }
        Err(e) => {
            events.warn(&format!("no API: cannot serve on {}: {e}", socket.display()));
            (None, None)
        }
    }
}

/// The first pass adopts what runs (its records synced together: few, it
/// leaves the reads and their records for after READY), then READY.
async fn adopt_then_ready<O: Ops>(sup: &mut Supervisor<O>) {
    let batch = atomic::Batch::begin();
    let pass_began = std::time::Instant::now();
    let running = sup.pass(true).await;
    let pass_us = pass_began.elapsed().as_micros();
    let pass_ms = pass_us / 1000;
    if let Err(e) = batch.commit() {
        sup.events
            .warn(&format!("cannot sync the records of the first pass: {e}"));
    }
    let sync_ms = pass_began.elapsed().as_millis() - pass_ms;
    if let Some(api) = &sup.api {
        api.set_adoption(
            running,
            std::time::Duration::from_micros(u64::try_from(pass_us).unwrap_or(u64::MAX)),
        );
    }
    sup.events.emit(
        log::Level::Info,
        ADOPTED_MESSAGE_ID,
        &[
            ("BERTH_ADOPTED", running.to_string()),
            ("BERTH_PASS_MS", pass_ms.to_string()),
            ("BERTH_PASS_US", pass_us.to_string()),
            ("BERTH_SYNC_MS", sync_ms.to_string()),
        ],
        &format!("adopted {running} running workloads (left untouched)"),
    );
    sup.log_health();
    let _ = sd_notify::notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&format!("supervising {running} running workloads")),
    ]);
}

/// A reconcile pass, its duration told in the unit's status: what a pass
/// costs at this host's size is one `systemctl status` away (and the
/// scale benchmark reads it there), and what adoption has left to read.
async fn pass<O: Ops>(sup: &mut Supervisor<O>) {
    let began = std::time::Instant::now();
    let running = sup.pass(false).await;
    // A pass's listing of every unit is garbage now.
    release_free_memory();
    write_textfile(sup);
    let left = sup.after_ready.len() + sup.fill.len();
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(&format!(
        "supervising {running} running workloads{}; last pass {} took {:.1} ms",
        if left > 0 {
            format!(", {left} still to look at")
        } else {
            String::new()
        },
        rfc3339(sup.heartbeat),
        began.elapsed().as_secs_f64() * 1000.0
    ))]);
}

/// node_exporter's textfile, when one is asked for and due.
fn write_textfile<O: Ops>(sup: &mut Supervisor<O>) {
    if let (Some(textfile), Some(api)) = (&mut sup.textfile, &sup.api)
        && let Some(e) = textfile.tick(api, std::time::Instant::now())
    {
        sup.events.warn(&e);
    }
}

/// Pings the watchdog (`watchdog`: half its period, when it is on). In
/// cluster mode only while the agent's thread runs too: a daemon whose
/// keep-alives stalled is killed (and fenced) before its lease could
/// outlive it. sd_notify opens a socket per call: with no descriptor left
/// the ping fails, and systemd would kill a healthy loop; the API's caps
/// keep descriptors free, and a failure is said, not swallowed.
fn ping_watchdog<O: Ops>(sup: &Supervisor<O>, watchdog: Option<Duration>) {
    let agent_stalled = match (&sup.cluster, watchdog) {
        (Some(agent), Some(half)) => !agent.alive(2 * half),
        _ => false,
    };
    if agent_stalled {
        sup.events
            .warn("watchdog: no ping, the cluster agent made no progress");
    } else if watchdog.is_some()
        && let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Watchdog])
    {
        sup.events.warn(&format!("watchdog ping failed: {e}"));
    }
}

/// The one way out of the loop: say why, tell systemd, make the records
/// durable, remove the socket it bound (if it is still there).
fn leave<O: Ops>(sup: &mut Supervisor<O>, socket: Option<&api::Bound>, exit: Exit, why: &str) -> Exit {
    if !why.is_empty() {
        sup.events.info(why);
    }
    // Cluster mode: the keys go to a maintenance lease first (not during
    // a shutdown: the drain speaks for the node then), so that peers move
    // nothing while the daemon is away for less than the grace.
    if let Some(agent) = &sup.cluster {
        let said = agent.hand_over(HAND_OVER_LIMIT);
        sup.events.info(&format!("cluster: {said}"));
    }
    if let Err(e) = sup.sync_now() {
        sup.events.warn(&format!("cannot sync the records: {e}"));
    }
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    if let Some(bound) = socket {
        api::stop(bound);
    }
    if let Some(textfile) = &sup.textfile {
        textfile.remove();
    }
    exit
}

/// How long a leaving daemon waits for its keys to reach the
/// maintenance lease: well inside the unit's stop timeout.
const HAND_OVER_LIMIT: Duration = Duration::from_secs(15);

/// Whether the daemon is still settling after this turn: the first time
/// the work left for after READY is all done, the memory it used is
/// handed back.
fn settled<O: Ops>(sup: &Supervisor<O>, settling: bool) -> bool {
    if settling && sup.fill.is_empty() && sup.after_ready.is_empty() {
        release_free_memory();
        return false;
    }
    settling
}

/// Returns the heap's free pages to the kernel. What starting up freed
/// (the parsed workload files, a listing of every unit, the first pass's
/// reads) lies between long-lived allocations, where glibc keeps it:
/// 3 MB of RSS at 5000 workloads, and a pass's listing 2.4 MB more.
fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim takes no pointer and only walks glibc's own
    // free lists; it is safe to call at any time.
    unsafe {
        nix::libc::malloc_trim(0);
    }
}

/// The running executable's file was replaced or removed (the kernel
/// marks the link " (deleted)").
pub fn binary_replaced() -> bool {
    std::fs::read_link("/proc/self/exe").is_ok_and(|p| p.to_string_lossy().ends_with(" (deleted)"))
}
