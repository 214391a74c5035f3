//! Stops queued together. On a connection made with
//! [`Systemd::stopping_together`] (the drain's), every stop asked for while
//! the previous batch is being queued joins the next batch, and a batch
//! reaches systemd as one transaction: a transient oneshot service with
//! `Conflicts=` on the batch's units, which queues a stop job for each.
//!
//! Why: over the bus, systemd answers every StopUnit only after asking
//! dbus-daemon for the caller's credentials (a synchronous round trip
//! inside PID 1) and adding a match rule to track the caller, and it runs
//! no job while calls are waiting. A first drain of 200 spent its first
//! 140-170 ms there before any workload stopped. A transaction's
//! Conflicts= jobs cost neither.
//!
//! Each unit's job is then learned from one ListJobs; a job that already
//! finished is known from its JobRemoved. A unit neither shows (it was
//! down already, or another job replaced its stop), or a batch whose
//! transaction systemd refuses, falls back to a StopUnit of its own, as
//! before. A transaction or a listing that gets no answer fails the
//! batch's stops: systemd may have queued them, and a StopUnit each would
//! wait as long again on a bus that does not answer.
//!
//! One difference from StopUnit: systemd applies `RefuseManualStop=` only
//! to a unit asked for by name, so the drain now stops such a unit too.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures_util::future::join_all;
use tokio::sync::oneshot;
use zbus::OwnedObjectPath;
use zbus::Variant as Value;

use super::connection::{Systemd, Together};
use super::error::SystemdError;
use super::proxies::ListedJob;

impl Systemd {
    /// This connection's stops are queued together (see the module).
    pub fn stopping_together(mut self) -> Systemd {
        self.together = Some(Arc::new(Together::default()));
        self
    }

    /// Queues `unit`'s stop with the next batch; its job's path.
    pub(super) async fn stop_with_others(
        &self,
        together: &Arc<Together>,
        unit: &str,
    ) -> Result<String, SystemdError> {
        let (tx, rx) = oneshot::channel();
        let first = match together.state.lock() {
            Ok(mut waiting) => {
                waiting.stops.push((unit.to_string(), tx));
                !std::mem::replace(&mut waiting.sending, true)
            }
            Err(_) => return Err(SystemdError::local("StopUnit", unit, "the batch is broken")),
        };
        if first {
            let (systemd, together) = (self.clone(), together.clone());
            tokio::spawn(async move { systemd.send_batches(&together).await });
        }
        rx.await
            .unwrap_or_else(|_| Err(SystemdError::local("StopUnit", unit, "the connection is closing")))
    }

    /// Sends batches until no stop waits: a batch collects what was asked
    /// for while the one before it was on its way.
    async fn send_batches(&self, together: &Together) {
        loop {
            // The other stops of this round of the caller's loop join in.
            tokio::task::yield_now().await;
            let batch = match together.state.lock() {
                Ok(mut waiting) if waiting.stops.is_empty() => {
                    waiting.sending = false;
                    return;
                }
                Ok(mut waiting) => std::mem::take(&mut waiting.stops),
                Err(_) => return,
            };
            let units: Vec<String> = batch.iter().map(|(unit, _)| unit.clone()).collect();
            let seq = together.batches.fetch_add(1, Ordering::Relaxed);
            let jobs = self.stop_batch(&units, seq).await;
            for ((_, tx), job) in batch.into_iter().zip(jobs) {
                let _ = tx.send(job);
            }
        }
    }

    /// One transaction for `units`, then each unit's job path.
    async fn stop_batch(&self, units: &[String], seq: u64) -> Vec<Result<String, SystemdError>> {
        if let Ok(mut jobs) = self.jobs.lock() {
            jobs.watch_units(units);
        }
        let name = format!("berth-stop-{}-{seq}.service", std::process::id());
        let exec: Vec<(&str, Vec<&str>, bool)> = vec![("/bin/true", vec!["/bin/true"], false)];
        let properties = [
            (
                "Description",
                Value::from(format!(
                    "berth: {} stop{} together",
                    units.len(),
                    if units.len() == 1 { "" } else { "s" }
                )),
            ),
            ("Type", Value::from("oneshot")),
            ("ExecStart", Value::from(exec)),
            // Out of the shutdown transaction, like the workloads.
            ("DefaultDependencies", Value::from(false)),
            ("Conflicts", Value::from(units.to_vec())),
            ("CollectMode", Value::from("inactive-or-failed")),
        ];
        let queued = self
            .bounded(
                "StartTransientUnit",
                &name,
                self.manager
                    .start_transient_unit(&name, "replace", &properties, &[]),
            )
            .await;
        let listed = match &queued {
            Ok(_) => Some(
                self.bounded("ListJobs", "the manager", self.manager.list_jobs())
                    .await,
            ),
            Err(_) => None,
        };
        let removed = match self.jobs.lock() {
            Ok(mut jobs) => jobs.unwatch_units(units),
            Err(_) => HashMap::new(),
        };
        let known = match after_transaction(units, queued, listed, &removed) {
            Ok(known) => known,
            Err(e) => return units.iter().map(|_| Err(e.clone())).collect(),
        };
        join_all(units.iter().zip(known).map(|(unit, known)| async move {
            match known {
                Some(path) => Ok(path),
                None => {
                    self.queue_job("StopUnit", unit, self.manager.stop_unit(unit, "replace"))
                        .await
                }
            }
        }))
        .await
    }
}

/// What a batch's transaction and listing leave each unit: its job's
/// path, or `None` for a StopUnit of its own (refused, or queued and not
/// listed). No answer to either call fails them all: the transaction may
/// have been applied, and a StopUnit each would wait as long again.
fn after_transaction(
    units: &[String],
    queued: Result<OwnedObjectPath, SystemdError>,
    listed: Option<Result<Vec<ListedJob>, SystemdError>>,
    removed: &HashMap<String, (u32, String)>,
) -> Result<Vec<Option<String>>, SystemdError> {
    match (queued, listed) {
        (Ok(anchor), Some(Ok(listed))) => {
            let anchor = super::ops::job(anchor.as_str().to_string()).id;
            Ok(jobs_of(units, anchor, &listed, removed))
        }
        (Err(e), _) | (_, Some(Err(e))) if e.is_transient() => Err(e),
        _ => Ok(vec![None; units.len()]),
    }
}

/// Each unit's stop job after a batch's transaction (`anchor`, the id of
/// the transient unit's own start job, which is older than every job the
/// transaction queued): the stop job ListJobs shows for it (a stop queued
/// earlier, which the batch's merged into, included), else the job whose
/// JobRemoved came for it after the anchor. `None`: no stop job is known.
fn jobs_of(
    units: &[String],
    anchor: u32,
    listed: &[ListedJob],
    removed: &HashMap<String, (u32, String)>,
) -> Vec<Option<String>> {
    units
        .iter()
        .map(|unit| {
            let queued = listed
                .iter()
                .find(|j| j.1 == *unit && j.2 == "stop")
                .map(|j| j.4.as_str().to_string());
            queued.or_else(|| {
                removed
                    .get(unit)
                    .filter(|(id, _)| *id > anchor)
                    .map(|(_, path)| path.clone())
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(id: u32, unit: &str, kind: &str) -> ListedJob {
        let path = |p: String| OwnedObjectPath::try_from(p).unwrap();
        (
            id,
            unit.to_string(),
            kind.to_string(),
            "waiting".to_string(),
            path(format!("/org/freedesktop/systemd1/job/{id}")),
            path("/org/freedesktop/systemd1/unit/x".to_string()),
        )
    }

    #[test]
    fn each_unit_gets_the_stop_job_systemd_shows_or_has_just_finished() {
        let units: Vec<String> = ["a", "b", "c", "d", "e", "f"].map(String::from).to_vec();
        let listed = [
            listed(11, "a", "stop"),
            // A stop queued before the batch, which the batch's merged into.
            listed(3, "b", "stop"),
            // A start queued after the batch replaced its stop: unknown.
            listed(14, "c", "start"),
            listed(12, "x", "stop"),
        ];
        let removed: HashMap<String, (u32, String)> = [
            ("d", 13, "/j/13"),
            // Finished before the batch: not the batch's stop.
            ("e", 9, "/j/9"),
        ]
        .into_iter()
        .map(|(unit, id, path)| (unit.to_string(), (id, path.to_string())))
        .collect();
        let path = |id: u32| Some(format!("/org/freedesktop/systemd1/job/{id}"));
        assert_eq!(
            jobs_of(&units, 10, &listed, &removed),
            vec![path(11), path(3), None, Some("/j/13".to_string()), None, None]
        );
    }

    #[test]
    fn a_refused_batch_falls_back_and_an_unanswered_one_fails() {
        let units: Vec<String> = vec!["a".into(), "b".into()];
        let anchor = || Ok(OwnedObjectPath::try_from("/org/freedesktop/systemd1/job/10").unwrap());
        fn refused<T>() -> Result<T, SystemdError> {
            Err(SystemdError {
                operation: "StartTransientUnit",
                unit: "berth-stop-1-0.service".into(),
                error_name: "org.freedesktop.DBus.Error.InvalidArgs".into(),
                message: "no".into(),
            })
        }
        fn silent<T>() -> Result<T, SystemdError> {
            Err(SystemdError::local("ListJobs", "the manager", "no answer"))
        }
        let none = HashMap::new();
        let known = after_transaction(&units, anchor(), Some(Ok(vec![listed(11, "a", "stop")])), &none);
        assert_eq!(
            known.unwrap(),
            vec![Some("/org/freedesktop/systemd1/job/11".into()), None]
        );
        let cases = [
            // Refused: a StopUnit each.
            (refused(), None, Some(vec![None, None])),
            (anchor(), Some(refused()), Some(vec![None, None])),
            // No answer: every stop fails, none is asked again.
            (silent(), None, None),
            (anchor(), Some(silent()), None),
        ];
        for (queued, listing, want) in cases {
            let what = format!("{queued:?} {listing:?}");
            assert_eq!(
                after_transaction(&units, queued, listing, &none).ok(),
                want,
                "{what}"
            );
        }
    }
}
