//! The supervisor's state and its reactions: a pass over every workload,
//! a signal about one, and recording what the classifier decided.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::classify::{self, Decision, SeenBy, Settled};
use crate::api::health::{self, Health, HealthStatus};
use crate::api::metrics::{Facts, Kind};
use crate::api::{RecordJson, Shared, WorkloadView};
use crate::config::{self, HostSettings, Loaded};
use crate::events::Events;
use crate::names;
use crate::paths::Root;
use crate::state::lock;
use crate::state::records::{self, ExitCause, RecordState, TransitionReason};
use crate::systemd::{ActiveState, Change, JobType, Ops, UnitDetails, WatchedPaths};
use crate::time::rfc3339;

/// How long a seen start or stop job explains a transition.
const JOB_MEMORY: Duration = Duration::from_secs(120);

pub(super) struct Supervisor<O: Ops> {
    pub(super) sd: O,
    pub(super) root: Root,
    /// The host settings: what `berth.toml` said at the last (re)load.
    pub(super) host: HostSettings,
    /// The configured workloads and their kind (for the metrics).
    /// Nothing else of their definitions: 5000 of them held 2.5 MB the
    /// daemon never read.
    configured: BTreeMap<String, Kind>,
    /// Which unit each workload is (`unit =` workloads name their own).
    units: names::WorkloadUnits,
    /// The object paths of those units, shared with the watcher.
    watched: WatchedPaths,
    pub(super) events: Events,
    /// unit → (job type, when seen)
    jobs: HashMap<String, (JobType, Instant)>,
    pub(super) deferred: Vec<String>,
    pub(super) heartbeat: SystemTime,
    pub(super) api: Option<Arc<Shared>>,
    /// Every workload configured or loaded at the last pass, and those
    /// signalled since: what was seen of it. A pass looks closer only at
    /// what changed, so an idle pass is one D-Bus call.
    tracked: HashMap<String, Tracked>,
    /// Workloads whose MainPID and InvocationID the API still lacks; filled
    /// a few at a time after READY, so adoption of many is quick.
    pub(super) fill: VecDeque<String>,
    /// Running workloads the first pass found: looked at closely after
    /// READY, a chunk at a time. Their InvocationID is read (a new one
    /// than the record's is a restart made while no supervisor watched;
    /// a record without one gets it, so that the next such restart is
    /// seen) and adoption records are written. Creating a thousand files
    /// took most of a second on a slow disk, and a thousand round trips
    /// more: READY does not wait for either.
    pub(super) after_ready: VecDeque<String>,
    /// Set during the first pass: running workloads go to `after_ready`.
    first_pass: bool,
    /// Set during a later pass: a transition it finds goes to
    /// `after_ready` too, to be read and recorded a chunk per loop turn.
    /// Read one after the other inside the pass, the 2000 exits of a
    /// `systemctl stop` of 2000 workloads took longer than the watchdog
    /// (systemd, busy with the stops, answered each read in ~50 ms).
    passing: bool,
    /// Records written (renamed into place) but not yet fsynced: the
    /// loop hands them to a blocking thread every [`SYNC_EVERY`], so no
    /// fsync ever runs on the loop, and a transition is logged right
    /// after its record is in place, not after a slow disk's sync (a
    /// daemon killed in between would have left the record without its
    /// line).
    unsynced: BTreeSet<String>,
    /// A sync of `unsynced` is running on the blocking pool.
    syncing: bool,
    /// The last InvocationIDs whose end was recorded, per workload: a
    /// queued signal showing one of them is older than that record.
    ended: HashMap<String, VecDeque<String>>,
    /// Cluster mode: the agent on its own thread (keep-alives, taking,
    /// fencing), told to hand over for maintenance when the daemon leaves.
    pub(super) cluster: Option<crate::cluster::Agent>,
    /// The last drain's and autostart's reports' mtime and size when
    /// last read.
    last_drain_stamp: Option<FileStamp>,
    last_autostart_stamp: Option<FileStamp>,
    /// `[daemon] metrics_textfile`, written after passes.
    pub(super) textfile: Option<crate::api::metrics::textfile::Textfile>,
}

/// What the supervisor last saw of a workload.
struct Tracked {
    active: ActiveState,
    /// The record's mtime after the last look: a record rewritten behind
    /// the supervisor's back (a helper, an admin) is looked at again.
    record_mtime: Option<SystemTime>,
}

/// How often the daemon's loop hands written records to a sync.
pub(super) const SYNC_EVERY: Duration = Duration::from_millis(200);

/// Ended InvocationIDs remembered per workload.
const ENDED_MEMORY: usize = 16;

/// Workloads looked at closely per turn of the loop after READY.
const AFTER_READY_CHUNK: usize = 64;
/// And for no longer than this per turn: with systemd busy (thousands of
/// jobs) a read takes ~50 ms, and the turn must end well inside the
/// watchdog's 15 s ping interval, the API and the signals waiting too.
const TURN_BUDGET: Duration = Duration::from_millis(500);

impl<O: Ops> Supervisor<O> {
    pub(super) fn new(sd: O, root: Root, loaded: Loaded, events: Events, api: Option<Arc<Shared>>) -> Self {
        let mut sup = Supervisor {
            sd,
            root,
            host: loaded.host.clone(),
            configured: BTreeMap::new(),
            units: names::WorkloadUnits::default(),
            watched: WatchedPaths::default(),
            events,
            jobs: HashMap::new(),
            deferred: Vec::new(),
            heartbeat: SystemTime::now(),
            api,
            tracked: HashMap::new(),
            fill: VecDeque::new(),
            after_ready: VecDeque::new(),
            first_pass: false,
            passing: false,
            unsynced: BTreeSet::new(),
            syncing: false,
            ended: HashMap::new(),
            cluster: None,
            last_drain_stamp: None,
            last_autostart_stamp: None,
            textfile: None,
        };
        sup.configure(loaded);
        sup
    }

    /// Takes what the daemon needs of a (re)loaded config.
    pub(super) fn configure(&mut self, loaded: Loaded) {
        self.units = loaded.workload_units();
        self.share_watched(self.watched.clone());
        self.host = loaded.host;
        self.configured = loaded
            .workloads
            .into_iter()
            .map(|w| {
                let kind = Kind::of(&w.kind);
                (w.name, kind)
            })
            .collect();
    }

    /// Keeps `watched` (the watcher's filter) holding the object paths of
    /// the `unit =` workloads.
    pub(super) fn share_watched(&mut self, watched: WatchedPaths) {
        if let Ok(mut paths) = watched.write() {
            *paths = self.units.existing_paths().cloned().collect();
        }
        self.watched = watched;
    }

    /// One scan of every workload unit; returns how many run.
    pub(super) async fn pass(&mut self, first: bool) -> usize {
        let began = std::time::Instant::now();
        // The freezes the API shows: a flag written by hand is seen within
        // one pass (the cluster agent tells its own changes at once).
        if let Some(api) = self.api.clone() {
            api.set_freezes(crate::state::freeze::all(&self.root));
            self.look_at_reports(&api);
        }
        let live = match self.sd.list_workloads(&self.units.existing_units()).await {
            Ok(live) => live,
            Err(e) => {
                self.events
                    .warn(&format!("pass: cannot list the workload units: {e}"));
                if let Some(api) = &self.api {
                    api.set_systemd_ok(false);
                }
                return 0;
            }
        };
        let mut running = 0;
        let mut states: HashMap<String, ActiveState> = HashMap::with_capacity(live.len());
        for u in live {
            if let Some(name) = self.units.workload_of(&u.name)
                && self.is_followed(name, &u.active_state)
            {
                states.insert(name.to_string(), u.active_state);
            }
        }
        // A map, not a search of the listed per workload: that was
        // quadratic, 12.5 million comparisons a pass at 5000 workloads.
        for name in self.configured.keys() {
            if !states.contains_key(name) {
                states.insert(name.clone(), ActiveState::Inactive);
            }
        }
        self.first_pass = first;
        self.passing = !first;
        // What a busy lock deferred is looked at again now.
        let deferred: BTreeSet<String> = std::mem::take(&mut self.deferred).into_iter().collect();
        // Gone from systemd and from config: forgotten (and its view
        // DELETED), before the pass, so that it holds no memory.
        self.tracked.retain(|name, _| states.contains_key(name));
        self.ended.retain(|name, _| states.contains_key(name));
        if let Some(api) = &self.api {
            api.retain(|name| states.contains_key(name));
        }
        for (name, active) in states {
            // A record rewritten behind its back (a helper, an admin, a
            // corrupted file) is looked at again too: a stat per workload.
            let mtime = record_mtime(&self.root, &name);
            let seen = self.tracked.get(&name);
            let touched = seen.is_none_or(|t| t.record_mtime != mtime);
            let changed = seen.is_none_or(|t| t.active != active);
            if first || changed || touched || deferred.contains(&name) {
                let listed = UnitDetails {
                    active_state: active.clone(),
                    ..Default::default()
                };
                self.reconcile(&name, SeenBy::Scan, Some(listed)).await;
            }
            if active.is_up() {
                running += 1;
            }
            // Read again only if this pass wrote the record.
            let mtime = if first || changed || touched || deferred.contains(&name) {
                record_mtime(&self.root, &name)
            } else {
                mtime
            };
            self.tracked.insert(
                name,
                Tracked {
                    active,
                    record_mtime: mtime,
                },
            );
        }
        self.first_pass = false;
        self.passing = false;
        self.heartbeat = SystemTime::now();
        let health = self.health();
        if let Err(e) = health::write_status(&self.root, self.heartbeat, running, &health) {
            self.events.warn(&format!(
                "cannot write {}: {e}",
                health::status_path(&self.root).display()
            ));
        }
        if let Some(api) = &self.api {
            api.passed(self.heartbeat, health);
            api.observe_pass(began.elapsed());
        }
        running
    }

    /// Reads the last drain's and the last autostart's reports for the
    /// metrics when they changed (a drain by hand while the daemon runs;
    /// at boot, the shutdown's and the boot's): a stat each per pass.
    fn look_at_reports(&mut self, api: &Shared) {
        use crate::state::{autostart_report, drain_report};
        if changed(&mut self.last_drain_stamp, &drain_report::path(&self.root)) {
            match drain_report::read(&self.root) {
                Ok((_, report)) => api.set_last_drain(Some(report)),
                Err(drain_report::ReadError::Missing(_)) => api.set_last_drain(None),
                Err(e) => {
                    api.set_last_drain(None);
                    self.events.warn(&format!("metrics: {e}"));
                }
            }
        }
        if changed(
            &mut self.last_autostart_stamp,
            &autostart_report::path(&self.root),
        ) {
            match autostart_report::read(&self.root) {
                Ok(report) => api.set_last_autostart(report),
                Err(e) => {
                    api.set_last_autostart(None);
                    self.events.warn(&format!("metrics: {e}"));
                }
            }
        }
    }

    pub(super) async fn on_change(&mut self, change: Change) {
        match change {
            Change::JobNew { job, unit } => {
                let Some(name) = self.units.workload_of(&unit) else {
                    return;
                };
                // A helper holds the workload's lock across its job and
                // records what the job did: its type is not worth a call
                // into systemd, which a drain of 200 made 200 times while
                // systemd was busiest.
                let kind = if lock::workload_held(&self.root, name) {
                    JobType::Other(classify::JOB_OF_HELPER.into())
                } else {
                    // A job that is gone by the time it is asked about ran
                    // and ended at once: noted as such (a quick stop).
                    self.sd
                        .job_type(&job)
                        .await
                        .unwrap_or_else(|| JobType::Other(classify::JOB_GONE.into()))
                };
                self.jobs.insert(unit, (kind, Instant::now()));
            }
            // Handled by the daemon's loop (it may relaunch).
            Change::Reloaded => {}
            Change::Properties {
                path,
                observed,
                exit_known,
            } => {
                // Decoded from the path (systemd's escaping is exact): no
                // map of 5000 paths is kept.
                if let Some(name) = self.units.workload_of_path(&path) {
                    let observed = match observed {
                        // Down, waiting for its restart, or up with no
                        // restart count: what the Service signal would
                        // have told is read now.
                        Some(seen)
                            if !exit_known
                                && (seen.active_state.is_down()
                                    || seen.restart_pending()
                                    || seen.n_restarts.is_none()) =>
                        {
                            self.with_exit_cause(&name, seen).await
                        }
                        other => other,
                    };
                    self.reconcile(&name, SeenBy::Signal, observed).await;
                }
            }
        }
    }

    /// A signal's state with the exit cause read now: the Service signal
    /// that carries it was not seen (a unit's first signal since this
    /// daemon started). The state stays the signal's: read now instead,
    /// it may already be past queued signals (a stop's first signal, read
    /// after the stop, made a `systemctl stop` look like an exit with no
    /// job). None when systemd does not answer: deferred like any read.
    async fn with_exit_cause(&self, name: &str, mut seen: UnitDetails) -> Option<UnitDetails> {
        let now = self.details(&self.units.unit_of(name)).await?;
        seen.result = now.result;
        seen.exec_main_code = now.exec_main_code;
        seen.exec_main_status = now.exec_main_status;
        seen.main_pid = now.main_pid;
        seen.n_restarts = seen.n_restarts.or(now.n_restarts);
        Some(seen)
    }

    /// Looks closely at the next chunk of the workloads the first pass
    /// found running (their records are synced with the others: see
    /// `unsynced`).
    pub(super) async fn look_closer_next(&mut self) {
        let until = Instant::now() + TURN_BUDGET;
        for _ in 0..AFTER_READY_CHUNK {
            if Instant::now() >= until {
                break;
            }
            let Some(name) = self.after_ready.pop_front() else {
                break;
            };
            self.reconcile(&name, SeenBy::Scan, None).await;
        }
    }

    /// Looks again at what was deferred (a lock a helper held across its
    /// job, a read systemd did not answer), a chunk at most, from a 1 s
    /// tick of the loop. Retried after every signal instead, a drain's 256
    /// locked workloads cost 256 reads per signal, and the reads held back
    /// the drain's own calls.
    pub(super) async fn retry_deferred(&mut self) {
        let retry: Vec<String> = self
            .deferred
            .drain(..self.deferred.len().min(AFTER_READY_CHUNK))
            .collect();
        let until = Instant::now() + TURN_BUDGET;
        for (i, name) in retry.iter().enumerate() {
            if Instant::now() >= until {
                self.deferred.extend(retry[i..].iter().cloned());
                break;
            }
            self.reconcile(name, SeenBy::Scan, None).await;
        }
        // Converged now: /healthz says so at once, not a pass later.
        if self.deferred.is_empty()
            && let Some(api) = &self.api
        {
            api.passed(self.heartbeat, self.health());
        }
    }

    /// Whether records wait for a sync and none is running.
    pub(super) fn wants_sync(&self) -> bool {
        !self.unsynced.is_empty() && !self.syncing
    }

    /// A sync of the blocking pool is done: the next may begin.
    pub(super) fn synced(&mut self, result: std::io::Result<()>) {
        self.syncing = false;
        if let Err(e) = result {
            self.events.warn(&format!("cannot sync the records: {e}"));
        }
    }

    /// The same sync, here and now: on the way out.
    pub(super) fn sync_now(&mut self) -> std::io::Result<()> {
        sync_paths(self.unsynced_paths(), records::records_dir(&self.root))
    }

    fn unsynced_paths(&mut self) -> Vec<std::path::PathBuf> {
        std::mem::take(&mut self.unsynced)
            .iter()
            .map(|name| records::record_path(&self.root, name))
            .collect()
    }

    /// Syncs the records written since the last sync, and their
    /// directory, on the blocking pool; the result comes back on `done`.
    pub(super) fn sync_records(&mut self, done: tokio::sync::mpsc::UnboundedSender<std::io::Result<()>>) {
        let (paths, dir) = (self.unsynced_paths(), records::records_dir(&self.root));
        self.syncing = true;
        tokio::task::spawn_blocking(move || {
            let _ = done.send(sync_paths(paths, dir));
        });
    }

    /// Whether a loaded `berth@NAME.service` is berth's to record: a valid
    /// name that is configured, running, or already has a record. Anyone
    /// can load a unit (`systemctl status berth@junk1.service`); a loaded,
    /// unconfigured, idle instance gets no record, no lock and no view.
    fn is_followed(&self, name: &str, active: &ActiveState) -> bool {
        names::is_valid_workload_name(name)
            && (self.configured.contains_key(name)
                || active.is_up()
                || records::record_path(&self.root, name).exists())
    }

    /// Compares systemd's state of one workload with its record and records
    /// the transition nobody else recorded.
    /// `known`: what a signal showed (the state at that moment, complete)
    /// or a pass listed (the ActiveState alone: details are fetched only
    /// when a transition is to be recorded); None: ask systemd now.
    async fn reconcile(&mut self, name: &str, seen_by: SeenBy, known: Option<UnitDetails>) {
        let unit = self.units.unit_of(name);
        let Some((details, now)) = self.settled(name, &unit, seen_by, known).await else {
            return;
        };
        let job = self.track(name, &unit, &details, now, seen_by);
        let record = self.record(name, &unit, &details, now, job.as_ref(), seen_by);
        self.publish(name, unit, &details, record);
    }

    /// The unit's settled state, read again where a signal cannot tell;
    /// None when there is nothing to record now (not settled, not
    /// followed, a stale signal, or put off: deferred or after READY).
    async fn settled(
        &mut self,
        name: &str,
        unit: &str,
        seen_by: SeenBy,
        known: Option<UnitDetails>,
    ) -> Option<(UnitDetails, Settled)> {
        let mut details = match known {
            Some(known) => known,
            None => match self.details(unit).await {
                Some(details) => details,
                None => {
                    self.deferred.push(name.to_string());
                    return None;
                }
            },
        };
        let mut now = Settled::of_unit(&details)?;
        if !self.is_followed(name, &details.active_state) {
            return None;
        }
        let recorded = records::load(&self.root, name).ok().flatten();
        let was_running = recorded.as_ref().is_some_and(|r| r.state == RecordState::Running);
        // A signal shows the state when it was sent; reads and passes show
        // it now. A signal still queued behind a newer read must not undo
        // what that read recorded (an instance ended twice, or started
        // again after its end).
        if seen_by == SeenBy::Signal && !details.invocation_id.is_empty() {
            // A job still pending is not settled, whatever the state
            // shows: a stop's first signal still shows the unit active, a
            // start's first one down under a new InvocationID. The signal
            // without the job follows. Taken as settled, a drain's stop
            // read late (after the drain recorded it and let go of the
            // lock) became a start nobody made, then a user's stop.
            if details.job_id != 0 {
                return None;
            }
            let shown = details.invocation_id.as_str();
            let running = recorded
                .as_ref()
                .filter(|_| was_running)
                .and_then(|r| r.invocation_id.as_deref());
            let ended = self.ended.get(name).is_some_and(|e| e.iter().any(|i| i == shown));
            if ended && running != Some(shown) {
                return None;
            }
            // Another instance than the running one on record, shown down:
            // older or newer, only a read now can tell.
            if now != Settled::Running && running.is_some_and(|r| r != shown) {
                details = match self.details(unit).await {
                    Some(details) => details,
                    None => {
                        self.deferred.push(name.to_string());
                        return None;
                    }
                };
                now = Settled::of_unit(&details)?;
            }
        }
        // An adoption records neither an exit cause nor an InvocationID:
        // no details to ask for. A thousand record-less running workloads
        // (a first start on a busy host, or after `uninstall --purge`) are
        // adopted without a thousand round trips before READY.
        let adopting = now == Settled::Running
            && seen_by == SeenBy::Scan
            && recorded.as_ref().is_none_or(|r| r.state == RecordState::Unknown);
        if self.first_pass && (adopting || (was_running && now == Settled::Running)) {
            self.after_ready.push_back(name.to_string());
            return None;
        }
        if (now == Settled::Running) != was_running && details.invocation_id.is_empty() && !adopting {
            // The first pass too: a thousand workloads started while no
            // daemon ran took 2.8 s of reads and records before READY.
            if self.passing || self.first_pass {
                self.after_ready.push_back(name.to_string());
                return None;
            }
            details = match self.details(unit).await {
                Some(details) => details,
                None => {
                    self.deferred.push(name.to_string());
                    return None;
                }
            };
        } else if details.invocation_id.is_empty() && self.api.is_some() {
            self.fill.push_back(name.to_string());
        }
        Some((details, now))
    }

    /// Notes the unit's state for the next pass; the job this daemon saw
    /// end on it lately, which explains what follows.
    fn track(
        &mut self,
        name: &str,
        unit: &str,
        details: &UnitDetails,
        now: Settled,
        seen_by: SeenBy,
    ) -> Option<JobType> {
        match self.tracked.get_mut(name) {
            Some(t) => t.active = details.active_state.clone(),
            // First seen by a signal: its record's mtime is unknown, so
            // the next pass looks at it once more.
            None => {
                self.tracked.insert(
                    name.to_string(),
                    Tracked {
                        active: details.active_state.clone(),
                        record_mtime: None,
                    },
                );
            }
        }
        let job = self
            .jobs
            .get(unit)
            .filter(|(_, at)| at.elapsed() < JOB_MEMORY)
            .map(|(kind, _)| kind.clone());
        // A gone job that left the unit running (a start of a running
        // unit ends at once too) explains no later exit; a signal that
        // still shows a job pending (a stop's first signal shows the unit
        // active) says nothing yet.
        if now == Settled::Running
            && seen_by == SeenBy::Signal
            && details.job_id == 0
            && job.as_ref().is_some_and(|j| j.as_str() == classify::JOB_GONE)
        {
            self.jobs.remove(unit);
        }
        job
    }

    /// Records what the state means ([`classify::classify`]), telling a
    /// transition in the journal before it is written; the record as it
    /// is now.
    fn record(
        &mut self,
        name: &str,
        unit: &str,
        details: &UnitDetails,
        now: Settled,
        job: Option<&JobType>,
        seen_by: SeenBy,
    ) -> Option<records::Record> {
        let stamp = rfc3339(SystemTime::now());
        // The definition on disk now (a daemon-reload may have brought a
        // new one since this daemon read its config), read only when a
        // start is recorded.
        let root = self.root.clone();
        let definition =
            || config::load_workload(&root, name).map(|w| crate::render::definition_fingerprint(&root, &w));
        let current = Some(details.invocation_id.clone()).filter(|i| !i.is_empty());
        let events = &self.events;
        let mut ended_here = None;
        let mut started_here = false;
        let restarts = details.n_restarts;
        // Written in place without waiting for the disk: see `unsynced`.
        let unsynced = crate::state::atomic::Batch::begin();
        let outcome = records::try_update(&self.root, name, |r| {
            // A count that went down was reset by a start by hand.
            let restarted = restarts.is_some_and(|n| n > r.restarts.unwrap_or(0));
            match classify::classify(r, now, current.as_deref(), job, seen_by, restarted) {
                // The count follows systemd's even without a transition
                // (restarts that failed, a reset by hand): a later start
                // is compared with the count it followed.
                Decision::Nothing => {
                    r.restarts = restarts.or(r.restarts);
                    false
                }
                Decision::NoteInvocation => {
                    r.invocation_id = current.clone();
                    r.restarts = restarts.or(r.restarts);
                    false
                }
                Decision::Adopt => {
                    r.state = RecordState::Running;
                    r.adopted_at = Some(stamp.clone());
                    r.invocation_id = current.clone();
                    r.restarts = restarts;
                    false
                }
                Decision::Refine => {
                    r.state = now.record_state();
                    r.restarts = restarts.or(r.restarts);
                    false
                }
                Decision::Transition(reason) => {
                    // A stop ends the recorded instance; a start ends it
                    // only if it was another one (a restart).
                    let ended = r
                        .invocation_id
                        .clone()
                        .filter(|old| now != Settled::Running || Some(old) != current.as_ref());
                    ended_here.clone_from(&ended);
                    started_here = now == Settled::Running;
                    r.state = now.record_state();
                    r.detected_by = Some(seen_by.as_str().into());
                    r.restarts = restarts.or(r.restarts);
                    if now == Settled::Running {
                        r.exit_cause = None;
                        r.definition = definition();
                        r.invocation_id = current.clone();
                    } else {
                        r.stopped_at = Some(stamp.clone());
                        r.exit_cause = Some(exit_cause(details));
                        r.invocation_id = None;
                    }
                    // Logged before the record is written, with the
                    // generation it is about to get: a daemon killed in
                    // between finds the transition again and logs it again,
                    // with the same BERTH_GENERATION. The journal may repeat
                    // a transition, never miss one (journald can hold a
                    // sender for a while; a kill there lost the line).
                    let mut fields = vec![
                        ("BERTH_WORKLOAD", name.to_string()),
                        ("BERTH_UNIT", unit.to_string()),
                        ("BERTH_TRANSITION", reason.to_string()),
                        ("BERTH_GENERATION", (r.transition_generation + 1).to_string()),
                        ("BERTH_DETECTED_BY", seen_by.as_str().to_string()),
                    ];
                    if let Some(id) = current.as_ref().filter(|_| now == Settled::Running) {
                        fields.push(("BERTH_INVOCATION_ID", id.clone()));
                    }
                    if let Some(id) = ended {
                        fields.push(("BERTH_ENDED_INVOCATION_ID", id));
                    }
                    if now != Settled::Running {
                        fields.push((
                            "BERTH_EXIT_CAUSE",
                            format!(
                                "{} ({} {})",
                                details.result,
                                details.exec_main_code.as_str(),
                                details.exec_main_status
                            ),
                        ));
                    }
                    if let Some(n) = restarts.filter(|n| *n > 0) {
                        fields.push(("BERTH_RESTARTS", n.to_string()));
                    }
                    events.emit(
                        if reason == TransitionReason::UnexpectedExit {
                            log::Level::Warn
                        } else {
                            log::Level::Info
                        },
                        super::messages::transition_message_id(&reason).unwrap_or(""),
                        &fields,
                        &format!(
                            "{unit}: {reason} (result {}, seen by {})",
                            details.result,
                            seen_by.as_str()
                        ),
                    );
                    r.last_transition_reason = reason;
                    true
                }
            }
        });
        drop(unsynced);
        if started_here {
            // The job that started it explains nothing after: a restart
            // job of systemd's own (252 queues one for Restart=) taken
            // for a user's stop made the next crash a stop-user.
            self.jobs.remove(unit);
        }
        if let Ok(Some(_)) = &outcome {
            self.unsynced.insert(name.to_string());
            if let Some(id) = ended_here {
                let ended = self.ended.entry(name.to_string()).or_default();
                ended.push_back(id);
                if ended.len() > ENDED_MEMORY {
                    ended.pop_front();
                }
            }
        }
        match outcome {
            Ok(Some(updated)) => self.events.recorded(name, Ok(updated)),
            Ok(None) => {
                self.deferred.push(name.to_string());
                records::load(&self.root, name).ok().flatten()
            }
            Err(e) => self.events.recorded(name, Err(e)),
        }
    }

    /// Tells the API's view of the workload.
    fn publish(&self, name: &str, unit: String, details: &UnitDetails, record: Option<records::Record>) {
        if let Some(api) = &self.api {
            // Without fresh details, keep what the view already knows of
            // the same running instance rather than publish blanks.
            let (mut main_pid, mut invocation_id) = (details.main_pid, details.invocation_id.clone());
            if invocation_id.is_empty()
                && let Some(old) = api.view(name)
                && old.active_state == details.active_state
            {
                (main_pid, invocation_id) = (old.main_pid, old.invocation_id.clone());
            }
            api.publish(WorkloadView {
                name: name.to_string(),
                unit,
                active_state: details.active_state.clone(),
                main_pid,
                invocation_id,
                record: record.as_ref().and_then(RecordJson::of),
                facts: Facts::of(self.kind_of(name), record.as_ref()),
            });
        }
    }

    /// A loaded unit of a workload no file defines is a command's
    /// (`berth@NAME.service`).
    fn kind_of(&self, name: &str) -> Kind {
        self.configured.get(name).copied().unwrap_or(Kind::Command)
    }

    pub(super) fn health(&self) -> Health {
        let failed = self
            .tracked
            .iter()
            .filter(|(_, t)| t.active == ActiveState::Failed)
            .map(|(n, _)| n.clone())
            .collect();
        Health::new(failed, self.deferred.clone())
    }

    pub(super) fn log_health(&self) {
        let health = self.health();
        self.events.emit(
            if health.status == HealthStatus::Healthy {
                log::Level::Info
            } else {
                log::Level::Warn
            },
            "",
            &[
                ("BERTH_HEALTH", health.status.to_string()),
                ("BERTH_FAILED", health.failed.join(" ")),
                ("BERTH_UNCONVERGED", health.unconverged.join(" ")),
            ],
            &format!(
                "daemon.{}: {} failed [{}], {} not converged [{}]",
                health.status,
                health.failed.len(),
                health.failed.join(" "),
                health.unconverged.len(),
                health.unconverged.join(" ")
            ),
        );
    }

    /// Removes the records of workloads neither configured nor loaded.
    /// Quarantined (`.corrupt`) records are kept for inspection.
    pub(super) fn sweep(&mut self) {
        let Ok(entries) = std::fs::read_dir(records::records_dir(&self.root)) else {
            return;
        };
        for entry in entries.flatten() {
            let file = entry.file_name().to_string_lossy().into_owned();
            let Some(name) = file.strip_suffix(".json") else {
                continue;
            };
            if !crate::names::is_valid_workload_name(name) || self.tracked.contains_key(name) {
                continue;
            }
            // Never waited on inside the loop: a held lock means someone is
            // writing this record; the next sweep sees it again.
            if let Ok(lock) = lock::try_workload(&self.root, name)
                && std::fs::remove_file(entry.path()).is_ok()
            {
                drop(lock);
                self.events.info(&format!(
                    "swept the record of {name}: neither configured nor loaded"
                ));
            }
        }
    }

    /// The unit's details, or None when systemd did not answer (a call
    /// timing out during a long daemon-reload, a full bus): an
    /// inconclusive observation is never an exit, so the caller defers
    /// the workload to the next pass instead of recording anything.
    async fn details(&self, unit: &str) -> Option<UnitDetails> {
        match self.sd.details(unit).await {
            Ok(details) => Some(details),
            Err(e) => {
                self.events
                    .warn(&format!("cannot observe {unit}: {e}; looked at again next pass"));
                None
            }
        }
    }

    /// Completes one workload's API view with its MainPID and InvocationID.
    pub(super) async fn fill_one(&mut self) {
        let Some(name) = self.fill.pop_front() else { return };
        let Some(api) = &self.api else { return };
        let unit = self.units.unit_of(&name);
        let Some(details) = self.details(&unit).await else {
            return;
        };
        let record = records::load(&self.root, &name).ok().flatten();
        let facts = Facts::of(self.kind_of(&name), record.as_ref());
        api.publish(WorkloadView {
            name,
            unit,
            active_state: details.active_state,
            main_pid: details.main_pid,
            invocation_id: details.invocation_id,
            record: record.as_ref().and_then(RecordJson::of),
            facts,
        });
    }
}

/// A file's modification time and size: what tells a rewrite.
type FileStamp = (Option<SystemTime>, u64);

/// Whether the file at `path` is not the one `stamp` saw; `stamp` now
/// holds what it is (None: not there).
fn changed(stamp: &mut Option<FileStamp>, path: &std::path::Path) -> bool {
    let now = std::fs::metadata(path).ok().map(|m| (m.modified().ok(), m.len()));
    if now == *stamp {
        return false;
    }
    *stamp = now;
    true
}

/// fsync of each file, then of their directory.
fn sync_paths(paths: Vec<std::path::PathBuf>, dir: std::path::PathBuf) -> std::io::Result<()> {
    if paths.is_empty() {
        return Ok(());
    }
    for path in paths {
        match std::fs::File::open(&path) {
            Ok(f) => f.sync_all()?,
            // Swept or moved aside since: nothing to sync.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    std::fs::File::open(&dir)?.sync_all()
}

fn record_mtime(root: &Root, name: &str) -> Option<SystemTime> {
    std::fs::metadata(records::record_path(root, name))
        .and_then(|m| m.modified())
        .ok()
}

fn exit_cause(d: &UnitDetails) -> ExitCause {
    ExitCause {
        result: d.result.to_string(),
        code: d.exec_main_code.as_str().into(),
        status: d.exec_main_status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::records::TransitionReason;
    use crate::systemd::fake::{Behaviour, FakeOps};

    /// Issue 10: anyone could make the daemon write a record (and a lock)
    /// by loading `berth@junk1.service`; records grew without bound.
    #[tokio::test]
    async fn a_loaded_idle_unconfigured_unit_gets_no_record() {
        let (_d, root, loaded) = crate::testing::temp_root("", &[("web", "")]);
        let ops = FakeOps::default()
            .unit("web", true, Behaviour::Takes(Duration::ZERO))
            .unit("junk1", false, Behaviour::Takes(Duration::ZERO))
            .unit("adhoc", true, Behaviour::Takes(Duration::ZERO));
        let mut sup = Supervisor::new(ops, root.clone(), loaded, Events::new("test"), None);
        sup.pass(true).await;
        // Adopted before READY, recorded after it.
        assert!(records::load(&root, "web").unwrap().is_none());
        assert_eq!(sup.after_ready.len(), 2);
        sup.look_closer_next().await;
        assert!(sup.after_ready.is_empty());
        let web = records::load(&root, "web").unwrap().unwrap();
        assert_eq!(web.state, RecordState::Running);
        assert!(web.adopted_at.is_some());
        assert!(
            records::load(&root, "adhoc").unwrap().is_some(),
            "a running instance is followed, configured or not"
        );
        assert!(records::load(&root, "junk1").unwrap().is_none());
        assert!(!sup.tracked.contains_key("junk1"));
        assert!(!root.runtime_dir().join("locks/workloads/junk1").exists());
    }

    /// Issue 10: a details() call that failed read as inactive, so a
    /// running workload got a false unexpected-exit record.
    #[tokio::test]
    async fn an_observation_that_fails_is_not_an_exit() {
        let (_d, root, loaded) = crate::testing::temp_root("", &[("web", "")]);
        records::update(&root, "web", |r| {
            r.state = RecordState::Running;
            r.last_transition_reason = TransitionReason::Boot;
            true
        })
        .unwrap();
        let before = records::load(&root, "web").unwrap().unwrap();
        let ops = FakeOps::default().unit("web", true, Behaviour::Takes(Duration::ZERO));
        ops.unanswered.borrow_mut().push(names::unit_name("web"));
        let mut sup = Supervisor::new(ops, root.clone(), loaded, Events::new("test"), None);
        sup.reconcile("web", SeenBy::Signal, None).await;
        let after = records::load(&root, "web").unwrap().unwrap();
        assert_eq!(after.state, RecordState::Running);
        assert_eq!(after.transition_generation, before.transition_generation);
        assert_eq!(sup.deferred, ["web"], "looked at again next pass");

        // Answered again: nothing happened, nothing is recorded.
        sup.sd.unanswered.borrow_mut().clear();
        sup.reconcile("web", SeenBy::Signal, None).await;
        let again = records::load(&root, "web").unwrap().unwrap();
        assert_eq!(again.transition_generation, before.transition_generation);
    }

    /// Issue 10, R1: an exit and a start by hand while the daemon was
    /// down left the record saying "running" with the old InvocationID,
    /// and the first pass (which reads no InvocationID) saw nothing.
    #[tokio::test]
    async fn a_restart_while_unwatched_is_recorded_once_as_replaced() {
        let (_d, root, loaded) = crate::testing::temp_root("", &[("web", ""), ("db", "")]);
        for (name, invocation) in [("web", Some("aaaa")), ("db", None)] {
            records::update(&root, name, |r| {
                r.state = RecordState::Running;
                r.invocation_id = invocation.map(str::to_string);
                r.last_transition_reason = TransitionReason::Boot;
                true
            })
            .unwrap();
        }
        let ops = FakeOps::default()
            .unit("web", true, Behaviour::Takes(Duration::ZERO))
            .unit("db", true, Behaviour::Takes(Duration::ZERO));
        for (name, invocation) in [("web", "bbbb"), ("db", "cccc")] {
            ops.invocations
                .borrow_mut()
                .insert(names::unit_name(name), invocation.into());
        }
        let mut sup = Supervisor::new(ops, root.clone(), loaded, Events::new("test"), None);
        sup.pass(true).await;
        assert_eq!(sup.after_ready.len(), 2, "both looked at closely after READY");
        sup.look_closer_next().await;
        let web = records::load(&root, "web").unwrap().unwrap();
        assert_eq!(web.last_transition_reason, TransitionReason::Replaced);
        assert_eq!(web.transition_generation, 2);
        assert_eq!(web.invocation_id.as_deref(), Some("bbbb"));
        assert_eq!(web.detected_by.as_deref(), Some("scan"));
        let db = records::load(&root, "db").unwrap().unwrap();
        assert_eq!(
            db.transition_generation, 1,
            "a first InvocationID is noted, no transition"
        );
        assert_eq!(db.invocation_id.as_deref(), Some("cccc"));

        // Looked at again (another daemon start): nothing new.
        sup.pass(true).await;
        sup.look_closer_next().await;
        assert_eq!(
            records::load(&root, "web")
                .unwrap()
                .unwrap()
                .transition_generation,
            2
        );
        assert_eq!(
            records::load(&root, "db").unwrap().unwrap().transition_generation,
            1
        );
    }

    /// Issue 10, R1: the first signal of a unit since the daemon started
    /// (no Service signal seen yet) was read again from systemd; under
    /// load that read came after the stop it announced, before the stop's
    /// JobNew, and a `systemctl stop` was recorded as an unexpected exit.
    #[tokio::test]
    async fn a_first_signal_keeps_the_state_it_showed() {
        let (_d, root, loaded) = crate::testing::temp_root("", &[("web", "")]);
        records::update(&root, "web", |r| {
            r.state = RecordState::Running;
            r.invocation_id = Some("aaaa".into());
            r.last_transition_reason = TransitionReason::Boot;
            true
        })
        .unwrap();
        let ops = FakeOps::default().unit("web", true, Behaviour::Takes(Duration::ZERO));
        let mut sup = Supervisor::new(ops, root.clone(), loaded, Events::new("test"), None);
        sup.pass(false).await;
        // By the time the signal is handled, the stop it announced is done.
        sup.sd.set_running("web", false);
        let path = names::unit_object_path(&names::unit_name("web"));
        let observed = UnitDetails {
            active_state: ActiveState::Active,
            invocation_id: "aaaa".into(),
            job_id: 7,
            ..Default::default()
        };
        sup.on_change(Change::Properties {
            path,
            observed: Some(observed),
            exit_known: false,
        })
        .await;
        let web = records::load(&root, "web").unwrap().unwrap();
        assert_eq!(
            (web.state, web.transition_generation),
            (RecordState::Running, 1),
            "the signal showed it running: nothing to record yet"
        );
    }

    /// A unit signal of `path` showing `observed`, its exit cause with it.
    async fn show(sup: &mut Supervisor<FakeOps>, path: &str, observed: UnitDetails) {
        sup.on_change(Change::Properties {
            path: path.to_string(),
            observed: Some(observed),
            exit_known: true,
        })
        .await;
    }

    /// Restart= on systemd 252: each restart is a restart job of
    /// systemd's own, remembered for two minutes; the next crash was
    /// taken for a user's stop. Each crash is an exit with its cause, each
    /// new instance systemd's restart with the count.
    #[tokio::test]
    async fn a_crash_loop_is_exits_and_restarts_by_systemd() {
        let (_d, root, loaded) = crate::testing::temp_root("", &[("web", "restart = \"on-failure\"")]);
        records::update(&root, "web", |r| {
            r.state = RecordState::Running;
            r.invocation_id = Some("a0".into());
            r.last_transition_reason = TransitionReason::Boot;
            true
        })
        .unwrap();
        let ops = FakeOps::default().unit("web", true, Behaviour::Takes(Duration::ZERO));
        let mut sup = Supervisor::new(ops, root.clone(), loaded, Events::new("test"), None);
        sup.pass(false).await;
        let unit = names::unit_name("web");
        let path = names::unit_object_path(&unit);
        let mut reasons = Vec::new();
        for n in 1..=3u32 {
            // Down, waiting for its restart (systemd shows it activating).
            let crashed = UnitDetails {
                active_state: ActiveState::Activating,
                sub_state: "auto-restart".into(),
                invocation_id: format!("a{}", n - 1),
                result: crate::systemd::ServiceResult::ExitCode,
                exec_main_code: crate::systemd::ExitCode::Exited,
                exec_main_status: 3,
                n_restarts: Some(n - 1),
                ..Default::default()
            };
            show(&mut sup, &path, crashed).await;
            let r = records::load(&root, "web").unwrap().unwrap();
            assert_eq!(r.state, RecordState::Failed);
            assert_eq!(r.exit_cause.as_ref().map(|c| c.status), Some(3));
            reasons.push(r.last_transition_reason);
            // systemd's restart job, then the new instance.
            sup.jobs.insert(unit.clone(), (JobType::Restart, Instant::now()));
            let running = UnitDetails {
                active_state: ActiveState::Active,
                sub_state: "running".into(),
                invocation_id: format!("a{n}"),
                n_restarts: Some(n),
                ..Default::default()
            };
            show(&mut sup, &path, running).await;
            let r = records::load(&root, "web").unwrap().unwrap();
            assert_eq!((r.state, r.restarts), (RecordState::Running, Some(n)));
            reasons.push(r.last_transition_reason);
        }
        use TransitionReason::{SystemdRestart, UnexpectedExit};
        assert_eq!(
            reasons,
            [
                UnexpectedExit,
                SystemdRestart,
                UnexpectedExit,
                SystemdRestart,
                UnexpectedExit,
                SystemdRestart
            ]
        );
        // A start by hand resets systemd's count: a user's start.
        show(
            &mut sup,
            &path,
            UnitDetails {
                active_state: ActiveState::Inactive,
                invocation_id: "a3".into(),
                n_restarts: Some(3),
                ..Default::default()
            },
        )
        .await;
        sup.jobs.insert(unit.clone(), (JobType::Start, Instant::now()));
        show(
            &mut sup,
            &path,
            UnitDetails {
                active_state: ActiveState::Active,
                invocation_id: "a4".into(),
                n_restarts: Some(0),
                ..Default::default()
            },
        )
        .await;
        let r = records::load(&root, "web").unwrap().unwrap();
        assert_eq!(
            (r.last_transition_reason, r.restarts),
            (TransitionReason::StartUser, Some(0))
        );
    }

    /// Review of the restart slice: a crash recorded with count 1, two
    /// restarts that failed (the count 3, no transition), a stop by hand
    /// while the next one waited (systemd keeps the count), then a start
    /// by hand, with the count still 3: taken for systemd's restart,
    /// since the record still said 1.
    #[tokio::test]
    async fn a_start_by_hand_after_failed_restarts_is_a_users() {
        let (_d, root, loaded) = crate::testing::temp_root("", &[("web", "restart = \"on-failure\"")]);
        records::update(&root, "web", |r| {
            r.state = RecordState::Failed;
            r.restarts = Some(1);
            r.last_transition_reason = TransitionReason::UnexpectedExit;
            true
        })
        .unwrap();
        let ops = FakeOps::default().unit("web", false, Behaviour::Takes(Duration::ZERO));
        let mut sup = Supervisor::new(ops, root.clone(), loaded, Events::new("test"), None);
        let path = names::unit_object_path(&names::unit_name("web"));
        let down = |sub: &str, n: u32| UnitDetails {
            active_state: ActiveState::Activating,
            sub_state: sub.into(),
            invocation_id: format!("f{n}"),
            result: crate::systemd::ServiceResult::ExitCode,
            n_restarts: Some(n),
            ..Default::default()
        };
        show(&mut sup, &path, down("auto-restart", 2)).await;
        show(&mut sup, &path, down("auto-restart", 3)).await;
        let r = records::load(&root, "web").unwrap().unwrap();
        assert_eq!(
            (r.state, r.restarts, r.transition_generation),
            (RecordState::Failed, Some(3), 1)
        );
        let stopped = UnitDetails {
            active_state: ActiveState::Inactive,
            sub_state: "dead".into(),
            n_restarts: Some(3),
            ..down("dead", 3)
        };
        show(&mut sup, &path, stopped).await;
        let started = UnitDetails {
            active_state: ActiveState::Active,
            sub_state: "running".into(),
            invocation_id: "h1".into(),
            n_restarts: Some(3),
            ..Default::default()
        };
        show(&mut sup, &path, started).await;
        let r = records::load(&root, "web").unwrap().unwrap();
        assert_eq!(r.last_transition_reason, TransitionReason::StartUser);
    }

    /// A unit's first signal since the daemon started carries no Service
    /// half, so no count: systemd's restart was recorded as a user's
    /// start. The count is read then, with the exit cause.
    #[tokio::test]
    async fn a_restart_shown_without_its_count_is_read_again() {
        let (_d, root, loaded) = crate::testing::temp_root("", &[("web", "restart = \"on-failure\"")]);
        records::update(&root, "web", |r| {
            r.state = RecordState::Failed;
            r.restarts = Some(0);
            r.last_transition_reason = TransitionReason::UnexpectedExit;
            true
        })
        .unwrap();
        let ops = FakeOps::default().unit("web", true, Behaviour::Takes(Duration::ZERO));
        let unit = names::unit_name("web");
        ops.restarts.borrow_mut().insert(unit.clone(), 1);
        let mut sup = Supervisor::new(ops, root.clone(), loaded, Events::new("test"), None);
        sup.on_change(Change::Properties {
            path: names::unit_object_path(&unit),
            observed: Some(UnitDetails {
                active_state: ActiveState::Active,
                invocation_id: "b".into(),
                ..Default::default()
            }),
            exit_known: false,
        })
        .await;
        let r = records::load(&root, "web").unwrap().unwrap();
        assert_eq!(
            (r.last_transition_reason, r.restarts),
            (TransitionReason::SystemdRestart, Some(1))
        );
    }

    /// Issue 16: a pass read the details of every transition it found, one
    /// after the other, inside one loop turn: the 2000 exits of a
    /// `systemctl stop` of 2000 workloads held the loop past its watchdog.
    #[tokio::test]
    async fn a_pass_leaves_the_reads_to_later_loop_turns() {
        let (_d, root, loaded) = crate::testing::temp_root("", &[("web", "")]);
        let ops = FakeOps::default().unit("web", true, Behaviour::Takes(Duration::ZERO));
        let mut sup = Supervisor::new(ops, root.clone(), loaded, Events::new("test"), None);
        sup.pass(true).await;
        sup.look_closer_next().await;
        assert_eq!(
            records::load(&root, "web").unwrap().unwrap().state,
            RecordState::Running
        );
        // Stopped behind the daemon's back, no signal seen.
        sup.sd.set_running("web", false);
        sup.pass(false).await;
        assert_eq!(
            records::load(&root, "web").unwrap().unwrap().state,
            RecordState::Running,
            "nothing read or recorded inside the pass"
        );
        assert_eq!(sup.after_ready, ["web"]);
        sup.look_closer_next().await;
        let web = records::load(&root, "web").unwrap().unwrap();
        assert_eq!(web.state, RecordState::Stopped, "recorded on the next loop turn");
    }

    /// Issue 16: the first pass read and recorded, before READY, every
    /// transition made while no daemon ran: 1000 workloads started
    /// meanwhile held READY for 2.8 s.
    #[tokio::test]
    async fn a_first_pass_records_transitions_after_ready() {
        let (_d, root, loaded) = crate::testing::temp_root("", &[("web", "")]);
        records::update(&root, "web", |r| {
            r.state = RecordState::Stopped;
            r.last_transition_reason = TransitionReason::Boot;
            true
        })
        .unwrap();
        let ops = FakeOps::default().unit("web", true, Behaviour::Takes(Duration::ZERO));
        let mut sup = Supervisor::new(ops, root.clone(), loaded, Events::new("test"), None);
        sup.pass(true).await;
        assert_eq!(
            records::load(&root, "web").unwrap().unwrap().state,
            RecordState::Stopped,
            "nothing read or recorded before READY"
        );
        assert_eq!(sup.after_ready, ["web"]);
        sup.look_closer_next().await;
        let web = records::load(&root, "web").unwrap().unwrap();
        assert_eq!(
            (web.state, web.last_transition_reason),
            (RecordState::Running, TransitionReason::StartUser),
            "recorded right after READY"
        );
    }

    /// Issue 16: a signal of a unit loaded since the last pass listed every
    /// workload unit again; 2000 starts made 2000 listings of up to 2000
    /// units each, and the daemon missed its watchdog.
    #[tokio::test]
    async fn a_signal_of_a_newly_loaded_unit_lists_nothing() {
        let (_d, root, loaded) = crate::testing::temp_root("", &[("web", "")]);
        let mut sup = Supervisor::new(
            FakeOps::default(),
            root.clone(),
            loaded,
            Events::new("test"),
            None,
        );
        sup.pass(false).await;
        assert_eq!(sup.sd.listings.get(), 1);
        sup.sd = sup.sd.unit("web", true, Behaviour::Takes(Duration::ZERO));
        let observed = UnitDetails {
            active_state: ActiveState::Active,
            invocation_id: "bbbb".into(),
            ..Default::default()
        };
        sup.on_change(Change::Properties {
            path: names::unit_object_path("berth@web.service"),
            observed: Some(observed),
            exit_known: true,
        })
        .await;
        assert_eq!(sup.sd.listings.get(), 1, "no listing for a signal");
        let web = records::load(&root, "web").unwrap().unwrap();
        assert_eq!(web.state, RecordState::Running, "the signal was placed");
    }

    /// Issue 10, R1: a signal still queued when a newer read recorded the
    /// end of an instance started it again (and ended it a second time).
    #[tokio::test]
    async fn a_queued_signal_does_not_undo_a_newer_record() {
        let (_d, root, loaded) = crate::testing::temp_root("", &[("web", "")]);
        records::update(&root, "web", |r| {
            r.state = RecordState::Running;
            r.invocation_id = Some("aaaa".into());
            true
        })
        .unwrap();
        let ops = FakeOps::default().unit("web", false, Behaviour::Takes(Duration::ZERO));
        let mut sup = Supervisor::new(ops, root.clone(), loaded, Events::new("test"), None);
        let shown = |active_state| UnitDetails {
            active_state,
            invocation_id: "aaaa".into(),
            ..Default::default()
        };
        // The end of aaaa, read now (a pass, say)...
        sup.reconcile("web", SeenBy::Scan, Some(shown(ActiveState::Inactive)))
            .await;
        let after_end = records::load(&root, "web").unwrap().unwrap();
        assert_eq!(
            (after_end.state, after_end.transition_generation),
            (RecordState::Stopped, 2)
        );
        // ... then the signals sent before it: running, then down.
        for state in [ActiveState::Active, ActiveState::Inactive] {
            sup.reconcile("web", SeenBy::Signal, Some(shown(state))).await;
        }
        let web = records::load(&root, "web").unwrap().unwrap();
        assert_eq!(
            (web.state, web.transition_generation),
            (RecordState::Stopped, 2),
            "aaaa neither started again nor ended twice"
        );
    }

    /// A helper's job (the drain's stop, under the workload's lock) costs
    /// the supervisor no call into systemd; anyone else's is asked about.
    #[tokio::test]
    async fn a_job_queued_under_a_helpers_lock_is_not_asked_about() {
        let (_d, root, loaded) = crate::testing::temp_root("", &[("web", ""), ("db", "")]);
        let ops = FakeOps::default()
            .unit("web", true, Behaviour::Takes(Duration::ZERO))
            .unit("db", true, Behaviour::Takes(Duration::ZERO));
        let mut sup = Supervisor::new(ops, root.clone(), loaded, Events::new("test"), None);
        let held = lock::workload(&root, "web").unwrap();
        for unit in ["berth@web.service", "berth@db.service"] {
            sup.on_change(Change::JobNew {
                job: "/job/9".into(),
                unit: unit.into(),
            })
            .await;
        }
        drop(held);
        assert_eq!(sup.sd.job_types_asked.get(), 1, "only db's job was asked about");
        assert!(
            !lock::workload_held(&root, "web") && !lock::workload_held(&root, "../x"),
            "a free lock and a name that is no workload's are held by nobody"
        );
        assert_eq!(
            sup.jobs["berth@web.service"].0,
            JobType::Other(classify::JOB_OF_HELPER.into())
        );
    }

    /// A drain's stop seen late: its first signal (the unit still active,
    /// the stop job pending) read after the drain recorded the stop. The
    /// record made by the drain stands; it was overwritten with a start
    /// nobody made and a user's stop.
    #[tokio::test]
    async fn a_stop_signal_read_after_the_drain_recorded_it_changes_nothing() {
        let (_d, root, loaded) = crate::testing::temp_root("", &[("web", "")]);
        records::update(&root, "web", |r| {
            r.state = RecordState::Stopped;
            r.last_transition_reason = crate::state::records::TransitionReason::Drain;
            true
        })
        .unwrap();
        let ops = FakeOps::default().unit("web", false, Behaviour::Takes(Duration::ZERO));
        let mut sup = Supervisor::new(ops, root.clone(), loaded, Events::new("test"), None);
        let shown = |active_state, job_id| UnitDetails {
            active_state,
            invocation_id: "aaaa".into(),
            job_id,
            ..Default::default()
        };
        for (state, job) in [
            (ActiveState::Active, 7),
            (ActiveState::Deactivating, 7),
            (ActiveState::Inactive, 0),
        ] {
            sup.reconcile("web", SeenBy::Signal, Some(shown(state, job)))
                .await;
        }
        let web = records::load(&root, "web").unwrap().unwrap();
        assert_eq!(
            (web.state, web.last_transition_reason, web.transition_generation),
            (
                RecordState::Stopped,
                crate::state::records::TransitionReason::Drain,
                1
            )
        );
    }
}
