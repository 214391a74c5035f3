//! `berth install`, `berth uninstall`, `berth reload`.
//!
//! Two sources of units:
//! - a package put them in the vendor directory (`/usr/lib/systemd/…`):
//!   install only enables and starts `berth.target` and proves it works; it
//!   never writes copies that would shadow the packaged files (and removes
//!   copies an earlier source install left, for the same reason);
//! - otherwise (a source tree, or a per-user install without root) it also
//!   installs the binary, the units and, system-wide, the generator. A
//!   per-user install cannot add a user generator (systemd reads those only
//!   from system directories), so it writes the generator's output itself,
//!   and `berth reload` writes it again after a config change.
//!
//! What install did is kept in `install.json` in the state directory, so
//! that uninstall reverses exactly that and both are idempotent. Success is
//! reported only after proof: the daemon active with a live MainPID that is
//! still the same after a settle, or (without the daemon) the drain active
//! and the target reached.
//!
//! [`layout`] decides what goes where, with no bus; [`files`] owns the
//! files install writes (fingerprints, remove only if unchanged);
//! [`steps`] are the systemd steps (retried when transient, verified);
//! [`verbs`] puts them together.

pub mod files;
pub mod layout;
pub mod steps;
pub mod verbs;

use std::fmt;

pub use verbs::{install, reload, render_per_user, uninstall};

/// The step that failed, named in the error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Preflight,
    Connect,
    StopOldDaemon,
    WriteFiles,
    Reload,
    Enable,
    Start,
    Verify,
    Stop,
    Disable,
    RemoveFiles,
    Purge,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Preflight => "preflight",
            Step::Connect => "connect",
            Step::StopOldDaemon => "stop the old daemon",
            Step::WriteFiles => "write files",
            Step::Reload => "reload systemd",
            Step::Enable => "enable berth.target",
            Step::Start => "start berth.target",
            Step::Verify => "verify",
            Step::Stop => "stop berth's units",
            Step::Disable => "disable berth.target",
            Step::RemoveFiles => "remove files",
            Step::Purge => "purge state",
        })
    }
}

#[derive(Debug)]
pub struct Error {
    pub step: Step,
    pub reason: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step '{}' failed: {}", self.step, self.reason)
    }
}

impl std::error::Error for Error {}

fn fail(step: Step, reason: impl fmt::Display) -> Error {
    Error {
        step,
        reason: reason.to_string(),
    }
}

/// What install reports on success: each step done, and warnings (files
/// left in place because they changed, retries).
#[derive(Debug, Default)]
pub struct Report {
    pub lines: Vec<String>,
    pub warnings: Vec<String>,
}

impl Report {
    fn say(&mut self, line: impl Into<String>) {
        self.lines.push(line.into());
    }

    fn warn(&mut self, line: impl Into<String>) {
        self.warnings.push(line.into());
    }
}
