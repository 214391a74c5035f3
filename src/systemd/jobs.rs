//! Job results by job path. One task reads every JobRemoved signal and
//! completes the waiter registered for that job; a job that finishes
//! before its waiter registers (StartUnit returns after the job may have
//! run) is kept in a short cache, so no result is missed.

use std::collections::{HashMap, VecDeque};

use tokio::sync::{OwnedSemaphorePermit, oneshot};

use super::types::JobResult;

enum Slot {
    Waiting(oneshot::Sender<JobResult>),
    Done(JobResult),
}

/// Finished jobs kept for waiters that register late; other clients' jobs
/// arrive here too, so the cache is bounded.
const DONE_CACHE: usize = 4096;

#[derive(Default)]
pub(super) struct Jobs {
    slots: HashMap<String, Slot>,
    /// The in-flight permit of each job this connection queued, until it
    /// finishes (see `connection::MAX_JOBS_IN_FLIGHT`).
    held: HashMap<String, OwnedSemaphorePermit>,
    /// Finished jobs nobody waited for yet, oldest first, for eviction.
    done_order: VecDeque<String>,
    /// Units a batch of stops is queuing, with the last job seen removed
    /// for each (id, path): see `together`.
    watched: HashMap<String, Option<(u32, String)>>,
    closed: bool,
}

/// What a waiter gets back from [`Jobs::register`].
pub(super) enum Registered {
    Done(JobResult),
    Waiting(oneshot::Receiver<JobResult>),
}

impl Jobs {
    /// Keeps `permit` until the job at `path` finishes; at once if it
    /// already has (its JobRemoved can come before the call's reply).
    pub(super) fn hold(&mut self, path: &str, permit: OwnedSemaphorePermit) {
        if !self.closed && !matches!(self.slots.get(path), Some(Slot::Done(_))) {
            self.held.insert(path.to_string(), permit);
        }
    }

    /// A JobRemoved: `unit`'s job `id` at `path` ended with `result`.
    pub(super) fn removed(&mut self, id: u32, path: String, unit: &str, result: JobResult) {
        if let Some(last) = self.watched.get_mut(unit)
            && last.as_ref().is_none_or(|(seen, _)| *seen < id)
        {
            *last = Some((id, path.clone()));
        }
        self.complete(path, result);
    }

    /// From now on, the last job removed for each of `units` is noted.
    pub(super) fn watch_units(&mut self, units: &[String]) {
        for unit in units {
            self.watched.insert(unit.clone(), None);
        }
    }

    /// Stops noting `units`; the last job removed for each, if any.
    pub(super) fn unwatch_units(&mut self, units: &[String]) -> HashMap<String, (u32, String)> {
        units
            .iter()
            .filter_map(|unit| Some((unit.clone(), self.watched.remove(unit)??)))
            .collect()
    }

    pub(super) fn complete(&mut self, path: String, result: JobResult) {
        self.held.remove(&path);
        let result = match self.slots.remove(&path) {
            // A waiter that gave up (timed out) dropped its receiver: keep
            // the result for the next wait on the same job.
            Some(Slot::Waiting(tx)) => match tx.send(result) {
                Ok(()) => return,
                Err(result) => result,
            },
            _ => result,
        };
        self.slots.insert(path.clone(), Slot::Done(result));
        self.done_order.push_back(path);
        while self.done_order.len() > DONE_CACHE {
            if let Some(old) = self.done_order.pop_front()
                && matches!(self.slots.get(&old), Some(Slot::Done(_)))
            {
                self.slots.remove(&old);
            }
        }
    }

    /// The connection closed: every waiter learns it now.
    pub(super) fn close(&mut self) {
        self.closed = true;
        self.held.clear();
        for (_, slot) in self.slots.drain() {
            if let Slot::Waiting(tx) = slot {
                let _ = tx.send(JobResult::Disconnected);
            }
        }
    }

    pub(super) fn register(&mut self, path: &str) -> Registered {
        match self.slots.remove(path) {
            Some(Slot::Done(result)) => Registered::Done(result),
            _ if self.closed => Registered::Done(JobResult::Disconnected),
            _ => {
                let (tx, rx) = oneshot::channel();
                self.slots.insert(path.to_string(), Slot::Waiting(tx));
                Registered::Waiting(rx)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(jobs: &mut Jobs, path: &str) -> Option<JobResult> {
        match jobs.register(path) {
            Registered::Done(r) => Some(r),
            Registered::Waiting(_) => None,
        }
    }

    #[test]
    fn early_results_are_kept_for_late_waiters() {
        let mut jobs = Jobs::default();
        jobs.complete("/org/freedesktop/systemd1/job/7".into(), JobResult::Done);
        assert_eq!(
            done(&mut jobs, "/org/freedesktop/systemd1/job/7"),
            Some(JobResult::Done)
        );
        let Registered::Waiting(mut rx) = jobs.register("/j/8") else {
            panic!("nothing finished /j/8 yet")
        };
        jobs.complete("/j/8".into(), JobResult::Canceled);
        assert_eq!(rx.try_recv().unwrap(), JobResult::Canceled);
    }

    #[test]
    fn a_result_for_a_waiter_that_gave_up_is_kept() {
        let mut jobs = Jobs::default();
        let Registered::Waiting(rx) = jobs.register("/j/9") else {
            panic!("nothing finished /j/9 yet")
        };
        drop(rx); // the wait timed out
        jobs.complete("/j/9".into(), JobResult::Done);
        assert_eq!(done(&mut jobs, "/j/9"), Some(JobResult::Done));
    }

    #[test]
    fn the_done_cache_is_bounded() {
        let mut jobs = Jobs::default();
        for i in 0..(DONE_CACHE + 10) {
            jobs.complete(format!("/j/{i}"), JobResult::Done);
        }
        assert_eq!(jobs.slots.len(), DONE_CACHE);
        assert_eq!(done(&mut jobs, "/j/0"), None);
    }

    /// Issue 16: a permit is given back when its job finishes, also when
    /// the job finished before its permit was handed over.
    #[test]
    fn job_slots_come_back_when_their_jobs_finish() {
        let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(2));
        let mut jobs = Jobs::default();
        jobs.hold("/j/1", slots.clone().try_acquire_owned().unwrap());
        jobs.complete("/j/2".into(), JobResult::Done);
        jobs.hold("/j/2", slots.clone().try_acquire_owned().unwrap());
        assert_eq!(slots.available_permits(), 1, "/j/2 had finished already");
        jobs.complete("/j/1".into(), JobResult::Done);
        assert_eq!(slots.available_permits(), 2);
        jobs.hold("/j/3", slots.clone().try_acquire_owned().unwrap());
        jobs.close();
        assert_eq!(slots.available_permits(), 2, "a closed connection frees them all");
    }

    #[test]
    fn a_closed_connection_answers_every_waiter() {
        let mut jobs = Jobs::default();
        let Registered::Waiting(mut rx) = jobs.register("/j/1") else {
            panic!("nothing finished /j/1 yet")
        };
        jobs.close();
        assert_eq!(rx.try_recv().unwrap(), JobResult::Disconnected);
        assert_eq!(done(&mut jobs, "/j/2"), Some(JobResult::Disconnected));
    }

    #[test]
    fn the_last_removal_of_a_watched_unit_is_noted_and_its_result_kept() {
        let mut jobs = Jobs::default();
        let units = ["a.service".to_string(), "b.service".to_string()];
        jobs.removed(4, "/j/4".into(), "a.service", JobResult::Done);
        jobs.watch_units(&units);
        jobs.removed(9, "/j/9".into(), "a.service", JobResult::Done);
        // Signals can come out of order with each other: the newest stays.
        jobs.removed(7, "/j/7".into(), "a.service", JobResult::Canceled);
        jobs.removed(8, "/j/8".into(), "c.service", JobResult::Done);
        let seen = jobs.unwatch_units(&units);
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen["a.service"], (9, "/j/9".to_string()));
        assert_eq!(done(&mut jobs, "/j/9"), Some(JobResult::Done));
        jobs.removed(10, "/j/10".into(), "a.service", JobResult::Done);
        assert!(jobs.unwatch_units(&units).is_empty(), "no longer watched");
        assert!(jobs.watched.is_empty());
    }
}
