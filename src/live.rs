//! `berth check --live`: the loaded units, admin drop-ins included, checked
//! against the lifecycle invariants (berth.units(7)). Config validation
//! cannot see a drop-in in /etc/systemd/system that ties a workload to a
//! unit the shutdown transaction stops, or one that empties the drain's
//! ExecStop; the manager's view of the loaded units can.
//!
//! Gathering talks to systemd; the judgement ([`problems`]) is pure.

use std::collections::{BTreeMap, BTreeSet};

use crate::names::{DRAIN, SLICE, TARGET};
use crate::systemd::{ActiveState, LoadState, Ops, SystemdError, UnitTopology};

/// Units whose start is the shutdown: a unit that conflicts with one of
/// them is stopped by the shutdown transaction (mounts through umount.target).
const SHUTDOWN_UNITS: &[&str] = &[
    "shutdown.target",
    "umount.target",
    "final.target",
    "poweroff.target",
    "reboot.target",
    "halt.target",
    "kexec.target",
    "exit.target",
];

impl UnitTopology {
    /// Units whose stop (or restart) propagates to this one.
    fn stop_sources(&self) -> impl Iterator<Item = (&'static str, &String)> {
        let requires = self.requires.iter().map(|u| ("Requires", u));
        let requisite = self.requisite.iter().map(|u| ("Requisite", u));
        let binds_to = self.binds_to.iter().map(|u| ("BindsTo", u));
        let part_of = self.part_of.iter().map(|u| ("PartOf", u));
        let propagated = self
            .stop_propagated_from
            .iter()
            .map(|u| ("StopPropagatedFrom", u));
        requires
            .chain(requisite)
            .chain(binds_to)
            .chain(part_of)
            .chain(propagated)
    }

    /// ` (FILE)`: where a unit that is not one of berth's own comes from,
    /// the file to look at (a generator's source, such as a quadlet's
    /// `.container`, before the unit it made).
    fn declared_in(&self, unit: &str) -> String {
        if crate::names::instance_of(unit).is_some() || crate::names::PACKAGED_UNITS.contains(&unit) {
            return String::new();
        }
        match [&self.source_path, &self.fragment_path]
            .into_iter()
            .find(|p| !p.is_empty())
        {
            Some(file) => format!(" ({file})"),
            None => String::new(),
        }
    }

    /// The drop-ins that are not berth's own generated ones: where an
    /// admin's change would come from.
    fn where_from(&self) -> String {
        let admin: Vec<&str> = self
            .drop_ins
            .iter()
            .map(String::as_str)
            .filter(|p| !p.contains("/systemd/generator"))
            .collect();
        if admin.is_empty() {
            String::new()
        } else {
            format!(" (admin drop-ins: {})", admin.join(", "))
        }
    }
}

/// Why `unit` is stopped by the shutdown transaction, if it is: a
/// conflict with a shutdown unit, or a stop propagated from a unit that is.
fn stopped_at_shutdown(
    unit: &str,
    units: &BTreeMap<String, UnitTopology>,
    seen: &mut BTreeSet<String>,
) -> Option<String> {
    if !seen.insert(unit.to_string()) {
        return None;
    }
    let u = units.get(unit)?;
    let at = u.declared_in(unit);
    if let Some(c) = u.conflicts.iter().find(|c| SHUTDOWN_UNITS.contains(&c.as_str())) {
        return Some(format!("{unit}{at} has Conflicts={c}"));
    }
    if let Some(c) = u
        .conflicted_by
        .iter()
        .find(|c| SHUTDOWN_UNITS.contains(&c.as_str()))
    {
        return Some(format!("{c} has Conflicts={unit}{at}"));
    }
    for (kind, dep) in u.stop_sources() {
        if let Some(why) = stopped_at_shutdown(dep, units, seen) {
            return Some(format!("{unit}{at} has {kind}={dep}, and {why}"));
        }
    }
    None
}

/// Units every workload starts after (the drop-ins' base targets) and
/// the drain: with what the drain is ordered after, the anchors a
/// workload must not be ordered before.
const START_ANCHORS: &[&str] = &["sysinit.target", "basic.target", DRAIN];

/// Why `unit`, which starts after the drain, is also ordered before
/// something the drain (or every workload) starts after: an ordering
/// cycle, which systemd breaks at boot by deleting a start job, maybe the
/// drain's. Follows `Before=` through the units at hand (the targets
/// [`gather`] reads).
fn ordering_cycle(unit: &str, units: &BTreeMap<String, UnitTopology>) -> Option<String> {
    let mut anchors: BTreeSet<&str> = START_ANCHORS.iter().copied().collect();
    if let Some(d) = units.get(DRAIN) {
        anchors.extend(d.after.iter().map(String::as_str));
    }
    // Breadth first, so that the shortest chain is the one named.
    let mut seen = BTreeSet::from([unit.to_string()]);
    let mut queue = std::collections::VecDeque::from([(unit.to_string(), String::new())]);
    while let Some((at, path)) = queue.pop_front() {
        let Some(u) = units.get(&at) else { continue };
        for next in &u.before {
            let step = if path.is_empty() {
                format!("{at} has Before={next}")
            } else {
                format!("{path}, {at} has Before={next}")
            };
            if anchors.contains(next.as_str()) {
                let why = if START_ANCHORS.contains(&next.as_str()) {
                    "every workload starts after it".to_string()
                } else {
                    format!("{DRAIN} is After={next}")
                };
                return Some(format!("{step}, and {why}"));
            }
            if seen.insert(next.clone()) {
                queue.push_back((next.clone(), step));
            }
        }
    }
    None
}

/// What the configuration says the loaded units should have.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expected {
    /// The drain's `TimeoutStopSec=`: the deadline plus the exit margin.
    pub drain_timeout_stop_s: u64,
    /// Per workload unit that stops gracefully: the stop delay the drain
    /// gives it, which the unit's own stop must not cut short.
    pub stop_delay_s: BTreeMap<String, u64>,
}

/// How long podman lets a container stop before it kills it, when the
/// unit's `ExecStop=` is `podman stop` or `podman rm -f` (a quadlet's is
/// the latter): that command's `-t`/`--time`, else the container's own
/// `--stop-timeout` from the `podman run` of `ExecStart=`, else podman's
/// default of 10 s. None when no podman stops the unit.
pub fn podman_stop_window(exec_stop: &[Vec<String>], exec_start: &[Vec<String>]) -> Option<(u64, String)> {
    let is_podman = |argv: &Vec<String>| {
        argv.first()
            .is_some_and(|p| p.rsplit('/').next() == Some("podman"))
    };
    let flag = |argv: &[String], names: &[&str]| -> Option<u64> {
        let mut words = argv.iter();
        while let Some(w) = words.next() {
            for n in names {
                if w == n {
                    return words.next().and_then(|v| v.parse().ok());
                }
                if let Some(v) = w.strip_prefix(n).and_then(|r| r.strip_prefix('=')) {
                    return v.parse().ok();
                }
            }
        }
        None
    };
    let stop = exec_stop
        .iter()
        .find(|argv| is_podman(argv) && argv.iter().skip(1).any(|w| w == "stop" || w == "rm"))?;
    if let Some(t) = flag(stop, &["-t", "--time", "--timeout"]) {
        return Some((t, format!("its ExecStop `{}`", stop.join(" "))));
    }
    let run = exec_start
        .iter()
        .find(|argv| is_podman(argv) && argv.iter().skip(1).any(|w| w == "run"));
    match run.and_then(|argv| flag(argv, &["--stop-timeout"])) {
        Some(t) => Some((
            t,
            "the container's --stop-timeout (quadlet: StopTimeout=)".to_string(),
        )),
        None => Some((
            10,
            "podman's default stop timeout; the container sets none (quadlet: StopTimeout=)".to_string(),
        )),
    }
}

/// Every broken invariant among the loaded units: the drain, the slice and
/// each workload in `workloads`. `units` holds those and what they depend
/// on, transitively.
pub fn problems(
    workloads: &[String],
    units: &BTreeMap<String, UnitTopology>,
    expected: &Expected,
) -> Vec<String> {
    let mut out = drain_problems(workloads, units, expected);
    out.extend(slice_problems(units));
    for name in workloads {
        if let Some(w) = units.get(name) {
            out.extend(workload_problems(name, w, workloads, units, expected));
        }
    }
    out
}

/// What keeps berth-drain.service from draining at shutdown.
fn drain_problems(
    workloads: &[String],
    units: &BTreeMap<String, UnitTopology>,
    expected: &Expected,
) -> Vec<String> {
    let mut out = Vec::new();
    match units.get(DRAIN) {
        None => out.push(format!(
            "{DRAIN} is not loaded: nothing drains the workloads at shutdown"
        )),
        Some(d) if d.load_state != LoadState::Loaded => out.push(format!(
            "{DRAIN} is {}: its unit file is gone, so no drain runs at shutdown (reinstall berth)",
            d.load_state
        )),
        Some(d) => {
            let from = d.where_from();
            if !d.exec_stop.iter().any(|argv| argv.iter().any(|a| a == "drain")) {
                out.push(format!(
                    "{DRAIN} has no ExecStop running `berth drain`{from}: shutdown would not drain"
                ));
            }
            if !d.conflicts.iter().any(|c| c == "shutdown.target") {
                out.push(format!("{DRAIN} lost Conflicts=shutdown.target{from}: shutdown would not stop it, so would not drain"));
            }
            // Its slice (system.slice, implied) is the one dependency it
            // may have: nobody stops a slice that holds every service.
            for (kind, dep) in d.stop_sources().filter(|(_, dep)| !dep.ends_with(".slice")) {
                out.push(format!(
                    "{DRAIN} has {kind}={dep}{from}: stopping or restarting {dep} would drain the host"
                ));
            }
            if !d.refuse_manual_stop {
                out.push(format!(
                    "{DRAIN} lost RefuseManualStop=yes{from}: `systemctl stop` would drain the host"
                ));
            }
            if !d.ignore_on_isolate {
                out.push(format!(
                    "{DRAIN} lost IgnoreOnIsolate=yes{from}: isolating rescue.target would drain the host"
                ));
            }
            if d.timeout_stop_us < expected.drain_timeout_stop_s.saturating_mul(1_000_000) {
                out.push(format!(
                    "{DRAIN} has TimeoutStopSec={} s{from}, under the {} s the drain deadline needs: systemd \
                     would kill the drain before it is done",
                    d.timeout_stop_us / 1_000_000,
                    expected.drain_timeout_stop_s
                ));
            }
            let running = workloads
                .iter()
                .filter(|w| {
                    units
                        .get(*w)
                        .is_some_and(|u| u.active_state == ActiveState::Active)
                })
                .count();
            if d.active_state != ActiveState::Active && running > 0 {
                out.push(format!(
                    "{DRAIN} is {} while {running} workload(s) run: a shutdown now would not drain them \
                     (systemctl start {DRAIN})",
                    d.active_state
                ));
            }
            if let Some(w) = d
                .after
                .iter()
                .find(|a| a.starts_with("berth@") || workloads.contains(a))
            {
                out.push(format!(
                    "{DRAIN} is After={w}{from}: at shutdown {w} would be stopped first, by the transaction, not the drain"
                ));
            }
        }
    }
    out
}

/// What would take berth.slice, and every workload in it, down early.
fn slice_problems(units: &BTreeMap<String, UnitTopology>) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(slice) = units.get("berth.slice") {
        if let Some(why) = stopped_at_shutdown("berth.slice", units, &mut BTreeSet::new()) {
            out.push(format!(
                "berth.slice is stopped at shutdown ({why}){}: every workload would go with it before the drain",
                slice.where_from()
            ));
        }
        if slice.load_state == LoadState::Loaded && !slice.refuse_manual_stop {
            out.push(format!(
                "berth.slice lost RefuseManualStop=yes{}: stopping it would stop every workload at once",
                slice.where_from()
            ));
        }
    }
    out
}

/// What puts one workload's unit out of berth's order.
fn workload_problems(
    name: &str,
    w: &UnitTopology,
    workloads: &[String],
    units: &BTreeMap<String, UnitTopology>,
    expected: &Expected,
) -> Vec<String> {
    let mut out = Vec::new();
    let from = w.where_from();
    if w.load_state != LoadState::Loaded {
        out.push(format!(
            "{name} is {}: its unit file is missing or broken, so it has none of berth's ordering",
            w.load_state
        ));
        return out;
    }
    out.extend(takeover_problems(name, units));
    if !w.slice.is_empty() && w.slice != "berth.slice" {
        out.push(format!(
            "{name} runs in {}{from}, not berth.slice: that slice may be stopped at shutdown with it",
            w.slice
        ));
    }
    let mut seen = BTreeSet::new();
    if let Some(why) = stopped_at_shutdown(name, units, &mut seen) {
        out.push(format!(
            "{name} is stopped by the shutdown transaction itself ({why}){from}: it would stop before \
             or around the drain, out of order and past its budget"
        ));
    }
    if !w.ignore_on_isolate {
        out.push(format!(
            "{name} lost IgnoreOnIsolate=yes{from}: isolating rescue.target would stop it"
        ));
    }
    for dep in &w.part_of {
        out.push(format!(
            "{name} has PartOf={dep}{from}: stopping or restarting {dep} would stop or restart the workload"
        ));
    }
    if !w.after.iter().any(|a| a == DRAIN) {
        out.push(format!(
            "{name} is not After={DRAIN}{from}: it could start before the drain is armed"
        ));
    }
    let starters: Vec<&str> = w
        .wanted_by
        .iter()
        .chain(&w.triggered_by)
        .map(String::as_str)
        .filter(|u| crate::names::instance_of(u).is_none() && !workloads.iter().any(|w| w == u))
        .collect();
    if !starters.is_empty() {
        out.push(format!(
            "{name}{} is wanted or triggered by {}: systemd starts it outside berth's order, frozen or \
             not (and a trigger may start it again after the drain); disable it (systemctl disable \
             {name}; a quadlet: no [Install] in its .container) and let berth's autostart start it",
            w.declared_in(name),
            starters.join(", ")
        ));
    }
    if let Some(&delay) = expected.stop_delay_s.get(name) {
        if w.timeout_stop_us < delay.saturating_mul(1_000_000) {
            out.push(format!(
                "{name} has TimeoutStopSec={} s{from}, under its stop_delay_s of {delay} s: systemd would \
                 kill it before the drain's graceful window ends",
                w.timeout_stop_us / 1_000_000
            ));
        }
        if let Some((window, why)) = podman_stop_window(&w.exec_stop, &w.exec_start)
            && window < delay
        {
            out.push(format!(
                "{name}{} gives its container {window} s to stop ({why}) before podman kills it, under \
                 its stop_delay_s of {delay} s: set StopTimeout={delay} in the .container (podman run \
                 --stop-timeout={delay})",
                w.declared_in(name)
            ));
        }
    }
    out
}

/// What makes a unit unfit to be a workload whatever its drop-in says:
/// an alias (berth lists, watches and drains units by their own name,
/// and systemd lists no alias), or an order before what the drain and
/// every workload start after. `berth add --unit` refuses on these.
pub fn takeover_problems(name: &str, units: &BTreeMap<String, UnitTopology>) -> Vec<String> {
    let mut out = Vec::new();
    let Some(w) = units.get(name) else { return out };
    if !w.id.is_empty() && w.id != name {
        out.push(format!(
            "{name} is an alias of {}: name {} instead (systemd lists and signals a unit by its own name only, \
             so berth would never see it run)",
            w.id, w.id
        ));
    }
    if let Some(why) = ordering_cycle(name, units) {
        out.push(format!(
            "{name}{} starts after {DRAIN} as a workload, but {why}: an ordering cycle, which systemd breaks \
             at boot by dropping a start job (maybe the drain's); a unit the boot or the network needs \
             cannot be a workload",
            w.declared_in(name)
        ));
    }
    out
}

/// What is worth knowing but breaks no invariant: a workload still
/// running where it ran before its drop-in said `Slice=berth.slice`
/// (systemd moves a running unit's processes only at its next start).
pub fn notes(workloads: &[String], units: &BTreeMap<String, UnitTopology>) -> Vec<String> {
    workloads
        .iter()
        .filter_map(|name| {
            let w = units.get(name)?;
            let moved = w.slice == "berth.slice"
                && !w.control_group.is_empty()
                && !w.control_group.contains("/berth.slice/");
            moved.then(|| {
                format!(
                    "{name} still runs in {}: Slice=berth.slice applies from its next start (systemctl \
                     restart {name} when convenient); the drain stops it all the same",
                    w.control_group
                )
            })
        })
        .collect()
}

/// Reads the berth units and, transitively, what they depend on.
pub async fn gather<O: Ops>(
    sd: &O,
    configured: &[String],
) -> Result<(Vec<String>, BTreeMap<String, UnitTopology>), SystemdError> {
    let mut workloads: BTreeSet<String> = configured.iter().cloned().collect();
    let existing: Vec<String> = configured
        .iter()
        .filter(|u| crate::names::instance_of(u).is_none())
        .cloned()
        .collect();
    for u in sd.list_workloads(&existing).await? {
        if !u.name.ends_with("@.service") {
            workloads.insert(u.name);
        }
    }
    let mut todo: Vec<String> = workloads.iter().cloned().collect();
    todo.extend([DRAIN.to_string(), SLICE.into(), TARGET.into()]);
    let mut units = BTreeMap::new();
    // Bounded: dependency chains are short, but a bad admin setup must
    // not make this walk the whole unit graph.
    while let Some(name) = todo.pop() {
        if units.contains_key(&name) {
            continue;
        }
        if units.len() >= MAX_UNITS {
            return Err(SystemdError::local(
                "walk the dependencies of",
                "the berth units",
                format!("more than {MAX_UNITS} units: the check would be incomplete"),
            ));
        }
        let u = sd.topology(&name).await?;
        for (_, dep) in u.stop_sources() {
            todo.push(dep.clone());
        }
        units.insert(name, u);
    }
    let workloads: Vec<String> = workloads.into_iter().collect();
    let roots: Vec<String> = workloads
        .iter()
        .filter_map(|w| units.get(w))
        .flat_map(|u| u.before.iter().cloned())
        .collect();
    gather_order(sd, roots, &mut units).await?;
    Ok((workloads, units))
}

/// Reads the targets that `roots` (what workloads are ordered before)
/// lead to through `Before=`, for [`ordering_cycle`]. Targets only: chains
/// of order run through them (network-pre.target → network.target), and
/// they are few; bounded all the same.
async fn gather_order<O: Ops>(
    sd: &O,
    roots: Vec<String>,
    units: &mut BTreeMap<String, UnitTopology>,
) -> Result<(), SystemdError> {
    let mut todo: Vec<String> = roots.into_iter().filter(|u| u.ends_with(".target")).collect();
    let mut read = 0;
    while let Some(name) = todo.pop() {
        if units.contains_key(&name) {
            continue;
        }
        if read >= MAX_ORDER_UNITS {
            break;
        }
        let u = sd.topology(&name).await?;
        todo.extend(u.before.iter().filter(|b| b.ends_with(".target")).cloned());
        units.insert(name, u);
        read += 1;
    }
    Ok(())
}

/// What `berth add --unit` checks before it writes anything: the unit,
/// the drain and the targets the unit is ordered before.
pub async fn takeover_check<O: Ops>(sd: &O, unit: &str) -> Result<Vec<String>, SystemdError> {
    let mut units = BTreeMap::new();
    let u = sd.topology(unit).await?;
    if u.load_state != LoadState::Loaded {
        return Ok(vec![format!(
            "{unit} is {}: there is no such unit to take over",
            u.load_state
        )]);
    }
    let before = u.before.clone();
    units.insert(unit.to_string(), u);
    units.insert(DRAIN.to_string(), sd.topology(DRAIN).await?);
    gather_order(sd, before, &mut units).await?;
    Ok(takeover_problems(unit, &units))
}

/// Targets read to follow the workloads' `Before=`.
const MAX_ORDER_UNITS: usize = 64;

const MAX_UNITS: usize = 512;

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn expected() -> Expected {
        Expected {
            drain_timeout_stop_s: 210,
            ..Default::default()
        }
    }

    /// The units as the packaged files and the generator make them.
    fn healthy() -> BTreeMap<String, UnitTopology> {
        let mut m = BTreeMap::new();
        m.insert(
            DRAIN.to_string(),
            UnitTopology {
                load_state: LoadState::Loaded,
                conflicts: s(&["shutdown.target"]),
                after: s(&["basic.target", "dbus.service"]),
                slice: "system.slice".into(),
                exec_stop: vec![s(&["/usr/bin/berth", "drain"])],
                refuse_manual_stop: true,
                ignore_on_isolate: true,
                active_state: ActiveState::Active,
                timeout_stop_us: 210_000_000,
                ..Default::default()
            },
        );
        m.insert(
            "berth.slice".into(),
            UnitTopology {
                load_state: LoadState::Loaded,
                requires: s(&["-.slice"]),
                refuse_manual_stop: true,
                ignore_on_isolate: true,
                ..Default::default()
            },
        );
        m.insert(
            "-.slice".into(),
            UnitTopology {
                load_state: LoadState::Loaded,
                ..Default::default()
            },
        );
        m.insert(
            "berth@a.service".into(),
            UnitTopology {
                load_state: LoadState::Loaded,
                requires: s(&["berth.slice"]),
                after: s(&["basic.target", DRAIN]),
                slice: "berth.slice".into(),
                ignore_on_isolate: true,
                active_state: ActiveState::Active,
                ..Default::default()
            },
        );
        m
    }

    #[test]
    fn the_packaged_topology_has_no_problem() {
        assert_eq!(
            problems(&s(&["berth@a.service"]), &healthy(), &expected()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_dependency_stopped_at_shutdown_is_found_through_a_chain() {
        let mut m = healthy();
        m.get_mut("berth@a.service")
            .unwrap()
            .requires
            .push("db.service".into());
        m.get_mut("berth@a.service").unwrap().drop_ins =
            s(&["/etc/systemd/system/berth@a.service.d/override.conf"]);
        m.insert(
            "db.service".into(),
            UnitTopology {
                load_state: LoadState::Loaded,
                binds_to: s(&["x.mount"]),
                ..Default::default()
            },
        );
        m.insert(
            "x.mount".into(),
            UnitTopology {
                load_state: LoadState::Loaded,
                conflicts: s(&["umount.target"]),
                ..Default::default()
            },
        );
        let p = problems(&s(&["berth@a.service"]), &m, &expected());
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("Requires=db.service, and db.service has BindsTo=x.mount, and x.mount has Conflicts=umount.target"), "{p:?}");
        assert!(
            p[0].contains("admin drop-ins: /etc/systemd/system/berth@a.service.d/override.conf"),
            "{p:?}"
        );
    }

    #[test]
    fn stops_propagated_by_the_other_side_are_found_too() {
        let mut m = healthy();
        // db.service: PropagatesStopTo=berth@a.service, and a mount whose
        // conflict is declared by umount.target's side only.
        m.get_mut("berth@a.service").unwrap().stop_propagated_from = s(&["db.service"]);
        m.insert(
            "db.service".into(),
            UnitTopology {
                load_state: LoadState::Loaded,
                requisite: s(&["y.mount"]),
                ..Default::default()
            },
        );
        m.insert(
            "y.mount".into(),
            UnitTopology {
                load_state: LoadState::Loaded,
                conflicted_by: s(&["umount.target"]),
                ..Default::default()
            },
        );
        let p = problems(&s(&["berth@a.service"]), &m, &expected());
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].contains("has StopPropagatedFrom=db.service, and db.service has Requisite=y.mount, and umount.target has Conflicts=y.mount"),
            "{p:?}"
        );
    }

    #[test]
    fn a_short_drain_timeout_an_unarmed_drain_and_lost_protections_are_reported() {
        let mut m = healthy();
        let d = m.get_mut(DRAIN).unwrap();
        d.timeout_stop_us = 90_000_000;
        d.active_state = ActiveState::Inactive;
        m.get_mut("berth.slice").unwrap().refuse_manual_stop = false;
        m.get_mut("berth@a.service").unwrap().ignore_on_isolate = false;
        let p = problems(&s(&["berth@a.service"]), &m, &expected()).join("\n");
        for needle in [
            "TimeoutStopSec=90 s",
            "is inactive while 1 workload(s) run",
            "berth.slice lost RefuseManualStop=yes",
            "berth@a.service lost IgnoreOnIsolate=yes",
        ] {
            assert!(p.contains(needle), "{needle}: {p}");
        }
    }

    #[test]
    fn a_drain_without_its_stop_or_protections_is_reported() {
        let mut m = healthy();
        let d = m.get_mut(DRAIN).unwrap();
        d.exec_stop.clear();
        d.refuse_manual_stop = false;
        d.part_of = s(&["berth.target"]);
        d.after.push("berth@a.service".into());
        let p = problems(&[], &m, &expected()).join("\n");
        for needle in [
            "no ExecStop",
            "RefuseManualStop",
            "PartOf=berth.target",
            "After=berth@a.service",
        ] {
            assert!(p.contains(needle), "{needle}: {p}");
        }
        m.get_mut(DRAIN).unwrap().load_state = LoadState::NotFound;
        assert!(problems(&[], &m, &expected())[0].contains("not-found"));
    }

    /// What podman gives a container before it kills it, from the unit's
    /// own command lines: each case carries its answer.
    #[test]
    fn podman_stop_windows() {
        let quadlet_stop = vec![s(&[
            "/usr/bin/podman",
            "rm",
            "-v",
            "-f",
            "-i",
            "--cidfile=/run/x.cid",
        ])];
        for (stop, start, window) in [
            (
                quadlet_stop.clone(),
                vec![s(&["/usr/bin/podman", "run", "--name=x", "img"])],
                Some(10),
            ),
            (
                quadlet_stop.clone(),
                vec![s(&["/usr/bin/podman", "run", "--stop-timeout=90", "img"])],
                Some(90),
            ),
            (
                quadlet_stop,
                vec![s(&["/usr/bin/podman", "run", "--stop-timeout", "45", "img"])],
                Some(45),
            ),
            (
                vec![s(&["podman", "stop", "-t", "120", "x"])],
                vec![s(&["podman", "run", "--stop-timeout=5", "img"])],
                Some(120),
            ),
            (
                vec![s(&["/usr/bin/podman", "stop", "--time=30", "x"])],
                vec![],
                Some(30),
            ),
            (vec![s(&["/bin/kill", "-TERM", "$MAINPID"])], vec![], None),
            (vec![], vec![s(&["/usr/bin/podman", "run", "img"])], None),
        ] {
            assert_eq!(
                podman_stop_window(&stop, &start).map(|w| w.0),
                window,
                "{stop:?} {start:?}"
            );
        }
    }

    /// An existing unit (`unit =`) that something else starts at boot, a
    /// podman stop shorter than its stop delay, an admin's short
    /// TimeoutStopSec, and a chain through a unit of its own file.
    #[test]
    fn an_existing_unit_is_judged_like_a_workload_and_names_its_files() {
        let mut m = healthy();
        let mut pg = m["berth@a.service"].clone();
        pg.fragment_path = "/etc/systemd/system/pg.service".into();
        pg.wanted_by = s(&["multi-user.target", "berth@web.service"]);
        pg.exec_stop = vec![s(&["/usr/bin/podman", "rm", "-f", "--cidfile=/run/pg.cid"])];
        pg.timeout_stop_us = 20_000_000;
        pg.part_of = s(&["pg-all.service"]);
        m.insert("pg.service".into(), pg);
        m.insert(
            "pg-all.service".into(),
            UnitTopology {
                load_state: LoadState::Loaded,
                fragment_path: "/usr/lib/systemd/system/pg-all.service".into(),
                conflicts: s(&["shutdown.target"]),
                ..Default::default()
            },
        );
        let mut e = expected();
        e.stop_delay_s.insert("pg.service".into(), 60);
        let p = problems(&s(&["pg.service"]), &m, &e);
        for needle in [
            "pg.service is stopped by the shutdown transaction itself (pg.service (/etc/systemd/system/pg.service) \
             has PartOf=pg-all.service, and pg-all.service (/usr/lib/systemd/system/pg-all.service) has \
             Conflicts=shutdown.target)",
            "pg.service (/etc/systemd/system/pg.service) is wanted or triggered by multi-user.target: systemd starts it outside berth's order",
            "pg.service has TimeoutStopSec=20 s, under its stop_delay_s of 60 s",
            "pg.service (/etc/systemd/system/pg.service) gives its container 10 s to stop (podman's default stop \
             timeout; the container sets none (quadlet: StopTimeout=)) before podman kills it, under its \
             stop_delay_s of 60 s: set StopTimeout=60",
        ] {
            assert!(p.iter().any(|l| l.contains(needle)), "{needle}\n{p:#?}");
        }
        // PartOf= itself, too.
        assert_eq!(p.len(), 5, "{p:#?}");
    }

    /// Review of issue 11: a unit the network or the boot needs, taken
    /// over, made an ordering cycle with the drain (systemd-analyze
    /// verify: "Job berth-drain.service/start deleted to break ordering
    /// cycle"), and an alias was never listed, so never drained.
    #[test]
    fn a_cycle_with_the_drain_an_alias_and_a_refused_stop_are_problems() {
        let mut m = healthy();
        m.get_mut(DRAIN).unwrap().after.push("network.target".into());
        let workload = |before: &[&str]| UnitTopology {
            load_state: LoadState::Loaded,
            id: "nm.service".into(),
            before: s(before),
            after: s(&["basic.target", DRAIN]),
            slice: "berth.slice".into(),
            ignore_on_isolate: true,
            ..Default::default()
        };
        let target = |before: &[&str]| UnitTopology {
            load_state: LoadState::Loaded,
            before: s(before),
            ..Default::default()
        };
        let units = s(&["nm.service"]);
        for (before, chain) in [
            (
                &["network.target"][..],
                Some("nm.service has Before=network.target, and berth-drain.service is After=network.target"),
            ),
            (
                &["network-pre.target"],
                Some(
                    "nm.service has Before=network-pre.target, network-pre.target has Before=network.target, \
                     and berth-drain.service is After=network.target",
                ),
            ),
            (
                &["sysinit.target"],
                Some("nm.service has Before=sysinit.target, and every workload starts after it"),
            ),
            (&["multi-user.target"], None),
            (&[], None),
        ] {
            let mut m = m.clone();
            m.insert("nm.service".into(), workload(before));
            m.insert("network-pre.target".into(), target(&["network.target"]));
            m.insert(
                "multi-user.target".into(),
                target(&["graphical.target", "shutdown.target"]),
            );
            m.insert("network.target".into(), target(&["network-online.target"]));
            let p = problems(&units, &m, &expected());
            match chain {
                Some(chain) => {
                    assert_eq!(p.len(), 1, "{before:?}: {p:#?}");
                    assert!(
                        p[0].contains(chain) && p[0].contains("an ordering cycle"),
                        "{before:?}: {p:#?}"
                    );
                }
                None => assert!(p.is_empty(), "{before:?}: {p:#?}"),
            }
        }
        let mut alias = workload(&[]);
        alias.id = "mariadb.service".into();
        alias.refuse_manual_stop = true;
        alias.triggered_by = s(&["mysql.socket"]);
        m.insert("mysql.service".into(), alias);
        let p = problems(&s(&["mysql.service"]), &m, &expected()).join("\n");
        for needle in [
            "mysql.service is an alias of mariadb.service: name mariadb.service instead",
            "mysql.service is wanted or triggered by mysql.socket",
        ] {
            assert!(p.contains(needle), "{needle}: {p}");
        }
        // The drain's stops are queued by a transaction's Conflicts=, to
        // which systemd does not apply RefuseManualStop=: not a problem.
        assert!(!p.contains("RefuseManualStop"), "{p}");
    }

    #[test]
    fn a_running_unit_not_yet_moved_to_its_slice_is_a_note() {
        let mut m = healthy();
        m.get_mut("berth@a.service").unwrap().control_group = "/system.slice/berth@a.service".into();
        let units = s(&["berth@a.service"]);
        assert_eq!(problems(&units, &m, &expected()), Vec::<String>::new());
        let n = notes(&units, &m);
        assert_eq!(n.len(), 1);
        assert!(n[0].starts_with("berth@a.service still runs in /system.slice/berth@a.service: Slice=berth.slice applies from its next start"), "{n:?}");
        m.get_mut("berth@a.service").unwrap().control_group = "/berth.slice/berth@a.service".into();
        assert!(notes(&units, &m).is_empty());
    }

    #[test]
    fn a_workload_out_of_its_slice_or_part_of_a_target_is_reported() {
        let mut m = healthy();
        let w = m.get_mut("berth@a.service").unwrap();
        w.slice = "system-berth.slice".into();
        w.part_of = s(&["berth.target"]);
        w.after.clear();
        let p = problems(&s(&["berth@a.service"]), &m, &expected()).join("\n");
        for needle in [
            "system-berth.slice",
            "PartOf=berth.target",
            "not After=berth-drain.service",
        ] {
            assert!(p.contains(needle), "{needle}: {p}");
        }
    }
}
