//! `berth autostart`: at boot, start the enabled workloads that are not
//! running, in order; leave running ones untouched.
//!
//! Sequence: workloads sorted by (`order`, name). An order group's start
//! jobs all finish before the next group begins. Inside a group the starts
//! go out together, except that a workload with `start_delay_s > 0` holds
//! back everything after it until that many seconds after its own start
//! completed. A workload this run does not start imposes no delay.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use crate::config::{Loaded, Workload};
use crate::freeze::{self, rfc3339};
use crate::paths::Root;
use crate::plan;
use crate::records;
use crate::report::Events;
use crate::systemd::{Job, Ops, SystemdError};

pub const MESSAGE_ID: &str = "5afd3d3e87ee4d158033841e5f87b361";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Started,
    StartFailed(String),
    Adopted,
    Skipped(String),
}

#[derive(Debug, Default)]
pub struct Summary {
    pub actions: Vec<(String, Action)>,
    pub node_frozen: Option<String>,
}

impl Summary {
    fn count(&self, f: impl Fn(&Action) -> bool) -> usize {
        self.actions.iter().filter(|(_, a)| f(a)).count()
    }
}

/// Runs the autostart. Errs only when systemd cannot be asked at all.
pub async fn run<O: Ops>(
    ops: &O,
    root: &Root,
    loaded: &Loaded,
    node_frozen: Option<String>,
    events: &Events,
) -> Result<Summary, SystemdError> {
    let live = ops.list_workloads().await?;
    let running: BTreeSet<String> = live
        .iter()
        .filter(|u| u.is_running())
        .filter_map(|u| instance_of(&u.name))
        .collect();
    let mut summary = Summary {
        node_frozen: node_frozen.clone(),
        ..Default::default()
    };

    let now = rfc3339(SystemTime::now());
    for name in &running {
        let _ = records::update(root, name, |r| {
            r.adopted_at = Some(now.clone());
            if r.state != "running" {
                r.state = "running".into();
                r.last_transition_reason = "adopted".into();
                return true;
            }
            false
        });
        summary.actions.push((name.clone(), Action::Adopted));
    }
    events.emit(
        log::Level::Info,
        MESSAGE_ID,
        &[("BERTH_ADOPTED", running.len().to_string())],
        &format!("adopted {} running workloads (left untouched)", running.len()),
    );

    if let Some(reason) = node_frozen {
        events.warn(&format!("starting no workload: {reason}"));
        return Ok(summary);
    }

    for group in plan::start_groups(&loaded.workloads) {
        let mut pending: Vec<(&Workload, Job)> = Vec::new();
        for w in group {
            if running.contains(&w.name) {
                continue;
            }
            let skip = if !w.autostart {
                Some("autostart = false".to_string())
            } else {
                freeze::instance_frozen(root, &w.name)
            };
            if let Some(reason) = skip {
                events.info(&format!("not starting {}: {reason}", w.unit_name()));
                summary.actions.push((w.name.clone(), Action::Skipped(reason)));
                continue;
            }
            match ops.start(&w.unit_name()).await {
                Ok(job) if w.start_delay_s > 0 => {
                    let action = finish(ops, root, w, &job, events).await;
                    summary.actions.push((w.name.clone(), action));
                    tokio::time::sleep(Duration::from_secs(w.start_delay_s)).await;
                }
                Ok(job) => pending.push((w, job)),
                Err(e) => {
                    let action = record_start(root, w, Err(e.to_string()), events);
                    summary.actions.push((w.name.clone(), action));
                }
            }
        }
        for (w, job) in pending {
            let action = finish(ops, root, w, &job, events).await;
            summary.actions.push((w.name.clone(), action));
        }
    }

    let started = summary.count(|a| *a == Action::Started);
    let failed = summary.count(|a| matches!(a, Action::StartFailed(_)));
    let skipped = summary.count(|a| matches!(a, Action::Skipped(_)));
    events.emit(
        if failed > 0 {
            log::Level::Warn
        } else {
            log::Level::Info
        },
        "",
        &[
            ("BERTH_STARTED", started.to_string()),
            ("BERTH_FAILED", failed.to_string()),
            ("BERTH_SKIPPED", skipped.to_string()),
        ],
        &format!(
            "autostart done: {started} started, {failed} failed, {skipped} skipped, {} adopted",
            running.len()
        ),
    );
    Ok(summary)
}

async fn finish<O: Ops>(ops: &O, root: &Root, w: &Workload, job: &Job, events: &Events) -> Action {
    let result = ops.wait(job, None).await.unwrap_or_else(|| "unknown".into());
    let outcome = if result == "done" {
        Ok(())
    } else {
        Err(format!(
            "start job {result}; see `systemctl status {}`",
            w.unit_name()
        ))
    };
    record_start(root, w, outcome, events)
}

fn record_start(root: &Root, w: &Workload, outcome: Result<(), String>, events: &Events) -> Action {
    let (state, action) = match &outcome {
        Ok(()) => ("running", Action::Started),
        Err(e) => ("failed", Action::StartFailed(e.clone())),
    };
    let recorded = records::update(root, &w.name, |r| {
        r.state = state.into();
        r.last_transition_reason = "boot".into();
        r.outcome = Some(if outcome.is_ok() { "Started" } else { "StartFailed" }.into());
        r.detail = outcome.as_ref().err().cloned();
        r.code = None;
        true
    });
    if let Err(e) = recorded {
        events.warn(&format!("cannot record {}: {e}", w.name));
    }
    match &outcome {
        Ok(()) => events.emit(
            log::Level::Info,
            "",
            &[("BERTH_WORKLOAD", w.name.clone())],
            &format!("started {}", w.unit_name()),
        ),
        Err(e) => events.emit(
            log::Level::Error,
            "",
            &[("BERTH_WORKLOAD", w.name.clone())],
            &format!("failed to start {}: {e}", w.unit_name()),
        ),
    }
    action
}

/// `berth@NAME.service` → `NAME`.
pub fn instance_of(unit: &str) -> Option<String> {
    unit.strip_prefix("berth@")
        .and_then(|u| u.strip_suffix(".service"))
        .filter(|n| !n.is_empty())
        .map(str::to_string)
}
