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
/// The fence's backstop, wanted by the daemon in cluster mode.
pub const FENCE_WATCH: &str = "berth-fence-watch.service";
/// The workload template.
pub const TEMPLATE: &str = "berth@.service";

/// Every workload unit, for `ListUnitsByPatterns`.
pub const WORKLOAD_PATTERN: &str = "berth@*.service";

/// Units berth ships; a workload may not order itself against them (the
/// autostart waits for workload starts, the drain stops workloads: either
/// way round is a deadlock).
pub const PACKAGED_UNITS: &[&str] = &[TARGET, SLICE, DRAIN, AUTOSTART, DAEMON, FENCE_WATCH, TEMPLATE];

/// Where systemd puts the D-Bus objects of workload units: it escapes
/// every byte of a unit name outside `[A-Za-z0-9]` as `_xx`, so `berth@…`
/// becomes `berth_40…`.
pub const WORKLOAD_PATH_PREFIX: &str = "/org/freedesktop/systemd1/unit/berth_40";
const UNIT_PATH_PREFIX: &str = "/org/freedesktop/systemd1/unit/";

/// Where systemd keeps `unit`'s object: every byte outside [A-Za-z0-9]
/// escaped as `_xx` (systemd's `bus_label_escape`).
pub fn unit_object_path(unit: &str) -> String {
    let mut path = String::from(UNIT_PATH_PREFIX);
    for b in unit.bytes() {
        if b.is_ascii_alphanumeric() {
            path.push(b as char);
        } else {
            path.push_str(&format!("_{b:02x}"));
        }
    }
    path
}

/// The workload whose unit systemd keeps at `path`, decoded from the path
/// itself: a signal for a unit loaded since the last listing is placed
/// without listing every unit again (one listing per new unit was
/// quadratic: 2000 starts stalled the daemon past its watchdog). Only
/// systemd's exact escaping of a valid workload name decodes; anything
/// else is no workload.
pub fn workload_of_path(path: &str) -> Option<String> {
    let label = path.strip_prefix(UNIT_PATH_PREFIX)?.as_bytes();
    let mut unit = Vec::with_capacity(label.len());
    let mut i = 0;
    while i < label.len() {
        match label[i] {
            b'_' => {
                let hex = label.get(i + 1..i + 3)?;
                if !hex.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                    return None;
                }
                let byte = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
                // systemd escapes exactly the bytes outside [A-Za-z0-9]:
                // another spelling of the same name is not its path.
                if byte.is_ascii_alphanumeric() {
                    return None;
                }
                unit.push(byte);
                i += 3;
            }
            b if b.is_ascii_alphanumeric() => {
                unit.push(b);
                i += 1;
            }
            _ => return None,
        }
    }
    let unit = String::from_utf8(unit).ok()?;
    let name = instance_of(&unit)?;
    is_valid_workload_name(name).then(|| name.to_string())
}

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

/// Which unit each workload is, both ways: `berth@NAME.service` for a
/// workload berth runs itself, the named unit for one that puts an
/// existing unit under berth's rules (`unit = "…"`). Only the latter are
/// held (a handful), so a daemon following 5000 workloads keeps no map of
/// them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkloadUnits {
    /// unit → workload, for `unit =` workloads.
    by_unit: std::collections::BTreeMap<String, String>,
    /// workload → unit, the same pairs.
    by_name: std::collections::BTreeMap<String, String>,
    /// object path → workload, the same units.
    by_path: std::collections::BTreeMap<String, String>,
}

impl WorkloadUnits {
    /// From (workload, unit) pairs of the `unit =` workloads.
    pub fn new<'a>(existing: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut map = WorkloadUnits::default();
        for (name, unit) in existing {
            map.by_unit.insert(unit.to_string(), name.to_string());
            map.by_name.insert(name.to_string(), unit.to_string());
            map.by_path.insert(unit_object_path(unit), name.to_string());
        }
        map
    }

    /// The unit workload `name` runs as.
    pub fn unit_of(&self, name: &str) -> String {
        self.by_name.get(name).cloned().unwrap_or_else(|| unit_name(name))
    }

    /// The workload `unit` is, if any. A `berth@` instance is one whatever
    /// its name (a unit loaded by hand may carry one berth would refuse),
    /// unless its name is a `unit =` workload's: `berth@pg.service` left
    /// running after pg became an existing unit is not pg.
    pub fn workload_of<'a>(&'a self, unit: &'a str) -> Option<&'a str> {
        if let Some(name) = self.by_unit.get(unit) {
            return Some(name);
        }
        instance_of(unit).filter(|name| !self.by_name.contains_key(*name))
    }

    /// The workload whose unit systemd keeps at `path`.
    pub fn workload_of_path(&self, path: &str) -> Option<String> {
        if let Some(name) = self.by_path.get(path) {
            return Some(name.clone());
        }
        workload_of_path(path).filter(|name| !self.by_name.contains_key(name))
    }

    /// The object paths of the `unit =` workloads: signals of these are
    /// berth's too, beside everything under [`WORKLOAD_PATH_PREFIX`].
    pub fn existing_paths(&self) -> impl Iterator<Item = &String> {
        self.by_path.keys()
    }

    /// The `unit =` workloads' units: listed beside [`WORKLOAD_PATTERN`].
    pub fn existing_units(&self) -> Vec<String> {
        self.by_unit.keys().cloned().collect()
    }
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
    fn workload_names_decode_from_systemd_object_paths() {
        for (path, name) in [
            (
                "/org/freedesktop/systemd1/unit/berth_40web_2d1_2eservice",
                "web-1",
            ),
            ("/org/freedesktop/systemd1/unit/berth_40t0001_2eservice", "t0001"),
            (
                "/org/freedesktop/systemd1/unit/berth_40db_2eprimary_2eservice",
                "db.primary",
            ),
            ("/org/freedesktop/systemd1/unit/berth_40A_5fb_2eservice", "A_b"),
        ] {
            assert_eq!(workload_of_path(path).as_deref(), Some(name), "{path}");
        }
        for not_one in [
            "/org/freedesktop/systemd1/unit/berth_2ddrain_2eservice",
            "/org/freedesktop/systemd1/unit/berth_40_2eservice",
            // a name berth refuses: "-a", "a b", "é"
            "/org/freedesktop/systemd1/unit/berth_40_2da_2eservice",
            "/org/freedesktop/systemd1/unit/berth_40a_20b_2eservice",
            "/org/freedesktop/systemd1/unit/berth_40_c3_a9_2eservice",
            // not systemd's spelling: upper-case hex, an escaped letter,
            // a cut escape, a byte systemd escapes left bare
            "/org/freedesktop/systemd1/unit/berth_40web_2D1_2eservice",
            "/org/freedesktop/systemd1/unit/berth_40_77eb_2eservice",
            "/org/freedesktop/systemd1/unit/berth_40web_2eservice_2",
            "/org/freedesktop/systemd1/unit/berth_40web_2eservice/x",
            "/org/freedesktop/systemd1/unit/berth_40web_2eservice_",
            "/org/freedesktop/systemd1/job/42",
            "",
        ] {
            assert_eq!(workload_of_path(not_one), None, "{not_one}");
        }
        // Round trip through systemd's escaping for every valid name shape.
        for name in ["a", "web-1", "x.y_z", &"x".repeat(MAX_NAME_LEN)] {
            let path = unit_object_path(&unit_name(name));
            assert!(path.starts_with(WORKLOAD_PATH_PREFIX));
            assert_eq!(workload_of_path(&path).as_deref(), Some(name));
        }
    }

    #[test]
    fn existing_units_map_both_ways_and_templates_still_decode() {
        let map = WorkloadUnits::new([("pg", "postgresql@15-main.service")]);
        assert_eq!(map.unit_of("pg"), "postgresql@15-main.service");
        assert_eq!(map.unit_of("web"), "berth@web.service");
        assert_eq!(map.workload_of("postgresql@15-main.service"), Some("pg"));
        assert_eq!(map.workload_of("berth@web.service"), Some("web"));
        assert_eq!(map.workload_of("postgresql.service"), None);
        let path = unit_object_path("postgresql@15-main.service");
        assert_eq!(
            path,
            "/org/freedesktop/systemd1/unit/postgresql_4015_2dmain_2eservice"
        );
        assert_eq!(map.workload_of_path(&path).as_deref(), Some("pg"));
        assert_eq!(
            map.workload_of_path(&unit_object_path("berth@web.service"))
                .as_deref(),
            Some("web")
        );
        assert_eq!(
            map.workload_of_path(&unit_object_path("postgresql.service")),
            None
        );
        assert_eq!(map.existing_units(), ["postgresql@15-main.service"]);
        // Review of issue 11: berth@pg.service (left from before pg named
        // an existing unit) was taken for pg.
        assert_eq!(map.workload_of("berth@pg.service"), None);
        assert_eq!(map.workload_of_path(&unit_object_path("berth@pg.service")), None);
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
