//! `berth status`: a report that never fails (exit 0), in text or JSON.

use serde_json::Value;

use super::{say, with_systemd};
use crate::paths::{Manager, Root, UserEnvError};
use crate::status::{self, Unreachable};

pub(super) fn run(manager: Manager, root: Result<Root, UserEnvError>, json: bool) -> i32 {
    let mut v = match &root {
        Ok(root) => status::gather(root, || live(root)),
        Err(reason) => status::unusable(manager, &reason.to_string()),
    };
    let cluster = root.as_ref().ok().and_then(cluster);
    if let Some((c, _)) = &cluster {
        v["cluster"] = c.clone();
    }
    if json {
        say(&format!(
            "{}\n",
            serde_json::to_string_pretty(&v).unwrap_or_default()
        ));
    } else {
        let mut out = text(&v);
        if let Some((_, c)) = &cluster {
            out.push_str(c);
        }
        say(&out);
    }
    0
}

/// In cluster mode, the cluster as etcd tells it now (bounded wait): for
/// the JSON, and as text.
#[cfg(feature = "cluster")]
fn cluster(root: &Root) -> Option<(Value, String)> {
    let settings = crate::config::load(root).host.cluster?;
    Some(match super::ask_cluster(root, &settings, true) {
        Ok(view) => (
            serde_json::to_value(&view).unwrap_or_default(),
            crate::cluster::view::text(&view),
        ),
        Err(e) => (
            serde_json::json!({ "error": e }),
            format!("cluster: cannot ask etcd: {e}\n"),
        ),
    })
}

/// Without cluster mode there is no `[cluster]` to ask about.
#[cfg(not(feature = "cluster"))]
fn cluster(_root: &Root) -> Option<(Value, String)> {
    None
}

fn live(root: &Root) -> Result<serde_json::Map<String, Value>, Unreachable> {
    with_systemd(root, |sd| async move { Ok(status::live_units(&sd).await?) })
        .map_err(|e| Unreachable(format!("{e:#}")))
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
        Some(_) => out.push_str(&format!("frozen: {}\n", freeze_line(&v["frozen"]))),
        None => out.push_str("frozen: no\n"),
    }
    for i in v["frozen"]["instances"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  workload {}: {}\n",
            i["workload"].as_str().unwrap_or("?").escape_debug(),
            freeze_line(i)
        ));
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

/// `SCOPE since T, taken by N: REASON` of a freeze's summary; the reason
/// and the node may come from etcd, so they are escaped.
pub(super) fn freeze_line(f: &serde_json::Value) -> String {
    let mut line = f["frozen_scope"].as_str().unwrap_or("?").to_string();
    if let Some(t) = f["frozen_at"].as_str().filter(|t| !t.is_empty()) {
        line.push_str(&format!(" since {}", t.escape_debug()));
    }
    if let Some(n) = f["taken_by"].as_str() {
        line.push_str(&format!(", taken by {}", n.escape_debug()));
    }
    if let Some(r) = f["reason"].as_str().filter(|r| !r.is_empty()) {
        line.push_str(&format!(": {}", r.escape_debug()));
    }
    if f["covers"].is_object() {
        line.push_str(&format!(" (covering: {})", freeze_line(&f["covers"])));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freezes_show_scope_time_taker_and_an_escaped_reason() {
        let v = serde_json::json!({"frozen": {
            "frozen_scope": "cluster", "frozen_at": "T", "taken_by": "n2", "reason": "up\u{1b}grade",
            "instances": [{"workload": "db", "frozen_scope": "object", "frozen_at": "T2", "taken_by": "n1", "reason": ""}]
        }});
        let t = text(&v);
        assert!(
            t.contains("frozen: cluster since T, taken by n2: up\\u{1b}grade\n"),
            "{t}"
        );
        assert!(t.contains("  workload db: object since T2, taken by n1\n"), "{t}");
        let covering = serde_json::json!({"frozen": {
            "frozen_scope": "node", "frozen_at": "T3", "taken_by": null, "reason": "disk swap",
            "covers": {"frozen_scope": "cluster", "frozen_at": "T", "taken_by": "n2", "reason": "upgrade", "covers": null}
        }});
        assert!(
            text(&covering).contains(
                "frozen: node since T3: disk swap (covering: cluster since T, taken by n2: upgrade)\n"
            ),
            "{}",
            text(&covering)
        );
    }

    #[test]
    fn not_installed_reads_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let v = status::gather(&Root::new(dir.path()), || panic!("not installed: no D-Bus call"));
        assert!(text(&v).contains("installed: no"));
    }
}
