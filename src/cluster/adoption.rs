//! Freeze adoption: `freeze/cluster` and `freeze/objects/W` become this
//! node's own freezes. A cluster freeze is adopted as a node freeze of
//! scope `cluster`, an object freeze as an instance freeze of scope
//! `object` (only where W is configured). A running daemon adopts a key as
//! its watch brings it; a daemon that was down adopts, at its join, the
//! keys whose mod_revision is above the last revision it processed
//! (persisted in `cluster-freeze-revision`), and drops the adopted freezes
//! whose key is gone.
//!
//! Never adopted: a freeze that is only a peer's own (node and instance
//! freezes are files on that peer, never keys), and a key already
//! processed: a node thawed by hand stays thawed until the cluster is
//! frozen again. A node's or instance's own freeze is never replaced by
//! an adopted one (nor lifted by `berth thaw --cluster`): it covers it
//! (`shadows`), and `berth thaw` then uncovers it rather than lift both.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, SystemTime};

use etcd_client::{Client, EventType};

use super::keys::{ClusterFreeze, Keys};
use super::node::Node;
use super::session::{self, ClusterError};
use crate::state::cluster::{self as cluster_files, FreezeRevision as Processed};
use crate::state::freeze::{self, Adopted, Freeze, Scope};

/// What a freeze key freezes here.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    Node,
    Instance(String),
}

impl Target {
    fn name(&self) -> Option<&str> {
        match self {
            Target::Node => None,
            Target::Instance(n) => Some(n),
        }
    }
}

/// A freeze key as etcd has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub target: Target,
    pub key: String,
    pub mod_revision: i64,
    pub value: ClusterFreeze,
}

/// What to do to this node's flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Write the adopted flag (no flag, or an older adopted one).
    Adopt { target: Target, flag: Freeze },
    /// Remove the adopted flag: its key is gone.
    Clear { target: Target },
    /// The target has an own freeze: set (or, None, drop) the adopted
    /// freeze it covers.
    Cover {
        target: Target,
        covered: Option<Box<Freeze>>,
    },
}

/// The flags as they are now (files only: the command line's freeze is
/// the node's own).
pub struct Local<'a> {
    pub node: Option<&'a Freeze>,
    pub instances: &'a BTreeMap<String, Freeze>,
    /// The workloads configured on this node.
    pub configured: &'a BTreeSet<String>,
}

impl Local<'_> {
    fn flag(&self, target: &Target) -> Option<&Freeze> {
        match target {
            Target::Node => self.node,
            Target::Instance(n) => self.instances.get(n),
        }
    }
}

/// The keys above `last` that this node adopts.
pub fn adopt(seen: &[Seen], last: i64, local: &Local, now: SystemTime) -> Vec<Action> {
    let mut out = Vec::new();
    for s in seen.iter().filter(|s| s.mod_revision > last) {
        if let Target::Instance(n) = &s.target
            && !local.configured.contains(n)
        {
            continue;
        }
        let existing = local.flag(&s.target);
        // The adopted freeze there now: the flag, or the one an own
        // freeze covers.
        let adopted_now = existing.and_then(|f| match f.is_adopted() {
            true => Some(f),
            false => f.shadows.as_deref(),
        });
        if adopted_now
            .and_then(|f| f.adopted.as_ref())
            .is_some_and(|a| a.revision >= s.mod_revision)
        {
            continue;
        }
        // A freeze taken again keeps the first frozen_at.
        let frozen_at = adopted_now
            .map(|f| f.frozen_at.clone())
            .filter(|t| !t.is_empty())
            .or_else(|| plausible_time(&s.value.frozen_at))
            .unwrap_or_else(|| crate::time::rfc3339(now));
        let (scope, target) = match &s.target {
            Target::Node => (Scope::Cluster, None),
            Target::Instance(n) => (Scope::Object, Some(n.clone())),
        };
        let flag = Freeze {
            scope,
            target,
            frozen_at,
            reason: s.value.reason.clone(),
            adopted: Some(Adopted {
                key: s.key.clone(),
                revision: s.mod_revision,
                taken_by: s.value.taken_by.clone(),
            }),
            shadows: None,
        };
        out.push(match existing {
            // The node's or the instance's own freeze holds; it covers this.
            Some(f) if !f.is_adopted() => Action::Cover {
                target: s.target.clone(),
                covered: Some(Box::new(flag)),
            },
            _ => Action::Adopt {
                target: s.target.clone(),
                flag,
            },
        });
    }
    out
}

/// A key deleted: the adopted freeze of `target` goes (or the one its own
/// freeze covers).
pub fn deleted(target: &Target, local: &Local) -> Option<Action> {
    match local.flag(target)? {
        f if f.is_adopted() => Some(Action::Clear {
            target: target.clone(),
        }),
        f if f.shadows.is_some() => Some(Action::Cover {
            target: target.clone(),
            covered: None,
        }),
        _ => None,
    }
}

/// After a full listing: the adopted freezes whose key is gone.
pub fn vanished(seen: &[Seen], local: &Local) -> Vec<Action> {
    let present: BTreeSet<&Target> = seen.iter().map(|s| &s.target).collect();
    let node = local.node.map(|f| (Target::Node, f));
    let instances = local
        .instances
        .iter()
        .map(|(n, f)| (Target::Instance(n.clone()), f));
    node.into_iter()
        .chain(instances)
        .filter(|(t, _)| !present.contains(t))
        .filter_map(|(target, _)| deleted(&target, local))
        .collect()
}

/// A key's `frozen_at` as written by `berth freeze --cluster`, or None
/// for anything that does not look like a time (it is shown to admins).
pub(crate) fn plausible_time(t: &str) -> Option<String> {
    let ok = !t.is_empty()
        && t.len() <= 40
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'-' | b'+' | b'.'));
    ok.then(|| t.to_string())
}

/// The freeze keys of a listing or a watch event; a value that does not
/// parse still freezes (its writer meant to freeze), taken by `?`.
pub fn seen(keys: &Keys, key: &str, value: &[u8], mod_revision: i64) -> Option<Seen> {
    let target = if key == keys.cluster_freeze() {
        Target::Node
    } else {
        let w = keys.name_in(&keys.object_freezes(), key)?;
        if !crate::names::is_valid_workload_name(w) {
            return None;
        }
        Target::Instance(w.to_string())
    };
    let value = serde_json::from_slice(value).unwrap_or_else(|e| ClusterFreeze {
        taken_by: "?".into(),
        frozen_at: String::new(),
        reason: format!("unreadable value at {key} ({e}); treated as frozen"),
    });
    Some(Seen {
        target,
        key: key.to_string(),
        mod_revision,
        value,
    })
}

/// The last processed revision for this etcd cluster (0: none).
pub fn last_processed(state_dir: &Path, cluster_id: u64) -> i64 {
    cluster_files::read_freeze_revision(state_dir)
        .filter(|p| p.cluster_id == cluster_id)
        .map_or(0, |p| p.revision)
}

fn save_processed(state_dir: &Path, p: Processed) -> std::io::Result<()> {
    cluster_files::write_freeze_revision(state_dir, p)
}

/// How the journal words an adoption: at the join (the daemon was down,
/// or had not joined) or as the watch brings it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    WhileDown,
    Now,
}

/// The journal's line for an action.
pub fn said(action: &Action, when: When) -> String {
    match (action, when) {
        (
            Action::Adopt {
                target: Target::Node,
                flag,
            },
            When::WhileDown,
        ) => format!(
            "the cluster was frozen while this daemon was down (peer {} frozen): local node has been frozen",
            taken_by(flag)
        ),
        (
            Action::Adopt {
                target: Target::Node,
                flag,
            },
            When::Now,
        ) => format!(
            "the cluster was frozen by peer {}: local node has been frozen",
            taken_by(flag)
        ),
        (
            Action::Adopt {
                target: Target::Instance(w),
                flag,
            },
            When::WhileDown,
        ) => format!(
            "workload {w} was frozen cluster-wide while this daemon was down (peer {} frozen): local instance has been frozen",
            taken_by(flag)
        ),
        (
            Action::Adopt {
                target: Target::Instance(w),
                flag,
            },
            When::Now,
        ) => format!(
            "workload {w} was frozen cluster-wide by peer {}: local instance has been frozen",
            taken_by(flag)
        ),
        (Action::Clear { target: Target::Node }, When::WhileDown) => {
            "the cluster was thawed while this daemon was down: local node's adopted freeze cleared".into()
        }
        (Action::Clear { target: Target::Node }, When::Now) => {
            "the cluster was thawed: local node's adopted freeze cleared".into()
        }
        (
            Action::Clear {
                target: Target::Instance(w),
            },
            When::WhileDown,
        ) => {
            format!(
                "workload {w} was thawed cluster-wide while this daemon was down: local instance's adopted freeze cleared"
            )
        }
        (
            Action::Clear {
                target: Target::Instance(w),
            },
            When::Now,
        ) => {
            format!("workload {w} was thawed cluster-wide: local instance's adopted freeze cleared")
        }
        (Action::Cover { target, covered }, when) => {
            let what = match target {
                Target::Node => "the cluster was".to_string(),
                Target::Instance(w) => format!("workload {w} was"),
            };
            let down = if when == When::WhileDown {
                " while this daemon was down"
            } else {
                ""
            };
            let local = if target.name().is_some() {
                "instance"
            } else {
                "node"
            };
            match covered {
                Some(flag) => format!(
                    "{what} frozen{down} by peer {}: local {local} is frozen already by a freeze of its own, which covers it (berth thaw leaves it in place)",
                    taken_by(flag)
                ),
                None => format!("{what} thawed{down}: local {local}'s own freeze stays"),
            }
        }
    }
}

fn taken_by(flag: &Freeze) -> String {
    flag.adopted
        .as_ref()
        .map_or_else(|| "?".to_string(), |a| a.taken_by.escape_debug().to_string())
}

/// Applies the actions; whether every one landed (the revision is saved
/// only then, so that the next start tries again).
fn apply(node: &Node, actions: &[Action], when: When) -> bool {
    let mut ok = true;
    for action in actions {
        // Each looks at the flag again just before: `berth freeze` or
        // `berth thaw` may have run since the decision.
        let name = match action {
            Action::Adopt { target, .. } | Action::Clear { target } | Action::Cover { target, .. } => {
                target.name()
            }
        };
        let done = match (action, freeze::current(&node.root, name)) {
            (Action::Adopt { flag, .. }, Some(mut own)) if !own.is_adopted() => {
                own.shadows = Some(Box::new(flag.clone()));
                freeze::write(&node.root, name, &own)
            }
            (Action::Adopt { flag, .. }, _) => freeze::write(&node.root, name, flag),
            (Action::Clear { .. }, Some(f)) if f.is_adopted() => freeze::remove(&node.root, name).map(|_| ()),
            (Action::Clear { .. }, _) => continue,
            (Action::Cover { covered, .. }, Some(mut own)) if !own.is_adopted() => {
                own.shadows = covered.clone();
                freeze::write(&node.root, name, &own)
            }
            (
                Action::Cover {
                    covered: Some(flag), ..
                },
                _,
            ) => freeze::write(&node.root, name, flag),
            (Action::Cover { covered: None, .. }, _) => continue,
        };
        match done {
            // The lines the issue names are said as they are: no prefix.
            Ok(()) => node.events.info(&said(action, when)),
            Err(e) => {
                ok = false;
                node.events
                    .warn(&format!("cluster: cannot apply \"{}\": {e}", said(action, when)));
            }
        }
    }
    if !actions.is_empty()
        && let Some(api) = &node.api
    {
        api.set_freezes(freeze::all(&node.root));
    }
    ok
}

/// Lists the freeze keys and adopts; returns the revision to watch from
/// and the etcd cluster's id, and whether every change landed; None when
/// etcd did not answer.
async fn listing(client: &mut Client, node: &Node, when: When) -> Option<((i64, u64), bool)> {
    let keys = &node.keys;
    let r = match session::list_dir(client, &keys.freezes()).await {
        Ok(r) => r,
        Err(e @ ClusterError::TooMany { .. }) => {
            node.events
                .warn(&format!("cluster: cannot list the freezes: {e}"));
            return None;
        }
        Err(_) => return None,
    };
    let header = r.header()?;
    let (revision, cluster_id) = (header.revision(), header.cluster_id());
    let all: Vec<Seen> = r
        .kvs()
        .iter()
        .filter_map(|kv| seen(keys, kv.key_str().ok()?, kv.value(), kv.mod_revision()))
        .collect();
    let state_dir = node.root.state_dir();
    let last = last_processed(&state_dir, cluster_id);
    let flags = freeze::flags(&node.root);
    let local = Local {
        node: flags.node.as_ref(),
        instances: &flags.instances,
        configured: &node.configured,
    };
    let mut actions = adopt(&all, last, &local, SystemTime::now());
    actions.extend(vanished(&all, &local));
    let applied = apply(node, &actions, when);
    if applied && let Err(e) = save_processed(&state_dir, Processed { cluster_id, revision }) {
        node.events.warn(&format!(
            "cluster: cannot record the freeze revision processed: {e}"
        ));
    }
    Some(((revision, cluster_id), applied))
}

/// The listing at a join: keys changed while the daemon was down (its
/// first join) or had lost its lease. Tried again every second until etcd answers.
pub async fn first(client: &mut Client, node: &Node, when: When) -> (i64, u64) {
    loop {
        // A change that did not land is tried again by the watch's
        // next listing; the grace and the taking go on meanwhile.
        if let Some((done, _)) = listing(client, node, when).await {
            return done;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Watches the freeze keys from `from` on, adopting and clearing as they
/// change; lists again when the watch breaks. Never ends.
pub async fn watch(mut client: Client, node: &Node, from: (i64, u64)) {
    let keys = &node.keys;
    let state_dir = node.root.state_dir();
    let (mut revision, mut cluster_id) = from;
    loop {
        let watched = session::watch(&mut client, &keys.freezes(), revision + 1, false).await;
        if let Ok(mut stream) = watched {
            'stream: while let Ok(Some(r)) = stream.message().await {
                if r.canceled() {
                    break;
                }
                for ev in r.events() {
                    let Some(kv) = ev.kv() else { continue };
                    let Ok(key) = kv.key_str() else { continue };
                    let Some(s) = seen(keys, key, kv.value(), kv.mod_revision()) else {
                        continue;
                    };
                    let flags = freeze::flags(&node.root);
                    let local = Local {
                        node: flags.node.as_ref(),
                        instances: &flags.instances,
                        configured: &node.configured,
                    };
                    let actions = if ev.event_type() == EventType::Delete {
                        deleted(&s.target, &local).into_iter().collect()
                    } else {
                        adopt(std::slice::from_ref(&s), revision, &local, SystemTime::now())
                    };
                    if !apply(node, &actions, When::Now) {
                        // Not recorded as processed: the listing below
                        // (and each next one) tries again.
                        break 'stream;
                    }
                    revision = revision.max(kv.mod_revision());
                    if let Err(e) = save_processed(&state_dir, Processed { cluster_id, revision }) {
                        node.events.warn(&format!(
                            "cluster: cannot record the freeze revision processed: {e}"
                        ));
                    }
                }
            }
        }
        // Broken, cancelled (compacted), not opened or a change not
        // applied: list again until a listing is applied in full.
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if let Some((done, true)) = listing(&mut client, node, When::Now).await {
                (revision, cluster_id) = done;
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(target: Target, rev: i64, by: &str) -> Seen {
        let key = match &target {
            Target::Node => "/berth/freeze/cluster".to_string(),
            Target::Instance(w) => format!("/berth/freeze/objects/{w}"),
        };
        Seen {
            target,
            key,
            mod_revision: rev,
            value: ClusterFreeze {
                taken_by: by.into(),
                frozen_at: "2026-12-03T08:00:00Z".into(),
                reason: "upgrade".into(),
            },
        }
    }

    fn adopted(scope: Scope, rev: i64) -> Freeze {
        freeze::adopted_for_tests(scope, rev, "n2")
    }

    /// The adoption matrix: (what etcd has, last processed, local flags)
    /// → what is done, as `adopt|clear|cover|uncover TARGET`, for a listing
    /// (adopt, then vanished).
    #[test]
    fn the_adoption_matrix() {
        let now = std::time::UNIX_EPOCH;
        let own_node = Freeze::node("disk swap", now);
        let own_db = Freeze::instance("db", "by hand", now);
        let configured: BTreeSet<String> = ["db", "web"].iter().map(|s| s.to_string()).collect();
        let none = BTreeMap::new();
        let db_own = BTreeMap::from([("db".to_string(), own_db.clone())]);
        let db_adopted = BTreeMap::from([("db".to_string(), adopted(Scope::Object, 7))]);
        let cluster_adopted = adopted(Scope::Cluster, 7);
        let covering = Freeze {
            shadows: Some(Box::new(cluster_adopted.clone())),
            ..own_node.clone()
        };
        let node = Target::Node;
        let db = || Target::Instance("db".into());
        type Case<'a> = (
            &'a str,
            Vec<Seen>,
            i64,
            Option<&'a Freeze>,
            &'a BTreeMap<String, Freeze>,
            &'a [&'a str],
        );
        let cases: Vec<Case> = vec![
            (
                "a cluster freeze taken while down is adopted",
                vec![key(node.clone(), 10, "n2")],
                5,
                None,
                &none,
                &["adopt node"],
            ),
            (
                "an object freeze taken while down is adopted",
                vec![key(db(), 10, "n2")],
                5,
                None,
                &none,
                &["adopt db"],
            ),
            (
                "... only where the workload is configured",
                vec![key(Target::Instance("other".into()), 10, "n2")],
                5,
                None,
                &none,
                &[],
            ),
            (
                "a key already processed is not adopted again (thawed here by hand)",
                vec![key(node.clone(), 4, "n2")],
                5,
                None,
                &none,
                &[],
            ),
            (
                "the node's own freeze is not replaced: it covers the cluster freeze",
                vec![key(node.clone(), 10, "n2")],
                5,
                Some(&own_node),
                &none,
                &["cover node"],
            ),
            (
                "the instance's own freeze covers the object freeze",
                vec![key(db(), 10, "n2")],
                5,
                None,
                &db_own,
                &["cover db"],
            ),
            (
                "a covered freeze of the same revision is not covered again",
                vec![key(node.clone(), 7, "n2")],
                5,
                Some(&covering),
                &none,
                &[],
            ),
            (
                "an adopted freeze of the same revision is not adopted again",
                vec![key(node.clone(), 7, "n2")],
                5,
                Some(&cluster_adopted),
                &none,
                &[],
            ),
            (
                "a freeze taken again (newer revision) is adopted again",
                vec![key(node.clone(), 9, "n2")],
                5,
                Some(&cluster_adopted),
                &none,
                &["adopt node"],
            ),
            (
                "a cluster freeze thawed while down is cleared",
                vec![],
                5,
                Some(&cluster_adopted),
                &none,
                &["clear node"],
            ),
            (
                "an object freeze thawed while down is cleared",
                vec![],
                5,
                None,
                &db_adopted,
                &["clear db"],
            ),
            (
                "a covered freeze thawed while down is uncovered; the own freeze stays",
                vec![],
                5,
                Some(&covering),
                &none,
                &["uncover node"],
            ),
            (
                "own freezes are never cleared",
                vec![],
                5,
                Some(&own_node),
                &db_own,
                &[],
            ),
            (
                "a processed key with its adopted flag is kept",
                vec![key(node.clone(), 4, "n2")],
                5,
                Some(&cluster_adopted),
                &none,
                &[],
            ),
        ];
        let name = |t: &Target| match t {
            Target::Node => "node".to_string(),
            Target::Instance(n) => n.clone(),
        };
        for (what, seen, last, node_flag, instances, want) in cases {
            let local = Local {
                node: node_flag,
                instances,
                configured: &configured,
            };
            let mut actions = adopt(&seen, last, &local, now);
            actions.extend(vanished(&seen, &local));
            let got: Vec<String> = actions
                .iter()
                .map(|a| match a {
                    Action::Adopt { target, .. } => format!("adopt {}", name(target)),
                    Action::Clear { target } => format!("clear {}", name(target)),
                    Action::Cover {
                        target,
                        covered: Some(_),
                    } => format!("cover {}", name(target)),
                    Action::Cover {
                        target,
                        covered: None,
                    } => format!("uncover {}", name(target)),
                })
                .collect();
            assert_eq!(got, want, "{what}");
        }
        // A deletion while running: the adopted flag goes, a covered one is
        // uncovered, an own freeze alone stays.
        fn just<'a>(
            n: Option<&'a Freeze>,
            none: &'a BTreeMap<String, Freeze>,
            c: &'a BTreeSet<String>,
        ) -> Local<'a> {
            Local {
                node: n,
                instances: none,
                configured: c,
            }
        }
        let l = |n| just(n, &none, &configured);
        assert_eq!(
            deleted(&node, &l(Some(&cluster_adopted))),
            Some(Action::Clear { target: Target::Node })
        );
        assert_eq!(
            deleted(&node, &l(Some(&covering))),
            Some(Action::Cover {
                target: Target::Node,
                covered: None
            })
        );
        assert_eq!(deleted(&node, &l(Some(&own_node))), None);
        assert_eq!(deleted(&node, &l(None)), None);
    }

    #[test]
    fn an_adopted_flag_carries_scope_provenance_and_the_keys_time() {
        let configured = BTreeSet::new();
        let none = BTreeMap::new();
        let local = Local {
            node: None,
            instances: &none,
            configured: &configured,
        };
        let actions = adopt(&[key(Target::Node, 10, "n2")], 0, &local, std::time::UNIX_EPOCH);
        let Action::Adopt { flag, .. } = &actions[0] else {
            panic!("{actions:?}")
        };
        assert_eq!(flag.scope, Scope::Cluster);
        assert_eq!(flag.frozen_at, "2026-12-03T08:00:00Z");
        assert_eq!(
            flag.adopted,
            Some(Adopted {
                key: "/berth/freeze/cluster".into(),
                revision: 10,
                taken_by: "n2".into()
            })
        );
        assert_eq!(
            said(&actions[0], When::WhileDown),
            "the cluster was frozen while this daemon was down (peer n2 frozen): local node has been frozen"
        );
    }

    #[test]
    fn hostile_keys_and_values() {
        let keys = Keys::new("/berth/");
        assert_eq!(seen(&keys, "/berth/freeze/objects/a/b", b"{}", 1), None);
        assert_eq!(seen(&keys, "/berth/freeze/objects/..", b"{}", 1), None);
        assert_eq!(seen(&keys, "/berth/freeze/other", b"{}", 1), None);
        // A value that does not parse still freezes.
        let s = seen(&keys, "/berth/freeze/cluster", b"\xff", 3).unwrap();
        assert_eq!((s.target, s.value.taken_by.as_str()), (Target::Node, "?"));
        // A time that is not one is not shown as one.
        assert_eq!(
            plausible_time("2026-12-03T08:00:00Z").as_deref(),
            Some("2026-12-03T08:00:00Z")
        );
        assert_eq!(plausible_time("\u{1b}[2J"), None);
        let mut evil = key(Target::Node, 1, "n\u{1b}2");
        evil.value.frozen_at = "x\ny".into();
        let configured = BTreeSet::new();
        let none = BTreeMap::new();
        let local = Local {
            node: None,
            instances: &none,
            configured: &configured,
        };
        let actions = adopt(&[evil], 0, &local, std::time::UNIX_EPOCH);
        let Action::Adopt { flag, .. } = &actions[0] else {
            panic!()
        };
        assert_eq!(flag.frozen_at, "1970-01-01T00:00:00Z");
        assert!(!said(&actions[0], When::Now).contains('\u{1b}'));
    }

    #[test]
    fn the_processed_revision_is_per_etcd_cluster() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(last_processed(dir.path(), 1), 0);
        save_processed(
            dir.path(),
            Processed {
                cluster_id: 1,
                revision: 42,
            },
        )
        .unwrap();
        assert_eq!(last_processed(dir.path(), 1), 42);
        assert_eq!(last_processed(dir.path(), 2), 0);
    }
}
