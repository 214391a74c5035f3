//! `berth list` and `berth inspect NAME`: the same data with or without a
//! daemon, from systemd (when reachable) and the records.

use std::collections::{BTreeSet, HashMap};

use futures_util::{StreamExt, stream};
use serde_json::{Value, json};

use super::{say, say_error, with_systemd};
use crate::config::{self, Loaded};
use crate::names::WorkloadUnits;
use crate::paths::Root;
use crate::state::records::{self, Record};
use crate::systemd::{ActiveState, Ops, UnitDetails};

/// Reads of unit details in flight at once: `berth list` of 5000
/// workloads read them one after the other, a round trip each.
const READS_IN_FLIGHT: usize = 64;

/// Every loaded `berth@*.service` with its details, by workload name, or
/// None when systemd cannot be asked.
async fn live_workloads<O: Ops>(sd: &O, map: &WorkloadUnits) -> Option<HashMap<String, UnitDetails>> {
    let units = sd.list_workloads(&map.existing_units()).await.ok()?;
    let reads = units.into_iter().filter_map(|u| {
        let name = map.workload_of(&u.name)?.to_string();
        Some(async move { sd.details(&u.name).await.ok().map(|d| (name, d)) })
    });
    Some(
        stream::iter(reads)
            .buffer_unordered(READS_IN_FLIGHT)
            .filter_map(|read| async move { read })
            .collect()
            .await,
    )
}

pub(super) fn run(root: &Root, only: Option<String>, json: bool) -> i32 {
    let loaded = config::load(root);
    let map = loaded.workload_units();
    let listing = map.clone();
    let live = with_systemd(root, |sd| async move { Ok(live_workloads(&sd, &listing).await) })
        .ok()
        .flatten();
    // Cluster mode: each HA workload's owner, as etcd tells it now (no
    // lease TTLs: only the owners are shown).
    #[cfg(not(feature = "cluster"))]
    let owners: Option<Result<HashMap<String, String>, String>> = None;
    #[cfg(feature = "cluster")]
    let owners: Option<Result<HashMap<String, String>, String>> =
        loaded.host.cluster.as_ref().map(|settings| {
            super::ask_cluster(root, settings, false).map(|v| {
                v.owners
                    .into_iter()
                    .filter_map(|o| Some((o.workload, o.node?)))
                    .collect()
            })
        });
    // Sets and maps, not searches of lists: those were quadratic.
    let mut names: BTreeSet<String> = loaded.workloads.iter().map(|w| w.name.clone()).collect();
    names.extend(live.iter().flat_map(|l| l.keys().cloned()));
    if let Some(only) = &only {
        if !names.contains(only) && records::load(root, only).ok().flatten().is_none() {
            say_error(&format!(
                "berth inspect: no workload {only:?} (not configured, not loaded, no record)"
            ));
            return 1;
        }
        names = BTreeSet::from([only.clone()]);
    }
    let freezes = crate::state::freeze::all(root);
    let mut rows = Vec::new();
    for name in &names {
        let record = records::load(root, name).ok().flatten();
        let details = live.as_ref().and_then(|l| l.get(name));
        let active_state = match (details, &live) {
            (Some(d), _) => d.active_state.as_str().to_string(),
            (None, Some(_)) => ActiveState::Inactive.as_str().to_string(),
            (None, None) => "unknown".to_string(),
        };
        let mut row = json!({
            "name": name,
            "unit": map.unit_of(name),
            "configured": loaded.workload(name).is_some(),
            "active_state": active_state,
            "main_pid": details.map(|d| d.main_pid),
            "invocation_id": details.map(|d| d.invocation_id.clone()),
            // systemd's automatic restarts since systemd last reset the count.
            "restarts": details.and_then(|d| d.n_restarts),
            "restart_pending": restart_pending(root, &loaded, name, details, record.as_ref()),
            "record": record,
            // What holds it back: its own freeze, else the node's.
            "frozen": freezes.of(name).map(|f| f.summary()),
        });
        // An HA workload: its owner (null: nobody), or why it is unknown.
        if loaded.workload(name).is_some_and(|w| w.ha.is_some()) {
            match &owners {
                Some(Ok(o)) => row["owner"] = json!(o.get(name)),
                Some(Err(e)) => row["owner_unknown"] = json!(e),
                None => {}
            }
        }
        rows.push(row);
    }
    if json {
        let value = if only.is_some() {
            rows.remove(0)
        } else {
            Value::Array(rows)
        };
        say(&format!("{}\n", pretty(&value)));
        return 0;
    }
    let mut out = String::new();
    if let Some(Err(e)) = &owners {
        out.push_str(&format!("(etcd not reachable: owners unknown: {e})\n"));
    }
    let node_frozen = freezes.node.as_ref().map(|f| f.summary());
    out.push_str(&text(&rows, live.is_some(), only.is_some(), node_frozen.as_ref()));
    say(&out);
    0
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

fn text(rows: &[Value], reachable: bool, inspect: bool, node_frozen: Option<&Value>) -> String {
    let mut out = String::new();
    if !reachable {
        out.push_str("(systemd not reachable: live state unknown)\n");
    }
    // The node's freeze once; a workload's own in a note.
    if let Some(f) = node_frozen {
        out.push_str(&format!(
            "note: the node is frozen: {}\n",
            super::status::freeze_line(f)
        ));
    }
    for r in rows {
        if matches!(r["frozen"]["frozen_scope"].as_str(), Some("instance" | "object")) {
            out.push_str(&format!(
                "note: {} is frozen: {}\n",
                r["unit"].as_str().unwrap_or("").escape_debug(),
                super::status::freeze_line(&r["frozen"])
            ));
        }
        if r["restart_pending"] == true {
            out.push_str(&format!(
                "note: {} runs an older definition; it applies at its next start (restart pending)\n",
                r["unit"].as_str().unwrap_or("")
            ));
        }
    }
    // An OWNER column in cluster mode: HA workloads' rows carry one.
    let cluster = rows
        .iter()
        .any(|r| r.get("owner").is_some() || r.get("owner_unknown").is_some());
    // The AT column padded only when one follows it.
    let at = |t: &str| {
        if cluster {
            format!("{t:<25}")
        } else {
            t.to_string()
        }
    };
    out.push_str(&format!(
        "{:<24} {:<10} {:>8} {:>4}  {:<16} {}{}\n",
        "WORKLOAD",
        "STATE",
        "PID",
        "GEN",
        "LAST",
        at("AT"),
        if cluster { " OWNER" } else { "" }
    ));
    for r in rows {
        let rec = &r["record"];
        let owner = match (r.get("owner"), r.get("owner_unknown")) {
            (Some(Value::String(n)), _) => format!(" {}", n.escape_debug()),
            (Some(_), _) => " (none)".to_string(),
            (None, Some(_)) => " ?".to_string(),
            (None, None) if cluster => " -".to_string(),
            (None, None) => String::new(),
        };
        out.push_str(&format!(
            "{:<24} {:<10} {:>8} {:>4}  {:<16} {}{}\n",
            r["name"].as_str().unwrap_or(""),
            r["active_state"].as_str().unwrap_or(""),
            r["main_pid"]
                .as_u64()
                .map(|p| p.to_string())
                .unwrap_or_else(|| "-".into()),
            rec["transition_generation"]
                .as_u64()
                .map(|g| g.to_string())
                .unwrap_or_else(|| "-".into()),
            rec["last_transition_reason"].as_str().unwrap_or("-"),
            at(rec["last_transition_at"].as_str().unwrap_or("-")),
            owner
        ));
        if inspect && !rec.is_null() {
            out.push_str(&format!("{}\n", pretty(rec)));
        }
    }
    out
}

/// A running workload whose definition changed since it started: the
/// change applies at its next start.
fn restart_pending(
    root: &Root,
    loaded: &Loaded,
    name: &str,
    details: Option<&UnitDetails>,
    record: Option<&Record>,
) -> bool {
    let running = details.is_some_and(|d| d.active_state == ActiveState::Active);
    match (
        running,
        loaded.workload(name),
        record.and_then(|r| r.definition.as_deref()),
    ) {
        (true, Some(w), Some(started_with)) => crate::render::definition_fingerprint(root, w) != started_with,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 13, point 7: in cluster mode an OWNER column; outside it the
    /// table is as it was (no trailing padding).
    #[test]
    fn the_owner_column_appears_in_cluster_mode_only() {
        let plain = json!({"name": "web", "active_state": "active", "main_pid": 7, "record": null});
        let single = text(std::slice::from_ref(&plain), true, false, None);
        assert!(
            single.lines().all(|l| !l.ends_with(' ') && !l.contains("OWNER")),
            "{single}"
        );
        let rows = [
            json!({"name": "db", "active_state": "active", "main_pid": 7, "record": null, "owner": "n1"}),
            json!({"name": "queue", "active_state": "inactive", "record": null, "owner": null}),
            json!({"name": "evil", "active_state": "inactive", "record": null, "owner": "n\u{1b}2"}),
            json!({"name": "cache", "active_state": "inactive", "record": null, "owner_unknown": "timeout"}),
            plain,
        ];
        let cluster = text(&rows, true, false, None);
        let ends: Vec<&str> = cluster
            .lines()
            .map(|l| l.rsplit_once(' ').map_or(l, |(_, last)| last))
            .collect();
        assert_eq!(
            ends,
            ["OWNER", "n1", "(none)", "n\\u{1b}2", "?", "-"],
            "{cluster}"
        );
    }

    /// Issue 14: the node's freeze once (also when every workload has a
    /// freeze of its own, which then shows instead in its row), each
    /// workload's own in a note, with scope, time and taker; the table
    /// itself is unchanged.
    #[test]
    fn freezes_are_noted_above_the_table() {
        let node =
            json!({"frozen_scope": "cluster", "frozen_at": "T", "taken_by": "n2", "reason": "upgrade"});
        let object =
            json!({"frozen_scope": "object", "frozen_at": "T2", "taken_by": "n\u{1b}1", "reason": ""});
        let rows = [
            json!({"name": "db", "unit": "berth@db.service", "active_state": "inactive", "record": null, "frozen": object}),
        ];
        let out = text(&rows, true, false, Some(&node));
        let notes: Vec<&str> = out.lines().take_while(|l| l.starts_with("note:")).collect();
        assert_eq!(
            notes,
            [
                "note: the node is frozen: cluster since T, taken by n2: upgrade",
                "note: berth@db.service is frozen: object since T2, taken by n\\u{1b}1",
            ],
            "{out}"
        );
        let plain = json!({"name": "web", "active_state": "active", "record": null, "frozen": null});
        assert!(text(&[plain], true, false, None).starts_with("WORKLOAD"));
    }
}
