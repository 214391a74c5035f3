//! libvirt guests as workloads: libvirt's API through berth-libvirt (or
//! `virsh` where it is not installed) with a time limit on every call,
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

/// How long one libvirt call may take before it is killed: libvirt answers
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

/// Why a call to libvirt (berth-libvirt or virsh) did not give an answer.
#[derive(Debug)]
pub enum CallError {
    /// It could not be run at all (virsh missing).
    Spawn(std::io::Error),
    /// Still running after the limit: killed.
    TimedOut(Duration),
    /// libvirt refused the action in the domain's present state
    /// (VIR_ERR_OPERATION_INVALID: a destroy of a guest that is not
    /// running): what it said.
    Refused(String),
    /// It exited non-zero: what it said on stderr.
    Failed(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Spawn(e) => write!(f, "cannot run it: {e}"),
            CallError::TimedOut(d) => write!(f, "no answer within {} s", d.as_secs()),
            CallError::Refused(why) | CallError::Failed(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for CallError {}

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
pub fn virsh(args: &[&str], limit: Duration) -> Result<String, CallError> {
    run_within(virsh_command(args), args.first().copied().unwrap_or(""), limit)
}

/// berth-libvirt's exit status when libvirt refused the action in the
/// domain's state.
const HELPER_REFUSED: i32 = 3;

/// What the watcher asks libvirt to do to a guest: one call each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action<'a> {
    Start,
    /// `agent,acpi`, `acpi` or `agent`.
    Shutdown {
        mode: &'a str,
    },
    Destroy,
    ManagedSave,
    /// Ends a managed save that outlived its time: the guest runs on.
    AbortJob,
    Resume,
    PmWakeup,
}

impl<'a> Action<'a> {
    /// berth-libvirt's arguments for it.
    fn helper_args(self, domain: &'a str) -> Vec<&'a str> {
        match self {
            Action::Shutdown { mode } => vec!["shutdown", domain, mode],
            other => vec![other.helper_verb(), domain],
        }
    }

    fn helper_verb(self) -> &'static str {
        match self {
            Action::Start => "start",
            Action::Shutdown { .. } => "shutdown",
            Action::Destroy => "destroy",
            Action::ManagedSave => "managedsave",
            Action::AbortJob => "abortjob",
            Action::Resume => "resume",
            Action::PmWakeup => "pmwakeup",
        }
    }

    /// virsh's, where berth-libvirt is not installed.
    fn virsh_args(self, domain: &'a str) -> Vec<&'a str> {
        let verb = match self {
            Action::AbortJob => "domjobabort",
            Action::PmWakeup => "dompmwakeup",
            other => other.helper_verb(),
        };
        let mut args = vec![verb, "--domain", domain];
        if let Action::Shutdown { mode } = self {
            args.extend(["--mode", mode]);
        }
        args
    }
}

/// Does `action` to `domain` through libvirt's API (berth-libvirt), else
/// through virsh; killed after `limit`.
pub fn act(domain: &str, action: Action, limit: Duration) -> Result<(), CallError> {
    match events::helper() {
        Some(helper) => {
            let mut command = Command::new(helper);
            command.args(action.helper_args(domain));
            run_within_refusing(command, action.helper_verb(), limit, Some(HELPER_REFUSED)).map(drop)
        }
        None => match virsh(&action.virsh_args(domain), limit) {
            // What libvirt says, untranslated in the C locale, for
            // VIR_ERR_OPERATION_INVALID.
            Err(CallError::Failed(why)) if why.contains("Requested operation is not valid") => {
                Err(CallError::Refused(why))
            }
            other => other.map(drop),
        },
    }
}

/// `command`, killed after `limit`; its standard output on success, else
/// what it said on stderr (`what` names it when it said nothing).
fn run_within(command: Command, what: &str, limit: Duration) -> Result<String, CallError> {
    run_within_refusing(command, what, limit, None)
}

/// As [`run_within`]; exit status `refused` is [`CallError::Refused`].
fn run_within_refusing(
    mut command: Command,
    what: &str,
    limit: Duration,
    refused: Option<i32>,
) -> Result<String, CallError> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(CallError::Spawn)?;
    let began = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if began.elapsed() >= limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CallError::TimedOut(limit));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(CallError::Spawn(e)),
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
        return Ok(out);
    }
    let why = err.trim().trim_start_matches("error: ").replace('\n', "; ");
    let why = if why.is_empty() {
        format!(
            "{} {what} exited with {status}",
            command.get_program().to_string_lossy()
        )
    } else {
        why
    };
    if refused.is_some() && status.code() == refused {
        Err(CallError::Refused(why))
    } else {
        Err(CallError::Failed(why))
    }
}

/// The domain's state.
pub fn state(domain: &str) -> Result<DomainState, CallError> {
    state_with_reason(domain).map(|(s, _)| s)
}

/// The domain's state and its reason: libvirt's numbers through
/// berth-libvirt where it is installed, else virsh's words (C locale).
pub fn state_with_reason(domain: &str) -> Result<(DomainState, Option<String>), CallError> {
    if let Some(helper) = events::helper() {
        let mut command = Command::new(&helper);
        command.args(["state", domain]);
        let out = run_within(command, "state", CALL_LIMIT)?;
        return match events::Seen::parse(out.trim()) {
            Some(events::Seen::State { state, reason }) => Ok(events::domain_state(state, reason)),
            _ => Err(CallError::Failed(format!(
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

    /// The same action through either path: the helper's verbs, virsh's
    /// with the domain always an option's value.
    #[test]
    fn actions_as_each_path_asks_them() {
        for (action, helper, virsh) in [
            (
                Action::Start,
                vec!["start", "vm"],
                vec!["start", "--domain", "vm"],
            ),
            (
                Action::Shutdown { mode: "agent,acpi" },
                vec!["shutdown", "vm", "agent,acpi"],
                vec!["shutdown", "--domain", "vm", "--mode", "agent,acpi"],
            ),
            (
                Action::Destroy,
                vec!["destroy", "vm"],
                vec!["destroy", "--domain", "vm"],
            ),
            (
                Action::ManagedSave,
                vec!["managedsave", "vm"],
                vec!["managedsave", "--domain", "vm"],
            ),
            (
                Action::AbortJob,
                vec!["abortjob", "vm"],
                vec!["domjobabort", "--domain", "vm"],
            ),
            (
                Action::Resume,
                vec!["resume", "vm"],
                vec!["resume", "--domain", "vm"],
            ),
            (
                Action::PmWakeup,
                vec!["pmwakeup", "vm"],
                vec!["dompmwakeup", "--domain", "vm"],
            ),
        ] {
            assert_eq!(action.helper_args("vm"), helper, "{action:?}");
            assert_eq!(action.virsh_args("vm"), virsh, "{action:?}");
        }
    }

    /// The helper's exit status 3 is a refusal, any other failure a
    /// failure: the watcher's destroy relies on telling them apart.
    #[test]
    fn a_refusal_is_told_from_a_failure() {
        let run = |code: i32| {
            let mut command = Command::new("sh");
            command.args(["-c", &format!("echo 'not running' >&2; exit {code}")]);
            run_within_refusing(command, "destroy", Duration::from_secs(10), Some(HELPER_REFUSED))
        };
        assert!(matches!(run(3), Err(CallError::Refused(why)) if why == "not running"));
        assert!(matches!(run(1), Err(CallError::Failed(why)) if why == "not running"));
        assert!(run(0).is_ok());
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
