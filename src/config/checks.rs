//! Setting types and checks the host file and the workload files share:
//! the autostart setting, the longest delay, lists of unit names. Below
//! both, so that neither file needs the other for them.

use std::path::Path;

use super::ConfigError;
use crate::names::{PACKAGED_UNITS, instance_of};

/// Whether the boot autostart starts a workload: `autostart = true`,
/// `false` or `"last-state"` (the host's `default_autostart` when unset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Autostart {
    Yes,
    No,
    /// As it was when the last shutdown drain of the previous boot began:
    /// started if it was running then (or is new since), else left off.
    LastState,
}

impl Autostart {
    pub fn as_str(self) -> &'static str {
        match self {
            Autostart::Yes => "true",
            Autostart::No => "false",
            Autostart::LastState => "last-state",
        }
    }
}

/// As it is written in TOML: true, false or "last-state".
impl serde::Serialize for Autostart {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Autostart::Yes => s.serialize_bool(true),
            Autostart::No => s.serialize_bool(false),
            Autostart::LastState => s.serialize_str("last-state"),
        }
    }
}

/// The longest a stop delay may be: a day. Longer is a typo, not a policy.
pub(super) const MAX_DELAY_S: i64 = 86_400;

/// Units that power off, reboot or change the system's mode when started,
/// or only exist for shutdown: never something a workload needs.
pub(super) const SHUTDOWN_AND_MODE_UNITS: &[&str] = &[
    "shutdown.target",
    "final.target",
    "umount.target",
    "poweroff.target",
    "reboot.target",
    "halt.target",
    "kexec.target",
    "soft-reboot.target",
    "exit.target",
    "ctrl-alt-del.target",
    "rescue.target",
    "emergency.target",
    "rescue.service",
    "emergency.service",
    "systemd-poweroff.service",
    "systemd-reboot.service",
    "systemd-halt.service",
    "systemd-kexec.service",
    "systemd-exit.service",
];

/// Unit types a workload may name in `after`/`wants`, and the drain in
/// `drain_after`.
const UNIT_SUFFIXES: &[&str] = &[
    ".service",
    ".socket",
    ".target",
    ".mount",
    ".automount",
    ".device",
    ".path",
    ".timer",
    ".swap",
    ".slice",
    ".scope",
];

pub(super) fn is_valid_unit_name(name: &str) -> bool {
    let Some(suffix) = UNIT_SUFFIXES.iter().find(|s| name.ends_with(*s)) else {
        return false;
    };
    let stem = &name[..name.len() - suffix.len()];
    let (prefix, instance) = match stem.split_once('@') {
        Some((p, i)) => (p, Some(i)),
        None => (stem, None),
    };
    let ok = |s: &str| {
        s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '_' | '.' | '-' | '\\'))
    };
    name.len() <= 255
        && !prefix.is_empty()
        && ok(prefix)
        && instance.is_none_or(|i| !i.is_empty() && !i.contains('@') && ok(i))
}

/// Validates a list of unit names for `after`/`wants` (with `workload`
/// set) or `drain_after` (without). Returns the first problem.
pub(super) fn check_unit_list(
    list: &[String],
    file: &Path,
    key: &str,
    workload: Option<&str>,
) -> Result<(), ConfigError> {
    for (i, unit) in list.iter().enumerate() {
        let at = format!("{key}[{i}]");
        if !is_valid_unit_name(unit) {
            return Err(ConfigError::key(
                file,
                at,
                format!("{unit:?} is not a valid unit name (e.g. \"network-online.target\")"),
            ));
        }
        if SHUTDOWN_AND_MODE_UNITS.contains(&unit.as_str()) {
            return Err(ConfigError::key(
                file,
                at,
                format!(
                    "{unit} is a shutdown or rescue unit; wanting or ordering against it would halt, reboot or isolate the host"
                ),
            ));
        }
        if PACKAGED_UNITS.contains(&unit.as_str()) {
            return Err(ConfigError::key(
                file,
                at,
                format!(
                    "{unit} is one of berth's own units; ordering against it would deadlock boot or shutdown"
                ),
            ));
        }
        let instance = instance_of(unit);
        match (instance, workload) {
            (Some(_), None) => {
                return Err(ConfigError::key(
                    file,
                    at,
                    format!(
                        "{unit} is a workload the drain stops itself; waiting for it would deadlock the shutdown"
                    ),
                ));
            }
            (Some(other), Some(me)) if other == me => {
                return Err(ConfigError::key(file, at, "a workload cannot depend on itself"));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_names() {
        for ok in [
            "network-online.target",
            "libvirtd.service",
            "getty@tty1.service",
            "x\\x2dy.mount",
        ] {
            assert!(is_valid_unit_name(ok), "{ok}");
        }
        for bad in [
            "libvirtd",
            "a b.service",
            ".service",
            "a@b@c.service",
            "x.conf",
            "a;b.service",
        ] {
            assert!(!is_valid_unit_name(bad), "{bad}");
        }
    }
}
