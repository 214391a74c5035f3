//! Pure planning: start order, drain groups, and the time budgets that the
//! units' timeouts are derived from. No I/O.

use std::collections::BTreeSet;

use crate::config::host::DRAIN_EXIT_MARGIN_S;
use crate::config::{HostSettings, StopAction, Workload};

/// How much longer a workload unit's own `TimeoutStopSec=` is than berth's
/// stop budget for it: the drain, not the unit's timer, decides when to
/// force, and a forced stop needs a moment to complete.
pub const WORKLOAD_STOP_MARGIN_S: u64 = 30;

/// Units the drain is always ordered after: they stay up until it is done.
pub const DRAIN_BASE_AFTER: &[&str] = &["network.target", "remote-fs.target", "local-fs.target"];

/// `TimeoutStopSec=` of berth-drain.service for a deadline.
pub fn drain_timeout_stop_s(deadline_s: u64) -> u64 {
    deadline_s + DRAIN_EXIT_MARGIN_S
}

/// A workload unit's `TimeoutStopSec=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitStopTimeout {
    Seconds(u64),
    /// Force-off disabled: systemd must never SIGKILL it on its own.
    Infinity,
}

pub fn workload_timeout_stop(w: &Workload) -> UnitStopTimeout {
    if w.force_off_on_timeout {
        UnitStopTimeout::Seconds(w.stop_delay_s + WORKLOAD_STOP_MARGIN_S)
    } else {
        UnitStopTimeout::Infinity
    }
}

/// Workloads grouped by `order`, ascending; names sorted within a group.
pub fn start_groups(workloads: &[Workload]) -> Vec<Vec<&Workload>> {
    let mut sorted: Vec<&Workload> = workloads.iter().collect();
    sorted.sort_by(|a, b| (a.order, &a.name).cmp(&(b.order, &b.name)));
    let mut groups: Vec<Vec<&Workload>> = Vec::new();
    for w in sorted {
        match groups.last_mut() {
            Some(g) if g[0].order == w.order => g.push(w),
            _ => groups.push(vec![w]),
        }
    }
    groups
}

/// Drain groups: start groups in reverse.
pub fn drain_groups(workloads: &[Workload]) -> Vec<Vec<&Workload>> {
    let mut groups = start_groups(workloads);
    groups.reverse();
    groups
}

/// What berth-drain.service is ordered after: the base targets, the host's
/// `drain_after`, and every workload's `after`/`wants` except other
/// workloads (the drain stops those itself; waiting for them would
/// deadlock the shutdown).
pub fn drain_after(host: &HostSettings, workloads: &[Workload]) -> Vec<String> {
    let mut units: BTreeSet<&str> = DRAIN_BASE_AFTER.iter().copied().collect();
    units.extend(host.drain_after.iter().map(String::as_str));
    let existing: BTreeSet<&str> = workloads.iter().filter_map(Workload::existing_unit).collect();
    if workloads.iter().any(|w| w.libvirt_domain().is_some()) {
        units.extend(crate::libvirt::DAEMON_UNITS.iter().copied());
        units.extend(crate::libvirt::DRAIN_AFTER.iter().copied());
    }
    for w in workloads {
        for u in w.after.iter().chain(&w.wants) {
            if !u.starts_with("berth@") && !existing.contains(u.as_str()) {
                units.insert(u);
            }
        }
    }
    units.into_iter().map(str::to_string).collect()
}

/// What berth-drain.service wants besides: libvirt's shutdown target when
/// a workload is a libvirt guest (see [`crate::libvirt::DRAIN_WANTS`]).
pub fn drain_wants(workloads: &[Workload]) -> Vec<String> {
    if workloads.iter().any(|w| w.libvirt_domain().is_some()) {
        crate::libvirt::DRAIN_WANTS
            .iter()
            .map(|u| u.to_string())
            .collect()
    } else {
        Vec::new()
    }
}

/// How long the drain may wait for one workload: its stop delay, or
/// nothing for `power_off`, which is killed at once.
pub fn budget_s(w: &Workload) -> u64 {
    match w.stop_action {
        StopAction::PowerOff => 0,
        StopAction::GuestShutdown | StopAction::Save => w.stop_delay_s,
    }
}

/// The worst case of a drain with these settings, ignoring the deadline:
/// per group, ceil(n / parallelism) rounds of the group's longest delay.
/// Shown by `berth check` so an admin sees when the deadline will cut in.
pub fn worst_case_drain_s(host: &HostSettings, workloads: &[Workload]) -> u64 {
    drain_groups(workloads)
        .iter()
        .map(|g| {
            let rounds = g.len().div_ceil(host.drain_parallelism as usize) as u64;
            let longest = g.iter().map(|w| budget_s(w)).max().unwrap_or(0);
            rounds * longest
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WorkloadKind;

    fn w(name: &str, order: i64, delay: u64) -> Workload {
        Workload {
            name: name.into(),
            source: format!("/etc/berth/workloads/{name}.toml").into(),
            description: None,
            kind: WorkloadKind::Command {
                exec: vec!["/bin/true".into()],
                stop_exec: None,
            },
            autostart: crate::config::Autostart::Yes,
            order,
            start_delay_s: 0,
            stop_action: StopAction::GuestShutdown,
            ready: crate::config::Readiness::Exec,
            ready_exec: None,
            stop_delay_s: delay,
            force_off_on_timeout: true,
            after: vec![],
            wants: vec![],
            environment: Default::default(),
            user: None,
            group: None,
            service: vec![],
            ha: None,
            restart: Some(Default::default()),
            from_all_guests: false,
        }
    }

    fn names(groups: &[Vec<&Workload>]) -> Vec<Vec<String>> {
        groups
            .iter()
            .map(|g| g.iter().map(|w| w.name.clone()).collect())
            .collect()
    }

    #[test]
    fn groups_by_order_then_name_and_drain_reverses() {
        let ws = vec![w("c", 10, 5), w("a", 0, 5), w("b", 10, 5), w("z", -5, 5)];
        assert_eq!(names(&start_groups(&ws)), [vec!["z"], vec!["a"], vec!["b", "c"]]);
        assert_eq!(names(&drain_groups(&ws)), [vec!["b", "c"], vec!["a"], vec!["z"]]);
    }

    #[test]
    fn workload_timeouts_leave_the_decision_to_the_drain() {
        let mut a = w("a", 0, 60);
        assert_eq!(workload_timeout_stop(&a), UnitStopTimeout::Seconds(90));
        a.force_off_on_timeout = false;
        assert_eq!(workload_timeout_stop(&a), UnitStopTimeout::Infinity);
    }

    #[test]
    fn drain_is_never_after_a_workload() {
        let mut a = w("a", 0, 60);
        a.after = vec!["berth@b.service".into(), "network-online.target".into()];
        a.wants = vec!["libvirtd.service".into(), "pg.service".into()];
        // pg.service is a workload too (`unit =`): the drain stops it.
        let mut pg = w("pg", 0, 60);
        pg.kind = WorkloadKind::Existing {
            unit: "pg.service".into(),
        };
        let host = HostSettings {
            drain_after: vec!["iscsid.service".into()],
            ..Default::default()
        };
        assert_eq!(
            drain_after(&host, &[a, pg]),
            [
                "iscsid.service",
                "libvirtd.service",
                "local-fs.target",
                "network-online.target",
                "network.target",
                "remote-fs.target"
            ]
        );
    }

    #[test]
    fn worst_case_counts_rounds_per_group() {
        let host = HostSettings {
            drain_parallelism: 2,
            ..Default::default()
        };
        // group 10: 3 workloads, 2 at a time → 2 rounds of 30; group 0: 1 round of 5.
        let mut ws = vec![w("a", 10, 30), w("b", 10, 10), w("c", 10, 30), w("d", 0, 5)];
        assert_eq!(worst_case_drain_s(&host, &ws), 65);
        ws[3].stop_action = StopAction::PowerOff;
        assert_eq!(worst_case_drain_s(&host, &ws), 60, "power_off waits for nothing");
    }
}
