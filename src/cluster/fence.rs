//! The owner's fence (issue 13, point 3): when the node's lease deadline
//! (`t_send + TTL − margin`, moved by each acknowledged keep-alive) passes,
//! the node stops every HA workload it runs, through the drain's stop path
//! (graceful, then forced per policy, each within its stop bound), and
//! records them as stopped by the fence. Deadlines, never errors, decide:
//! a partition hangs calls rather than failing them, and the fence needs
//! nothing from etcd.
//!
//! Once the deadline is ahead again (a keep-alive got through before the
//! lease expired), a workload the fence stopped is started again only
//! after a transaction confirms its owner key is still on this node's live
//! lease; a key that went (the lease expired, a peer may own it now)
//! leaves it to the takers.
//!
//! The deadline is also kept under the runtime directory: a daemon that
//! restarts while etcd cannot be reached fences at the deadline its
//! predecessor last saw.

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn};

use super::keys;
use super::node::Node;
use super::session::{self, boottime};
use crate::api::metrics::FenceCause;
use crate::config::Workload;
use crate::events::Events;
use crate::paths::Root;
use crate::state::records::{self, RecordState, TransitionReason};
use crate::systemd::Ops;

/// What the fence does on this look (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing: the deadline is ahead and nothing is fenced, or no
    /// deadline is known (never joined: nothing was taken either).
    Wait,
    /// The deadline passed: stop the HA workloads. Again every second
    /// while it stays passed: a start that lands after the first look (a
    /// take or a lift in flight, a start by hand) is stopped too.
    Fence,
    /// The deadline is ahead again: try to start what the fence stopped.
    Lift,
}

/// `last_fence`: when the fence last looked since the deadline passed.
pub fn step(deadline: Option<Duration>, now: Duration, fenced: bool, last_fence: Option<Duration>) -> Step {
    match deadline {
        Some(d) if now >= d => {
            if last_fence.is_none_or(|t| now.saturating_sub(t) >= Duration::from_secs(1)) {
                Step::Fence
            } else {
                Step::Wait
            }
        }
        Some(_) if fenced => Step::Lift,
        _ => Step::Wait,
    }
}

/// `berth owner-check`'s rule: past the deadline this node's daemon last
/// saw, no HA workload starts, for the fence is (or is about to be)
/// stopping them. No deadline known: the owner key decides (pure).
pub fn start_refused(deadline: Option<Duration>, now: Duration) -> bool {
    deadline.is_some_and(|d| now >= d)
}

/// What `berth fence-arm` does when the daemon has ended (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arming {
    /// No deadline was seen in this boot: nothing was taken either.
    NothingToArm,
    /// The host is shutting down: the drain releases the HA workloads.
    ShuttingDown,
    /// Arm the fence timer to elapse this much from now (at least 1 µs:
    /// a deadline already passed fences at once).
    After(Duration),
}

/// `system_state`: the manager's SystemState, if it answered.
pub fn arming(deadline: Option<Duration>, now: Duration, system_state: Option<&str>) -> Arming {
    match deadline {
        None => Arming::NothingToArm,
        Some(_) if system_state == Some("stopping") => Arming::ShuttingDown,
        Some(d) => Arming::After(d.saturating_sub(now).max(Duration::from_micros(1))),
    }
}

pub use crate::state::cluster::{
    read_fence_deadline as read_deadline, write_fence_deadline as write_deadline,
};

/// Runs until the process ends, looking every 100 ms, on a `LocalSet`.
pub async fn run<O: Ops + 'static>(node: &Node, ops: Rc<O>) {
    let sd = &*ops;
    let runtime_dir = node.root.runtime_dir();
    // What a fence stopped, this daemon's or the timer's (`berth fence`,
    // maybe while no daemon ran): read from the records, each stop once
    // (by its transition generation).
    let mut fenced: BTreeSet<String> = BTreeSet::new();
    let mut judged: BTreeMap<String, u64> = BTreeMap::new();
    let mut last_scan = Duration::ZERO;
    let mut client: Option<Client> = None;
    let mut written = None;
    let mut last_fence: Option<Duration> = None;
    let mut last_lift = Duration::ZERO;
    // The live lease whose arrival was dealt with: the timer disarmed,
    // and what runs here checked against the owner keys.
    let mut settled = 0;
    loop {
        let now = boottime();
        let deadline = node.lease.deadline();
        if deadline != written
            && let Some(d) = deadline
        {
            write_deadline(&runtime_dir, d);
            written = deadline;
        }
        if now.saturating_sub(last_scan) >= Duration::from_secs(1) {
            last_scan = now;
            for w in &node.workloads {
                let Ok(Some(r)) = records::load(&node.root, &w.name) else {
                    continue;
                };
                if r.state == RecordState::Stopped
                    && r.last_transition_reason == TransitionReason::Fence
                    && judged.get(&w.name) != Some(&r.transition_generation)
                {
                    judged.insert(w.name.clone(), r.transition_generation);
                    fenced.insert(w.name.clone());
                }
            }
        }
        match step(deadline, now, !fenced.is_empty(), last_fence) {
            Step::Fence => {
                let quiet = last_fence.is_some();
                last_fence = Some(now);
                let stopped = fence_now(sd, &node.root, &node.workloads, &node.events, quiet).await;
                if let Some(api) = &node.api {
                    api.agent.fenced(FenceCause::Deadline, stopped.len());
                }
                fenced.extend(stopped);
            }
            Step::Lift if now.saturating_sub(last_lift) >= Duration::from_secs(1) => {
                last_lift = now;
                lift(&ops, node, &mut client, &mut fenced).await;
            }
            _ => {}
        }
        if deadline.is_some_and(|d| boottime() < d) {
            last_fence = None;
            let lease = node.lease.lease_id();
            if lease != 0 && settled != lease && settle(sd, node, &mut client, lease).await {
                settled = lease;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A new live lease: the timer a previous daemon armed on its way out
/// (ExecStopPost=) has nothing left to do, and an HA workload that runs
/// here without its key on this lease (the old lease expired or was
/// revoked while it ran) is stopped, as the fence would have. False when
/// etcd could not be asked: the next look tries again.
async fn settle<O: Ops>(sd: &O, node: &Node, client: &mut Option<Client>, lease: i64) -> bool {
    if sd.stop(&format!("{TIMER}.timer")).await.is_ok() {
        node.events.info(&format!(
            "cluster: disarmed {TIMER}.timer: lease {lease:x} is alive"
        ));
    }
    let running = running_of(sd, &node.workloads).await;
    if running.is_empty() {
        return true;
    }
    let Some(c) = connected(node, client).await else {
        return false;
    };
    let mut strays = Vec::new();
    for w in running {
        let txn = Txn::new().when(vec![Compare::lease(
            node.keys.owner(&w.name),
            CompareOp::Equal,
            lease,
        )]);
        match session::txn(c, txn, session::CALL_TIMEOUT).await {
            Ok(r) if r.succeeded() => {}
            Ok(_) => strays.push(w),
            Err(_) => {
                *client = None;
                return false;
            }
        }
    }
    if !strays.is_empty() {
        node.events.warn(&format!(
            "cluster: {} run here without their owner key on lease {lease:x}: stopping them",
            strays
                .iter()
                .map(|w| w.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
        let stopped = fence_now(sd, &node.root, &strays, &node.events, true).await;
        if let Some(api) = &node.api {
            api.agent.fenced(FenceCause::NewLease, stopped.len());
        }
    }
    true
}

/// Those of `workloads` whose unit runs (or is starting) here.
async fn running_of<O: Ops>(sd: &O, workloads: &[Workload]) -> Vec<Workload> {
    let mut running = Vec::new();
    for w in workloads {
        if sd.active_state(&w.unit_name()).await.is_ok_and(|s| !s.is_down()) {
            running.push(w.clone());
        }
    }
    running
}

/// The cached etcd client, connected when there is none.
async fn connected<'c>(node: &Node, client: &'c mut Option<Client>) -> Option<&'c mut Client> {
    if client.is_none() {
        *client = session::within(session::CALL_TIMEOUT, session::connect(&node.settings))
            .await
            .ok();
    }
    client.as_mut()
}

/// The transient timer (and service) `berth fence-arm` arms.
pub const TIMER: &str = "berth-fence";

/// Stops every HA workload of `workloads` that runs here, all at once,
/// each within its stop bound, recorded as the fence's; the names of
/// those it stopped. The daemon's fence and `berth fence` (the timer's)
/// both come here.
pub async fn fence_now<O: Ops>(
    sd: &O,
    root: &Root,
    workloads: &[Workload],
    events: &Events,
    quiet: bool,
) -> Vec<String> {
    let running = running_of(sd, workloads).await;
    if running.is_empty() {
        if quiet {
            return Vec::new();
        }
        events
            .warn("cluster: fence: the lease deadline passed with no keep-alive acknowledged; no HA workload runs here");
        return Vec::new();
    }
    events.warn(&format!(
        "cluster: fence: the lease deadline passed with no keep-alive acknowledged; stopping {}",
        running
            .iter()
            .map(|w| w.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    stop_now(sd, root, &running, events).await
}

/// Stops `running` at once, each within its stop bound, recorded as the
/// fence's; the names of those it stopped. The caller said why.
pub async fn stop_now<O: Ops>(sd: &O, root: &Root, running: &[Workload], events: &Events) -> Vec<String> {
    let stops = running.iter().map(|w| (w, sd_bound(w))).collect();
    crate::drain::stop_at_once(sd, root, stops, TransitionReason::Fence, events)
        .await
        .into_iter()
        .filter(|r| r.outcome.stopped_it() || r.outcome.is_down())
        .map(|r| r.workload)
        .collect()
}

/// How long the fence gives a workload before forcing it: its stop delay,
/// as the drain does, and never more than the bound peers wait for.
fn sd_bound(w: &Workload) -> Duration {
    Duration::from_secs(keys::stop_bound_s(0, Some(w.stop_delay_s)).unwrap_or(5))
}

/// Starts again what the fence stopped, each only when its owner key is
/// still on this node's live lease.
async fn lift<O: Ops + 'static>(
    ops: &Rc<O>,
    node: &Node,
    client: &mut Option<Client>,
    fenced: &mut BTreeSet<String>,
) {
    let lease = node.lease.lease_id();
    if lease == 0 {
        return;
    }
    let Some(c) = connected(node, client).await else {
        return;
    };
    for name in fenced.clone() {
        let key = node.keys.owner(&name);
        let txn = Txn::new().when(vec![Compare::lease(key.as_str(), CompareOp::Equal, lease)]);
        match session::txn(c, txn, session::CALL_TIMEOUT).await {
            Ok(r) if r.succeeded() => {
                fenced.remove(&name);
                node.events.info(&format!(
                    "cluster: fence lifted: {name}'s owner key is still on lease {lease:x}; starting it again"
                ));
                // On a task of its own: a start may take long, and the
                // fence must keep looking meanwhile.
                if let Some(w) = node.workload(&name).cloned() {
                    let (ops, root) = (ops.clone(), node.root.clone());
                    tokio::task::spawn_local(async move {
                        let events = Events::new("berth-daemon");
                        crate::autostart::start_one(&*ops, &root, &w, TransitionReason::HaTake, &events)
                            .await;
                    });
                }
            }
            Ok(_) => {
                fenced.remove(&name);
                node.events.info(&format!(
                    "cluster: {name} stays stopped: its owner key is no longer on this node's lease {lease:x} \
                     (its takers decide)"
                ));
            }
            // etcd out of reach, or a connection that stopped answering:
            // a fresh one at the next look.
            Err(_) => {
                *client = None;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// (deadline, now, something fenced, last fence look) → step.
    #[test]
    fn the_fence_follows_the_deadline_alone() {
        let cases = [
            (None, 10 * S, false, None, Step::Wait),
            (None, 10 * S, true, None, Step::Wait),
            (Some(20 * S), 10 * S, false, None, Step::Wait),
            (Some(20 * S), 20 * S, false, None, Step::Fence),
            // Passed and looked at half a second ago: not yet again.
            (Some(20 * S), 25 * S, true, Some(24 * S + S / 2), Step::Wait),
            // Still passed a second later: looked at again (a start that
            // landed since is stopped too).
            (Some(20 * S), 25 * S, true, Some(24 * S), Step::Fence),
            (Some(30 * S), 25 * S, true, None, Step::Lift),
            (Some(30 * S), 31 * S, true, None, Step::Fence),
        ];
        for (deadline, now, fenced, last, want) in cases {
            assert_eq!(
                step(deadline, now, fenced, last),
                want,
                "{deadline:?} {now:?} {fenced} {last:?}"
            );
        }
    }

    /// (deadline, now, manager state) → owner-check refuses, fence-arm.
    #[test]
    fn the_unit_side_helpers_follow_the_deadline() {
        let us = Duration::from_micros(1);
        let cases = [
            (None, 10 * S, Some("running"), false, Arming::NothingToArm),
            (None, 10 * S, Some("stopping"), false, Arming::NothingToArm),
            (
                Some(20 * S),
                10 * S,
                Some("running"),
                false,
                Arming::After(10 * S),
            ),
            // The manager did not answer: armed all the same (fails safe).
            (Some(20 * S), 10 * S, None, false, Arming::After(10 * S)),
            (
                Some(20 * S),
                10 * S,
                Some("stopping"),
                false,
                Arming::ShuttingDown,
            ),
            (Some(20 * S), 20 * S, Some("degraded"), true, Arming::After(us)),
            (Some(20 * S), 30 * S, Some("running"), true, Arming::After(us)),
        ];
        for (deadline, now, state, refused, armed) in cases {
            assert_eq!(start_refused(deadline, now), refused, "{deadline:?} {now:?}");
            assert_eq!(
                arming(deadline, now, state),
                armed,
                "{deadline:?} {now:?} {state:?}"
            );
        }
    }
}
