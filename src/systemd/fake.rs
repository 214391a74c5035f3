//! A fake service manager for unit tests of the helpers' scheduling, on
//! tokio's paused clock: stop and start jobs take the time each unit is
//! told to take, and every job's span is recorded.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio::time::Instant;

use super::{
    ActiveState, Change, Job, JobResult, JobType, LoadState, Ops, SystemdError, UnitDetails, UnitFileState,
    UnitStatus, UnitTopology,
};

#[derive(Debug, Clone, Copy)]
pub enum Behaviour {
    /// Stops (or starts) this long after the job is queued.
    Takes(Duration),
    /// Ignores SIGTERM: a stop ends only with SIGKILL.
    IgnoresTerm,
    /// A bus that no longer answers: a stop call for this unit never returns.
    Unanswered,
}

struct FakeJob {
    unit: String,
    queued: Instant,
    done_at: Option<Instant>,
    result: Option<JobResult>,
}

#[derive(Default)]
pub struct FakeOps {
    pub units: RefCell<HashMap<String, (bool, Behaviour)>>,
    jobs: RefCell<Vec<FakeJob>>,
    /// (unit, verb, begin, end) for every finished job.
    pub spans: RefCell<Vec<(String, &'static str, Instant, Instant)>>,
    pub killed: RefCell<Vec<String>>,
    /// Units whose guest watcher was asked to destroy its guest.
    pub destroy_asked: RefCell<Vec<String>>,
    /// Units whose main process was sent SIGHUP.
    pub hung_up: RefCell<Vec<String>>,
    pub cancelled: RefCell<Vec<String>>,
    verbs: RefCell<HashMap<u32, &'static str>>,
    /// Where [`Ops::watch`]'s changes come from, once watched.
    pub changes: RefCell<Option<tokio::sync::mpsc::UnboundedSender<Change>>>,
    /// Units whose details systemd does not answer for (a timed-out call).
    pub unanswered: RefCell<Vec<String>>,
    /// unit → its InvocationID, as details() tells it.
    pub invocations: RefCell<HashMap<String, String>>,
    /// How long a start or stop call takes to be answered (the job is
    /// queued when it is): zero unless a test says otherwise.
    pub round_trip: std::cell::Cell<Duration>,
    /// How many times the units were listed.
    pub listings: std::cell::Cell<usize>,
    /// How many times a job's type was asked for.
    pub job_types_asked: std::cell::Cell<usize>,
    /// How many daemon-reloads were asked for.
    pub reloads: RefCell<u32>,
    /// The manager's SystemState; "running" unless a test says otherwise.
    pub system_state: RefCell<Option<String>>,
    /// kill() ends the unit's jobs but answers with an error.
    pub kill_reports_eio: std::cell::Cell<bool>,
    /// What manager_started_us() answers (0: 1).
    pub manager_started_us: std::cell::Cell<u64>,
    /// A daemon-reload that outlasts the call's timeout (it goes on).
    pub reload_times_out: std::cell::Cell<bool>,
    /// unit → an ActiveState other than what its running flag says.
    pub states: RefCell<HashMap<String, ActiveState>>,
    /// Every unit a stop was asked for, in order (finished or not).
    pub stops_asked: RefCell<Vec<String>>,
    /// unit → its NRestarts, as details() tells it (else unknown).
    pub restarts: RefCell<HashMap<String, u32>>,
    /// unit → its SubState in the listing and details() (else empty).
    pub sub_states: RefCell<HashMap<String, String>>,
    /// unit → what topology() tells of it (else: loaded, no dependencies).
    pub topologies: RefCell<HashMap<String, UnitTopology>>,
    /// unit → a pending job the listing and details() show (one queued
    /// by someone else: an admin's stop, the shutdown's).
    pub pending: RefCell<HashMap<String, (u32, JobType)>>,
    /// unit → how many of its next start jobs end `failed`.
    pub start_failures: RefCell<HashMap<String, u32>>,
    /// unit → how many of its next stop jobs end `canceled` at once, the
    /// unit still up (a start queued by someone else replaced them).
    pub stop_cancellations: RefCell<HashMap<String, u32>>,
}

impl FakeOps {
    pub fn unit(self, name: &str, running: bool, behaviour: Behaviour) -> Self {
        self.units
            .borrow_mut()
            .insert(crate::names::unit_name(name), (running, behaviour));
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
        let dead = self.killed.borrow().iter().any(|k| k == unit)
            || self.destroy_asked.borrow().iter().any(|k| k == unit);
        let done_at = match behaviour {
            _ if dead && verb == "stop" => Some(now),
            Behaviour::Takes(d) => Some(now + d),
            Behaviour::IgnoresTerm | Behaviour::Unanswered if verb == "start" => Some(now),
            Behaviour::IgnoresTerm | Behaviour::Unanswered => None,
        };
        let take_one = |counts: &RefCell<HashMap<String, u32>>| {
            counts
                .borrow_mut()
                .get_mut(unit)
                .filter(|n| **n > 0)
                .map(|n| *n -= 1)
                .is_some()
        };
        let result = if verb == "start" && take_one(&self.start_failures) {
            Some(JobResult::Failed)
        } else if verb == "stop" && take_one(&self.stop_cancellations) {
            Some(JobResult::Canceled)
        } else {
            None
        };
        let mut jobs = self.jobs.borrow_mut();
        jobs.push(FakeJob {
            unit: unit.into(),
            queued: now,
            done_at,
            result,
        });
        let id = jobs.len() as u32;
        self.verbs.borrow_mut().insert(id, verb);
        Job {
            path: format!("/job/{id}"),
            id,
        }
    }

    /// The unit's processes are gone: its pending jobs complete now.
    fn end_jobs_now(&self, unit: &str) {
        let now = Instant::now();
        for job in self.jobs.borrow_mut().iter_mut() {
            if job.unit == unit && job.result.is_none() {
                job.done_at = Some(now);
            }
        }
    }

    fn finish(&self, id: u32, result: JobResult) {
        let mut jobs = self.jobs.borrow_mut();
        let job = &mut jobs[id as usize - 1];
        if job.result.is_none() {
            let done = result == JobResult::Done;
            job.result = Some(result);
            let verb = self.verbs.borrow()[&id];
            self.spans
                .borrow_mut()
                .push((job.unit.clone(), verb, job.queued, Instant::now()));
            if done && let Some(u) = self.units.borrow_mut().get_mut(&job.unit) {
                u.0 = verb == "start";
            }
        }
    }

    /// Changes a unit's state behind berth's back (no job, no signal).
    pub fn set_running(&self, name: &str, running: bool) {
        if let Some(u) = self.units.borrow_mut().get_mut(&crate::names::unit_name(name)) {
            u.0 = running;
        }
    }

    /// A call's round trip.
    async fn answer(&self) {
        let round_trip = self.round_trip.get();
        if !round_trip.is_zero() {
            tokio::time::sleep(round_trip).await;
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
    async fn list_workloads(&self, _existing: &[String]) -> Result<Vec<UnitStatus>, SystemdError> {
        self.listings.set(self.listings.get() + 1);
        Ok(self
            .units
            .borrow()
            .iter()
            .map(|(name, (running, _))| UnitStatus {
                name: name.clone(),
                load_state: LoadState::Loaded,
                active_state: self
                    .states
                    .borrow()
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| state(*running)),
                sub_state: self.sub_states.borrow().get(name).cloned().unwrap_or_default(),
                path: crate::names::unit_object_path(name),
                job: self.pending.borrow().get(name).cloned(),
            })
            .collect())
    }

    async fn start(&self, unit: &str) -> Result<Job, SystemdError> {
        self.answer().await;
        Ok(self.queue(unit, "start"))
    }

    async fn stop(&self, unit: &str) -> Result<Job, SystemdError> {
        let unanswered = self
            .units
            .borrow()
            .get(unit)
            .is_some_and(|u| matches!(u.1, Behaviour::Unanswered));
        if unanswered {
            std::future::pending::<()>().await;
        }
        self.answer().await;
        self.stops_asked.borrow_mut().push(unit.to_string());
        Ok(self.queue(unit, "stop"))
    }

    async fn hang_up(&self, unit: &str) -> Result<(), SystemdError> {
        self.hung_up.borrow_mut().push(unit.into());
        Ok(())
    }

    /// A guest's watcher destroys its guest and ends: as a kill does.
    async fn ask_to_destroy(&self, unit: &str) -> Result<(), SystemdError> {
        self.destroy_asked.borrow_mut().push(unit.into());
        self.end_jobs_now(unit);
        Ok(())
    }

    async fn kill(&self, unit: &str) -> Result<(), SystemdError> {
        self.killed.borrow_mut().push(unit.into());
        self.end_jobs_now(unit);
        if self.kill_reports_eio.get() {
            // systemd 252 under load: the main process got SIGKILL, the
            // cgroup's other processes could not be signalled (it was
            // going away), and KillUnit says so.
            return Err(SystemdError {
                operation: "KillUnit",
                unit: unit.into(),
                error_name: "org.freedesktop.DBus.Error.IOError".into(),
                message: "Failed to send signal SIGKILL to auxiliary processes: Input/output error".into(),
            });
        }
        Ok(())
    }

    async fn cancel(&self, unit: &str, job: &Job) -> Result<(), SystemdError> {
        self.cancelled.borrow_mut().push(unit.into());
        self.finish(job.id, JobResult::Canceled);
        Ok(())
    }

    async fn wait(&self, job: &Job, limit: Option<Duration>) -> Option<JobResult> {
        let until = limit.map(|l| Instant::now() + l);
        loop {
            let (done_at, result) = {
                let jobs = self.jobs.borrow();
                let j = &jobs[job.id as usize - 1];
                (j.done_at, j.result.clone())
            };
            if let Some(r) = result {
                return Some(r);
            }
            let now = Instant::now();
            if done_at.is_some_and(|d| d <= now) {
                self.finish(job.id, JobResult::Done);
                return Some(JobResult::Done);
            }
            if until.is_some_and(|u| u <= now) {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn active_state(&self, unit: &str) -> Result<ActiveState, SystemdError> {
        if let Some(s) = self.states.borrow().get(unit) {
            return Ok(s.clone());
        }
        Ok(state(self.units.borrow().get(unit).is_some_and(|u| u.0)))
    }

    async fn details(&self, unit: &str) -> Result<UnitDetails, SystemdError> {
        if self.unanswered.borrow().iter().any(|u| u == unit) {
            return Err(SystemdError::local("GetAll", unit, "timed out"));
        }
        Ok(UnitDetails {
            load_state: LoadState::Loaded,
            active_state: self.active_state(unit).await?,
            invocation_id: self.invocations.borrow().get(unit).cloned().unwrap_or_default(),
            job_id: self.pending.borrow().get(unit).map_or(0, |(id, _)| *id),
            sub_state: self.sub_states.borrow().get(unit).cloned().unwrap_or_default(),
            n_restarts: self.restarts.borrow().get(unit).copied(),
            ..Default::default()
        })
    }

    async fn topology(&self, unit: &str) -> Result<UnitTopology, SystemdError> {
        if let Some(t) = self.topologies.borrow().get(unit) {
            return Ok(t.clone());
        }
        Ok(UnitTopology {
            load_state: LoadState::Loaded,
            active_state: self.active_state(unit).await?,
            ..Default::default()
        })
    }

    async fn job_type(&self, job: &str) -> Option<JobType> {
        self.job_types_asked.set(self.job_types_asked.get() + 1);
        let id: u32 = job.strip_prefix("/job/")?.parse().ok()?;
        self.verbs.borrow().get(&id).map(|v| JobType::from(*v))
    }

    async fn unit_file_state(&self, _unit: &str) -> Result<UnitFileState, SystemdError> {
        Ok(UnitFileState::Enabled)
    }

    async fn reload(&self) -> Result<(), SystemdError> {
        *self.reloads.borrow_mut() += 1;
        if self.reload_times_out.get() {
            return Err(SystemdError::local("Reload", "the manager", "timed out"));
        }
        Ok(())
    }

    async fn manager_started_us(&self) -> Result<u64, SystemdError> {
        Ok(self.manager_started_us.get().max(1))
    }

    async fn system_state(&self) -> Result<String, SystemdError> {
        Ok(self
            .system_state
            .borrow()
            .clone()
            .unwrap_or_else(|| "running".into()))
    }

    async fn enable_unit_file(&self, _unit: &str) -> Result<(), SystemdError> {
        Ok(())
    }

    async fn disable_unit_file(&self, _unit: &str) -> Result<(), SystemdError> {
        Ok(())
    }

    /// Changes the test sends itself, through [`FakeOps::changes`].
    async fn watch(&self, _existing: super::WatchedPaths) -> Result<UnboundedReceiver<Change>, SystemdError> {
        let (tx, rx) = unbounded_channel();
        *self.changes.borrow_mut() = Some(tx);
        Ok(rx)
    }
}

fn state(running: bool) -> ActiveState {
    if running {
        ActiveState::Active
    } else {
        ActiveState::Inactive
    }
}
