//! `berth check [--root DIR] [--live]`: the configuration, and with
//! `--live` the loaded units, against berth's rules.

use std::path::PathBuf;

use super::{say, say_error, with_systemd};
use crate::config::{self, Loaded, WorkloadKind};
use crate::libvirt;
use crate::live;
use crate::paths::Root;
use crate::plan;
use crate::state::freeze::{self, Freeze, Scope};
use crate::systemd::{Ops, UnitFileState};

pub(super) fn run(root: &Root, dir: Option<PathBuf>, live: bool, json: bool) -> i32 {
    match dir {
        Some(dir) => match root.user_dirs() {
            Some(user) => check(&Root::new_user(dir, user.clone()), json),
            None => check(&Root::new(dir), json),
        },
        None => {
            let rc = check(root, json);
            if live { check_live(root).max(rc) } else { rc }
        }
    }
}

fn check(root: &Root, json: bool) -> i32 {
    if !root.dir().is_dir() {
        say_error(&format!(
            "berth check: {}: no such directory",
            config::shown_path(root.dir())
        ));
        return 1;
    }
    let loaded = config::load(root);
    if json {
        say(&format!(
            "{}\n",
            serde_json::to_string_pretty(&check_json(&loaded)).unwrap_or_default()
        ));
    } else {
        say(&check_report(&loaded));
        say(&freeze_report(root, &loaded));
    }
    if loaded.is_clean() { 0 } else { 1 }
}

/// `berth check --json`: what the text report says, for a CI job.
fn check_json(loaded: &Loaded) -> serde_json::Value {
    let host = &loaded.host;
    let errors: Vec<_> = loaded
        .errors
        .iter()
        .map(|e| serde_json::json!({"file": config::shown_path(&e.file), "key": e.key, "reason": e.reason}))
        .collect();
    let workloads: Vec<_> = loaded
        .workloads
        .iter()
        .map(|w| {
            serde_json::json!({
                "name": w.name,
                "unit": w.unit_name(),
                "file": config::shown_path(&w.source),
                "order": w.order,
                "autostart": w.autostart,
                "stop_action": w.stop_action,
                "stop_delay_s": w.stop_delay_s,
                "force_off_on_timeout": w.force_off_on_timeout,
                "ha_nodes": w.ha.as_ref().map(|h| &h.nodes),
                "restart": w.restart,
                "libvirt_domain": w.libvirt_domain(),
                "shutdown_mode": match &w.kind {
                    WorkloadKind::Libvirt { shutdown_mode, .. } => Some(shutdown_mode),
                    _ => None,
                },
                "from_all_guests": w.from_all_guests,
            })
        })
        .collect();
    serde_json::json!({
        "ok": loaded.is_clean(),
        "errors": errors,
        "host_files": loaded.host_files.iter().map(|p| config::shown_path(p)).collect::<Vec<_>>(),
        "host_has_errors": loaded.host_has_errors,
        "masked": loaded.masked,
        "workloads": workloads,
        "drain": {
            "timeout_stop_s": plan::drain_timeout_stop_s(host.drain_deadline_s),
            "deadline_s": host.drain_deadline_s,
            "parallelism": host.drain_parallelism,
            "after": plan::drain_after(host, &loaded.workloads),
        },
        "daemon": {"enabled": host.daemon.enabled, "watchdog_s": host.daemon.watchdog_s},
        "cluster": host.cluster.as_ref().map(|c| serde_json::json!({
            "node": c.node,
            "endpoints": c.endpoints,
            "prefix": c.prefix,
            "lease_ttl_s": c.lease_ttl_s,
            "keep_alive_interval_ms": c.keep_alive_interval().as_millis() as u64,
            "fence_margin_ms": c.fence_margin().as_millis() as u64,
            "maintenance_grace_period_s": c.maintenance_grace_period_s,
            "rejoin_grace_period_s": c.rejoin_grace_period_s,
            "tls": c.tls.is_some(),
            "watchdog": c.watchdog.as_ref().map(|w| serde_json::json!({
                "device": w.device,
                "timeout_s": w.timeout_s,
                "takeover_wait_s": crate::cluster::watchdog::takeover_wait_s(u64::MAX, Some(w.timeout_s)),
            })),
        })),
    })
}

/// `berth check --live`: the loaded units against the invariants.
fn check_live(root: &Root) -> i32 {
    let loaded = config::load(root);
    let configured: Vec<String> = loaded.workloads.iter().map(|w| w.unit_name()).collect();
    let all_guests = loaded.host.libvirt.guests == config::GuestCoverage::All;
    let has_guests = all_guests
        || loaded
            .workloads
            .iter()
            .any(|w| matches!(w.kind, WorkloadKind::Libvirt { .. }));
    let gathered = with_systemd(root, |sd| async move {
        let found = live::gather(&sd, &configured)
            .await
            .map_err(|e| anyhow::anyhow!("cannot inspect the loaded units: {e}"))?;
        // libvirt-guests acts at boot when enabled, and at this shutdown
        // when it is active, enabled or not.
        let enabled = has_guests
            && matches!(
                sd.unit_file_state("libvirt-guests.service").await,
                Ok(UnitFileState::Enabled | UnitFileState::EnabledRuntime)
            );
        let active = has_guests
            && sd
                .active_state("libvirt-guests.service")
                .await
                .is_ok_and(|s| s.is_running());
        Ok((found, (enabled, active)))
    });
    let ((workloads, units), (guests_service_enabled, guests_service_active)) = match gathered {
        Ok(found) => found,
        Err(e) => return super::fail("check --live", &e),
    };
    let expected = live::Expected {
        drain_timeout_stop_s: plan::drain_timeout_stop_s(loaded.host.drain_deadline_s),
        stop_delay_s: loaded
            .workloads
            .iter()
            .filter(|w| w.stop_action != config::StopAction::PowerOff)
            .map(|w| (w.unit_name(), w.stop_delay_s))
            .collect(),
    };
    let mut problems = live::problems(&workloads, &units, &expected);
    let mut guest_warnings = Vec::new();
    if has_guests {
        let guests: Vec<libvirt::check::Guest> = loaded
            .workloads
            .iter()
            .filter_map(|w| match &w.kind {
                WorkloadKind::Libvirt { domain, .. } => Some(libvirt::check::Guest {
                    workload: w.name.clone(),
                    unit: w.unit_name(),
                    domain: domain.clone(),
                    autostart: w.autostart,
                    force_off_on_timeout: w.force_off_on_timeout,
                    unit_active: units
                        .get(&w.unit_name())
                        .is_some_and(|u| u.active_state.is_running()),
                    ha: w.ha.is_some() && loaded.host.cluster.is_some(),
                    from_all_guests: w.from_all_guests,
                    drop_in_loaded: units.get(&w.unit_name()).is_some_and(|u| {
                        let ours = format!("/{}.d/{}", w.unit_name(), crate::render::DROP_IN_NAME);
                        u.drop_ins.iter().any(|p| p.ends_with(&ours))
                    }),
                }),
                _ => None,
            })
            .collect();
        let host = libvirt::check::gather(root, all_guests, guests_service_enabled, guests_service_active);
        problems.extend(libvirt::check::problems(&guests, &host));
        guest_warnings = libvirt::check::warnings(&guests, &host);
    }
    let mut out = String::new();
    for p in &problems {
        out.push_str(&format!("live: problem: {p}\n"));
    }
    for n in live::notes(&workloads, &units) {
        out.push_str(&format!("live: note: {n}\n"));
    }
    for warning in guest_warnings {
        out.push_str(&format!("live: warning: {warning}\n"));
    }
    if problems.is_empty() {
        out.push_str(&format!(
            "live: the drain, berth.slice and {} workload unit(s) keep the lifecycle invariants\n",
            workloads.len()
        ));
    } else {
        out.push_str(&format!(
            "live: {} problem(s); see berth.units(7)\n",
            problems.len()
        ));
    }
    say(&out);
    if problems.is_empty() { 0 } else { 1 }
}

/// Freezes that would make the boot autostart skip the node or a workload.
fn freeze_report(root: &Root, loaded: &Loaded) -> String {
    let mut out = String::new();
    let mut line = |what: &str, result: std::io::Result<Option<Freeze>>| match result {
        Ok(None) => {}
        // An adopted freeze's reason came from etcd: escaped.
        Ok(Some(f)) => out.push_str(&format!(
            "frozen: {what} since {} ({}{}): autostart skips it\n",
            f.since(),
            f.why().escape_debug(),
            f.adopted.as_ref().map_or_else(String::new, |a| format!(
                "; scope {}, taken by {}",
                f.scope.as_str(),
                a.taken_by.escape_debug()
            ))
        )),
        Err(e) => out.push_str(&format!("warning: cannot read the freeze flag of {what}: {e}\n")),
    };
    line("node", freeze::read(&freeze::node_flag(root), Scope::Node, None));
    for w in &loaded.workloads {
        let flag = freeze::instance_flag(root, &w.name);
        line(
            &w.unit_name(),
            freeze::read(&flag, Scope::Instance, Some(&w.name)),
        );
    }
    out
}

/// What `restart` means for the drain, said once when a workload restarts.
const RESTART_AND_THE_DRAIN: &str = "\
restart: systemd restarts a workload only after its own exit, never after a stop job: the drain's stop (and \
one it sends to a workload waiting for its restart) ends it for good. At a shutdown systemd restarts no \
workload (the restart would start units the shutdown stops: it refuses that transaction), so one that \
crashes then stays failed; during a `berth drain` by hand it is restarted and stopped in its turn. One that \
reached its start limit stays failed, refused by systemd until its interval has passed or `systemctl \
reset-failed UNIT`, and started by nothing but a start by hand or the next boot's autostart; the drain finds it \
off\n";

/// What `berth check` prints: problems per file, or the units in short.
pub fn check_report(loaded: &Loaded) -> String {
    let mut out = String::new();
    if !loaded.is_clean() {
        for e in &loaded.errors {
            out.push_str(&format!("error: {e}\n"));
        }
        if loaded.host_has_errors {
            out.push_str(&format!("note: {}\n", crate::generator::HOST_ERRORS_NOTE));
        }
        out.push_str(&format!(
            "{} problem(s); the generator skips the files named above and writes the rest\n",
            loaded.errors.len()
        ));
        return out;
    }
    let host = &loaded.host;
    match loaded.host_files.as_slice() {
        [] => out.push_str("host: no berth.toml, built-in defaults\n"),
        files => {
            for f in files {
                out.push_str(&format!("host: {} ok\n", config::shown_path(f)));
            }
        }
    }
    out.push_str(&format!(
        "berth-drain.service: TimeoutStopSec={}s (deadline {}s + {}s), {} at a time, after {}\n",
        plan::drain_timeout_stop_s(host.drain_deadline_s),
        host.drain_deadline_s,
        crate::config::host::DRAIN_EXIT_MARGIN_S,
        host.drain_parallelism,
        plan::drain_after(host, &loaded.workloads).join(" "),
    ));
    if host.daemon.enabled {
        out.push_str(&format!(
            "berth-daemon.service: wanted by berth.target, WatchdogSec={}\n",
            host.daemon.watchdog_s
        ));
    } else {
        out.push_str("berth-daemon.service: not wanted ([daemon] enabled = false)\n");
    }
    if let Some(c) = &host.cluster {
        out.push_str(&format!(
            "cluster: node {}, etcd {}, keys under {}, lease {}s (kept alive every {} ms, fenced {} ms before \
             its end), maintenance grace {}s, rejoin grace {}s{}\n",
            c.node.as_deref().unwrap_or("(the hostname)"),
            c.endpoints.join(" "),
            c.prefix,
            c.lease_ttl_s,
            c.keep_alive_interval().as_millis(),
            c.fence_margin().as_millis(),
            c.maintenance_grace_period_s,
            c.rejoin_grace_period_s,
            if c.tls.is_some() { ", TLS" } else { "" }
        ));
        out.push_str(&match &c.watchdog {
            Some(w) => format!(
                "cluster: watchdog {} (timeout {} s), held by berth-fence-watch.service: a peer takes an HA workload of this \
                 node {} s after its lease ended (the timeout + {} s), or after the workload's stop bound when that is \
                 shorter; no HA workload starts here while the watchdog is not held\n",
                w.device.display(),
                w.timeout_s,
                w.timeout_s + crate::cluster::watchdog::MARGIN.as_secs(),
                crate::cluster::watchdog::MARGIN.as_secs()
            ),
            None => "cluster: no watchdog: a peer takes an HA workload of this node once its lease ended and then \
                     the workload's stop bound passed ((ExecStop= commands + 1) x TimeoutStopSec= + 5 s)\n"
                .to_string(),
        });
    }
    if loaded.workloads.is_empty() {
        out.push_str("no workloads\n");
    }
    for group in plan::start_groups(&loaded.workloads) {
        out.push_str(&format!("order {}:\n", group[0].order));
        for w in group {
            let runs = match &w.kind {
                WorkloadKind::Command { exec, .. } => exec[0].clone(),
                WorkloadKind::Existing { .. } => "an existing unit, its own command".to_string(),
                WorkloadKind::Libvirt {
                    domain,
                    shutdown_mode,
                } => format!(
                    "libvirt domain {domain}{}, shut down by {}",
                    if w.from_all_guests {
                        " (guests = \"all\")"
                    } else {
                        ""
                    },
                    config::ShutdownMode::join(shutdown_mode)
                ),
            };
            let stop = match w.stop_action {
                config::StopAction::PowerOff => "power_off".to_string(),
                config::StopAction::GuestShutdown | config::StopAction::Save => format!(
                    "{} within {}s{}",
                    w.stop_action.as_str(),
                    w.stop_delay_s,
                    if w.force_off_on_timeout {
                        ", then force off"
                    } else {
                        ", never forced"
                    }
                ),
            };
            let ha = match &w.ha {
                Some(ha) => format!(" [ha: {}]", ha.nodes.join(", ")),
                None => String::new(),
            };
            let ready = match (w.ready, &w.ready_exec) {
                (config::Readiness::Exec, None) => String::new(),
                (config::Readiness::Exec, Some(probe)) => format!(" [ready when {} succeeds]", probe[0]),
                (config::Readiness::Notify, None) => " [ready at READY=1]".to_string(),
                (config::Readiness::Notify, Some(probe)) => {
                    format!(" [ready at READY=1, then when {} succeeds]", probe[0])
                }
            };
            let restart = match &w.restart {
                Some(p) if p.restarts() => format!(" — restart: {}", p.describe()),
                _ => String::new(),
            };
            out.push_str(&format!(
                "  {} ({}){}{ha}{}{}: {} — stop: {}{restart}\n",
                w.unit_name(),
                w.source.display(),
                match w.autostart {
                    config::Autostart::Yes => "",
                    config::Autostart::No => " [no autostart]",
                    config::Autostart::LastState => " [autostart: last-state]",
                },
                ready,
                if w.start_delay_s > 0 {
                    format!(" [then wait {}s]", w.start_delay_s)
                } else {
                    String::new()
                },
                runs,
                stop,
            ));
        }
    }
    for m in &loaded.masked {
        out.push_str(&format!("masked: {m}\n"));
    }
    if loaded
        .workloads
        .iter()
        .any(|w| w.restart.is_some_and(|p| p.restarts()))
    {
        out.push_str(RESTART_AND_THE_DRAIN);
    }
    if !loaded.workloads.is_empty() {
        out.push_str(&format!(
            "worst-case drain: {}s without the deadline; the deadline is {}s\n",
            plan::worst_case_drain_s(host, &loaded.workloads),
            host.drain_deadline_s
        ));
    }
    out
}
