//! What the manager tells about units and jobs, typed: the states are
//! enums with systemd's own strings (`string_enum!`), so JSON and messages
//! read as before while code matches variants.

use crate::macros::string_enum;

string_enum! {
    /// A unit's ActiveState.
    #[derive(Default)]
    pub enum ActiveState {
        Active = "active",
        Reloading = "reloading",
        #[default]
        Inactive = "inactive",
        Failed = "failed",
        Activating = "activating",
        Deactivating = "deactivating",
        Maintenance = "maintenance",
        Refreshing = "refreshing",
    }
}

impl ActiveState {
    /// Running or about to: berth leaves these alone at boot and stops
    /// them at shutdown.
    pub fn is_running(&self) -> bool {
        matches!(
            self,
            ActiveState::Active
                | ActiveState::Activating
                | ActiveState::Reloading
                | ActiveState::Deactivating
        )
    }

    /// Up and settled: counted as running by the supervisor.
    pub fn is_up(&self) -> bool {
        matches!(self, ActiveState::Active | ActiveState::Reloading)
    }

    /// Down, cleanly or not.
    pub fn is_down(&self) -> bool {
        matches!(self, ActiveState::Inactive | ActiveState::Failed)
    }
}

string_enum! {
    /// A unit's LoadState.
    #[derive(Default)]
    pub enum LoadState {
        Loaded = "loaded",
        NotFound = "not-found",
        BadSetting = "bad-setting",
        Error = "error",
        Masked = "masked",
        #[default]
        Stub = "stub",
        Merged = "merged",
    }
}

string_enum! {
    /// How a job ended (the JobRemoved `result`); `Disconnected` is
    /// berth's own: the connection closed before the job's end was seen.
    pub enum JobResult {
        Done = "done",
        Canceled = "canceled",
        Timeout = "timeout",
        Failed = "failed",
        Dependency = "dependency",
        Skipped = "skipped",
        Invalid = "invalid",
        Assert = "assert",
        Unsupported = "unsupported",
        Collected = "collected",
        Once = "once",
        Disconnected = "disconnected",
    }
}

string_enum! {
    /// A job's JobType.
    pub enum JobType {
        Start = "start",
        Stop = "stop",
        Restart = "restart",
        Reload = "reload",
        ReloadOrStart = "reload-or-start",
        TryRestart = "try-restart",
        VerifyActive = "verify-active",
        Nop = "nop",
    }
}

string_enum! {
    /// A service's Result: why it last stopped or failed.
    #[derive(Default)]
    pub enum ServiceResult {
        #[default]
        Success = "success",
        Protocol = "protocol",
        Resources = "resources",
        Timeout = "timeout",
        ExitCode = "exit-code",
        Signal = "signal",
        CoreDump = "core-dump",
        Watchdog = "watchdog",
        StartLimitHit = "start-limit-hit",
        OomKill = "oom-kill",
        Skipped = "skipped",
    }
}

string_enum! {
    /// `systemctl is-enabled` of a unit file.
    pub enum UnitFileState {
        Enabled = "enabled",
        EnabledRuntime = "enabled-runtime",
        Linked = "linked",
        LinkedRuntime = "linked-runtime",
        Alias = "alias",
        Masked = "masked",
        MaskedRuntime = "masked-runtime",
        Static = "static",
        Disabled = "disabled",
        Indirect = "indirect",
        Generated = "generated",
        Transient = "transient",
        Bad = "bad",
    }
}

/// How the main process last ended (ExecMainCode, from waitid's si_code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExitCode {
    /// No exit seen yet.
    #[default]
    None,
    Exited,
    Killed,
    Dumped,
}

impl ExitCode {
    pub fn from_code(code: i32) -> ExitCode {
        match code {
            1 => ExitCode::Exited,
            2 => ExitCode::Killed,
            3 => ExitCode::Dumped,
            _ => ExitCode::None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ExitCode::None => "none",
            ExitCode::Exited => "exited",
            ExitCode::Killed => "killed",
            ExitCode::Dumped => "dumped",
        }
    }
}

/// A loaded unit as ListUnitsByPatterns reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitStatus {
    pub name: String,
    pub load_state: LoadState,
    pub active_state: ActiveState,
    pub sub_state: String,
    /// The unit's object path, as systemd named it: what its
    /// PropertiesChanged signals carry.
    pub path: String,
    /// Its pending job, if any: id and type.
    pub job: Option<(u32, JobType)>,
}

impl UnitStatus {
    pub fn is_running(&self) -> bool {
        self.active_state.is_running()
    }

    /// Down and waiting for systemd to start it again (`Restart=`):
    /// `auto-restart` while its RestartSec= runs, `auto-restart-queued`
    /// (systemd 254 and later) once the start is queued. Its ActiveState
    /// (activating on 252 and 257) does not tell it from a start.
    pub fn restart_pending(&self) -> bool {
        self.sub_state.starts_with(AUTO_RESTART)
    }

    /// Something to stop: running, or about to run again.
    pub fn needs_stop(&self) -> bool {
        self.is_running() || self.restart_pending()
    }
}

/// A unit's live state, for the supervisor, list and status: the Unit
/// interface and, for services, the Service interface.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitDetails {
    pub load_state: LoadState,
    pub active_state: ActiveState,
    /// The pending job's id, 0 when none.
    pub job_id: u32,
    /// Hex, empty before the first start.
    pub invocation_id: String,
    pub result: ServiceResult,
    pub exec_main_code: ExitCode,
    /// The exit status, or the signal number when killed or dumped.
    pub exec_main_status: i32,
    pub main_pid: u32,
    /// The SubState: `auto-restart` while systemd waits to restart it.
    pub sub_state: String,
    /// systemd's NRestarts: its automatic restarts, counted since systemd
    /// last reset it (a start by hand, `reset-failed`). None when not
    /// known (not a service, not read, not in the signal).
    pub n_restarts: Option<u32>,
}

impl UnitDetails {
    /// See [`UnitStatus::restart_pending`].
    pub fn restart_pending(&self) -> bool {
        self.sub_state.starts_with(AUTO_RESTART)
    }
}

/// The SubState of a service waiting for its restart, and the start of
/// `auto-restart-queued` (systemd 254 and later).
const AUTO_RESTART: &str = "auto-restart";

/// What `berth check --live` needs of one loaded unit: its dependencies
/// (implicit ones included) and the protections berth's topology relies on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitTopology {
    pub load_state: LoadState,
    pub active_state: ActiveState,
    pub requires: Vec<String>,
    pub requisite: Vec<String>,
    /// Units with `PropagatesStopTo=` this one.
    pub stop_propagated_from: Vec<String>,
    pub binds_to: Vec<String>,
    pub part_of: Vec<String>,
    pub conflicts: Vec<String>,
    /// Units that declared `Conflicts=` with this one.
    pub conflicted_by: Vec<String>,
    pub after: Vec<String>,
    pub drop_ins: Vec<String>,
    /// Services: the Slice=; empty otherwise.
    pub slice: String,
    /// Services: each ExecStop= argv.
    pub exec_stop: Vec<Vec<String>>,
    pub refuse_manual_stop: bool,
    pub ignore_on_isolate: bool,
    /// Services: TimeoutStopUSec.
    pub timeout_stop_us: u64,
    /// Services: each ExecStart= argv.
    pub exec_start: Vec<Vec<String>>,
    /// Services: the cgroup its processes run in now (empty when none
    /// run): a new Slice= moves them only at the next start.
    pub control_group: String,
    /// The unit's own name: LoadUnit of an alias answers with the unit
    /// it stands for.
    pub id: String,
    pub before: Vec<String>,
    /// Sockets, timers and paths that start it.
    pub triggered_by: Vec<String>,
    pub fragment_path: String,
    pub source_path: String,
    /// Units that want or require this one (`WantedBy=`, `RequiredBy=`):
    /// what starts it besides berth.
    pub wanted_by: Vec<String>,
    /// CLOCK_MONOTONIC µs when it last left active (0: never): when its
    /// stop began.
    pub left_active_mono_us: u64,
}

/// A queued job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub path: String,
    pub id: u32,
}

/// Object paths of the `unit =` workloads, whose signals the watcher
/// passes on beside those of every `berth@` unit; the supervisor updates
/// it when it reloads the workload definitions.
pub type WatchedPaths = std::sync::Arc<std::sync::RwLock<std::collections::BTreeSet<String>>>;

/// Something that changed in the manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Some unit's properties changed: its object path (a
    /// [`UnitStatus::path`] for the workloads).
    Properties {
        path: String,
        /// The unit as the signal showed it, when it carried the
        /// settled-state properties (systemd sends them all): the state at
        /// that moment, which a later read may already have moved past.
        observed: Option<UnitDetails>,
        /// Whether `observed` holds the exit cause (Result, ExecMain*,
        /// MainPID): they come from the unit's Service signal, which the
        /// watcher has not seen yet for a unit's first signal.
        exit_known: bool,
    },
    JobNew {
        job: String,
        unit: String,
    },
    /// A daemon-reload finished: the generator ran, the workload
    /// definitions may have changed (an admin's edit and `systemctl
    /// daemon-reload`, not only `berth add`, which also sends SIGHUP).
    Reloaded,
}
