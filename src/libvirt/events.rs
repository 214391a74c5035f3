//! A guest's life as libvirt's events tell it: `berth-libvirt follow
//! DOMAIN` (a helper binary of its own, linking libvirt) prints the
//! domain's numeric state, then a line per lifecycle event. What ends the
//! guest is decided here ([`end_of`]), from numbers, in no language.

use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

use super::DomainState;

/// virDomainState values berth acts on.
const STATE_SHUTOFF: i32 = 5;
const STATE_CRASHED: i32 = 6;
/// virDomainShutoffReason: VIR_DOMAIN_SHUTOFF_CRASHED.
const SHUTOFF_CRASHED: i32 = 3;
/// virDomainEventType values.
const EVENT_STOPPED: i32 = 5;
const EVENT_CRASHED: i32 = 8;
/// virDomainEventStoppedDetailType: VIR_DOMAIN_EVENT_STOPPED_CRASHED, and
/// _FAILED, which libvirt sends when QEMU itself died (its state then
/// reads shut off, reason crashed).
const STOPPED_CRASHED: i32 = 2;
const STOPPED_FAILED: i32 = 5;

/// One line of `berth-libvirt follow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    State { state: i32, reason: i32 },
    Event { event: i32, detail: i32 },
}

impl Seen {
    /// A line as the helper prints it; anything else is None.
    pub fn parse(line: &str) -> Option<Seen> {
        let mut words = line.split_ascii_whitespace();
        let (kind, a, b) = (words.next()?, words.next()?, words.next()?);
        if words.next().is_some() {
            return None;
        }
        let (a, b) = (a.parse().ok()?, b.parse().ok()?);
        match kind {
            "state" => Some(Seen::State { state: a, reason: b }),
            "event" => Some(Seen::Event { event: a, detail: b }),
            _ => None,
        }
    }
}

/// How the guest ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Shut off by itself, destroyed, saved, migrated: not a failure.
    Down(&'static str),
    /// QEMU or the guest crashed: a failure of the unit, which a
    /// `restart = "on-failure"` starts again.
    Crashed(&'static str),
}

/// Whether `seen` says the guest has ended, as the poll's
/// [`super::DomainState::is_crash`] would judge it.
pub fn end_of(seen: Seen) -> Option<End> {
    match seen {
        Seen::State {
            state: STATE_CRASHED, ..
        } => Some(End::Crashed("crashed")),
        Seen::State {
            state: STATE_SHUTOFF,
            reason: SHUTOFF_CRASHED,
        } => Some(End::Crashed("shut off: crashed")),
        Seen::State {
            state: STATE_SHUTOFF,
            reason,
        } => Some(End::Down(shutoff_reason(reason))),
        Seen::Event {
            event: EVENT_STOPPED,
            detail: STOPPED_CRASHED,
        } => Some(End::Crashed("stopped: crashed")),
        Seen::Event {
            event: EVENT_STOPPED,
            detail: STOPPED_FAILED,
        } => Some(End::Crashed("stopped: the emulator failed")),
        Seen::Event {
            event: EVENT_STOPPED,
            detail,
        } => Some(End::Down(stopped_detail(detail))),
        // A crash event alone ends nothing: with on_crash = "restart" or
        // a crash kernel loaded the guest runs on, and with "destroy" a
        // STOPPED event follows (see `needs_a_look`).
        _ => None,
    }
}

/// Whether `seen` calls for a read of the state: after a crash event the
/// state says whether the guest still runs (reset, or a crash kernel),
/// is kept crashed (on_crash = "preserve"), or is gone.
pub fn needs_a_look(seen: Seen) -> bool {
    matches!(
        seen,
        Seen::Event {
            event: EVENT_CRASHED,
            ..
        }
    )
}

/// A numeric state and reason as the watcher's [`DomainState`], with the
/// reason in virsh's words (`is_crash` reads "crashed").
pub fn domain_state(state: i32, reason: i32) -> (DomainState, Option<String>) {
    let (state, reason) = match state {
        1 => (DomainState::Running, None),
        2 => (DomainState::Idle, None),
        3 => (DomainState::Paused, None),
        4 => (DomainState::InShutdown, None),
        STATE_SHUTOFF => (
            DomainState::ShutOff,
            Some(
                shutoff_reason(reason)
                    .trim_start_matches("shut off: ")
                    .trim_start_matches("shut off"),
            ),
        ),
        STATE_CRASHED => (
            DomainState::Crashed,
            Some(if reason == 1 { "panicked" } else { "unknown" }),
        ),
        7 => (DomainState::PmSuspended, None),
        other => (DomainState::Other(format!("state {other}")), None),
    };
    (state, reason.filter(|r| !r.is_empty()).map(str::to_string))
}

fn shutoff_reason(reason: i32) -> &'static str {
    match reason {
        1 => "shut off: shutdown",
        2 => "shut off: destroyed",
        3 => "shut off: crashed",
        4 => "shut off: migrated",
        5 => "shut off: saved",
        6 => "shut off: failed to start",
        7 => "shut off: from snapshot",
        8 => "shut off: by the daemon",
        _ => "shut off",
    }
}

fn stopped_detail(detail: i32) -> &'static str {
    match detail {
        0 => "stopped: shutdown",
        1 => "stopped: destroyed",
        3 => "stopped: migrated",
        4 => "stopped: saved",
        6 => "stopped: from snapshot",
        _ => "stopped",
    }
}

/// Where packages and `make install` put the helper; the first that is
/// there is used. None: berth follows guests by polling virsh.
const HELPER_PLACES: &[&str] = &[
    "/usr/libexec/berth/berth-libvirt",
    "/usr/local/libexec/berth/berth-libvirt",
    "/usr/lib/berth/berth-libvirt",
];

/// The helper next to this berth (PREFIX/bin/berth →
/// PREFIX/libexec/berth/berth-libvirt), else in the usual places;
/// `BERTH_LIBVIRT_HELPER` names another (empty or missing: none, poll), as
/// `BERTH_ROOT` re-roots paths for tests.
pub fn helper() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("BERTH_LIBVIRT_HELPER") {
        // One that is not there is none: the watcher polls, as without.
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("libexec/berth/berth-libvirt")));
    beside
        .into_iter()
        .chain(HELPER_PLACES.iter().map(PathBuf::from))
        .find(|p| p.is_file())
}

/// A running `berth-libvirt follow`: its lines arrive on a channel (None
/// once its output ends), so that the watcher can wait for a line and a
/// signal at once.
pub struct Follower {
    child: Child,
    pub lines: mpsc::Receiver<Option<String>>,
}

impl Follower {
    pub fn spawn(helper: &Path, domain: &str) -> std::io::Result<Follower> {
        let mut child = Command::new(helper)
            .args(["follow", domain])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let out = child.stdout.take().expect("stdout is piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            // Lines are a few bytes each; one longer than this is no
            // line of the helper's.
            let mut reader = std::io::BufReader::new(out);
            let mut line = String::new();
            loop {
                line.clear();
                match (&mut reader).take(256).read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if tx.send(Some(line.trim_end().to_string())).is_err() {
                            return;
                        }
                    }
                }
            }
            let _ = tx.send(None);
        });
        Ok(Follower { child, lines })
    }

    /// Its exit status once its output has ended: given a second to
    /// exit (its output may end on a read error while it runs on), then
    /// killed, so that the watcher never blocks here past a stop.
    pub fn wait(mut self) -> Option<std::process::ExitStatus> {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(1);
        while std::time::Instant::now() < until {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) => std::thread::sleep(std::time::Duration::from_millis(20)),
                Err(_) => return None,
            }
        }
        let _ = self.child.kill();
        self.child.wait().ok()
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_as_the_helper_prints_them() {
        for (line, want) in [
            ("state 1 1", Some(Seen::State { state: 1, reason: 1 })),
            ("event 5 0", Some(Seen::Event { event: 5, detail: 0 })),
            ("event 5 0\n", Some(Seen::Event { event: 5, detail: 0 })),
            ("event -1 2", Some(Seen::Event { event: -1, detail: 2 })),
            ("event 5", None),
            ("event 5 0 9", None),
            ("state x 1", None),
            ("laufend", None),
            ("", None),
        ] {
            assert_eq!(Seen::parse(line), want, "{line:?}");
        }
    }

    /// Each line: whether it ends the guest, and how; the numbers are
    /// libvirt-domain.h's (libvirt 9.0 and 11.3).
    #[test]
    fn what_ends_a_guest() {
        use End::*;
        for (seen, want) in [
            (Seen::State { state: 1, reason: 1 }, None),
            (Seen::State { state: 3, reason: 0 }, None),
            (Seen::State { state: 7, reason: 0 }, None),
            (
                Seen::State { state: 5, reason: 1 },
                Some(Down("shut off: shutdown")),
            ),
            (Seen::State { state: 5, reason: 5 }, Some(Down("shut off: saved"))),
            (
                Seen::State { state: 5, reason: 3 },
                Some(Crashed("shut off: crashed")),
            ),
            (Seen::State { state: 6, reason: 1 }, Some(Crashed("crashed"))),
            (Seen::Event { event: 2, detail: 0 }, None),
            (Seen::Event { event: 3, detail: 0 }, None),
            (Seen::Event { event: 6, detail: 0 }, None),
            (
                Seen::Event { event: 5, detail: 0 },
                Some(Down("stopped: shutdown")),
            ),
            (
                Seen::Event { event: 5, detail: 1 },
                Some(Down("stopped: destroyed")),
            ),
            (Seen::Event { event: 5, detail: 4 }, Some(Down("stopped: saved"))),
            (
                Seen::Event { event: 5, detail: 2 },
                Some(Crashed("stopped: crashed")),
            ),
            // QEMU died (OOM kill, segfault): a crash, as the state says.
            (
                Seen::Event { event: 5, detail: 5 },
                Some(Crashed("stopped: the emulator failed")),
            ),
            // A crash event: the state decides.
            (Seen::Event { event: 8, detail: 0 }, None),
            (Seen::Event { event: 8, detail: 1 }, None),
        ] {
            assert_eq!(end_of(seen), want, "{seen:?}");
        }
        assert!(needs_a_look(Seen::Event { event: 8, detail: 1 }));
        // The state as the watcher's DomainState, the crash rule intact.
        for (state, reason, want, crash) in [
            (1, 1, DomainState::Running, false),
            (3, 0, DomainState::Paused, false),
            (5, 1, DomainState::ShutOff, false),
            (5, 3, DomainState::ShutOff, true),
            (6, 1, DomainState::Crashed, true),
            (7, 0, DomainState::PmSuspended, false),
            (0, 0, DomainState::Other("state 0".into()), false),
        ] {
            let (s, r) = domain_state(state, reason);
            assert_eq!((&s, s.is_crash(r.as_deref())), (&want, crash), "{state} {reason}");
        }
        assert_eq!(domain_state(5, 5).1.as_deref(), Some("saved"));
        assert_eq!(domain_state(5, 0).1, None);
        assert!(!needs_a_look(Seen::Event { event: 5, detail: 2 }));
        assert!(!needs_a_look(Seen::State { state: 8, reason: 0 }));
    }
}
