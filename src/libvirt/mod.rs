//! libvirt guests as workloads: `virsh` with a time limit on every call,
//! the domain states berth acts on, and the watcher a guest's unit runs
//! ([`guest`]). berth talks to libvirt only from a guest's own unit, so
//! the drain never wakes a libvirt daemon that exited idle.

pub mod check;
pub mod events;
pub mod guest;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// libvirt's daemons (monolithic libvirtd on Debian 12, modular virtqemud
/// later), their sockets and the log daemon: what a guest's unit and the
/// drain are ordered after, so that they outlive the guests at shutdown.
pub const DAEMON_UNITS: &[&str] = &[
    "libvirtd.service",
    "libvirtd.socket",
    "virtqemud.service",
    "virtqemud.socket",
    "virtlogd.service",
    "virtlogd.socket",
];

/// What the drain adds when a workload is a libvirt guest. libvirt orders
/// each machine scope `Before=virt-guest-shutdown.target`, which is only
/// active when something wants it: the drain wants it and is ordered
/// after it, so every guest's scope is stopped after the drain. And the
/// drain is ordered after libvirt-guests.service (Debian enables it), so
/// that at shutdown the drain runs first.
pub const DRAIN_AFTER: &[&str] = &["virt-guest-shutdown.target", "libvirt-guests.service"];
pub const DRAIN_WANTS: &[&str] = &["virt-guest-shutdown.target"];

/// The connection: the system instance (a user manager's session
/// instance has no machine scopes).
pub const URI: &str = "qemu:///system";

/// How long one virsh call may take before it is killed: libvirt answers
/// in milliseconds, but a hung daemon must not hang a stop.
pub const CALL_LIMIT: Duration = Duration::from_secs(30);

/// A domain's state as `virsh domstate` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DomainState {
    Running,
    /// "idle" and "blocked": running, waiting on something.
    Idle,
    Paused,
    InShutdown,
    ShutOff,
    Crashed,
    PmSuspended,
    Other(String),
}

impl DomainState {
    /// `virsh domstate` output, with or without `--reason`'s ` (reason)`.
    pub fn parse(text: &str) -> DomainState {
        Self::parse_with_reason(text).0
    }

    /// The state, and the reason `domstate --reason` gives for it.
    pub fn parse_with_reason(text: &str) -> (DomainState, Option<String>) {
        let text = text.trim();
        let (state, reason) = match text.strip_suffix(')').and_then(|t| t.split_once(" (")) {
            Some((state, reason)) => (state, Some(reason.to_string())),
            None => (text, None),
        };
        let state = match state {
            "running" => DomainState::Running,
            "idle" | "blocked" => DomainState::Idle,
            "paused" => DomainState::Paused,
            "in shutdown" => DomainState::InShutdown,
            "shut off" => DomainState::ShutOff,
            "crashed" => DomainState::Crashed,
            "pmsuspended" => DomainState::PmSuspended,
            other => DomainState::Other(other.to_string()),
        };
        (state, reason)
    }

    /// Whether the guest ended by a failure: QEMU died or the guest
    /// crashed (libvirt's default `on_crash` destroys it: shut off,
    /// reason crashed). Its own shutdown, a destroy, a save are not.
    pub fn is_crash(&self, reason: Option<&str>) -> bool {
        match self {
            DomainState::Crashed => true,
            DomainState::ShutOff => reason == Some("crashed"),
            _ => false,
        }
    }

    /// QEMU runs (or is being torn down): the guest is up as far as
    /// its unit is concerned.
    pub fn is_up(&self) -> bool {
        !matches!(self, DomainState::ShutOff | DomainState::Crashed)
    }
}

/// Why a virsh call did not give an answer.
#[derive(Debug)]
pub enum VirshError {
    /// It could not be run at all (virsh missing).
    Spawn(std::io::Error),
    /// Still running after the limit: killed.
    TimedOut(Duration),
    /// It exited non-zero: what it said on stderr.
    Failed(String),
}

impl std::fmt::Display for VirshError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VirshError::Spawn(e) => write!(f, "cannot run virsh: {e}"),
            VirshError::TimedOut(d) => write!(f, "virsh gave no answer within {} s", d.as_secs()),
            VirshError::Failed(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for VirshError {}

/// The virsh command line, in the C locale: libvirt translates the
/// states berth parses ("shut off" is "ausgeschaltet" under de_DE), and
/// an unknown state would read as running.
fn virsh_command(args: &[&str]) -> Command {
    let mut command = Command::new("virsh");
    command.args(["--quiet", "-c", URI]).args(args).env("LC_ALL", "C");
    command
}

/// `virsh -c qemu:///system ARGS…`, killed after `limit`; its standard
/// output on success. The domain name is always an option's value
/// (`--domain NAME`), never a bare word virsh could read as an option.
pub fn virsh(args: &[&str], limit: Duration) -> Result<String, VirshError> {
    run_within(virsh_command(args), args.first().copied().unwrap_or(""), limit)
}

/// `command`, killed after `limit`; its standard output on success, else
/// what it said on stderr (`what` names it when it said nothing).
fn run_within(mut command: Command, what: &str, limit: Duration) -> Result<String, VirshError> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(VirshError::Spawn)?;
    let began = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if began.elapsed() >= limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(VirshError::TimedOut(limit));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(VirshError::Spawn(e)),
        }
    };
    // virsh's answers are a few lines: the pipes never fill before exit.
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    if status.success() {
        Ok(out)
    } else {
        let why = err.trim().trim_start_matches("error: ").replace('\n', "; ");
        Err(VirshError::Failed(if why.is_empty() {
            format!(
                "{} {what} exited with {status}",
                command.get_program().to_string_lossy()
            )
        } else {
            why
        }))
    }
}

/// The domain's state.
pub fn state(domain: &str) -> Result<DomainState, VirshError> {
    state_with_reason(domain).map(|(s, _)| s)
}

/// The domain's state and its reason: libvirt's numbers through
/// berth-libvirt where it is installed, else virsh's words (C locale).
pub fn state_with_reason(domain: &str) -> Result<(DomainState, Option<String>), VirshError> {
    if let Some(helper) = events::helper() {
        let mut command = Command::new(&helper);
        command.args(["state", domain]);
        let out = run_within(command, "state", CALL_LIMIT)?;
        return match events::Seen::parse(out.trim()) {
            Some(events::Seen::State { state, reason }) => Ok(events::domain_state(state, reason)),
            _ => Err(VirshError::Failed(format!(
                "{} state gave no state: {:?}",
                helper.display(),
                out.chars().take(80).collect::<String>()
            ))),
        };
    }
    virsh(&["domstate", "--reason", "--domain", domain], CALL_LIMIT)
        .map(|s| DomainState::parse_with_reason(&s))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 31, item 7: virsh ran in the unit's locale, and a German
    /// one made every state unknown.
    #[test]
    fn virsh_runs_in_the_c_locale() {
        let command = virsh_command(&["domstate", "--domain", "vm"]);
        let env: Vec<_> = command.get_envs().collect();
        assert!(
            env.contains(&(std::ffi::OsStr::new("LC_ALL"), Some(std::ffi::OsStr::new("C")))),
            "{env:?}"
        );
    }

    #[test]
    fn domain_states_as_virsh_prints_them() {
        for (text, state, up) in [
            ("running\n\n", DomainState::Running, true),
            ("idle", DomainState::Idle, true),
            ("blocked", DomainState::Idle, true),
            ("paused", DomainState::Paused, true),
            ("in shutdown", DomainState::InShutdown, true),
            ("shut off\n", DomainState::ShutOff, false),
            ("crashed", DomainState::Crashed, false),
            ("pmsuspended", DomainState::PmSuspended, true),
            ("dying", DomainState::Other("dying".into()), true),
        ] {
            let parsed = DomainState::parse(text);
            assert_eq!((&parsed, parsed.is_up()), (&state, up), "{text:?}");
        }
    }

    /// Restart= on-failure restarts a guest that crashed, not one that
    /// shut itself down: the reason tells them apart.
    #[test]
    fn reasons_and_crashes() {
        for (text, state, reason, crash) in [
            (
                "shut off (crashed)\n",
                DomainState::ShutOff,
                Some("crashed"),
                true,
            ),
            (
                "shut off (shutdown)",
                DomainState::ShutOff,
                Some("shutdown"),
                false,
            ),
            (
                "shut off (destroyed)",
                DomainState::ShutOff,
                Some("destroyed"),
                false,
            ),
            (
                "shut off (from snapshot)",
                DomainState::ShutOff,
                Some("from snapshot"),
                false,
            ),
            ("crashed (panicked)", DomainState::Crashed, Some("panicked"), true),
            ("running (booted)", DomainState::Running, Some("booted"), false),
            ("shut off", DomainState::ShutOff, None, false),
        ] {
            let (parsed, why) = DomainState::parse_with_reason(text);
            assert_eq!((&parsed, why.as_deref()), (&state, reason), "{text:?}");
            assert_eq!(parsed.is_crash(why.as_deref()), crash, "{text:?}");
        }
    }
}
