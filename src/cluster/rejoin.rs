//! The rejoin grace: a daemon starting after a boot (a new boot id; a
//! restart within one boot is maintenance) takes no HA workload until it
//! has heard every missing peer, or `rejoin_grace_period_s` has passed
//! since its first contact with etcd (so that an etcd outage during the
//! restart of every node freezes nobody). At expiry with a peer still
//! missing it freezes its own node: a peer it cannot hear may still run
//! what this node would take.
//!
//! A peer is missing when `members/N` exists, `last-state/N` is `up` or
//! `maintenance`, and `nodes/N` is on no lease (a node in maintenance has
//! one on its maintenance lease). A peer that drained (powered off on
//! purpose) is not missing.
//!
//! "After a boot" is "no rejoin finished in this boot": the first daemon
//! of a boot marks it in /run once its grace is over, so a restart within
//! the boot is maintenance, and a daemon restarted in the middle of the
//! grace waits again rather than skip it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use etcd_client::{Client, GetOptions};

use super::keys::{Keys, LastState, NodeState};
use super::node::Node;
use super::session;

/// Whether this boot's rejoin is still to do (no mark of this boot).
pub fn pending(runtime_dir: &Path, boot_id: &str) -> bool {
    crate::state::cluster::read_rejoined(runtime_dir).is_none_or(|b| b != boot_id)
}

/// Marks this boot's rejoin as done.
pub fn done(runtime_dir: &Path, boot_id: &str) -> std::io::Result<()> {
    crate::state::cluster::write_rejoined(runtime_dir, boot_id)
}

/// The peers this node has not heard.
pub fn missing(
    node: &str,
    members: &BTreeSet<String>,
    last_states: &BTreeMap<String, NodeState>,
    present: &BTreeSet<String>,
) -> Vec<String> {
    members
        .iter()
        .filter(|m| *m != node && !present.contains(*m))
        .filter(|m| matches!(last_states.get(*m), Some(NodeState::Up | NodeState::Maintenance)))
        .cloned()
        .collect()
}

/// Reads members, last states and presences; None when etcd did not
/// answer (an unanswered read decides nothing).
async fn look(client: &mut Client, keys: &Keys, node: &str) -> Option<Vec<String>> {
    let names = |r: &etcd_client::GetResponse, dir: &str| -> BTreeSet<String> {
        r.kvs()
            .iter()
            .filter_map(|kv| Some(keys.name_in(dir, kv.key_str().ok()?)?.to_string()))
            .collect()
    };
    let keys_only = || Some(GetOptions::new().with_prefix().with_keys_only());
    let members = session::get(client, &keys.members(), keys_only()).await.ok()?;
    let members = names(&members, &keys.members());
    let present = session::get(client, &keys.nodes(), keys_only()).await.ok()?;
    let present = names(&present, &keys.nodes());
    let dir = keys.last_state("");
    let states = session::list_dir(client, &dir).await.ok()?;
    let last_states = states
        .kvs()
        .iter()
        .filter_map(|kv| {
            let n = keys.name_in(&dir, kv.key_str().ok()?)?;
            let s: LastState = serde_json::from_slice(kv.value()).ok()?;
            Some((n.to_string(), s.state))
        })
        .collect();
    Some(missing(node, &members, &last_states, &present))
}

/// Waits until no peer is missing, or the grace (from `since`, the first
/// contact) has passed; the peers still missing then (empty: ready).
pub async fn grace(client: &mut Client, node: &Node, since: tokio::time::Instant) -> Vec<String> {
    let events = &node.events;
    let until = since + Duration::from_secs(node.settings.rejoin_grace_period_s);
    let mut said: Option<Vec<String>> = None;
    loop {
        if let Some(now_missing) = look(client, &node.keys, &node.name).await {
            if now_missing.is_empty() {
                if said.is_some() {
                    events.info("cluster: rejoin: every peer is heard; taking part again");
                }
                return now_missing;
            }
            if tokio::time::Instant::now() >= until {
                return now_missing;
            }
            if said.as_ref() != Some(&now_missing) {
                events.info(&format!(
                    "cluster: rejoin after a boot: waiting up to {} s for peer(s) {} (members, last state up or maintenance, no node key); taking nothing meanwhile",
                    until.saturating_duration_since(tokio::time::Instant::now()).as_secs(),
                    now_missing.join(" ")
                ));
                said = Some(now_missing);
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rejoin_is_pending_until_marked_for_this_boot() {
        let dir = tempfile::tempdir().unwrap();
        assert!(pending(dir.path(), "b1"));
        done(dir.path(), "b1").unwrap();
        assert!(!pending(dir.path(), "b1"));
        // A /run that outlived a boot (not a tmpfs) does not skip the next.
        assert!(pending(dir.path(), "b2"));
    }

    #[test]
    fn who_is_missing() {
        let set = |names: &[&str]| -> BTreeSet<String> { names.iter().map(|s| s.to_string()).collect() };
        use NodeState::*;
        let states = |pairs: &[(&str, NodeState)]| -> BTreeMap<String, NodeState> {
            pairs.iter().map(|(n, s)| (n.to_string(), *s)).collect()
        };
        // (what, members, last states, present) → missing, as seen by n1
        type Case<'a> = (
            &'a str,
            BTreeSet<String>,
            BTreeMap<String, NodeState>,
            BTreeSet<String>,
            Vec<&'a str>,
        );
        let cases: Vec<Case> = vec![
            (
                "single node: ready at once",
                set(&["n1"]),
                states(&[("n1", Up)]),
                set(&[]),
                vec![],
            ),
            (
                "a peer up but not present is missing",
                set(&["n1", "n2"]),
                states(&[("n2", Up)]),
                set(&["n1"]),
                vec!["n2"],
            ),
            (
                "a peer present is heard",
                set(&["n1", "n2"]),
                states(&[("n2", Up)]),
                set(&["n1", "n2"]),
                vec![],
            ),
            (
                "a peer in maintenance without its key is missing",
                set(&["n2"]),
                states(&[("n2", Maintenance)]),
                set(&[]),
                vec!["n2"],
            ),
            (
                "a drained peer is not missing",
                set(&["n2"]),
                states(&[("n2", Drained)]),
                set(&[]),
                vec![],
            ),
            (
                "a peer shutting down is not missing",
                set(&["n2"]),
                states(&[("n2", ShuttingDown)]),
                set(&[]),
                vec![],
            ),
            (
                "a member without a last state is not missing",
                set(&["n2"]),
                states(&[]),
                set(&[]),
                vec![],
            ),
            (
                "a forgotten node (no member key) is not missing",
                set(&["n1"]),
                states(&[("n3", Up)]),
                set(&[]),
                vec![],
            ),
            (
                "several",
                set(&["n1", "n2", "n3", "n4"]),
                states(&[("n2", Up), ("n3", Drained), ("n4", Maintenance)]),
                set(&[]),
                vec!["n2", "n4"],
            ),
        ];
        for (what, members, last, present, want) in cases {
            assert_eq!(missing("n1", &members, &last, &present), want, "{what}");
        }
    }
}
