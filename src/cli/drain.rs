//! `berth drain` (ExecStop of berth-drain.service), `--dry-run` and
//! `--last`: the drain itself always exits 0; what it did is in the journal
//! and the report.

use super::lifecycle::helper_context;
use super::{block_on, say, say_error};
use crate::config::{self, StopAction};
use crate::drain::{self, DryRun};
use crate::paths::Root;
use crate::state::drain_report::{self, ReadError, Report};
use crate::systemd::{Ops, Systemd};

/// Best effort: whatever happens, it reports and exits 0, well inside the
/// drain unit's TimeoutStopSec.
pub(super) fn run(root: &Root) -> i32 {
    let (loaded, events) = helper_context(root);
    let ran = block_on(async {
        // The deadline counts from here: connecting is part of the budget.
        let began = tokio::time::Instant::now();
        // The drain's stops are queued together: one transaction per
        // batch, not one call each.
        match Systemd::connect(root.manager())
            .await
            .map(Systemd::stopping_together)
        {
            Ok(sd) => {
                // In cluster mode, owner keys are released as workloads go
                // down, and HA workloads fenced at the lease deadline.
                #[cfg(feature = "cluster")]
                {
                    let release = crate::cluster::release::Release::begin(root, &loaded, &events);
                    drain::run_with(&sd, root, &loaded, &events, began, release, || {
                        cluster_wait_until(began, &loaded)
                    })
                    .await;
                }
                #[cfg(not(feature = "cluster"))]
                drain::run(&sd, root, &loaded, &events, began).await;
            }
            Err(e) => drain::unreachable(root, &loaded, &e, &events),
        }
    });
    if let Err(e) = ran {
        say_error(&format!("berth drain: {e:#}"));
    }
    0
}

/// How long a finished drain waits for etcd to hear the last releases
/// and `drained`: at most 5 s, and never past the drain's deadline.
#[cfg(feature = "cluster")]
fn cluster_wait_until(began: tokio::time::Instant, loaded: &config::Loaded) -> tokio::time::Instant {
    let deadline = began + std::time::Duration::from_secs(loaded.host.drain_deadline_s);
    (tokio::time::Instant::now() + std::time::Duration::from_secs(5))
        .min(deadline.max(tokio::time::Instant::now()))
}

pub(super) fn last(root: &Root, json: bool) -> i32 {
    match drain_report::read(root) {
        Ok((text, _)) if json => say(&text),
        Ok((_, report)) => say(&report_text(&report)),
        Err(ReadError::Missing(_)) => say(&format!("{}\n", ReadError::Missing(drain_report::path(root)))),
        // JSON asked for: what is there, as it is.
        Err(ReadError::NotAReport(path, _)) if json => {
            say(&std::fs::read_to_string(path).unwrap_or_default())
        }
        Err(e) => {
            say_error(&format!("berth drain --last: {e}"));
            return 1;
        }
    }
    0
}

pub(super) fn dry_run(root: &Root, json: bool) -> i32 {
    let loaded = config::load(root);
    let live = block_on(async {
        let sd = Systemd::connect(root.manager()).await.ok()?;
        sd.list_workloads(&loaded.workload_units().existing_units())
            .await
            .ok()
    })
    .ok()
    .flatten();
    let plan = drain::dry_run(&loaded, live.as_deref());
    if json {
        say(&format!(
            "{}\n",
            serde_json::to_string_pretty(&plan).unwrap_or_default()
        ));
    } else {
        say(&dry_run_text(&plan));
    }
    0
}

/// What `berth drain --last` prints.
fn report_text(report: &Report) -> String {
    let mut out = format!(
        "last drain: {} to {} ({} ms, deadline {} s{}, {} at a time), {}\n",
        report.started_at,
        report.finished_at,
        report.elapsed_ms,
        report.deadline_s,
        if report.deadline_reached { ", reached" } else { "" },
        report.parallelism,
        match (report.shutdown, report.boot_id.as_str()) {
            (Some(true), "") => "by a shutdown".to_string(),
            (Some(true), boot) => format!("by the shutdown of boot {}", boot.escape_debug()),
            (Some(false), _) => "by hand".to_string(),
            (None, _) => "by a shutdown or by hand (not recorded)".to_string(),
        }
    );
    for w in &report.workloads {
        out.push_str(&format!(
            "  {}: {}{} after {} ms{}\n",
            w.unit_name(),
            w.outcome.as_str(),
            w.code.as_deref().map(|c| format!(" ({c})")).unwrap_or_default(),
            w.elapsed_ms,
            w.detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default()
        ));
    }
    out
}

fn dry_run_text(plan: &DryRun) -> String {
    let mut out = format!(
        "drain plan: {} at a time per group, deadline {} s (unit TimeoutStopSec={} s), worst case {} s\n",
        plan.parallelism, plan.deadline_s, plan.drain_timeout_stop_s, plan.worst_case_s
    );
    for (i, g) in plan.groups.iter().enumerate() {
        out.push_str(&format!(
            "group {} ({}): worst case {} s, {} s from the start\n",
            i + 1,
            match g.order {
                Some(order) => format!("order {order}"),
                None => "running units with no workload file".to_string(),
            },
            g.worst_case_s,
            g.worst_case_until_end_s
        ));
        for t in &g.workloads {
            out.push_str(&format!(
                "  {} {}: {}{}\n",
                t.unit,
                if t.running { "running" } else { "not running" },
                match (t.stop_action, t.stop_delay_s) {
                    (StopAction::GuestShutdown | StopAction::Save, Some(delay)) => format!(
                        "{}, wait up to {delay} s, then {}",
                        if t.stop_action == StopAction::Save {
                            "save"
                        } else {
                            "stop"
                        },
                        if t.force_off_on_timeout == Some(true) {
                            "force off"
                        } else {
                            "leave running"
                        }
                    ),
                    _ => "power_off (SIGKILL at once, no stop delay)".to_string(),
                },
                if t.configured {
                    ""
                } else {
                    " [not configured: host defaults]"
                }
            ));
        }
    }
    for w in &plan.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `unit =` workload's own unit is shown, and a report written
    /// before reports named units still reads as `berth@NAME.service`.
    #[test]
    fn the_last_report_names_each_workloads_unit() {
        let report: Report = serde_json::from_str(
            r#"{"started_at": "a", "finished_at": "b", "elapsed_ms": 1, "deadline_s": 180,
                "parallelism": 4, "deadline_reached": false, "workloads": [
                {"workload": "cache", "unit": "example-cache.service", "outcome": "GracefulOff",
                 "started_ms": 0, "elapsed_ms": 1005},
                {"workload": "db", "outcome": "GracefulOff", "started_ms": 0, "elapsed_ms": 7}]}"#,
        )
        .unwrap();
        let text = report_text(&report);
        assert!(
            text.contains("  example-cache.service: GracefulOff after 1005 ms\n"),
            "{text}"
        );
        assert!(
            text.contains("  berth@db.service: GracefulOff after 7 ms\n"),
            "{text}"
        );
    }
}
