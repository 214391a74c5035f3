//! The key layout under `[cluster] prefix` (default `/berth/`), and the
//! values stored there (JSON). Designed for all three cluster issues;
//! each key says who writes it and whether it outlives its writer.
//!
//! | key                        | lease            | written by                  |
//! |----------------------------|------------------|-----------------------------|
//! | `nodes/N`                  | N's live lease (maintenance lease while in maintenance) | N's daemon (presence) |
//! | `members/N`                | none (persistent) | N's daemon, once; `berth cluster forget N` deletes it |
//! | `last-state/N`             | none (persistent) | N's daemon and drain, at each state change |
//! | `owners/W`                 | the owner's lease | the owner, create-if-absent; its drain deletes it |
//! | `freeze/cluster`           | none             | `berth freeze --cluster`; `berth thaw --cluster` deletes it |
//! | `freeze/objects/W`         | none             | `berth freeze W --cluster`; `berth thaw W --cluster` deletes it |
//!
//! Node and workload names are checked by the config (letters, digits,
//! `-`, `_`, `.`): no name can reach outside its directory.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// Key paths under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// `prefix` begins and ends with `/` (the config checks it).
    pub fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.to_string(),
        }
    }

    pub fn nodes(&self) -> String {
        format!("{}nodes/", self.prefix)
    }
    pub fn node(&self, node: &str) -> String {
        format!("{}nodes/{node}", self.prefix)
    }
    pub fn members(&self) -> String {
        format!("{}members/", self.prefix)
    }
    pub fn member(&self, node: &str) -> String {
        format!("{}members/{node}", self.prefix)
    }
    pub fn last_state(&self, node: &str) -> String {
        format!("{}last-state/{node}", self.prefix)
    }
    pub fn owners(&self) -> String {
        format!("{}owners/", self.prefix)
    }
    pub fn owner(&self, workload: &str) -> String {
        format!("{}owners/{workload}", self.prefix)
    }
    pub fn last_owners(&self) -> String {
        format!("{}last-owner/", self.prefix)
    }
    pub fn last_owner(&self, workload: &str) -> String {
        format!("{}last-owner/{workload}", self.prefix)
    }
    pub fn cluster_freeze(&self) -> String {
        format!("{}freeze/cluster", self.prefix)
    }
    pub fn object_freeze(&self, workload: &str) -> String {
        format!("{}freeze/objects/{workload}", self.prefix)
    }
    pub fn freezes(&self) -> String {
        format!("{}freeze/", self.prefix)
    }
    pub fn object_freezes(&self) -> String {
        format!("{}freeze/objects/", self.prefix)
    }

    /// The last component of a key under `dir` (`nodes/`, `owners/`…);
    /// None for a key elsewhere or deeper.
    pub fn name_in<'k>(&self, dir: &str, key: &'k str) -> Option<&'k str> {
        let name = key.strip_prefix(dir)?;
        (!name.is_empty() && !name.contains('/')).then_some(name)
    }
}

/// A node's state, in its presence key and its last-state key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeState {
    /// Its daemon runs and keeps its lease alive.
    Up,
    /// Its daemon is restarting or stopped by hand: its keys sit on a
    /// maintenance lease for the grace period; peers move nothing.
    Maintenance,
    /// Its host is shutting down: the drain runs.
    ShuttingDown,
    /// The drain is done: its HA workloads are released.
    Drained,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Up => "up",
            NodeState::Maintenance => "maintenance",
            NodeState::ShuttingDown => "shutting-down",
            NodeState::Drained => "drained",
        }
    }
}

/// `nodes/N`: the node's presence, bound to its lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Presence {
    pub state: NodeState,
    pub boot_id: String,
    /// Since when it has been in this state (RFC 3339).
    pub since: String,
    /// Its HA workloads and a hash of each one's candidate list, so that
    /// peers see who has a workload configured, and with which list.
    #[serde(default)]
    pub ha: BTreeMap<String, String>,
    /// The berth version that wrote it.
    #[serde(default)]
    pub version: String,
    /// The node is frozen (node freeze): it takes no HA workload.
    #[serde(default)]
    pub frozen: bool,
    /// HA workloads nobody owns that this node waits a stop bound of its
    /// own for, because it did not see their owner key go (it joined,
    /// restarted or listed anew since): a later candidate that is not
    /// waiting takes them first (placement). Older versions neither
    /// write nor read it.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub waiting: BTreeSet<String>,
    /// The timeout of the hardware watchdog the node declares (`[cluster]
    /// watchdog`): the owner keys it writes carry the shorter wait it
    /// allows. Informative: peers wait what each owner key says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watchdog_s: Option<u64>,
}

/// `members/N`: a node that joined the cluster, until forgotten.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub joined_at: String,
}

/// `last-state/N`: the state a node last announced, kept when its lease
/// is gone (the rejoin of issue 14 reads it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastState {
    pub state: NodeState,
    pub boot_id: String,
    pub at: String,
}

/// `owners/W`: who runs HA workload W, bound to the owner's lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub node: String,
    /// The longest the owner may take to stop it once its key is gone:
    /// a peer starts it no earlier than the deletion plus this.
    pub stop_bound_s: u64,
    pub since: String,
    /// The owner's boot when it took the workload; empty from versions
    /// that did not say.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub boot_id: String,
    /// The timeout of the watchdog the owner held when it wrote the key
    /// (its wait may count on it): `owner-check` starts the workload only
    /// where a watchdog of at most that timeout is held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watchdog_s: Option<u64>,
}

/// `last-owner/W`: who took HA workload W last, in which boot, with which
/// stop bound. Written in the take's own transaction, on no lease: it
/// outlives the owner key, so that a node that did not see that key go
/// knows whom it waits for, and how long (or that nobody ever owned W).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastOwner {
    pub node: String,
    pub boot_id: String,
    pub stop_bound_s: u64,
}

/// `freeze/cluster` and `freeze/objects/W`: a freeze of every node, or
/// of one workload on every node that has it. Each daemon adopts it as a
/// node or instance freeze (`berth freeze --cluster`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterFreeze {
    /// The node where `berth freeze --cluster` ran.
    pub taken_by: String,
    pub frozen_at: String,
    #[serde(default)]
    pub reason: String,
}

/// The owner's stop bound for a unit: systemd applies TimeoutStopSec= to
/// each ExecStop= command and again to the main process, plus 5 s for the
/// final SIGKILL to land. None for an unbounded stop (infinity), which
/// `berth check` refuses for HA workloads.
pub fn stop_bound_s(exec_stop_commands: usize, timeout_stop_s: Option<u64>) -> Option<u64> {
    timeout_stop_s.map(|t| (exec_stop_commands as u64 + 1) * t + 5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout() {
        let k = Keys::new("/berth/");
        assert_eq!(k.node("n1"), "/berth/nodes/n1");
        assert_eq!(k.member("n1"), "/berth/members/n1");
        assert_eq!(k.last_state("n1"), "/berth/last-state/n1");
        assert_eq!(k.owner("db"), "/berth/owners/db");
        assert_eq!(k.cluster_freeze(), "/berth/freeze/cluster");
        assert_eq!(k.object_freeze("db"), "/berth/freeze/objects/db");
        assert_eq!(k.name_in(&k.owners(), "/berth/owners/db"), Some("db"));
        assert_eq!(k.name_in(&k.owners(), "/berth/owners/"), None);
        assert_eq!(k.name_in(&k.owners(), "/berth/owners/a/b"), None);
        assert_eq!(k.name_in(&k.owners(), "/berth/nodes/n1"), None);
        let other = Keys::new("/site-a/berth/");
        assert_eq!(other.node("n1"), "/site-a/berth/nodes/n1");
    }

    #[test]
    fn values_as_json() {
        let p = Presence {
            state: NodeState::ShuttingDown,
            boot_id: "b".into(),
            since: "T".into(),
            ha: BTreeMap::from([("db".to_string(), "00ff".to_string())]),
            version: "0.1.0".into(),
            frozen: false,
            waiting: BTreeSet::new(),
            watchdog_s: None,
        };
        let text = serde_json::to_string(&p).unwrap();
        // No `waiting` when empty: what older versions wrote.
        assert_eq!(
            text,
            r#"{"state":"shutting-down","boot_id":"b","since":"T","ha":{"db":"00ff"},"version":"0.1.0","frozen":false}"#
        );
        assert_eq!(serde_json::from_str::<Presence>(&text).unwrap(), p);
        let waiting = Presence {
            waiting: BTreeSet::from(["db".to_string()]),
            ..p.clone()
        };
        let text = serde_json::to_string(&waiting).unwrap();
        assert!(text.ends_with(r#""frozen":false,"waiting":["db"]}"#), "{text}");
        assert_eq!(serde_json::from_str::<Presence>(&text).unwrap(), waiting);
        let watched = Presence {
            watchdog_s: Some(10),
            ..p.clone()
        };
        let text = serde_json::to_string(&watched).unwrap();
        assert!(text.ends_with(r#""frozen":false,"watchdog_s":10}"#), "{text}");
        assert_eq!(serde_json::from_str::<Presence>(&text).unwrap(), watched);
        // What a newer version may add is ignored, not refused: a peer's
        // presence must never become unreadable (absent) by an upgrade.
        let newer = r#"{"state":"up","boot_id":"b","since":"T","future":1}"#;
        assert_eq!(
            serde_json::from_str::<Presence>(newer).unwrap().state,
            NodeState::Up
        );
    }

    /// (ExecStop= commands, TimeoutStopSec=) → bound.
    #[test]
    fn stop_bounds() {
        assert_eq!(stop_bound_s(0, Some(60)), Some(65));
        assert_eq!(stop_bound_s(1, Some(90)), Some(185));
        assert_eq!(stop_bound_s(2, Some(10)), Some(35));
        assert_eq!(stop_bound_s(1, None), None);
    }
}
