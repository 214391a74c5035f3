//! `berth guest DOMAIN`: what a libvirt workload's unit
//! (`berth@NAME.service`, Type=notify) runs. It starts the domain, or
//! adopts it when it runs already (a managed save is restored by the
//! start), says READY=1, and follows it: the unit ends when the guest
//! does, so systemd, the autostart, the drain and the daemon see the
//! guest's life in the unit's. SIGTERM (a stop of the unit) stops the
//! guest by its policy: ACPI shutdown, then destroy at its stop delay
//! unless force-off is off; with --power-off, destroy at once. SIGUSR2
//! destroys at once: the drain's force-off (its SIGKILL would end this
//! process and leave QEMU, in libvirt's machine scope, running).
//!
//! What the guest does not react to ACPI in: paused (resumed first),
//! pmsuspended (woken first), crashed (destroyed: nothing to stop).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

use super::{Action, CALL_LIMIT, CallError, DomainState, act, state, state_with_reason};
use crate::events::Events;

/// How often the guest's state is read while it runs: its end shows in
/// the unit this much later at most.
const FOLLOW_EVERY: Duration = Duration::from_secs(2);
/// How often during a graceful stop: the state, and the ACPI request
/// again (a guest early in its boot may miss the first).
const STOP_POLL: Duration = Duration::from_millis(500);
const ACPI_AGAIN: Duration = Duration::from_secs(15);
/// How long a destroyed guest may take to show as shut off.
const DESTROY_SETTLE: Duration = Duration::from_secs(10);

static STOP: AtomicBool = AtomicBool::new(false);
static DESTROY: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: nix::libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

extern "C" fn on_destroy(_: nix::libc::c_int) {
    DESTROY.store(true, Ordering::SeqCst);
    STOP.store(true, Ordering::SeqCst);
}

/// How the unit asked for this guest to be stopped.
#[derive(Debug, Clone)]
pub struct Policy {
    pub stop_delay: Duration,
    pub power_off: bool,
    pub force_off: bool,
    /// Managed save first (stop_action = "save").
    pub save: bool,
    /// `virsh shutdown --mode`'s value: "agent,acpi", "acpi", "agent".
    pub shutdown_mode: String,
}

/// The watcher's exit status when the guest was saved (the unit counts
/// it a success: SuccessExitStatus=).
pub const EXIT_SAVED: i32 = 3;
/// When the save failed and the guest was shut down instead.
pub const EXIT_SAVE_FAILED: i32 = 4;

/// How a stop ended beyond "down", for the drain's outcome: left in
/// `guests/DOMAIN` under the runtime directory, taken by the drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopEnd {
    Saved,
    SaveFailed,
}

fn stop_end_path(runtime_dir: &std::path::Path, domain: &str) -> std::path::PathBuf {
    // Domain names are [A-Za-z0-9][A-Za-z0-9_.+:-]*: a file name as is.
    runtime_dir.join("guests").join(domain)
}

/// The runtime directory of the root the watcher runs for.
static RUNTIME_DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

fn leave_stop_end(domain: &str, end: StopEnd) {
    let Some(runtime_dir) = RUNTIME_DIR.get() else {
        return;
    };
    let path = stop_end_path(runtime_dir, domain);
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let _ = std::fs::write(
        &path,
        if end == StopEnd::Saved {
            "saved\n"
        } else {
            "save-failed\n"
        },
    );
}

/// What the watcher of `domain` left, removed once read.
pub fn take_stop_end(runtime_dir: &std::path::Path, domain: &str) -> Option<StopEnd> {
    let path = stop_end_path(runtime_dir, domain);
    let text = std::fs::read_to_string(&path).ok()?;
    let _ = std::fs::remove_file(&path);
    match text.trim() {
        "saved" => Some(StopEnd::Saved),
        "save-failed" => Some(StopEnd::SaveFailed),
        _ => None,
    }
}

/// Runs the watcher; the process's exit status.
pub fn run(root: &crate::paths::Root, domain: &str, policy: &Policy) -> i32 {
    let _ = RUNTIME_DIR.set(root.runtime_dir());
    // A stop end left by an earlier run is no news of this one.
    let _ = take_stop_end(&root.runtime_dir(), domain);
    let events = Events::new("berth-guest");
    for (signal, handler) in [
        (Signal::SIGTERM, on_term as extern "C" fn(nix::libc::c_int)),
        (Signal::SIGINT, on_term),
        (Signal::SIGUSR2, on_destroy),
    ] {
        let action = SigAction::new(SigHandler::Handler(handler), SaFlags::SA_RESTART, SigSet::empty());
        // SAFETY: the handlers only store to atomics (async-signal-safe).
        if let Err(e) = unsafe { sigaction(signal, &action) } {
            events.warn(&format!("guest {domain}: cannot handle {signal}: {e}"));
            return 1;
        }
    }
    match state(domain) {
        Ok(s) if s.is_up() => events.info(&format!("guest {domain} runs already ({s:?}): adopted")),
        Ok(_) => {
            if let Err(e) = act(domain, Action::Start, CALL_LIMIT) {
                events.warn(&format!("guest {domain}: start failed: {e}"));
                return 1;
            }
            events.info(&format!("guest {domain} started"));
        }
        Err(e) => {
            events.warn(&format!("guest {domain}: cannot read its state: {e}"));
            return 1;
        }
    }
    let _ = sd_notify::notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&format!("guest {domain} running")),
    ]);
    follow(domain, policy, &events)
}

/// Until the guest ends or the unit is stopped: by libvirt's events
/// where berth-libvirt is installed, else by reading its state every
/// [`FOLLOW_EVERY`].
fn follow(domain: &str, policy: &Policy, events: &Events) -> i32 {
    match super::events::helper() {
        Some(helper) => follow_events(domain, policy, events, &helper),
        None => follow_polling(domain, policy, events),
    }
}

fn follow_polling(domain: &str, policy: &Policy, events: &Events) -> i32 {
    let mut unreachable_said = false;
    loop {
        if STOP.load(Ordering::SeqCst) {
            return stop(domain, policy, events);
        }
        if let Some(code) = poll_once(domain, events, &mut unreachable_said) {
            return code;
        }
        sleep_unless_signalled(FOLLOW_EVERY);
    }
}

/// One read of the state: the unit's exit status once the guest has
/// ended.
fn poll_once(domain: &str, events: &Events, unreachable_said: &mut bool) -> Option<i32> {
    match state_with_reason(domain) {
        // A crash is a failure of the unit (its `restart = "on-failure"`
        // starts it again); the guest's own shutdown is not.
        Ok((s, reason)) if s.is_crash(reason.as_deref()) => {
            events.warn(&format!(
                "guest {domain} crashed ({s:?}, {})",
                reason.as_deref().unwrap_or("no reason")
            ));
            Some(1)
        }
        Ok((DomainState::ShutOff, reason)) => {
            events.info(&format!(
                "guest {domain} is shut off ({})",
                reason.as_deref().unwrap_or("no reason given")
            ));
            Some(0)
        }
        Ok(_) => {
            *unreachable_said = false;
            None
        }
        // A libvirt daemon restarting is no end of the guest.
        Err(e) => {
            if !*unreachable_said {
                events.warn(&format!(
                    "guest {domain}: cannot read its state ({e}); still following"
                ));
                *unreachable_said = true;
            }
            None
        }
    }
}

/// By `berth-libvirt follow`'s lines: the guest's end reaches the unit as
/// soon as libvirt reports it. When the helper's connection closes (a
/// libvirt daemon restarting) or it fails, one read of the state covers
/// the gap, and it runs again [`FOLLOW_EVERY`] later.
fn follow_events(domain: &str, policy: &Policy, events: &Events, helper: &std::path::Path) -> i32 {
    use super::events::{End, Follower, Seen, end_of, needs_a_look};
    let mut unreachable_said = false;
    let mut gap_said = false;
    loop {
        let follower = match Follower::spawn(helper, domain) {
            Ok(f) => f,
            Err(e) => {
                events.warn(&format!(
                    "guest {domain}: cannot run {} ({e}); following by its state every {} s",
                    helper.display(),
                    FOLLOW_EVERY.as_secs()
                ));
                return follow_polling(domain, policy, events);
            }
        };
        loop {
            if STOP.load(Ordering::SeqCst) {
                drop(follower);
                return stop(domain, policy, events);
            }
            match follower.lines.recv_timeout(Duration::from_millis(50)) {
                Ok(Some(line)) => {
                    let seen = Seen::parse(&line);
                    match seen.and_then(end_of) {
                        Some(End::Crashed(why)) => {
                            events.warn(&format!("guest {domain} crashed ({why})"));
                            return 1;
                        }
                        Some(End::Down(why)) => {
                            events.info(&format!("guest {domain} is down ({why})"));
                            return 0;
                        }
                        None => gap_said = false,
                    }
                    if seen.is_some_and(needs_a_look)
                        && let Some(code) = poll_once(domain, events, &mut unreachable_said)
                    {
                        return code;
                    }
                }
                Ok(None) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            }
        }
        let status = follower.wait();
        if STOP.load(Ordering::SeqCst) {
            return stop(domain, policy, events);
        }
        if !gap_said {
            events.warn(&format!(
                "guest {domain}: libvirt's events stopped ({}); still following",
                status.map_or_else(|| "no exit status".to_string(), |s| s.to_string())
            ));
            gap_said = true;
        }
        if let Some(code) = poll_once(domain, events, &mut unreachable_said) {
            return code;
        }
        sleep_unless_signalled(FOLLOW_EVERY);
    }
}

fn sleep_unless_signalled(d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until && !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The stop the unit asked for; 0 once the guest is shut off.
fn stop(domain: &str, policy: &Policy, events: &Events) -> i32 {
    let now = match state(domain) {
        Ok(s) => s,
        Err(e) => {
            events.warn(&format!("guest {domain}: cannot read its state to stop it: {e}"));
            return 1;
        }
    };
    if now == DomainState::ShutOff {
        return 0;
    }
    if policy.power_off || now == DomainState::Crashed || DESTROY.load(Ordering::SeqCst) {
        return destroy(domain, events, "as asked");
    }
    if policy.save {
        return save_or_shut_down(domain, policy, events);
    }
    shut_down(domain, policy, now, Instant::now(), events)
}

/// A managed save within the stop delay; if it fails or outlives it, the
/// guest is shut down instead (and the save aborted, so that it runs on
/// until then), in what is left of the delay.
fn save_or_shut_down(domain: &str, policy: &Policy, events: &Events) -> i32 {
    let began = Instant::now();
    let limit = policy.stop_delay.max(Duration::from_secs(1));
    match act(domain, Action::ManagedSave, limit) {
        Ok(_) => {
            events.info(&format!(
                "guest {domain} saved in {:.1} s; its next start resumes it",
                began.elapsed().as_secs_f64()
            ));
            leave_stop_end(domain, StopEnd::Saved);
            return EXIT_SAVED;
        }
        Err(e) => {
            if matches!(e, CallError::TimedOut(_)) {
                // The save goes on in libvirt unless aborted; the guest
                // runs on once it is.
                let _ = act(domain, Action::AbortJob, CALL_LIMIT);
            }
            events.warn(&format!(
                "guest {domain}: managed save failed ({e}); shutting it down instead"
            ));
        }
    }
    let now = match state(domain) {
        Ok(s) => s,
        Err(e) => {
            events.warn(&format!("guest {domain}: cannot read its state to stop it: {e}"));
            return 1;
        }
    };
    match shut_down(domain, policy, now, began, events) {
        0 => {
            leave_stop_end(domain, StopEnd::SaveFailed);
            EXIT_SAVE_FAILED
        }
        other => other,
    }
}

/// ACPI shutdown (a paused or suspended guest woken first), then destroy
/// at the stop delay counted from `began` unless force-off is off.
fn shut_down(domain: &str, policy: &Policy, now: DomainState, began: Instant, events: &Events) -> i32 {
    if now == DomainState::ShutOff {
        return 0;
    }
    // Neither reacts to ACPI: woken first.
    let wake = match now {
        DomainState::Paused => Some(Action::Resume),
        DomainState::PmSuspended => Some(Action::PmWakeup),
        _ => None,
    };
    if let Some(action) = wake
        && let Err(e) = act(domain, action, CALL_LIMIT)
    {
        events.warn(&format!(
            "guest {domain} is {now:?} and its {action:?} failed: {e}"
        ));
    }
    let mut asked: Option<Instant> = None;
    loop {
        if DESTROY.load(Ordering::SeqCst) {
            return destroy(domain, events, "on the drain's force-off");
        }
        if policy.force_off && began.elapsed() >= policy.stop_delay {
            return destroy(
                domain,
                events,
                &format!(
                    "not down after its stop delay of {} s",
                    policy.stop_delay.as_secs()
                ),
            );
        }
        if asked.is_none_or(|t| t.elapsed() >= ACPI_AGAIN) {
            let mode = policy.shutdown_mode.as_str();
            match act(domain, Action::Shutdown { mode }, CALL_LIMIT) {
                Ok(_) if asked.is_none() => events.info(&format!("guest {domain}: shutdown asked ({mode})")),
                Ok(_) => {}
                Err(e) => events.warn(&format!("guest {domain}: shutdown ({mode}) failed: {e}")),
            }
            asked = Some(Instant::now());
        }
        match state(domain) {
            Ok(DomainState::ShutOff) => {
                events.info(&format!(
                    "guest {domain} shut down after {:.1} s",
                    began.elapsed().as_secs_f64()
                ));
                return 0;
            }
            Ok(DomainState::Crashed) => return destroy(domain, events, "it crashed while stopping"),
            _ => {}
        }
        std::thread::sleep(STOP_POLL);
    }
}

/// A destroy, then until it shows as shut off.
fn destroy(domain: &str, events: &Events, why: &str) -> i32 {
    match act(domain, Action::Destroy, CALL_LIMIT) {
        Ok(()) => events.warn(&format!("guest {domain} destroyed: {why}")),
        // Not running any more (down in between): what was asked; the
        // state read below confirms it.
        Err(CallError::Refused(_)) => {}
        Err(e) => {
            events.warn(&format!("guest {domain}: destroy failed ({why}): {e}"));
            return 1;
        }
    }
    let until = Instant::now() + DESTROY_SETTLE;
    while Instant::now() < until {
        if matches!(state(domain), Ok(s) if !s.is_up()) {
            return 0;
        }
        std::thread::sleep(STOP_POLL);
    }
    events.warn(&format!(
        "guest {domain} still not shut off {} s after destroy",
        DESTROY_SETTLE.as_secs()
    ));
    1
}
