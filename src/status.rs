//! `berth status`: is berth installed, loaded, healthy, frozen, and what
//! did the last drain do. It never fails: what it cannot learn it reports
//! with the reason, and it exits 0.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::config;
use crate::names::{AUTOSTART, DAEMON, DRAIN, TARGET};
use crate::paths::{Manager, Root, unit_dirs};
use crate::state::drain_report;
use crate::state::freeze;
use crate::systemd::{ActiveState, Ops, SystemdError};
use crate::time::parse_rfc3339;

const UNITS: [&str; 4] = [TARGET, DRAIN, AUTOSTART, DAEMON];

/// Why systemd could not be asked: told in the status, never a failure.
#[derive(Debug)]
pub struct Unreachable(pub String);

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The berth units' ActiveState and MainPID, from the manager.
pub async fn live_units<O: Ops>(sd: &O) -> Result<serde_json::Map<String, Value>, SystemdError> {
    let mut units = serde_json::Map::new();
    for unit in UNITS {
        // A target has no Service interface, hence no MainPID.
        let (active_state, main_pid) = if unit.ends_with(".service") {
            let details = sd.details(unit).await?;
            (details.active_state, details.main_pid)
        } else {
            (sd.active_state(unit).await?, 0)
        };
        units.insert(
            unit.into(),
            json!({"active_state": active_state, "main_pid": main_pid}),
        );
    }
    Ok(units)
}

/// Status when the user's environment itself is unusable (no HOME, no
/// XDG_RUNTIME_DIR): still an answer, with the reason.
pub fn unusable(manager: Manager, reason: &str) -> Value {
    json!({
        "manager": manager_name(manager),
        "installed": null,
        "loaded": false,
        "reason": reason,
        "frozen": {"frozen_scope": null},
        "last_drain": null,
        "config_errors": 0,
    })
}

fn manager_name(manager: Manager) -> &'static str {
    match manager {
        Manager::System => "system",
        Manager::User => "user",
    }
}

/// The whole status; `live` asks the manager, and is called only when
/// berth is installed.
pub fn gather(
    root: &Root,
    live: impl FnOnce() -> Result<serde_json::Map<String, Value>, Unreachable>,
) -> Value {
    let unit_file = unit_dirs(root)
        .into_iter()
        .map(|d| d.join(DRAIN))
        .find(|p| p.exists());
    let loaded = config::load(root);
    let mut out = json!({
        "manager": manager_name(root.manager()),
        "installed": unit_file.is_some(),
        "unit_file": unit_file.as_ref().map(|p| p.display().to_string()),
        "config_errors": loaded.errors.len(),
        "frozen": frozen(root, &loaded),
        "last_drain": last_drain(root),
    });
    if unit_file.is_none() {
        // Not installed: no D-Bus call at all.
        out["loaded"] = json!(false);
        out["reason"] = json!("berth's units are not installed");
        return out;
    }
    // A user manager without a user bus still answers systemctl on its
    // private socket: a missing bus alone does not make it unusable.
    let live = match live() {
        Err(reason) if root.manager() == Manager::User => {
            via_systemctl(Manager::User).map_err(|e| Unreachable(format!("{reason}; systemctl --user: {e}")))
        }
        other => other,
    };
    match live {
        Ok(units) => {
            out["loaded"] = json!(true);
            let daemon_active = units[DAEMON]["active_state"] == ActiveState::Active.as_str();
            out["daemon"] = daemon_health(root, &loaded, daemon_active);
            out["units"] = Value::Object(units);
        }
        Err(reason) => {
            out["loaded"] = json!(false);
            out["reason"] = json!(format!("systemd is not usable here: {reason}"));
        }
    }
    out
}

/// The berth units' state from `systemctl show` (which uses the manager's
/// private socket), when the bus is not there.
fn via_systemctl(manager: Manager) -> Result<serde_json::Map<String, Value>, Unreachable> {
    // In the C locale, like every program whose output berth parses.
    let out = std::process::Command::new("systemctl")
        .env("LC_ALL", "C")
        .args([manager.flag(), "show", "--property=Id,ActiveState,MainPID"])
        .args(UNITS)
        .output()
        .map_err(|e| Unreachable(e.to_string()))?;
    if !out.status.success() {
        return Err(Unreachable(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut units = serde_json::Map::new();
    for (block, unit) in text.split("\n\n").zip(UNITS) {
        let field = |name: &str| {
            block
                .lines()
                .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
                .unwrap_or("")
                .to_string()
        };
        let main_pid: u32 = field("MainPID").parse().unwrap_or(0);
        units.insert(
            unit.into(),
            json!({"active_state": field("ActiveState"), "main_pid": main_pid}),
        );
    }
    if units.len() != UNITS.len() {
        return Err(Unreachable(format!("unexpected output: {text}")));
    }
    Ok(units)
}

/// The daemon's health from its status file; a heartbeat that stopped
/// advancing makes a live daemon `degraded`.
fn daemon_health(root: &Root, loaded: &config::Loaded, active: bool) -> Value {
    if !active {
        return json!({"running": false});
    }
    let path = root.runtime_dir().join("status.json");
    let Some(doc) = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
    else {
        return json!({"running": true, "health": "degraded", "reason": "no status file yet"});
    };
    let stale_after = Duration::from_secs(loaded.host.daemon.reconcile_interval_s * 3 + 5);
    let heartbeat = doc["heartbeat_at"].as_str().unwrap_or("").to_string();
    let age = parse_rfc3339(&heartbeat).and_then(|t| SystemTime::now().duration_since(t).ok());
    let stale = age.is_none_or(|a| a > stale_after);
    json!({
        "running": true,
        "health": if stale { "degraded" } else { doc["health"].as_str().unwrap_or("degraded") },
        "heartbeat_at": heartbeat,
        "heartbeat_stale": stale,
        "failed": doc["failed"],
        "unconverged": doc["unconverged"],
    })
}

/// The node's freeze (scope `node` or `cluster`) and the workloads' own
/// (`instance` or `object`), each with `frozen_at`, its reason and, for an
/// adopted one, the node that took it.
fn frozen(root: &Root, loaded: &config::Loaded) -> Value {
    let all = freeze::all(root);
    let instances: Vec<Value> = loaded
        .workloads
        .iter()
        .filter_map(|w| {
            let mut v = all.instances.get(&w.name)?.summary();
            v["workload"] = json!(w.name);
            Some(v)
        })
        .collect();
    let mut v = match &all.node {
        Some(node) => node.summary(),
        None if instances.is_empty() => return json!({"frozen_scope": null}),
        None => json!({"frozen_scope": "instance"}),
    };
    if !instances.is_empty() {
        v["instances"] = Value::Array(instances);
    }
    v
}

fn last_drain(root: &Root) -> Value {
    let Ok((_, report)) = drain_report::read(root) else {
        return Value::Null;
    };
    let counts: serde_json::Map<String, Value> = report
        .counts()
        .into_iter()
        .map(|(outcome, n)| (outcome.as_str().to_string(), json!(n)))
        .collect();
    json!({
        "finished_at": report.finished_at,
        "elapsed_ms": report.elapsed_ms,
        "deadline_reached": report.deadline_reached,
        "shutdown": report.shutdown,
        "outcomes": counts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_installed_means_no_dbus_and_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let v = gather(&Root::new(dir.path()), || panic!("not installed: no D-Bus call"));
        assert_eq!(v["installed"], false);
        assert_eq!(v["loaded"], false);
        assert!(v["reason"].as_str().unwrap().contains("not installed"));
    }
}
