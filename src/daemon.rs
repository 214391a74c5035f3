//! `berth daemon`: the optional resident supervisor. It adopts the live
//! workloads, notices exits as they happen (systemd's PropertiesChanged
//! signals, no polling), records every transition with its cause, and keeps
//! systemd's watchdog fed only while its loop runs. It never starts, stops
//! or kills a workload.
//!
//! Transitions a helper made are recorded by that helper under the
//! workload's lock, which it holds across the job; the supervisor never
//! waits for a lock (a busy one defers to the next pass), and records only
//! what nobody else did: `start-user`, `stop-user` (a start or stop job it
//! saw for the unit) and `unexpected-exit` (an exit with no stop job), with
//! systemd's Result, exit code or signal.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::time::{Duration, SystemTime};

use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use std::sync::Arc;

use crate::api::{self, Shared, WorkloadView};
use crate::autostart::instance_of;
use crate::config::{self, Loaded};
use crate::freeze::rfc3339;
use crate::paths::Root;
use crate::records::{self, ExitCause};
use crate::report::Events;
use crate::systemd::{Change, Ops, Systemd, UnitDetails};

/// `berth daemon --foreground` relaunches itself on this exit status; under
/// systemd, `SuccessExitStatus=75` and `Restart=always` do.
pub const EXIT_RELAUNCH: i32 = 75;

/// How long a seen start or stop job explains a transition.
const JOB_MEMORY: Duration = Duration::from_secs(120);

pub struct Options {
    pub reconcile_interval: Option<Duration>,
    /// No API socket, whatever `[daemon] api` says.
    pub no_api: bool,
    /// Seconds between sweeps of records of workloads that are neither
    /// configured nor loaded (default: `[daemon] gc_interval_s`; 0: never).
    pub gc_interval: Option<Duration>,
}

/// The single-instance lock, held for the life of the process.
fn take_lock(root: &Root) -> Result<File, String> {
    let dir = root.runtime_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let path = dir.join("lock");
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {
            file.set_len(0).ok();
            file.rewind().ok();
            let _ = writeln!(file, "{}", std::process::id());
            Ok(file)
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            Err(format!(
                "another berth daemon is running (pid {}, lock {}); not starting",
                pid.trim(),
                path.display()
            ))
        }
        Err(std::fs::TryLockError::Error(e)) => Err(format!("cannot lock {}: {e}", path.display())),
    }
}

pub fn main(root: &Root, options: Options) -> i32 {
    let root = root.clone();
    let _lock = match take_lock(&root) {
        Ok(lock) => lock,
        Err(msg) => {
            eprintln!("berth daemon: {msg}");
            return 1;
        }
    };
    let Ok(rt) = crate::systemd::runtime() else {
        eprintln!("berth daemon: cannot start the async runtime");
        return 1;
    };
    rt.block_on(run(root, options))
}

struct Supervisor {
    sd: Systemd,
    root: Root,
    loaded: Loaded,
    events: Events,
    /// unit → (job type, when seen)
    jobs: HashMap<String, (String, Instant)>,
    deferred: Vec<String>,
    heartbeat: SystemTime,
    api: Option<Arc<Shared>>,
    /// ActiveState per workload at the last look: a pass looks closer only
    /// at what changed, so an idle pass is one D-Bus call.
    seen: HashMap<String, String>,
    /// Workloads whose MainPID and InvocationID the API still lacks; filled
    /// a few at a time after READY, so adoption of many is quick.
    fill: std::collections::VecDeque<String>,
    record_mtimes: HashMap<String, Option<SystemTime>>,
    /// Workloads configured or loaded at the last pass.
    live_names: std::collections::BTreeSet<String>,
}

async fn run(root: Root, options: Options) -> i32 {
    let events = Events::new("berth-daemon");
    let sd = match Systemd::connect(root.manager()).await {
        Ok(sd) => sd,
        Err(e) => {
            eprintln!("berth daemon: cannot reach systemd: {e}");
            return 1;
        }
    };
    let mut changes = match sd.watch().await {
        Ok(rx) => rx,
        Err(e) => {
            eprintln!("berth daemon: cannot watch the units: {e}");
            return 1;
        }
    };
    let loaded = config::load(&root);
    let interval = options
        .reconcile_interval
        .unwrap_or(Duration::from_secs(loaded.host.daemon.reconcile_interval_s));
    let socket = root.join(&loaded.host.daemon.socket);
    let api = if loaded.host.daemon.api && !options.no_api {
        let shared = Shared::new(interval * 3 + Duration::from_secs(5));
        match api::start(&socket, shared.clone()) {
            Ok(()) => Some(shared),
            Err(e) => {
                events.warn(&format!("no API: cannot serve on {}: {e}", socket.display()));
                None
            }
        }
    } else {
        None
    };
    let mut sup = Supervisor {
        sd,
        root,
        loaded,
        events,
        jobs: HashMap::new(),
        deferred: Vec::new(),
        heartbeat: SystemTime::now(),
        api,
        seen: HashMap::new(),
        fill: std::collections::VecDeque::new(),
        record_mtimes: HashMap::new(),
        live_names: Default::default(),
    };

    let running = sup.pass(true).await;
    sup.events.emit(
        log::Level::Info,
        crate::autostart::MESSAGE_ID,
        &[("BERTH_ADOPTED", running.to_string())],
        &format!("adopted {running} running workloads (left untouched)"),
    );
    sup.log_health();
    let _ = sd_notify::notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&format!("supervising {running} running workloads")),
    ]);

    let watchdog = sd_notify::watchdog_enabled().map(|t| t / 2);
    let mut watchdog_tick = tokio::time::interval(watchdog.unwrap_or(Duration::from_secs(3600)));
    let mut reconcile_tick = tokio::time::interval(interval);
    let mut fill_tick = tokio::time::interval(Duration::from_millis(2));
    let gc_every = options
        .gc_interval
        .unwrap_or(Duration::from_secs(sup.loaded.host.daemon.gc_interval_s));
    let mut gc_tick = tokio::time::interval(if gc_every.is_zero() {
        Duration::from_secs(86_400)
    } else {
        gc_every
    });
    gc_tick.reset();
    reconcile_tick.reset();
    let (Ok(mut sigterm), Ok(mut sighup)) = (signal(SignalKind::terminate()), signal(SignalKind::hangup()))
    else {
        eprintln!("berth daemon: cannot install signal handlers");
        return 1;
    };
    // Test hook, inert unless set: hang the loop so the watchdog fires.
    let fault_hang = std::env::var("BERTH_DAEMON_FAULT").is_ok_and(|v| v == "hang");

    loop {
        tokio::select! {
            Some(change) = changes.recv() => sup.on_change(change).await,
            _ = fill_tick.tick(), if !sup.fill.is_empty() => sup.fill_one().await,
            _ = gc_tick.tick(), if !gc_every.is_zero() => sup.sweep(),
            _ = reconcile_tick.tick() => {
                // A package upgrade (or make install) replaced the binary
                // under us: noticed within one interval, no signal needed.
                if binary_replaced() {
                    sup.events.info("the berth binary was replaced: relaunching (exit 75)");
                    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
                    api::stop(&socket);
                    return EXIT_RELAUNCH;
                }
                let running = sup.pass(false).await;
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(&format!(
                    "supervising {running} running workloads; last pass {}", rfc3339(sup.heartbeat)
                ))]);
            }
            _ = watchdog_tick.tick() => {
                if fault_hang {
                    sup.events.warn("BERTH_DAEMON_FAULT=hang: the loop stops here (test hook)");
                    loop { std::thread::sleep(Duration::from_secs(3600)); }
                }
                if watchdog.is_some() {
                    let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
                }
            }
            _ = sigterm.recv() => {
                let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
                api::stop(&socket);
                return 0;
            }
            _ = sighup.recv() => {
                let fresh = config::load(&sup.root);
                if binary_replaced() {
                    sup.events.info("the berth binary was replaced: relaunching (exit 75)");
                    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
                    api::stop(&socket);
                    return EXIT_RELAUNCH;
                }
                if fresh.host.daemon != sup.loaded.host.daemon {
                    // New unit settings (WatchdogSec) come from the generator:
                    // reload systemd first, then ask to be relaunched under them.
                    if let Err(e) = sup.sd.reload().await {
                        sup.events.warn(&format!("daemon settings changed, but systemd could not be reloaded: {e}"));
                    }
                    sup.events.info("daemon settings changed: systemd reloaded, relaunching (exit 75)");
                    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
                    api::stop(&socket);
                    return EXIT_RELAUNCH;
                }
                sup.loaded = fresh;
                sup.events.info("reloaded the workload definitions");
            }
        }
    }
}

/// The running executable's file was replaced or removed (the kernel
/// marks the link " (deleted)").
fn binary_replaced() -> bool {
    std::fs::read_link("/proc/self/exe").is_ok_and(|p| p.to_string_lossy().ends_with(" (deleted)"))
}

impl Supervisor {
    /// One scan of every workload unit; returns how many run.
    async fn pass(&mut self, first: bool) -> usize {
        let live = match self.sd.list_workloads().await {
            Ok(live) => live,
            Err(e) => {
                self.events
                    .warn(&format!("pass: cannot list the workload units: {e}"));
                if let Some(api) = &self.api {
                    *api.systemd_ok.lock().expect("api state") = false;
                }
                return 0;
            }
        };
        let mut running = 0;
        let mut states: Vec<(String, String)> = live
            .iter()
            .filter_map(|u| instance_of(&u.name).map(|n| (n, u.active_state.clone())))
            .collect();
        for w in &self.loaded.workloads {
            if !states.iter().any(|(n, _)| *n == w.name) {
                states.push((w.name.clone(), "inactive".into()));
            }
        }
        self.live_names = states.iter().map(|(n, _)| n.clone()).collect();
        // What a busy lock deferred is looked at again now.
        let deferred: std::collections::BTreeSet<String> =
            std::mem::take(&mut self.deferred).into_iter().collect();
        for (name, active) in states {
            // A record rewritten behind its back (a helper, an admin, a
            // corrupted file) is looked at again too: a stat per workload.
            let mtime = std::fs::metadata(records::record_path(&self.root, &name))
                .and_then(|m| m.modified())
                .ok();
            let touched = self.record_mtimes.get(&name) != Some(&mtime);
            let changed = self.seen.get(&name) != Some(&active);
            if first || changed || touched || deferred.contains(&name) {
                self.reconcile(&name, "scan", first, Some(active.clone())).await;
            }
            if active == "active" || active == "reloading" {
                running += 1;
            }
            let mtime = std::fs::metadata(records::record_path(&self.root, &name))
                .and_then(|m| m.modified())
                .ok();
            self.record_mtimes.insert(name.clone(), mtime);
            self.seen.insert(name, active);
        }
        self.heartbeat = SystemTime::now();
        self.seen.retain(|name, _| self.live_names.contains(name));
        if let Some(api) = &self.api {
            let gone: Vec<String> = api
                .workloads
                .lock()
                .expect("api state")
                .keys()
                .filter(|n| !self.live_names.contains(*n))
                .cloned()
                .collect();
            for name in gone {
                api.remove(&name);
            }
        }
        self.write_status(running);
        if let Some(api) = &self.api {
            *api.systemd_ok.lock().expect("api state") = true;
            *api.heartbeat.lock().expect("api state") = Some(self.heartbeat);
        }
        running
    }

    async fn on_change(&mut self, change: Change) {
        match change {
            Change::JobNew { job, unit } => {
                if instance_of(&unit).is_some()
                    && let Some(kind) = self.sd.job_type(&job).await
                {
                    self.jobs.insert(unit, (kind, Instant::now()));
                }
            }
            Change::Properties { unit } => {
                if let Some(name) = instance_of(&unit) {
                    self.reconcile(&name, "signal", false, None).await;
                }
            }
        }
        let deferred = std::mem::take(&mut self.deferred);
        for name in deferred {
            self.reconcile(&name, "scan", false, None).await;
        }
    }

    /// Compares systemd's state of one workload with its record and records
    /// the transition nobody else recorded. Returns whether it runs.
    async fn reconcile(&mut self, name: &str, seen_by: &str, first: bool, known: Option<String>) -> bool {
        let unit = config::unit_name(name);
        // From a pass the ActiveState is known: details (exit cause, pid)
        // are fetched only when a transition is to be recorded.
        let mut details = match known {
            Some(active_state) => UnitDetails {
                active_state,
                ..Default::default()
            },
            None => self.details(&unit).await,
        };
        let state = match details.active_state.as_str() {
            "active" | "reloading" => "running",
            "failed" => "failed",
            "inactive" => "stopped",
            // activating, deactivating: mid-job; the settled state follows.
            _ => return details.active_state == "deactivating",
        };
        let recorded = records::load(&self.root, name).ok().flatten();
        let was_running = recorded.as_ref().is_some_and(|r| r.state == "running");
        if (state == "running") != was_running && details.invocation_id.is_empty() {
            details = self.details(&unit).await;
        } else if details.invocation_id.is_empty() && self.api.is_some() {
            self.fill.push_back(name.to_string());
        }
        self.seen.insert(name.to_string(), details.active_state.clone());
        let job = self
            .jobs
            .get(&unit)
            .filter(|(_, at)| at.elapsed() < JOB_MEMORY)
            .map(|(kind, _)| kind.clone());
        let now = rfc3339(SystemTime::now());
        // The definition on disk now (a daemon-reload may have brought a
        // new one since this daemon read its config), read only when a
        // start is recorded.
        let root = self.root.clone();
        let definition =
            || config::load_workload(&root, name).map(|w| crate::render::definition_fingerprint(&root, &w));
        let events = &self.events;
        let outcome = records::try_update(&self.root, name, |r| {
            let is_running = state == "running";
            let current = Some(details.invocation_id.clone()).filter(|i| !i.is_empty());
            let reason = match (r.state.as_str(), is_running) {
                // Running before and now: a new invocation is a restart
                // someone else made; otherwise only note the invocation.
                ("running", true) => match (&r.invocation_id, &current) {
                    (Some(old), Some(new)) if old != new => "start-user",
                    (None, Some(_)) => {
                        r.invocation_id = current;
                        return false;
                    }
                    _ => return false,
                },
                // A start it did not see (first pass, a record rebuilt
                // after corruption, a workload new to it): adopted.
                ("unknown", true) if first || seen_by == "scan" => {
                    r.state = "running".into();
                    r.adopted_at = Some(now.clone());
                    return false;
                }
                // Not running, and not running before (or never seen):
                // only refine stopped vs failed.
                (_, false) if r.state != "running" => {
                    r.state = state.into();
                    return false;
                }
                (_, true) => "start-user",
                (_, false) if matches!(job.as_deref(), Some("stop" | "restart")) => "stop-user",
                (_, false) => "unexpected-exit",
            };
            r.state = state.into();
            r.last_transition_reason = reason.into();
            r.detected_by = Some(seen_by.into());
            if is_running {
                r.exit_cause = None;
                r.definition = definition();
                r.invocation_id = current.clone();
            } else {
                r.stopped_at = Some(now.clone());
                r.exit_cause = Some(exit_cause(&details));
                r.invocation_id = None;
            }
            events.emit(
                if reason == "unexpected-exit" {
                    log::Level::Warn
                } else {
                    log::Level::Info
                },
                "",
                &[
                    ("BERTH_WORKLOAD", name.to_string()),
                    ("BERTH_TRANSITION", reason.to_string()),
                ],
                &format!("{unit}: {reason} (result {}, seen by {seen_by})", details.result),
            );
            true
        });
        let record = match outcome {
            Ok(Some(record)) => Some(record),
            Ok(None) => {
                self.deferred.push(name.to_string());
                records::load(&self.root, name).ok().flatten()
            }
            Err(e) => {
                self.events.warn(&format!("cannot record {name}: {e}"));
                None
            }
        };
        if let Some(api) = &self.api {
            // Without fresh details, keep what the view already knows of
            // the same running instance rather than publish blanks.
            let (mut main_pid, mut invocation_id) = (details.main_pid, details.invocation_id.clone());
            if invocation_id.is_empty()
                && let Some(old) = api.workloads.lock().expect("api state").get(name)
                && old.active_state == details.active_state
            {
                (main_pid, invocation_id) = (old.main_pid, old.invocation_id.clone());
            }
            api.publish(WorkloadView {
                name: name.to_string(),
                unit: unit.clone(),
                active_state: details.active_state.clone(),
                main_pid,
                invocation_id,
                record,
            });
        }
        state == "running"
    }
}

impl Supervisor {
    fn failed(&self) -> Vec<String> {
        let mut failed: Vec<String> = self
            .seen
            .iter()
            .filter(|(_, s)| *s == "failed")
            .map(|(n, _)| n.clone())
            .collect();
        failed.sort();
        failed
    }

    /// One health aggregate: healthy, or degraded with the failed workloads
    /// and those it could not converge (records it could not lock) listed
    /// apart.
    fn health(&self) -> (&'static str, Vec<String>, Vec<String>) {
        let failed = self.failed();
        let mut unconverged = self.deferred.clone();
        unconverged.sort();
        unconverged.dedup();
        let status = if failed.is_empty() && unconverged.is_empty() {
            "healthy"
        } else {
            "degraded"
        };
        (status, failed, unconverged)
    }

    fn log_health(&self) {
        let (status, failed, unconverged) = self.health();
        self.events.emit(
            if status == "healthy" {
                log::Level::Info
            } else {
                log::Level::Warn
            },
            "",
            &[
                ("BERTH_HEALTH", status.to_string()),
                ("BERTH_FAILED", failed.join(" ")),
                ("BERTH_UNCONVERGED", unconverged.join(" ")),
            ],
            &format!(
                "daemon.{status}: {} failed [{}], {} not converged [{}]",
                failed.len(),
                failed.join(" "),
                unconverged.len(),
                unconverged.join(" ")
            ),
        );
    }

    /// `/run/berthd/status.json`: the heartbeat (its timestamp advances
    /// every pass) and the health aggregate, which /healthz serves too.
    fn write_status(&self, running: usize) {
        let (status, failed, unconverged) = self.health();
        let doc = serde_json::json!({
            "pid": std::process::id(),
            "heartbeat_at": rfc3339(self.heartbeat),
            "health": status,
            "running": running,
            "failed": failed,
            "unconverged": unconverged,
        });
        let path = self.root.runtime_dir().join("status.json");
        // Replaced whole (rename) so a reader never sees half of it; /run is
        // a tmpfs, so no fsync.
        let tmp = path.with_extension("json.tmp");
        if let Err(e) = std::fs::write(&tmp, serde_json::to_vec_pretty(&doc).unwrap_or_default())
            .and_then(|()| std::fs::rename(&tmp, &path))
        {
            self.events.warn(&format!("cannot write {}: {e}", path.display()));
        }
        if let Some(api) = &self.api {
            *api.health.lock().expect("api state") = (status, failed, unconverged);
        }
    }

    /// Removes the records of workloads neither configured nor loaded.
    /// Quarantined (`.corrupt`) records are kept for inspection.
    fn sweep(&mut self) {
        let Ok(entries) = std::fs::read_dir(records::records_dir(&self.root)) else {
            return;
        };
        for entry in entries.flatten() {
            let file = entry.file_name().to_string_lossy().into_owned();
            let Some(name) = file.strip_suffix(".json") else {
                continue;
            };
            if name.starts_with('.') || self.live_names.contains(name) {
                continue;
            }
            if let Ok(lock) = records::lock(&self.root, name)
                && std::fs::remove_file(entry.path()).is_ok()
            {
                drop(lock);
                self.events.info(&format!(
                    "swept the record of {name}: neither configured nor loaded"
                ));
            }
        }
    }

    async fn details(&self, unit: &str) -> UnitDetails {
        self.sd.details(unit).await.unwrap_or_else(|_| UnitDetails {
            active_state: "inactive".into(),
            ..Default::default()
        })
    }

    /// Completes one workload's API view with its MainPID and InvocationID.
    async fn fill_one(&mut self) {
        let Some(name) = self.fill.pop_front() else { return };
        let Some(api) = &self.api else { return };
        let details = self.details(&config::unit_name(&name)).await;
        let record = records::load(&self.root, &name).ok().flatten();
        api.publish(WorkloadView {
            name: name.clone(),
            unit: config::unit_name(&name),
            active_state: details.active_state,
            main_pid: details.main_pid,
            invocation_id: details.invocation_id,
            record,
        });
    }
}

fn exit_cause(d: &UnitDetails) -> ExitCause {
    ExitCause {
        result: d.result.clone(),
        code: match d.exec_main_code {
            1 => "exited",
            2 => "killed",
            3 => "dumped",
            _ => "none",
        }
        .into(),
        status: d.exec_main_status,
    }
}
