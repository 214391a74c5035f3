//! What the drain will do, decided before it does anything: the groups in
//! reverse start order (then the running units nobody configured), each
//! workload's budget, and the worst case against the deadline.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::{Loaded, StopAction, Workload};
use crate::names;
use crate::plan;
use crate::systemd::UnitStatus;

/// One workload the drain acts on: from config, or a running unit whose
/// definition is gone or broken (host defaults, last group).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Target {
    pub name: String,
    pub unit: String,
    pub running: bool,
    pub stop_action: StopAction,
    pub stop_delay_s: u64,
    pub force_off_on_timeout: bool,
    pub configured: bool,
}

impl Target {
    fn from_workload(w: &Workload, running: bool) -> Target {
        Target {
            name: w.name.clone(),
            unit: w.unit_name(),
            running,
            stop_action: w.stop_action,
            stop_delay_s: w.stop_delay_s,
            force_off_on_timeout: w.force_off_on_timeout,
            configured: true,
        }
    }

    /// The longest the drain waits for it before forcing.
    pub fn budget_s(&self) -> u64 {
        match self.stop_action {
            StopAction::PowerOff => 0,
            StopAction::GuestShutdown => self.stop_delay_s,
        }
    }
}

/// The drain's groups: configured workloads in reverse start order, then
/// the running units nobody configured.
pub fn groups(loaded: &Loaded, live: &[UnitStatus]) -> Vec<Vec<Target>> {
    let running: BTreeMap<&str, bool> = live
        .iter()
        .filter_map(|u| names::instance_of(&u.name).map(|n| (n, u.is_running())))
        .collect();
    let mut groups: Vec<Vec<Target>> = plan::drain_groups(&loaded.workloads)
        .into_iter()
        .map(|g| {
            g.into_iter()
                .map(|w| Target::from_workload(w, running.get(w.name.as_str()).copied().unwrap_or(false)))
                .collect()
        })
        .collect();
    let orphans: Vec<Target> = running
        .iter()
        .filter(|(name, running)| **running && loaded.workload(name).is_none())
        .map(|(name, _)| Target {
            name: name.to_string(),
            unit: names::unit_name(name),
            running: true,
            stop_action: StopAction::GuestShutdown,
            stop_delay_s: loaded.host.default_stop_delay_s,
            force_off_on_timeout: loaded.host.force_off_on_timeout,
            configured: false,
        })
        .collect();
    if !orphans.is_empty() {
        groups.push(orphans);
    }
    groups
}

/// `berth drain --dry-run`: the plan, each budget, the worst case, and
/// whether the deadline fits.
#[derive(Debug, Serialize)]
pub struct DryRun {
    pub groups: Vec<Vec<Target>>,
    pub parallelism: u32,
    pub deadline_s: u64,
    pub worst_case_s: u64,
    pub drain_timeout_stop_s: u64,
    pub warnings: Vec<String>,
}

pub fn dry_run(loaded: &Loaded, live: Option<&[UnitStatus]>) -> DryRun {
    let groups = groups(loaded, live.unwrap_or(&[]));
    let p = loaded.host.drain_parallelism.max(1) as usize;
    let worst_case_s = groups
        .iter()
        .map(|g| g.len().div_ceil(p) as u64 * g.iter().map(Target::budget_s).max().unwrap_or(0))
        .sum();
    let deadline_s = loaded.host.drain_deadline_s;
    let mut warnings = Vec::new();
    if live.is_none() {
        warnings
            .push("systemd not reachable: live units not included, every configured workload shown".into());
    }
    if worst_case_s > deadline_s {
        warnings.push(format!(
            "the worst case ({worst_case_s} s) exceeds drain_deadline_s ({deadline_s} s): at the deadline the rest is forced off, or left to systemd's final kill without force-off"
        ));
    }
    if let Err(e) = plan::check_drain_deadline(deadline_s, loaded.host.manager) {
        warnings.push(format!("drain_deadline_s: {e}"));
    }
    DryRun {
        groups,
        parallelism: loaded.host.drain_parallelism,
        deadline_s,
        worst_case_s,
        drain_timeout_stop_s: plan::drain_timeout_stop_s(deadline_s),
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::tests::setup;

    #[test]
    fn dry_run_reports_budgets_and_the_worst_case() {
        let (_d, _root, loaded) = setup(
            "drain_parallelism = 2\ndrain_deadline_s = 60",
            &[
                ("a", "stop_delay_s = 50"),
                ("b", "stop_delay_s = 40"),
                ("c", "stop_delay_s = 30\norder = 5"),
            ],
        );
        let plan = dry_run(&loaded, None);
        assert_eq!(plan.worst_case_s, 80);
        assert_eq!(plan.drain_timeout_stop_s, 90);
        assert!(
            plan.warnings
                .iter()
                .any(|w| w.contains("worst case (80 s) exceeds drain_deadline_s (60 s)"))
        );
        assert_eq!(
            plan.groups
                .concat()
                .iter()
                .filter(|t| t.unit == "berth@c.service")
                .count(),
            1
        );
        let json = serde_json::to_value(&plan).unwrap();
        assert_eq!(json["groups"][0][0]["stop_action"], "guest_shutdown");
    }
}
