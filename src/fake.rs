//! A fake service manager for unit tests of the helpers' scheduling, on
//! tokio's paused clock: stop and start jobs take the time each unit is
//! told to take, and every job's span is recorded.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;
use zbus::OwnedObjectPath;

use crate::systemd::{Job, JobResult, Ops, SystemdError, UnitStatus};

#[derive(Debug, Clone, Copy)]
pub enum Behaviour {
    /// Stops (or starts) this long after the job is queued.
    Takes(Duration),
    /// Ignores SIGTERM: a stop ends only with SIGKILL.
    IgnoresTerm,
}

struct FakeJob {
    unit: String,
    queued: Instant,
    done_at: Option<Instant>,
    result: Option<&'static str>,
}

#[derive(Default)]
pub struct FakeOps {
    pub units: RefCell<HashMap<String, (bool, Behaviour)>>,
    jobs: RefCell<Vec<FakeJob>>,
    /// (unit, verb, begin, end) for every finished job.
    pub spans: RefCell<Vec<(String, &'static str, Instant, Instant)>>,
    pub killed: RefCell<Vec<String>>,
    pub cancelled: RefCell<Vec<String>>,
    verbs: RefCell<HashMap<u32, &'static str>>,
}

impl FakeOps {
    pub fn unit(self, name: &str, running: bool, behaviour: Behaviour) -> Self {
        self.units
            .borrow_mut()
            .insert(format!("berth@{name}.service"), (running, behaviour));
        self
    }

    fn queue(&self, unit: &str, verb: &'static str) -> Job {
        let behaviour = self
            .units
            .borrow()
            .get(unit)
            .map(|u| u.1)
            .unwrap_or(Behaviour::Takes(Duration::ZERO));
        let now = Instant::now();
        let dead = self.killed.borrow().iter().any(|k| k == unit);
        let done_at = match behaviour {
            _ if dead && verb == "stop" => Some(now),
            Behaviour::Takes(d) => Some(now + d),
            Behaviour::IgnoresTerm if verb == "start" => Some(now),
            Behaviour::IgnoresTerm => None,
        };
        let mut jobs = self.jobs.borrow_mut();
        jobs.push(FakeJob {
            unit: unit.into(),
            queued: now,
            done_at,
            result: None,
        });
        let id = jobs.len() as u32;
        self.verbs.borrow_mut().insert(id, verb);
        Job {
            path: format!("/job/{id}"),
            id,
        }
    }

    fn finish(&self, id: u32, result: &'static str) {
        let mut jobs = self.jobs.borrow_mut();
        let job = &mut jobs[id as usize - 1];
        if job.result.is_none() {
            job.result = Some(result);
            let verb = self.verbs.borrow()[&id];
            self.spans
                .borrow_mut()
                .push((job.unit.clone(), verb, job.queued, Instant::now()));
            if result == "done"
                && let Some(u) = self.units.borrow_mut().get_mut(&job.unit)
            {
                u.0 = verb == "start";
            }
        }
    }

    /// The most jobs of `verb` in flight at any one time.
    pub fn peak(&self, verb: &str) -> usize {
        let spans = self.spans.borrow();
        let mut edges: Vec<(Instant, i32)> = spans
            .iter()
            .filter(|s| s.1 == verb)
            .flat_map(|s| [(s.2, 1), (s.3, -1)])
            .collect();
        edges.sort_by_key(|e| (e.0, e.1));
        let (mut level, mut peak) = (0i32, 0i32);
        for (_, step) in edges {
            level += step;
            peak = peak.max(level);
        }
        peak as usize
    }

    pub fn span(&self, unit: &str, verb: &str) -> (Instant, Instant) {
        let spans = self.spans.borrow();
        let s = spans
            .iter()
            .find(|s| s.0 == format!("berth@{unit}.service") && s.1 == verb)
            .unwrap_or_else(|| panic!("no {verb} of {unit}"));
        (s.2, s.3)
    }
}

impl Ops for FakeOps {
    async fn list_workloads(&self) -> Result<Vec<UnitStatus>, SystemdError> {
        Ok(self
            .units
            .borrow()
            .iter()
            .map(|(name, (running, _))| UnitStatus {
                name: name.clone(),
                load_state: "loaded".into(),
                active_state: if *running { "active" } else { "inactive" }.into(),
                sub_state: String::new(),
                path: OwnedObjectPath::try_from("/").unwrap(),
            })
            .collect())
    }

    async fn start(&self, unit: &str) -> Result<Job, SystemdError> {
        Ok(self.queue(unit, "start"))
    }

    async fn stop(&self, unit: &str) -> Result<Job, SystemdError> {
        Ok(self.queue(unit, "stop"))
    }

    async fn kill(&self, unit: &str) -> Result<(), SystemdError> {
        self.killed.borrow_mut().push(unit.into());
        let now = Instant::now();
        for job in self.jobs.borrow_mut().iter_mut() {
            if job.unit == unit && job.result.is_none() {
                job.done_at = Some(now);
            }
        }
        Ok(())
    }

    async fn cancel(&self, unit: &str, job: &Job) -> Result<(), SystemdError> {
        self.cancelled.borrow_mut().push(unit.into());
        self.finish(job.id, "canceled");
        Ok(())
    }

    async fn wait(&self, job: &Job, limit: Option<Duration>) -> Option<JobResult> {
        let until = limit.map(|l| Instant::now() + l);
        loop {
            let (done_at, result) = {
                let jobs = self.jobs.borrow();
                let j = &jobs[job.id as usize - 1];
                (j.done_at, j.result)
            };
            if let Some(r) = result {
                return Some(r.into());
            }
            let now = Instant::now();
            if done_at.is_some_and(|d| d <= now) {
                self.finish(job.id, "done");
                return Some("done".into());
            }
            if until.is_some_and(|u| u <= now) {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn active_state(&self, unit: &str) -> Result<String, SystemdError> {
        let running = self.units.borrow().get(unit).is_some_and(|u| u.0);
        Ok(if running { "active" } else { "inactive" }.into())
    }
}
