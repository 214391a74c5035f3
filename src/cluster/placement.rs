//! Who takes an HA workload whose owner key is absent (pure): the first
//! node of its `nodes`, in that order, that is up, not frozen, not in
//! maintenance and has the workload configured with the same candidate
//! list. Every candidate runs the same judgement on the same presence
//! keys, so they agree on one taker; the create-if-absent transaction
//! makes sure there is at most one owner even when they do not.
//!
//! A candidate whose presence says it is `waiting` for the workload (it
//! did not see the owner key go, so it waits a stop bound of its own
//! from when it listed) is passed over while a later one qualifies
//! without waiting; when all that qualify are waiting, the first takes
//! it, once its wait is over. Each taker waits its own bound in any
//! case: this changes who takes, never how soon.
//!
//! Only the deletion of an owner key (or a workload never owned) leads
//! here: a node's state read from its presence never moves a workload
//! by itself (issue 13, point 2).

use std::collections::BTreeMap;

use super::keys::{NodeState, Presence};
use crate::config::HaPolicy;

/// Why a node does not qualify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotEligible {
    Absent,
    NotUp(NodeState),
    Frozen,
    NotConfigured,
    OtherList,
}

/// Whether `presence` makes its node a taker for `workload`, whose
/// candidate list hashes to `hash`.
pub fn eligible(presence: Option<&Presence>, workload: &str, hash: &str) -> Result<(), NotEligible> {
    let p = presence.ok_or(NotEligible::Absent)?;
    if p.state != NodeState::Up {
        return Err(NotEligible::NotUp(p.state));
    }
    if p.frozen {
        return Err(NotEligible::Frozen);
    }
    match p.ha.get(workload) {
        None => Err(NotEligible::NotConfigured),
        Some(h) if h != hash => Err(NotEligible::OtherList),
        Some(_) => Ok(()),
    }
}

/// The node that takes `workload`, given every node's presence by name;
/// None when no candidate qualifies.
pub fn taker<'a>(
    policy: &'a HaPolicy,
    workload: &str,
    presences: &BTreeMap<String, Presence>,
) -> Option<&'a str> {
    let hash = policy.nodes_hash();
    let qualifying: Vec<&'a String> = policy
        .nodes
        .iter()
        .filter(|n| eligible(presences.get(n.as_str()), workload, &hash).is_ok())
        .collect();
    let waiting = |n: &&&String| {
        presences
            .get(n.as_str())
            .is_some_and(|p| p.waiting.contains(workload))
    };
    qualifying
        .iter()
        .find(|n| !waiting(n))
        .or(qualifying.first())
        .map(|n| n.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn presence(state: NodeState, frozen: bool, ha: &[(&str, &str)]) -> Presence {
        Presence {
            state,
            boot_id: "b".into(),
            since: "T".into(),
            ha: ha.iter().map(|(w, h)| (w.to_string(), h.to_string())).collect(),
            version: String::new(),
            frozen,
            waiting: Default::default(),
            watchdog_s: None,
        }
    }

    /// `p`, waiting for `workloads`.
    fn waiting(p: Presence, workloads: &[&str]) -> Presence {
        Presence {
            waiting: workloads.iter().map(|w| w.to_string()).collect(),
            ..p
        }
    }

    /// Each case: the presence of n1, n2 and n3 (None: absent), and who
    /// takes `db` with nodes = [n1, n2, n3].
    #[test]
    fn the_first_qualifying_candidate_in_order_takes_it() {
        use NodeState::*;
        let policy = HaPolicy {
            nodes: vec!["n1".into(), "n2".into(), "n3".into()],
        };
        let h = policy.nodes_hash();
        let db = [("db", h.as_str())];
        let other_list = [("db", "0000000000000000")];
        type Case<'a> = (&'a str, [Option<Presence>; 3], Option<&'a str>);
        let cases: Vec<Case> = vec![
            (
                "all up",
                [
                    Some(presence(Up, false, &db)),
                    Some(presence(Up, false, &db)),
                    None,
                ],
                Some("n1"),
            ),
            (
                "n1 absent",
                [
                    None,
                    Some(presence(Up, false, &db)),
                    Some(presence(Up, false, &db)),
                ],
                Some("n2"),
            ),
            (
                "n1 in maintenance, n2 frozen",
                [
                    Some(presence(Maintenance, false, &db)),
                    Some(presence(Up, true, &db)),
                    Some(presence(Up, false, &db)),
                ],
                Some("n3"),
            ),
            (
                "n1 shutting down, n2 without db, n3 drained",
                [
                    Some(presence(ShuttingDown, false, &db)),
                    Some(presence(Up, false, &[])),
                    Some(presence(Drained, false, &db)),
                ],
                None,
            ),
            (
                "n1 has another candidate list",
                [
                    Some(presence(Up, false, &other_list)),
                    Some(presence(Up, false, &db)),
                    None,
                ],
                Some("n2"),
            ),
            ("nobody", [None, None, None], None),
            (
                "n1 waiting for db: the next one that is not",
                [
                    Some(waiting(presence(Up, false, &db), &["db"])),
                    Some(presence(Up, false, &db)),
                    Some(presence(Up, false, &db)),
                ],
                Some("n2"),
            ),
            (
                "n1 and n2 waiting",
                [
                    Some(waiting(presence(Up, false, &db), &["db"])),
                    Some(waiting(presence(Up, false, &db), &["db"])),
                    Some(presence(Up, false, &db)),
                ],
                Some("n3"),
            ),
            (
                "every candidate waiting: the first",
                [
                    Some(waiting(presence(Up, false, &db), &["db"])),
                    Some(waiting(presence(Up, false, &db), &["db"])),
                    Some(waiting(presence(Up, false, &db), &["db"])),
                ],
                Some("n1"),
            ),
            (
                "n1 waiting for another workload only",
                [
                    Some(waiting(presence(Up, false, &db), &["web"])),
                    Some(presence(Up, false, &db)),
                    None,
                ],
                Some("n1"),
            ),
            (
                "the only one not waiting does not qualify: the first that does",
                [
                    Some(presence(Up, true, &db)),
                    Some(waiting(presence(Up, false, &db), &["db"])),
                    Some(waiting(presence(Up, false, &db), &["db"])),
                ],
                Some("n2"),
            ),
            (
                "a waiting node that does not qualify is no taker",
                [
                    Some(waiting(presence(Maintenance, false, &db), &["db"])),
                    None,
                    None,
                ],
                None,
            ),
        ];
        for (what, nodes, want) in cases {
            let presences: BTreeMap<String, Presence> = ["n1", "n2", "n3"]
                .iter()
                .zip(nodes)
                .filter_map(|(n, p)| Some((n.to_string(), p?)))
                .collect();
            assert_eq!(taker(&policy, "db", &presences), want, "{what}");
        }
    }
}
