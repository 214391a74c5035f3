//! Names of berth's units and workloads, in one place: which unit a
//! workload runs as, which workload a unit is, and the pattern that lists
//! them all. Workload names use a charset that needs no escaping anywhere
//! (unit instance, file stem, freeze-flag file name), so the mapping is a
//! plain prefix and suffix in both directions.

/// berth.target: what gets enabled; wants the drain, autostart and daemon.
pub const TARGET: &str = "berth.target";
/// The slice every workload runs in (kept out of the shutdown transaction).
pub const SLICE: &str = "berth.slice";
pub const DRAIN: &str = "berth-drain.service";
pub const AUTOSTART: &str = "berth-autostart.service";
pub const DAEMON: &str = "berth-daemon.service";
/// The workload template.
pub const TEMPLATE: &str = "berth@.service";

/// Every workload unit, for `ListUnitsByPatterns`.
pub const WORKLOAD_PATTERN: &str = "berth@*.service";

/// Units berth ships; a workload may not order itself against them (the
/// autostart waits for workload starts, the drain stops workloads: either
/// way round is a deadlock).
pub const PACKAGED_UNITS: &[&str] = &[TARGET, SLICE, DRAIN, AUTOSTART, DAEMON, TEMPLATE];

/// Where systemd puts the D-Bus objects of workload units: it escapes
/// every byte of a unit name outside `[A-Za-z0-9]` as `_xx`, so `berth@…`
/// becomes `berth_40…`. Only a filter (a signal from any other unit is
/// not a workload's); names come from listed units, never from decoding.
pub const WORKLOAD_PATH_PREFIX: &str = "/org/freedesktop/systemd1/unit/berth_40";

const PREFIX: &str = "berth@";
const SUFFIX: &str = ".service";

/// Longest workload name. With `berth@` and `.service` around it the unit
/// name stays far below systemd's 255, and it fits a file name anywhere.
pub const MAX_NAME_LEN: usize = 64;

/// `[A-Za-z0-9][A-Za-z0-9_.-]{0,63}`.
pub fn is_valid_workload_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && name.len() <= MAX_NAME_LEN
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// `NAME` → `berth@NAME.service`.
pub fn unit_name(workload: &str) -> String {
    format!("{PREFIX}{workload}{SUFFIX}")
}

/// `berth@NAME.service` → `NAME`, for any non-empty instance (a unit
/// loaded by hand may carry a name berth would refuse in config).
pub fn instance_of(unit: &str) -> Option<&str> {
    unit.strip_prefix(PREFIX)
        .and_then(|u| u.strip_suffix(SUFFIX))
        .filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_names_and_instances_are_inverse() {
        assert_eq!(unit_name("web-1"), "berth@web-1.service");
        assert_eq!(instance_of("berth@web-1.service"), Some("web-1"));
        assert_eq!(instance_of(&unit_name("db.x")), Some("db.x"));
        for not_a_workload in [
            "berth@.service",
            "berth-drain.service",
            "berth@x.socket",
            "xberth@a.service",
        ] {
            assert_eq!(instance_of(not_a_workload), None, "{not_a_workload}");
        }
    }

    #[test]
    fn workload_names() {
        for ok in ["a", "web-1", "db.primary", "A_b", &"x".repeat(MAX_NAME_LEN)] {
            assert!(is_valid_workload_name(ok), "{ok}");
        }
        for bad in [
            "",
            "-a",
            ".a",
            "a b",
            "a/b",
            "a@b",
            "_a",
            "é",
            "a\\x2d",
            &"x".repeat(MAX_NAME_LEN + 1),
        ] {
            assert!(!is_valid_workload_name(bad), "{bad}");
        }
    }
}
