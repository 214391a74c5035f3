//! `berth status`: is berth installed, loaded, healthy, frozen, and what
//! did the last drain do. It never fails: what it cannot learn it reports
//! with the reason, and it exits 0.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::config;
use crate::freeze::{self, Scope};
use crate::paths::{Manager, Root, unit_dirs};
use crate::systemd::{self, Systemd};

const UNITS: [&str; 4] = [
    "berth.target",
    "berth-drain.service",
    "berth-autostart.service",
    "berth-daemon.service",
];

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

pub fn gather(root: &Root) -> Value {
    let unit_file = unit_dirs(root)
        .into_iter()
        .map(|d| d.join("berth-drain.service"))
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
    let live = systemd::runtime().map_err(|e| e.to_string()).and_then(|rt| {
        rt.block_on(async {
            let sd = Systemd::connect(root.manager())
                .await
                .map_err(|e| e.to_string())?;
            let mut units = serde_json::Map::new();
            for unit in UNITS {
                let active_state = sd.active_state(unit).await.map_err(|e| e.to_string())?;
                let main_pid = if unit.ends_with(".service") {
                    sd.details(unit).await.map(|d| d.main_pid).unwrap_or(0)
                } else {
                    0
                };
                units.insert(
                    unit.into(),
                    json!({"active_state": active_state, "main_pid": main_pid}),
                );
            }
            Ok::<_, String>(units)
        })
    });
    // A user manager without a user bus still answers systemctl on its
    // private socket: a missing bus alone does not make it unusable.
    let live = match live {
        Err(reason) if root.manager() == Manager::User => {
            via_systemctl(Manager::User).map_err(|e| format!("{reason}; systemctl --user: {e}"))
        }
        other => other,
    };
    match live {
        Ok(units) => {
            out["loaded"] = json!(true);
            let daemon_active = units["berth-daemon.service"]["active_state"] == "active";
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
fn via_systemctl(manager: Manager) -> Result<serde_json::Map<String, Value>, String> {
    let out = std::process::Command::new("systemctl")
        .args([manager.flag(), "show", "--property=Id,ActiveState,MainPID"])
        .args(UNITS)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
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
        return Err(format!("unexpected output: {text}"));
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
    let Ok(doc) = std::fs::read(&path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice::<Value>(&b).map_err(|e| e.to_string()))
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

fn frozen(root: &Root, loaded: &config::Loaded) -> Value {
    if freeze::cmdline_freeze(&freeze::kernel_command_line()) {
        return json!({"frozen_scope": "node", "frozen_at": null, "reason": "berth.freeze on the kernel command line"});
    }
    if let Ok(Some(f)) = freeze::read(&freeze::node_flag(root), Scope::Node, None) {
        return json!({"frozen_scope": "node", "frozen_at": f.frozen_at, "reason": f.reason});
    }
    let instances: Vec<Value> = loaded
        .workloads
        .iter()
        .filter_map(|w| {
            freeze::read(
                &freeze::instance_flag(root, &w.name),
                Scope::Instance,
                Some(&w.name),
            )
            .ok()
            .flatten()
            .map(|f| json!({"workload": w.name, "frozen_at": f.frozen_at, "reason": f.reason}))
        })
        .collect();
    if instances.is_empty() {
        json!({"frozen_scope": null})
    } else {
        json!({"frozen_scope": "instance", "instances": instances})
    }
}

fn last_drain(root: &Root) -> Value {
    let path = root.state_dir().join("last-drain.json");
    let Ok(report) = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice::<crate::drain::Report>(&b).ok())
        .ok_or(())
    else {
        return Value::Null;
    };
    let mut counts = serde_json::Map::new();
    for w in &report.workloads {
        let n = counts.entry(w.outcome.as_str()).or_insert(json!(0));
        *n = json!(n.as_u64().unwrap_or(0) + 1);
    }
    json!({
        "finished_at": report.finished_at,
        "elapsed_ms": report.elapsed_ms,
        "deadline_reached": report.deadline_reached,
        "outcomes": counts,
    })
}

/// Whole-second UTC RFC 3339, as berth writes it.
fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() != 20 || b[4] != b'-' || b[10] != b'T' || b[19] != b'Z' {
        return None;
    }
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d, hh, mm, ss) = (n(0..4)?, n(5..7)?, n(8..10)?, n(11..13)?, n(14..16)?, n(17..19)?);
    // Days from civil (H. Hinnant), the inverse of freeze::rfc3339.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    u64::try_from(secs)
        .ok()
        .map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s))
}

pub fn text(v: &Value) -> String {
    let mut out = String::new();
    let yes = |b: &Value| if b == true { "yes" } else { "no" };
    if let Some(manager) = v["manager"].as_str() {
        out.push_str(&format!("manager: {manager}\n"));
    }
    out.push_str(&format!("installed: {}\n", yes(&v["installed"])));
    out.push_str(&format!("loaded: {}", yes(&v["loaded"])));
    if let Some(reason) = v["reason"].as_str() {
        out.push_str(&format!(" ({reason})"));
    }
    out.push('\n');
    if let Some(units) = v["units"].as_object() {
        for (unit, u) in units {
            out.push_str(&format!(
                "  {unit}: {}{}\n",
                u["active_state"].as_str().unwrap_or("?"),
                u["main_pid"]
                    .as_u64()
                    .filter(|p| *p > 0)
                    .map(|p| format!(" (pid {p})"))
                    .unwrap_or_default()
            ));
        }
    }
    if let Some(health) = v["daemon"]["health"].as_str() {
        out.push_str(&format!("daemon: {health}"));
        if v["daemon"]["heartbeat_stale"] == true {
            out.push_str(" (heartbeat stopped advancing)");
        }
        out.push('\n');
    }
    match v["frozen"]["frozen_scope"].as_str() {
        Some(scope) => out.push_str(&format!(
            "frozen: {scope}{}\n",
            v["frozen"]["frozen_at"]
                .as_str()
                .filter(|t| !t.is_empty())
                .map(|t| format!(" since {t}"))
                .unwrap_or_default()
        )),
        None => out.push_str("frozen: no\n"),
    }
    if !v["last_drain"].is_null() {
        out.push_str(&format!(
            "last drain: {} in {} ms: {}\n",
            v["last_drain"]["finished_at"].as_str().unwrap_or("?"),
            v["last_drain"]["elapsed_ms"],
            v["last_drain"]["outcomes"]
        ));
    }
    if v["config_errors"].as_u64().unwrap_or(0) > 0 {
        out.push_str(&format!(
            "config: {} problem(s); see berth check\n",
            v["config_errors"]
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trip() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_971_581);
        assert_eq!(parse_rfc3339(&freeze::rfc3339(t)), Some(t));
        assert_eq!(parse_rfc3339("garbage"), None);
    }

    #[test]
    fn not_installed_means_no_dbus_and_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let v = gather(&Root::new(dir.path()));
        assert_eq!(v["installed"], false);
        assert_eq!(v["loaded"], false);
        assert!(v["reason"].as_str().unwrap().contains("not installed"));
        assert!(text(&v).contains("installed: no"));
    }
}
