//! Ownership reconciled, on every owner key event and every [`PERIOD`]:
//! what this node owns runs here, and what runs here is owned here. A take
//! is a decision made once; this is what keeps it true afterwards.
//!
//! - A key that names this node on its live lease, whose workload has not
//!   run in this ownership (the take's answer came late and the take was
//!   given up; the start failed), is started, again after a backoff
//!   doubling from [`PERIOD`] up to [`MAX_BACKOFF`], each attempt logged.
//! - A workload that ran in this ownership and went down is not berth's to
//!   start again: its unit's restart policy decides, and the key stays
//!   here (the admin's `systemctl stop` is not a failover). The ownership
//!   it ran in is kept in the runtime directory, so that a restarted
//!   daemon knows it too.
//! - A workload running (or starting) here whose key is absent, names
//!   another node, or sits on another of this node's leases (a maintenance
//!   lease whose take-back failed) is fenced, once two passes in a row saw
//!   it so and a fresh read of the key agrees. The first pass of a daemon
//!   only looks.
//!
//! Only systemd is asked at each pass; etcd only before a fence.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use etcd_client::Client;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::node::Node;
use super::ownership::{OwnerKey, View};
use super::session::{self, boottime};
use crate::config::Workload;
use crate::state::cluster as files;

/// How often the node looks even when no owner key changed.
pub const PERIOD: Duration = Duration::from_secs(2);

/// The longest wait between two starts of a workload that does not start.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// What a workload's unit is doing here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    Running,
    Starting,
    Stopping,
    Down,
}

/// Its owner key, as this node's view holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// Names this node, on its live lease.
    Mine,
    /// Names this node, on another lease (a maintenance lease, one of an
    /// earlier boot): it expires without this node's keep-alives.
    MineElsewhere,
    /// Absent, or another node's.
    NotMine,
}

impl Key {
    /// `key` as seen by `node` holding `live`.
    pub fn of(key: Option<&OwnerKey>, node: &str, live: i64) -> Key {
        match key {
            Some(k) if k.owner.node == node && k.lease == live => Key::Mine,
            Some(k) if k.owner.node == node => Key::MineElsewhere,
            _ => Key::NotMine,
        }
    }
}

/// What the node knows of one workload's ownership here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Track {
    /// The ownership followed: its key's create revision (0: none).
    pub revision: i64,
    /// The workload has run in it.
    pub ran: bool,
    pub attempts: u32,
    /// No start before this (CLOCK_BOOTTIME).
    pub next_at: Duration,
    /// A start was asked for and has not answered.
    pub starting: bool,
    /// The last pass saw it running without its key.
    pub suspect: bool,
}

/// What a pass does for one workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    Nothing,
    /// It is seen running in this ownership for the first time: recorded.
    Ran,
    Start,
    Fence,
}

/// The wait after the `attempt`th start failed.
pub fn backoff(attempt: u32) -> Duration {
    let doubled = PERIOD.saturating_mul(1u32.checked_shl(attempt.saturating_sub(1)).unwrap_or(u32::MAX));
    doubled.min(MAX_BACKOFF)
}

/// One workload at one pass (pure). `may_start`: the node is neither
/// frozen nor past its deadline; `first_pass`: this daemon's first look.
pub fn decide(
    key: Key,
    seen: Seen,
    t: &Track,
    may_start: bool,
    first_pass: bool,
    now: Duration,
) -> (Track, Act) {
    let mut t = t.clone();
    let act = match (key, seen) {
        (Key::Mine, Seen::Running) => {
            t.suspect = false;
            if t.ran {
                Act::Nothing
            } else {
                t.ran = true;
                Act::Ran
            }
        }
        (Key::Mine, Seen::Starting | Seen::Stopping) => {
            t.suspect = false;
            Act::Nothing
        }
        (Key::Mine, Seen::Down) => {
            t.suspect = false;
            if t.ran || t.starting || !may_start || now < t.next_at {
                Act::Nothing
            } else {
                t.attempts += 1;
                t.starting = true;
                Act::Start
            }
        }
        (Key::MineElsewhere | Key::NotMine, Seen::Running | Seen::Starting) => {
            if t.suspect && !first_pass {
                t.suspect = false;
                Act::Fence
            } else {
                t.suspect = true;
                Act::Nothing
            }
        }
        (Key::MineElsewhere | Key::NotMine, Seen::Stopping | Seen::Down) => {
            t.suspect = false;
            Act::Nothing
        }
    };
    (t, act)
}

/// A start answered (pure): the workload ran, or its next attempt waits.
pub fn answered(t: &Track, ok: bool, now: Duration) -> Track {
    let mut t = t.clone();
    t.starting = false;
    if ok {
        t.ran = true;
    } else {
        t.next_at = now.saturating_add(backoff(t.attempts));
    }
    t
}

/// A future of the ownership loop's own thread.
pub type Pending<T> = Pin<Box<dyn Future<Output = T>>>;

/// What the loop does to this node's units. The daemon goes through
/// systemd; the scale benchmark's simulated nodes only record.
pub trait Units: 'static {
    /// Starts the unit, recorded as an HA take: whether its start job
    /// ended done.
    fn start(&self, w: &Workload) -> Pending<bool>;
    /// What the unit does now; `None` when systemd did not say.
    fn seen(&self, w: &Workload) -> Pending<Option<Seen>>;
    /// Stops it at once within its stop bound, recorded as a fence:
    /// whether it is down afterwards.
    fn fence(&self, w: &Workload) -> Pending<bool>;
}

/// A start's answer: workload, ownership, done.
type Answer = (String, i64, bool);

/// The reconciliation's memory across passes.
pub struct Reconciler {
    tracks: BTreeMap<String, Track>,
    passes: u64,
    last: Option<Duration>,
    due: bool,
    tell: UnboundedSender<Answer>,
    answers: UnboundedReceiver<Answer>,
}

impl Default for Reconciler {
    fn default() -> Reconciler {
        let (tell, answers) = unbounded_channel();
        Reconciler {
            tracks: BTreeMap::new(),
            passes: 0,
            last: None,
            due: true,
            tell,
            answers,
        }
    }
}

impl Reconciler {
    /// An owner key changed: the next look is now.
    pub fn owners_changed(&mut self) {
        self.due = true;
    }

    /// Whether a pass is due at `now`.
    pub fn due(&self, now: Duration) -> bool {
        self.due || self.last.is_none_or(|l| now >= l.saturating_add(PERIOD))
    }

    /// When the next pass is due at the latest.
    pub fn next(&self, now: Duration) -> Duration {
        match self.last {
            _ if self.due => Duration::ZERO,
            Some(l) => l.saturating_add(PERIOD).saturating_sub(now),
            None => Duration::ZERO,
        }
    }

    /// The next start that answered.
    pub async fn answer(&mut self) -> Answer {
        match self.answers.recv().await {
            Some(a) => a,
            // The sender lives in self: never.
            None => std::future::pending().await,
        }
    }

    /// Takes a start's answer in; one for an ownership since gone is
    /// dropped.
    pub fn take_answer(&mut self, node: &Node, (name, revision, ok): Answer) {
        let Some(t) = self.tracks.get(&name).filter(|t| t.revision == revision) else {
            return;
        };
        let t = answered(t, ok, boottime());
        if let Some(api) = &node.api {
            api.agent.start_answered(ok);
        }
        if ok {
            remember_ran(node, &name, revision);
        } else {
            node.events.warn(&format!(
                "cluster: {name} is owned here but did not start (attempt {}); trying again in {} s",
                t.attempts,
                t.next_at.saturating_sub(boottime()).as_secs()
            ));
        }
        self.tracks.insert(name, t);
        self.due = true;
    }

    /// One look at every HA workload of this node.
    pub async fn pass(
        &mut self,
        client: &mut Client,
        node: &Node,
        units: &Rc<dyn Units>,
        view: &View,
        may_start: bool,
    ) {
        let live = node.lease.lease_id();
        let first_pass = self.passes == 0;
        self.passes += 1;
        self.due = false;
        self.last = Some(boottime());
        // Read only when a new ownership appears, not at every pass.
        let mut ran: Option<BTreeMap<String, i64>> = None;
        for w in node.workloads.iter().filter(|w| w.ha.is_some()) {
            let owner = view.owners.get(&w.name);
            let key = Key::of(owner, &node.name, live);
            let mut t = self.tracks.get(&w.name).cloned().unwrap_or_default();
            if key == Key::Mine {
                let revision = owner.map_or(0, |k| k.revision);
                if t.revision != revision {
                    // A new ownership: it ran only if a daemon of this
                    // boot saw it run.
                    t = Track {
                        revision,
                        ran: revision != 0
                            && ran
                                .get_or_insert_with(|| files::read_ran(&node.root.runtime_dir()))
                                .get(&w.name)
                                == Some(&revision),
                        suspect: t.suspect,
                        ..Track::default()
                    };
                }
            }
            let Some(seen) = units.seen(w).await else { continue };
            let (next, act) = decide(key, seen, &t, may_start, first_pass, boottime());
            match act {
                Act::Nothing => {}
                Act::Ran => remember_ran(node, &w.name, next.revision),
                Act::Start => {
                    node.events.info(&match next.attempts {
                        1 => format!("cluster: starting {} (owned here since revision {})", w.name, next.revision),
                        n => format!(
                            "cluster: {} is owned here and has not run since revision {}: starting it again (attempt {n})",
                            w.name, next.revision
                        ),
                    });
                    let (start, tell, name, revision) =
                        (units.start(w), self.tell.clone(), w.name.clone(), next.revision);
                    tokio::task::spawn_local(async move {
                        let ok = start.await;
                        let _ = tell.send((name, revision, ok));
                    });
                }
                Act::Fence => {
                    if confirmed_not_mine(client, node, &w.name, live).await {
                        node.events.warn(&format!(
                            "cluster: {} runs here but its owner key is {}: fencing it",
                            w.name,
                            describe(owner, live)
                        ));
                        // Counted once down: a stop that failed is tried
                        // again two passes later.
                        let (fence, api) = (units.fence(w), node.api.clone());
                        tokio::task::spawn_local(async move {
                            if fence.await
                                && let Some(api) = api
                            {
                                api.agent.fenced(crate::api::metrics::FenceCause::NotOwner, 1);
                            }
                        });
                    }
                }
            }
            self.tracks.insert(w.name.clone(), next);
        }
        self.publish(node, view);
    }

    /// The workloads owned here that have not run in this ownership, with
    /// the starts tried, for the metrics.
    fn publish(&self, node: &Node, view: &View) {
        let Some(api) = &node.api else { return };
        let live = node.lease.lease_id();
        let pending = self
            .tracks
            .iter()
            .filter(|(name, t)| {
                !t.ran && Key::of(view.owners.get(name.as_str()), &node.name, live) == Key::Mine
            })
            .map(|(name, t)| (name.clone(), t.attempts))
            .collect();
        api.agent.set_pending(pending);
    }
}

/// A fresh read of the key still does not put it on `live` under this
/// node's name. A read that fails fences nothing now: the next passes
/// look again (and the deadline fence covers a lost etcd).
async fn confirmed_not_mine(client: &mut Client, node: &Node, workload: &str, live: i64) -> bool {
    let Ok(got) = session::get(client, &node.keys.owner(workload), None).await else {
        return false;
    };
    let now = got.kvs().first().map(|kv| OwnerKey::read(kv.value(), kv.lease()));
    Key::of(now.as_ref(), &node.name, live) != Key::Mine
}

fn describe(key: Option<&OwnerKey>, live: i64) -> String {
    match key {
        None => "absent".into(),
        Some(k) if k.lease != live && !k.owner.node.is_empty() => format!(
            "{}'s on lease {:x}, not this node's live lease {live:x}",
            k.owner.node.escape_debug(),
            k.lease
        ),
        Some(k) => format!("{}'s", k.owner.node.escape_debug()),
    }
}

/// Best effort: a daemon restarted without it starts once more what it
/// finds down.
fn remember_ran(node: &Node, workload: &str, revision: i64) {
    let dir = node.root.runtime_dir();
    let mut ran = files::read_ran(&dir);
    // Only this node's HA workloads: the file stays as small as its
    // configuration.
    ran.retain(|w, _| node.workloads.iter().any(|c| &c.name == w && c.ha.is_some()));
    ran.insert(workload.to_string(), revision);
    if let Err(e) = files::write_ran(&dir, &ran) {
        node.events.warn(&format!(
            "cluster: cannot record that {workload} ran in this ownership ({e}): a restarted daemon would start it again if it is down"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn track(f: impl FnOnce(&mut Track)) -> Track {
        let mut t = Track {
            revision: 9,
            ..Track::default()
        };
        f(&mut t);
        t
    }

    /// Each row: key, unit, track before, may start, first pass → act and
    /// track after, at t = 10 s.
    #[test]
    fn what_runs_here_is_owned_here_and_what_is_owned_here_runs() {
        use Act::*;
        use Key::*;
        use Seen::*;
        let now = 10 * S;
        let fresh = track(|_| {});
        let starting = track(|t| {
            t.attempts = 1;
            t.starting = true;
        });
        let ran = track(|t| t.ran = true);
        let suspect = track(|t| t.suspect = true);
        let backing_off = track(|t| {
            t.attempts = 2;
            t.next_at = 12 * S;
        });
        let ran_suspect = track(|t| {
            t.ran = true;
            t.suspect = true;
        });
        let rows: Vec<(Key, Seen, &Track, bool, bool, Act, Track)> = vec![
            // Owned, never ran: started (a late take, a failed start).
            (Mine, Down, &fresh, true, true, Start, starting.clone()),
            // Not while frozen or past the deadline.
            (Mine, Down, &fresh, false, false, Nothing, fresh.clone()),
            // Not twice at once, nor before the backoff is over.
            (Mine, Down, &starting, true, false, Nothing, starting.clone()),
            (
                Mine,
                Down,
                &backing_off,
                true,
                false,
                Nothing,
                backing_off.clone(),
            ),
            // It ran and went down: its restart policy decides.
            (Mine, Down, &ran, true, false, Nothing, ran.clone()),
            // Seen running: recorded once.
            (Mine, Running, &fresh, true, false, Ran, ran.clone()),
            (Mine, Running, &ran, true, false, Nothing, ran.clone()),
            (Mine, Starting, &fresh, true, false, Nothing, fresh.clone()),
            // Running without its key: suspected, then fenced at the next
            // pass; a daemon's first pass never fences.
            (NotMine, Running, &fresh, true, false, Nothing, suspect.clone()),
            (NotMine, Running, &suspect, true, false, Fence, fresh.clone()),
            (NotMine, Starting, &suspect, true, false, Fence, fresh.clone()),
            (
                MineElsewhere,
                Running,
                &suspect,
                true,
                false,
                Fence,
                fresh.clone(),
            ),
            (NotMine, Running, &suspect, true, true, Nothing, suspect.clone()),
            // Gone down meanwhile, or the key came back: not suspected.
            (NotMine, Down, &suspect, true, false, Nothing, fresh.clone()),
            (Mine, Running, &ran_suspect, true, false, Nothing, ran.clone()),
            // Another node's workload, down here: nothing.
            (NotMine, Down, &fresh, true, false, Nothing, fresh.clone()),
        ];
        for (key, seen, before, may_start, first, act, after) in rows {
            let got = decide(key, seen, before, may_start, first, now);
            assert_eq!(
                got,
                (after, act),
                "{key:?} {seen:?} {before:?} may_start {may_start} first {first}"
            );
        }
    }

    #[test]
    fn a_failed_start_waits_a_doubling_backoff_and_a_done_one_counts_as_ran() {
        let now = 100 * S;
        let mut t = track(|t| {
            t.attempts = 1;
            t.starting = true;
        });
        let mut waits = Vec::new();
        for attempt in 1..=8 {
            t.attempts = attempt;
            let after = answered(&t, false, now);
            assert!(!after.starting && !after.ran);
            waits.push((after.next_at - now).as_secs());
            t = after;
        }
        assert_eq!(waits, [2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF, "no overflow");
        let done = answered(&track(|t| t.starting = true), true, now);
        assert!(done.ran && !done.starting);
    }

    #[test]
    fn a_key_is_mine_only_under_my_name_on_my_live_lease() {
        let key = |node: &str, lease| {
            OwnerKey::read(
                format!(r#"{{"node":"{node}","stop_bound_s":5,"since":"T"}}"#).as_bytes(),
                lease,
            )
        };
        assert_eq!(Key::of(Some(&key("n1", 7)), "n1", 7), Key::Mine);
        assert_eq!(Key::of(Some(&key("n1", 8)), "n1", 7), Key::MineElsewhere);
        assert_eq!(Key::of(Some(&key("n2", 7)), "n1", 7), Key::NotMine);
        assert_eq!(Key::of(None, "n1", 7), Key::NotMine);
        assert_eq!(Key::of(Some(&OwnerKey::read(b"junk", 7)), "n1", 7), Key::NotMine);
    }
}
