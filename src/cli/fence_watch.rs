//! `berth fence-watch` (berth-fence-watch.service): a process of its own,
//! two threads that share nothing but it.
//! - The backstop (the main thread): a second past the lease deadline the
//!   daemon last recorded, it stops the HA workloads that still run,
//!   should the daemon's fence and berth-fence.timer not have.
//! - With `[cluster] watchdog`, the holder: it keeps the device, petting
//!   it only while nothing here can outlive the lease
//!   ([`crate::cluster::watchdog`]). A stop of the backstop that blocks
//!   does not stop the petting; a holder that stops (hung, frozen,
//!   killed) lets the device reset the host.
//!
//! READY=1 goes out once the holder has tried the device (at once
//! without one): the daemon, ordered after this unit, then finds it held
//! and `owner-check` lets its HA workloads start.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::cluster::ha_workloads;
use super::{say, say_error, with_systemd};
use crate::cluster::fence;
use crate::cluster::session::boottime;
use crate::cluster::watchdog::device::{Device, Hardware};
use crate::cluster::watchdog::holder::{self, End, World};
use crate::cluster::watchdog::unit_of;
use crate::config::{self, Watchdog};
use crate::events::Events;
use crate::paths::Root;
use crate::state::cluster::{remove_armed, write_armed};
use crate::systemd::{Ops, Systemd};

pub(super) fn fence_watch(root: &Root) -> i32 {
    use crate::cluster::fence_watch::{LATE, Look, look};
    // Waits for a valid [cluster] rather than exit: a config briefly in
    // error must not leave the node without its backstop.
    let mut said = false;
    let settings = loop {
        if let Some(s) = config::load(root).host.cluster {
            break s;
        }
        if !said {
            say_error(
                "berth fence-watch: there is no valid [cluster] section in berth.toml (see berth check); looking again every 10 s",
            );
            // No watchdog to hold yet: the unit's start is over.
            notify_ready();
            said = true;
        }
        std::thread::sleep(Duration::from_secs(10));
    };
    match settings.watchdog.clone() {
        Some(w) => {
            if let Err(e) = on_sigterm() {
                say_error(&format!("berth fence-watch: cannot handle SIGTERM: {e}"));
                return 1;
            }
            let (root, margin) = (root.clone(), settings.fence_margin());
            let spawned = std::thread::Builder::new()
                .name("watchdog".into())
                .spawn(move || {
                    let runtime_dir = root.runtime_dir();
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        hold_watchdog(&root, &w, margin)
                    }));
                    park(&runtime_dir, "the watchdog's thread panicked")
                });
            if let Err(e) = spawned {
                say_error(&format!(
                    "berth fence-watch: cannot start the watchdog's thread: {e}"
                ));
                return 1;
            }
        }
        None => notify_ready(),
    }
    let runtime_dir = root.runtime_dir();
    let mut last_fence = None;
    loop {
        // An upgrade replaced the binary: the new one takes over the watch
        // (RestartForceExitStatus=75), and the device, left counting, with
        // it; while a watchdog is held, only at a moment a pet is allowed
        // (the exit's close pets it).
        if crate::daemon::binary_replaced()
            && (settings.watchdog.is_none() || PET_ALLOWED.load(Ordering::SeqCst))
        {
            say("berth fence-watch: the berth binary was replaced: relaunching (exit 75)\n");
            return crate::daemon::EXIT_RELAUNCH;
        }
        let deadline = fence::read_deadline(&runtime_dir);
        let now = boottime();
        if deadline.is_none_or(|d| now < d + LATE) {
            last_fence = None;
        }
        match look(deadline, now, last_fence) {
            Look::Sleep(nap) => std::thread::sleep(nap),
            Look::Fence => {
                let first = last_fence.is_none();
                last_fence = Some(now);
                if let Err(e) = backstop_fence(root, first) {
                    say_error(&format!(
                        "berth fence-watch: the lease deadline passed, and the HA workloads cannot be stopped: {e:#} (trying again in {} s)",
                        crate::cluster::fence_watch::AGAIN.as_secs()
                    ));
                }
            }
        }
    }
}

fn notify_ready() {
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
}

/// Set by SIGTERM when a watchdog is held: the holder closes it only
/// once that is safe, then ends the process.
static STOP_ASKED: AtomicBool = AtomicBool::new(false);
/// The holder's last judgement allowed a pet: the process may end (its
/// close pets the device) only then.
static PET_ALLOWED: AtomicBool = AtomicBool::new(false);

/// The holder cannot go on: the device stays open and unpetted, and the
/// host resets within its timeout (an exit would pet it). Starts are
/// refused from now on.
fn park(runtime_dir: &std::path::Path, why: &str) -> ! {
    let _ = remove_armed(runtime_dir);
    PET_ALLOWED.store(false, Ordering::SeqCst);
    Events::new("berth").warn(&format!(
        "cluster: watchdog: {why}: no longer petted; the host resets within its timeout if the device still counts"
    ));
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

extern "C" fn on_term(_: nix::libc::c_int) {
    STOP_ASKED.store(true, Ordering::SeqCst);
}

fn on_sigterm() -> nix::Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(SigHandler::Handler(on_term), SaFlags::SA_RESTART, SigSet::empty());
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    unsafe { sigaction(Signal::SIGTERM, &action) }.map(|_| ())
}

/// CLOCK_BOOTTIME − CLOCK_MONOTONIC: the time this host spent suspended.
/// Read between two monotonic reads less than a millisecond apart, so that
/// a preemption between the reads is not taken for a suspend (tried a few
/// times; a sample that never comes clean counts as no change).
fn time_asleep() -> Duration {
    let monotonic = || {
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .map(Duration::from)
            .unwrap_or_default()
    };
    static LAST: std::sync::Mutex<Duration> = std::sync::Mutex::new(Duration::ZERO);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..5 {
        let before = monotonic();
        let boot = boottime();
        let after = monotonic();
        if after.saturating_sub(before) < Duration::from_millis(1) {
            *last = boot.saturating_sub(after);
            break;
        }
    }
    *last
}

/// How long the holder waits between tries of a device it cannot hold.
const OPEN_AGAIN: Duration = Duration::from_secs(10);

/// The holder's thread: opens the device, holds it, and ends the
/// process when it closed it (or when the device failed: restarted).
fn hold_watchdog(root: &Root, w: &Watchdog, margin: Duration) -> ! {
    let events = Events::new("berth");
    let runtime_dir = root.runtime_dir();
    let mut said: Option<String> = None;
    let mut ready = false;
    loop {
        if STOP_ASKED.load(Ordering::SeqCst) {
            let _ = remove_armed(&runtime_dir);
            std::process::exit(0);
        }
        // Left counting by an earlier holder of this boot (the armed file
        // outlives it), or so the kernel says.
        let taking_over = crate::state::cluster::read_armed(&runtime_dir).is_some()
            || crate::cluster::watchdog::device::counting(&w.device);
        match Hardware::open(&w.device, w.timeout_s, taking_over) {
            Ok(device) => {
                let timeout = device.timeout();
                if taking_over {
                    events.info(&format!(
                        "cluster: watchdog: {} was left counting by an earlier holder: taken over as it is ({} s)",
                        w.device.display(),
                        timeout.as_secs()
                    ));
                }
                if let Err(e) = write_armed(&runtime_dir, &w.device, timeout.as_secs()) {
                    events.warn(&format!(
                        "cluster: watchdog: cannot write {}: {e}: owner-check starts no HA workload here",
                        crate::state::cluster::armed_path(&runtime_dir).display()
                    ));
                }
                events.info(&format!(
                    "cluster: watchdog: holding {} (timeout {} s, petted every {} ms while nothing here can outlive the lease): peers take this node's HA workloads {} s after its lease ends",
                    w.device.display(),
                    timeout.as_secs(),
                    holder::pet_every(timeout).as_millis(),
                    timeout.as_secs() + crate::cluster::watchdog::MARGIN.as_secs()
                ));
                notify_ready();
                let mut host = match Host::new(root, holder::pet_every(timeout)) {
                    Ok(h) => h,
                    Err(e) => park(&runtime_dir, &format!("{e:#}")),
                };
                match holder::hold(device, margin, &mut host) {
                    End::Closed => {
                        say("berth fence-watch: the watchdog is closed; stopping\n");
                        std::process::exit(0);
                    }
                    End::Failed(why) => park(&runtime_dir, &format!("{}: {why}", w.device.display())),
                }
            }
            Err(e) => {
                let _ = remove_armed(&runtime_dir);
                let text = e.to_string();
                if said.as_deref() != Some(text.as_str()) {
                    events.warn(&format!(
                        "cluster: watchdog: {text}: owner-check starts no HA workload here until it is held; trying again every {} s",
                        OPEN_AGAIN.as_secs()
                    ));
                    said = Some(text);
                }
                if !ready {
                    notify_ready();
                    ready = true;
                }
                for _ in 0..OPEN_AGAIN.as_secs() {
                    if STOP_ASKED.load(Ordering::SeqCst) {
                        break;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    }
}

/// The holder's world: CLOCK_BOOTTIME, the deadline file, systemd.
struct Host {
    root: Root,
    runtime: tokio::runtime::Runtime,
    systemd: Option<Systemd>,
    events: Events,
    /// The longest a look at the HA units may take (one pet period): one
    /// that takes longer counts as unseen, not petted this time.
    look_bound: Duration,
}

impl Host {
    fn new(root: &Root, look_bound: Duration) -> anyhow::Result<Host> {
        Ok(Host {
            root: root.clone(),
            runtime: crate::systemd::runtime()?,
            systemd: None,
            events: Events::new("berth"),
            look_bound,
        })
    }
}

/// The HA workloads that may run here: those berth.toml has, and those
/// owner-check let start in this boot (a token file), which a workload
/// file in error or removed since would otherwise hide.
fn watched(root: &Root) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = ha_workloads(&config::load(root))
        .into_iter()
        .map(|w| (w.name.clone(), w.unit_name()))
        .collect();
    let tokens = root.runtime_dir().join("owner");
    for entry in std::fs::read_dir(tokens).into_iter().flatten().flatten() {
        let file = entry.file_name();
        let Some(name) = file.to_str().and_then(|f| f.strip_suffix(".env")) else {
            continue;
        };
        if crate::config::is_valid_workload_name(name) && !out.iter().any(|(n, _)| n == name) {
            out.push((name.to_string(), crate::config::unit_name(name)));
        }
    }
    out
}

fn monotonic() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(Duration::from)
        .unwrap_or_default()
}

impl World for Host {
    fn now(&self) -> Duration {
        boottime()
    }

    fn asleep(&self) -> Duration {
        time_asleep()
    }

    fn deadline(&self) -> Option<Duration> {
        fence::read_deadline(&self.root.runtime_dir())
    }

    fn look(&mut self) -> holder::Looked {
        let ha = watched(&self.root);
        let manager = self.root.manager();
        let held = self.systemd.take();
        let bound = self.look_bound;
        // The timer is made inside the runtime: made outside, it panics.
        let looked = self.runtime.block_on(async move {
            tokio::time::timeout(bound, async move {
                let sd = match held {
                    Some(sd) => sd,
                    None => Systemd::connect(manager).await.map_err(|e| e.to_string())?,
                };
                let mut units = Vec::with_capacity(ha.len());
                for (name, unit) in &ha {
                    let t = sd.topology(unit).await.map_err(|e| e.to_string())?;
                    let timeout =
                        (t.timeout_stop_us != u64::MAX).then(|| t.timeout_stop_us.div_ceil(1_000_000));
                    let bound = crate::cluster::keys::stop_bound_s(t.exec_stop.len(), timeout)
                        .map_or(Duration::MAX, Duration::from_secs);
                    let unit = unit_of(
                        &t.active_state,
                        Duration::from_micros(t.left_active_mono_us),
                        monotonic(),
                        !t.control_group.is_empty(),
                        bound,
                    );
                    units.push((name.clone(), unit));
                }
                Ok::<_, String>((sd, units))
            })
            .await
        });
        match looked {
            Ok(Ok((sd, units))) => {
                self.systemd = Some(sd);
                Ok(units)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!("systemd did not answer within {} ms", bound.as_millis())),
        }
    }

    fn sleep(&mut self, d: Duration) {
        std::thread::sleep(d);
    }

    fn stop_asked(&self) -> bool {
        STOP_ASKED.load(Ordering::SeqCst)
    }

    fn judged(&mut self, pet_allowed: bool) {
        PET_ALLOWED.store(pet_allowed, Ordering::SeqCst);
    }

    fn margin(&mut self) -> Option<Duration> {
        config::load(&self.root).host.cluster.map(|c| c.fence_margin())
    }

    fn disarm(&mut self) {
        if let Err(e) = remove_armed(&self.root.runtime_dir()) {
            self.events
                .warn(&format!("cluster: watchdog: cannot remove the armed file: {e}"));
        }
    }

    fn info(&mut self, text: &str) {
        self.events.info(text);
    }

    fn warn(&mut self, text: &str) {
        self.events.warn(text);
    }
}

/// One look of the backstop: stops the HA workloads that still run.
/// `first`: the first look since this deadline passed, said even when
/// nothing runs.
fn backstop_fence(root: &Root, first: bool) -> anyhow::Result<()> {
    // The daemon reports the configuration's errors; this says only what
    // it does.
    let ha = ha_workloads(&config::load(root));
    let events = crate::events::Events::new("berth");
    with_systemd(root, |sd| async move {
        // One already stopping is the fence's or the timer's stop under
        // way (each within its bound): not stopped a second time. A unit
        // the manager did not answer for is skipped, not the whole look.
        let (mut running, mut unanswered) = (Vec::new(), Vec::new());
        for w in ha {
            match sd.active_state(&w.unit_name()).await {
                Ok(state) if !state.is_down() && state != crate::systemd::ActiveState::Deactivating => {
                    running.push(w)
                }
                Ok(_) => {}
                Err(e) => unanswered.push(format!("{}: {e}", w.name)),
            }
        }
        if !unanswered.is_empty() {
            events.warn(&format!(
                "cluster: fence-watch: the manager did not tell the state of {}",
                unanswered.join("; ")
            ));
        }
        // The daemon may have renewed its lease since the look began (a
        // late keep-alive answer): then nothing is stopped.
        let passed = match fence::read_deadline(&root.runtime_dir()) {
            Some(d) if boottime() >= d => boottime() - d,
            _ => return Ok(()),
        };
        if running.is_empty() {
            if first {
                events.info("cluster: fence-watch: the lease deadline passed; no HA workload runs here");
            }
            return Ok(());
        }
        let names: Vec<&str> = running.iter().map(|w| w.name.as_str()).collect();
        // After a suspend it passed long ago: said as it is.
        events.warn(&format!(
            "cluster: fence-watch: the lease deadline passed {} ms ago and {} still {} here (neither the daemon's fence nor berth-fence.timer stopped {}): stopping {}",
            passed.as_millis(),
            names.join(", "),
            if names.len() == 1 { "runs" } else { "run" },
            if names.len() == 1 { "it" } else { "them" },
            if names.len() == 1 { "it" } else { "them" },
        ));
        fence::stop_now(&sd, root, &running, &events).await;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The look at the HA units runs its bounded calls inside the
    /// holder's runtime: it answers (an error where no systemd listens),
    /// it does not panic.
    #[test]
    fn a_look_answers_without_panicking() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc/berth/workloads");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(
            dir.path().join("etc/berth/berth.toml"),
            "[cluster]\nnode = \"n1\"\nendpoints = [\"http://127.0.0.1:1\"]\n",
        )
        .unwrap();
        std::fs::write(
            etc.join("db.toml"),
            "exec = [\"/bin/true\"]\nha = true\nnodes = [\"n1\"]\n",
        )
        .unwrap();
        let root = Root::new(dir.path());
        assert_eq!(
            ha_workloads(&config::load(&root)).len(),
            1,
            "db is an HA workload"
        );
        let mut host = Host::new(&root, Duration::from_secs(2)).unwrap();
        match host.look() {
            Ok(units) => assert_eq!(units.len(), 1, "{units:?}"),
            Err(why) => assert!(!why.is_empty()),
        }
    }
}
