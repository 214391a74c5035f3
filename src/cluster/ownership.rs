//! What a node knows of the cluster's owner keys and presences, kept from
//! one listing and the watch that follows it, and which workloads it is to
//! take now (pure: the caller reads etcd and the clock).
//!
//! A workload is taken only when its owner key is absent and this node is
//! its [`taker`](super::placement::taker), and never before the last
//! owner's stop bound has run out since its key went: the last owner may
//! still be stopping it (issue 13, points 2 and 3). The deletion is
//! usually seen on the watch, whose event carries the key's last value
//! and so the bound; a key that went while this node was not watching
//! (before it joined, or across a broken watch) is given the bound this
//! node computes for the workload, counted from when it noticed.
//!
//! Such a wait (from a listing, not from a deletion seen) is announced in
//! the node's presence as `waiting`, and placement passes over a waiting
//! candidate while a later one qualifies without waiting. Else a first
//! candidate that restarts more often than once per stop bound would
//! hold the workload back for good, the later candidates waiting on it
//! (the liveness defect the cluster soak of issue 15 found).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::keys::{LastOwner, Owner, Presence};
use super::placement;
use crate::config::HaPolicy;

/// `now` plus a bound read from etcd: a hostile value cannot overflow
/// (it only waits forever).
fn after(now: Duration, bound_s: u64) -> Duration {
    now.saturating_add(Duration::from_secs(bound_s))
}

/// One of this node's HA workloads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Local {
    pub name: String,
    pub policy: HaPolicy,
    /// This node's stop bound for it (s), written into the key it takes.
    pub stop_bound_s: u64,
}

/// An owner key as read: its value, the lease it is bound to, and the
/// revision that created it (one ownership; 0 when not known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerKey {
    pub owner: Owner,
    pub lease: i64,
    pub revision: i64,
}

impl OwnerKey {
    /// An owner key as etcd holds it. A value that cannot be read still
    /// holds the workload (the key exists; create-if-absent fails on it).
    pub fn read(value: &[u8], lease: i64) -> OwnerKey {
        let owner = serde_json::from_slice(value).unwrap_or(Owner {
            node: String::new(),
            stop_bound_s: 0,
            since: String::new(),
            boot_id: String::new(),
            watchdog_s: None,
        });
        OwnerKey {
            owner,
            lease,
            revision: 0,
        }
    }

    /// The same, created at `revision`.
    pub fn created(self, revision: i64) -> OwnerKey {
        OwnerKey { revision, ..self }
    }
}

/// The cluster as this node has seen it; times on CLOCK_BOOTTIME.
#[derive(Debug, Default, Clone)]
pub struct View {
    pub presences: BTreeMap<String, Presence>,
    pub owners: BTreeMap<String, OwnerKey>,
    /// Workloads whose owner key went, and when a take may begin.
    pub not_before: BTreeMap<String, Duration>,
    /// Those of them whose wait began at a listing: nobody here saw the
    /// key go, so its timing is this node's guess.
    pub unseen: BTreeSet<String>,
    /// Who last owned each workload (`last-owner/`) as the last listing
    /// read it, kept up with the owner keys seen since; `None` when not
    /// read: then any unowned workload may have had an owner.
    pub last_owners: Option<BTreeMap<String, LastOwner>>,
    /// This node's name and boot id.
    pub me: (String, String),
}

impl View {
    /// A key put under `owners/`.
    pub fn owner_put(&mut self, workload: &str, value: &[u8], lease: i64) {
        self.owner_put_key(workload, OwnerKey::read(value, lease));
    }

    /// The same, as read with its revision.
    pub fn owner_put_key(&mut self, workload: &str, key: OwnerKey) {
        if let Some(last) = &mut self.last_owners {
            // An owner of a version that did not say its boot is one
            // whose boot is unknown: never taken for rebooted.
            last.insert(
                workload.to_string(),
                LastOwner {
                    node: key.owner.node.clone(),
                    boot_id: key.owner.boot_id.clone(),
                    stop_bound_s: key.owner.stop_bound_s,
                },
            );
        }
        self.owners.insert(workload.to_string(), key);
        self.not_before.remove(workload);
        self.unseen.remove(workload);
    }

    /// A key deleted under `owners/` at `now`, with its last value when
    /// etcd gave it (else the bound this node knows, `fallback_s`).
    pub fn owner_deleted(&mut self, workload: &str, last: Option<&[u8]>, fallback_s: u64, now: Duration) {
        let known = self.owners.remove(workload).map(|k| k.owner.stop_bound_s);
        let from_event = last
            .and_then(|v| serde_json::from_slice::<Owner>(v).ok())
            .map(|o| o.stop_bound_s);
        let bound = from_event.or(known).unwrap_or(fallback_s);
        self.not_before.insert(workload.to_string(), after(now, bound));
        self.unseen.remove(workload);
    }

    /// A presence put under `nodes/`; one that cannot be read counts as
    /// absent (it qualifies for nothing).
    pub fn presence_put(&mut self, node: &str, value: &[u8]) {
        match serde_json::from_slice(value) {
            Ok(p) => {
                self.presences.insert(node.to_string(), p);
            }
            Err(_) => {
                self.presences.remove(node);
            }
        }
    }

    pub fn presence_deleted(&mut self, node: &str) {
        self.presences.remove(node);
    }

    /// A fresh listing replaces what the watch built (after a broken
    /// watch, or at the start). An owner key this view held that the
    /// listing lacks went unseen: its bound counts from `now`. With
    /// `first` (the daemon passes it at every listing), a workload of
    /// this node's that nobody owns gets this node's bound from `now`
    /// too, or the wait it had if longer: nobody can tell when its last
    /// owner let go.
    pub fn relisted(
        &mut self,
        presences: BTreeMap<String, Presence>,
        owners: BTreeMap<String, OwnerKey>,
        locals: &[Local],
        first: bool,
        now: Duration,
    ) {
        let gone: Vec<(String, u64)> = self
            .owners
            .iter()
            .filter(|(w, _)| !owners.contains_key(*w))
            .map(|(w, k)| (w.clone(), k.owner.stop_bound_s))
            .collect();
        for (w, bound) in gone {
            self.not_before.insert(w.clone(), after(now, bound));
            self.unseen.insert(w);
        }
        if first {
            // Even a wait this view had, from a deletion it saw, may be
            // out of date: the workload may have been taken and let go
            // again while no watch ran. Never shorter than that wait.
            for l in locals {
                if owners.contains_key(&l.name) {
                    continue;
                }
                let Some(bound) = self.unseen_bound(&l.name, l.stop_bound_s, &presences) else {
                    continue;
                };
                let t = after(now, bound);
                let wait = self.not_before.entry(l.name.clone()).or_insert(t);
                *wait = (*wait).max(t);
                self.unseen.insert(l.name.clone());
            }
        }
        for w in owners.keys() {
            self.not_before.remove(w);
            self.unseen.remove(w);
        }
        self.presences = presences;
        self.owners = owners;
    }

    /// The wait for an unowned workload whose key this node did not see
    /// go: none when it never had an owner, or when its last owner has
    /// booted since (it cannot run it still); else the larger of the
    /// bound its last owner declared and this node's own. Without the
    /// record, this node's own bound.
    fn unseen_bound(
        &self,
        workload: &str,
        own_s: u64,
        presences: &BTreeMap<String, Presence>,
    ) -> Option<u64> {
        let Some(last_owners) = &self.last_owners else {
            return Some(own_s);
        };
        let last = last_owners.get(workload)?;
        if self.rebooted(last, presences) {
            return None;
        }
        Some(last.stop_bound_s.max(own_s))
    }

    /// `last` names a boot its node is no longer in: this node, or a
    /// peer whose presence says another boot.
    fn rebooted(&self, last: &LastOwner, presences: &BTreeMap<String, Presence>) -> bool {
        if last.boot_id.is_empty() {
            return false;
        }
        if last.node == self.me.0 {
            return !self.me.1.is_empty() && self.me.1 != last.boot_id;
        }
        presences
            .get(&last.node)
            .is_some_and(|p| !p.boot_id.is_empty() && p.boot_id != last.boot_id)
    }

    /// When an unowned workload may be taken: not before its last owner's
    /// bound ran out, unless that owner booted since.
    fn ready(&self, workload: &str, now: Duration) -> bool {
        self.not_before.get(workload).is_none_or(|t| now >= *t)
            || self
                .last_owners
                .as_ref()
                .and_then(|l| l.get(workload))
                .is_some_and(|last| self.rebooted(last, &self.presences))
    }

    /// This node's HA workloads that nobody owns and that it waits for
    /// from a listing, still: what its presence announces as `waiting`.
    pub fn waiting(&self, locals: &[Local], now: Duration) -> BTreeSet<String> {
        locals
            .iter()
            .filter(|l| self.unseen.contains(&l.name) && !self.owners.contains_key(&l.name))
            .filter(|l| !self.ready(&l.name, now))
            .map(|l| l.name.clone())
            .collect()
    }
}

/// The workloads `me` is to take now: its own HA workloads that nobody
/// owns, whose wait is over, and of which it is the first qualifying
/// candidate.
pub fn to_take<'a>(me: &str, locals: &'a [Local], view: &View, now: Duration) -> Vec<&'a Local> {
    locals
        .iter()
        .filter(|l| !view.owners.contains_key(&l.name))
        .filter(|l| view.ready(&l.name, now))
        .filter(|l| placement::taker(&l.policy, &l.name, &view.presences) == Some(me))
        .collect()
}

/// The next time a pending wait ends, for the caller's timer.
pub fn next_wake(locals: &[Local], view: &View, now: Duration) -> Option<Duration> {
    locals
        .iter()
        .filter(|l| !view.owners.contains_key(&l.name))
        .filter_map(|l| view.not_before.get(&l.name))
        .filter(|t| **t > now)
        .min()
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::keys::NodeState;

    const S: Duration = Duration::from_secs(1);

    fn local(name: &str, nodes: &[&str], bound: u64) -> Local {
        Local {
            name: name.into(),
            policy: HaPolicy {
                nodes: nodes.iter().map(|n| n.to_string()).collect(),
            },
            stop_bound_s: bound,
        }
    }

    fn presence(state: NodeState, locals: &[Local]) -> Vec<u8> {
        serde_json::to_vec(&Presence {
            state,
            boot_id: "b".into(),
            since: "T".into(),
            ha: locals
                .iter()
                .map(|l| (l.name.clone(), l.policy.nodes_hash()))
                .collect(),
            version: String::new(),
            frozen: false,
            waiting: BTreeSet::new(),
            watchdog_s: None,
        })
        .unwrap()
    }

    fn waiting_for(state: NodeState, locals: &[Local], waiting: &BTreeSet<String>) -> Vec<u8> {
        let mut p: Presence = serde_json::from_slice(&presence(state, locals)).unwrap();
        p.waiting = waiting.clone();
        serde_json::to_vec(&p).unwrap()
    }

    fn owner(node: &str, bound: u64) -> Vec<u8> {
        serde_json::to_vec(&Owner {
            node: node.into(),
            stop_bound_s: bound,
            since: "T".into(),
            boot_id: String::new(),
            watchdog_s: None,
        })
        .unwrap()
    }

    fn names(v: Vec<&Local>) -> Vec<&str> {
        v.iter().map(|l| l.name.as_str()).collect()
    }

    /// Each step changes the view, then says what n2 takes at that time.
    #[test]
    fn a_deleted_key_is_taken_by_the_first_candidate_after_the_last_owners_bound() {
        let locals = vec![local("db", &["n1", "n2"], 30), local("web", &["n2", "n1"], 30)];
        let mut v = View::default();
        let up = presence(NodeState::Up, &locals);
        // The first listing: n1 owns db; web has no owner, and n2 never
        // saw it go: its own bound, from now.
        let mut presences = BTreeMap::new();
        for n in ["n1", "n2"] {
            presences.insert(n.to_string(), serde_json::from_slice(&up).unwrap());
        }
        let owners = BTreeMap::from([(
            "db".to_string(),
            OwnerKey {
                owner: serde_json::from_slice(&owner("n1", 65)).unwrap(),
                lease: 7,
                revision: 3,
            },
        )]);
        v.relisted(presences, owners, &locals, true, 100 * S);
        assert_eq!(names(to_take("n2", &locals, &v, 100 * S)), Vec::<&str>::new());
        assert_eq!(next_wake(&locals, &v, 100 * S), Some(130 * S));
        assert_eq!(
            names(to_take("n2", &locals, &v, 130 * S)),
            ["web"],
            "n2 is web's first candidate"
        );
        assert_eq!(
            names(to_take("n1", &locals, &v, 130 * S)),
            Vec::<&str>::new(),
            "n1 is not"
        );
        v.owner_put("web", &owner("n2", 30), 8);
        assert_eq!(names(to_take("n2", &locals, &v, 131 * S)), Vec::<&str>::new());

        // n1's key on db goes (its lease expired): 65 s from the event.
        v.owner_deleted("db", Some(&owner("n1", 65)), 30, 200 * S);
        assert_eq!(
            names(to_take("n1", &locals, &v, 264 * S)),
            Vec::<&str>::new(),
            "within the bound"
        );
        // ... n1 is still up in presence (the deletion alone decides), but
        // n1 is db's first candidate: n2 waits for n1 to qualify no more.
        assert_eq!(names(to_take("n1", &locals, &v, 265 * S)), ["db"]);
        v.presence_put("n1", &presence(NodeState::Drained, &locals));
        assert_eq!(names(to_take("n2", &locals, &v, 265 * S)), ["db"]);

        // A drain releases with bound zero: taken at once.
        v.owner_put("db", &owner("n2", 30), 9);
        v.owner_deleted("db", Some(&owner("n2", 0)), 30, 300 * S);
        v.presence_deleted("n1");
        assert_eq!(names(to_take("n2", &locals, &v, 300 * S)), ["db"]);
    }

    #[test]
    fn a_key_that_went_unseen_waits_from_the_relisting() {
        let locals = vec![local("db", &["n2"], 30)];
        let mut v = View::default();
        v.presence_put("n2", &presence(NodeState::Up, &locals));
        v.owner_put("db", &owner("n1", 65), 7);
        let presences = v.presences.clone();
        v.relisted(presences, BTreeMap::new(), &locals, false, 50 * S);
        assert!(to_take("n2", &locals, &v, 114 * S).is_empty());
        assert_eq!(names(to_take("n2", &locals, &v, 115 * S)), ["db"]);
        // A deletion event without the last value falls back to what the
        // view held, then to this node's bound.
        v.owner_put("db", &owner("n1", 40), 7);
        v.owner_deleted("db", None, 30, Duration::ZERO);
        assert_eq!(v.not_before["db"], 40 * S);
        v.owner_deleted("db", None, 30, Duration::ZERO);
        assert_eq!(v.not_before["db"], 30 * S);
    }

    /// n1, db's first candidate, restarted (a listing: it waits its own
    /// bound from then, and says so); n2 saw n1's key go and takes db
    /// once the bound in the key ran out, n1 standing aside.
    #[test]
    fn a_waiting_first_candidate_is_passed_over_by_one_that_saw_the_key_go() {
        let locals = vec![local("db", &["n1", "n2"], 30)];
        let (mut n1, mut n2) = (View::default(), View::default());
        n2.presence_put("n1", &presence(NodeState::Up, &locals));
        n2.presence_put("n2", &presence(NodeState::Up, &locals));
        n2.owner_put("db", &owner("n1", 30), 7);
        n2.owner_deleted("db", Some(&owner("n1", 30)), 30, 90 * S);
        assert!(
            n2.waiting(&locals, 90 * S).is_empty(),
            "a deletion seen is no guess"
        );

        n1.relisted(n2.presences.clone(), BTreeMap::new(), &locals, true, 100 * S);
        let n1_waits = n1.waiting(&locals, 100 * S);
        assert_eq!(n1_waits, BTreeSet::from(["db".to_string()]));
        assert!(n1.waiting(&locals, 130 * S).is_empty(), "the wait ends");
        for v in [&mut n1, &mut n2] {
            v.presence_put("n1", &waiting_for(NodeState::Up, &locals, &n1_waits));
        }
        assert!(
            to_take("n2", &locals, &n2, 119 * S).is_empty(),
            "n2 still waits its bound"
        );
        assert_eq!(names(to_take("n2", &locals, &n2, 120 * S)), ["db"]);
        assert!(to_take("n1", &locals, &n1, 130 * S).is_empty(), "n1 stands aside");
        n1.owner_put("db", &owner("n2", 30), 8);
        assert!(
            n1.waiting(&locals, 100 * S).is_empty(),
            "owned: nothing to wait for"
        );

        // Both restarted: both wait from their listing, the first takes.
        let (mut n1, mut n2) = (View::default(), View::default());
        n1.relisted(BTreeMap::new(), BTreeMap::new(), &locals, true, 100 * S);
        n2.relisted(BTreeMap::new(), BTreeMap::new(), &locals, true, 101 * S);
        let waits = n1.waiting(&locals, 100 * S);
        for v in [&mut n1, &mut n2] {
            v.presence_put("n1", &waiting_for(NodeState::Up, &locals, &waits));
            v.presence_put("n2", &waiting_for(NodeState::Up, &locals, &waits));
        }
        assert!(to_take("n2", &locals, &n2, 131 * S).is_empty());
        assert_eq!(names(to_take("n1", &locals, &n1, 130 * S)), ["db"]);
        // A deletion seen after the listing replaces the guess.
        n2.owner_put("db", &owner("n1", 30), 9);
        n2.owner_deleted("db", Some(&owner("n1", 30)), 30, 140 * S);
        assert!(n2.waiting(&locals, 140 * S).is_empty());
        // A key gone while the watch was broken is a guess again.
        n2.owner_put("db", &owner("n1", 30), 10);
        n2.relisted(BTreeMap::new(), BTreeMap::new(), &locals, true, 200 * S);
        assert_eq!(n2.waiting(&locals, 200 * S), BTreeSet::from(["db".to_string()]));
    }

    /// n2 saw db's key go and its wait ran out; then its watch broke and
    /// db may have been taken and let go again unseen: the listing makes
    /// it wait a bound from then (and say so), not take at once; a longer
    /// wait it had is kept.
    #[test]
    fn a_listing_restarts_a_wait_that_ran_out() {
        let locals = vec![local("db", &["n1", "n2"], 30)];
        let mut n2 = View::default();
        n2.owner_put("db", &owner("n1", 30), 7);
        n2.owner_deleted("db", Some(&owner("n1", 30)), 30, 10 * S);
        n2.relisted(BTreeMap::new(), BTreeMap::new(), &locals, true, 100 * S);
        assert_eq!(n2.not_before["db"], 130 * S);
        assert_eq!(n2.waiting(&locals, 100 * S), BTreeSet::from(["db".to_string()]));
        n2.owner_put("db", &owner("n1", 90), 8);
        n2.owner_deleted("db", Some(&owner("n1", 90)), 30, 200 * S);
        n2.relisted(BTreeMap::new(), BTreeMap::new(), &locals, true, 201 * S);
        assert_eq!(n2.not_before["db"], 290 * S, "the longer wait is kept");
    }

    /// A hostile stop bound (u64::MAX) in a deleted key waits forever
    /// instead of panicking the agent's thread (which runs the fence).
    #[test]
    fn a_huge_bound_does_not_overflow() {
        let locals = vec![local("db", &["n2"], u64::MAX)];
        let mut v = View::default();
        v.presence_put("n2", &presence(NodeState::Up, &locals));
        v.owner_put("db", &owner("n1", u64::MAX), 7);
        v.owner_deleted("db", Some(&owner("n1", u64::MAX)), 30, 100 * S);
        assert!(to_take("n2", &locals, &v, 10_000 * S).is_empty());
        v.owner_put("db", &owner("n1", u64::MAX), 7);
        let presences = v.presences.clone();
        v.relisted(presences, BTreeMap::new(), &locals, true, 100 * S);
        assert!(to_take("n2", &locals, &v, 10_000 * S).is_empty());
    }

    #[test]
    fn unreadable_values_hold_and_qualify_for_nothing() {
        let locals = vec![local("db", &["n2"], 0)];
        let mut v = View::default();
        v.presence_put("n2", b"{not json");
        assert!(
            to_take("n2", &locals, &v, S).is_empty(),
            "an unreadable presence is absent"
        );
        v.presence_put("n2", &presence(NodeState::Up, &locals));
        assert_eq!(names(to_take("n2", &locals, &v, S)), ["db"]);
        v.owner_put("db", b"garbage", 3);
        assert!(
            to_take("n2", &locals, &v, S).is_empty(),
            "an unreadable owner key still holds it"
        );
    }

    /// After a listing (a daemon restart, a new cluster's first boot), an
    /// unowned workload waits for its last owner only: not at all when
    /// nobody ever owned it or its last owner booted since, else the
    /// larger of the bound that owner declared and this node's own.
    #[test]
    fn an_unseen_release_waits_for_the_last_owner_only() {
        let locals = vec![local("db", &["n1", "n2"], 5)];
        let last = |node: &str, boot: &str, bound| LastOwner {
            node: node.into(),
            boot_id: boot.into(),
            stop_bound_s: bound,
        };
        let booted = |boot: &str| {
            let mut p: Presence = serde_json::from_slice(&presence(NodeState::Up, &locals)).unwrap();
            p.boot_id = boot.into();
            p
        };
        // (last owner record, n2's presence boot, n1's wait in s; None:
        // taken at once)
        type Case<'a> = (Option<Option<LastOwner>>, &'a str, Option<u64>);
        let cases: Vec<Case> = vec![
            // Not read: this node's own bound, as before.
            (None, "b2", Some(5)),
            // Read, and nobody ever owned db.
            (Some(None), "b2", None),
            // n2 owned it with a bound of 100 s, in the boot it is in now.
            (Some(Some(last("n2", "b2", 100))), "b2", Some(100)),
            // ... with a bound below n1's own: n1's.
            (Some(Some(last("n2", "b2", 1))), "b2", Some(5)),
            // n2 booted since: it cannot run db still.
            (Some(Some(last("n2", "b1", 100))), "b2", None),
            // n1 itself owned it in an earlier boot.
            (Some(Some(last("n1", "old", 100))), "b2", None),
            // n1 in this boot (its daemon restarted): its own record.
            (Some(Some(last("n1", "boot-1", 100))), "b2", Some(100)),
            // A record of unknown boot: never taken for rebooted.
            (Some(Some(last("n2", "", 100))), "b2", Some(100)),
        ];
        for (record, n2_boot, want) in cases {
            let mut v = View {
                me: ("n1".into(), "boot-1".into()),
                last_owners: record
                    .clone()
                    .map(|r| r.into_iter().map(|l| ("db".to_string(), l)).collect()),
                ..View::default()
            };
            let presences = BTreeMap::from([
                ("n1".to_string(), booted("boot-1")),
                ("n2".to_string(), booted(n2_boot)),
            ]);
            v.relisted(presences, BTreeMap::new(), &locals, true, 100 * S);
            let at_once = !to_take("n1", &locals, &v, 100 * S).is_empty();
            match want {
                None => assert!(at_once, "{record:?} n2 in {n2_boot}: taken at once"),
                Some(s) => {
                    assert!(!at_once, "{record:?} n2 in {n2_boot}: waits");
                    assert_eq!(
                        next_wake(&locals, &v, 100 * S),
                        Some(Duration::from_secs(100 + s)),
                        "{record:?}"
                    );
                    assert!(v.waiting(&locals, 100 * S).contains("db"), "and says so");
                }
            }
        }
        // The last owner's presence comes back with a new boot during
        // the wait: db is ready at once.
        let mut v = View {
            me: ("n1".into(), "boot-1".into()),
            last_owners: Some(BTreeMap::from([("db".to_string(), last("n2", "b1", 100))])),
            ..View::default()
        };
        v.relisted(
            BTreeMap::from([("n1".to_string(), booted("boot-1"))]),
            BTreeMap::new(),
            &locals,
            true,
            100 * S,
        );
        assert!(to_take("n1", &locals, &v, 101 * S).is_empty(), "n2 unheard: wait");
        v.presence_put("n2", &serde_json::to_vec(&booted("b2")).unwrap());
        assert_eq!(
            names(to_take("n1", &locals, &v, 101 * S)),
            ["db"],
            "n2 is back in a new boot"
        );
    }
}
