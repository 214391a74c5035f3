//! What rides along a drain: cluster mode's release of owner keys and its
//! fence at the lease deadline. The drain owns `berth drain`; a companion
//! is told each outcome as it comes, runs its fence beside the stops, and
//! finishes once they are over, within a bound the drain gives.

use std::convert::Infallible;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;

use crate::config::Loaded;
use crate::events::Events;
use crate::paths::Root;
use crate::state::drain_report::{Report, StopResult};
use crate::systemd::Ops;

#[allow(async_fn_in_trait)]
pub trait Companion {
    /// Where each stop's result goes as the drain gets it (it must not
    /// wait for the whole drain).
    fn teller(&self) -> UnboundedSender<StopResult>;
    /// Runs beside the stops and never ends: stops, through
    /// [`super::stop_at_once`], what may not wait for its turn.
    async fn fence<O: Ops>(&self, ops: &O, root: &Root, events: &Events) -> Infallible;
    /// Whether the fence stops `workload`.
    fn fences(&self, workload: &str) -> bool;
    /// The drain is over: the companion's last words, waited for until
    /// `until` at the latest.
    async fn finish(self, until: Instant, events: &Events);
}

/// Runs the drain, with `companion` beside it when there is one. Its last
/// words are waited for until `until` (asked when the stops are over).
pub async fn run_with<O: Ops, C: Companion>(
    ops: &O,
    root: &Root,
    loaded: &Loaded,
    events: &Events,
    began: Instant,
    companion: Option<C>,
    until: impl FnOnce() -> Instant,
) -> Report {
    let Some(companion) = companion else {
        return super::run(ops, root, loaded, events, began).await;
    };
    let report = {
        let drained = super::run_telling(ops, root, loaded, events, began, Some(companion.teller()));
        let fenced = companion.fence(ops, root, events);
        tokio::pin!(drained, fenced);
        let report = tokio::select! {
            report = &mut drained => report,
            never = &mut fenced => match never {},
        };
        // A workload the drain could not stop (a stop that failed) is
        // still fenced, within the drain's own budget.
        let fenced_up = report
            .workloads
            .iter()
            .any(|w| !w.outcome.is_down() && companion.fences(&w.workload));
        if fenced_up {
            let budget = began + Duration::from_secs(loaded.host.drain_deadline_s);
            let _ = tokio::time::timeout_at(budget, &mut fenced).await;
        }
        report
    };
    companion.finish(until(), events).await;
    report
}
