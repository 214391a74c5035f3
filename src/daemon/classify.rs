//! The supervisor's transition rules as pure functions: what a change in
//! systemd's view of a workload means for its record. No I/O here, so the
//! rules are proven by the table below; the container scenarios prove the
//! observations that feed them.

use crate::state::records::{Record, RecordState, TransitionReason};
use crate::systemd::{ActiveState, JobType, ServiceResult, UnitDetails};

/// A workload's settled state; mid-job states (activating, deactivating,
/// …) are not settled, and the settled state follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    Running,
    Stopped,
    Failed,
}

impl Settled {
    pub fn of(active: &ActiveState) -> Option<Settled> {
        match active {
            ActiveState::Active | ActiveState::Reloading => Some(Settled::Running),
            ActiveState::Failed => Some(Settled::Failed),
            ActiveState::Inactive => Some(Settled::Stopped),
            _ => None,
        }
    }

    /// As [`Settled::of`], and a unit waiting for systemd's restart is
    /// down: its exit is a transition of its own, before the restart's
    /// (systemd shows such a unit activating, which is not settled).
    pub fn of_unit(details: &UnitDetails) -> Option<Settled> {
        if details.restart_pending() {
            return Some(if details.result == ServiceResult::Success {
                Settled::Stopped
            } else {
                Settled::Failed
            });
        }
        Settled::of(&details.active_state)
    }

    pub fn record_state(self) -> RecordState {
        match self {
            Settled::Running => RecordState::Running,
            Settled::Stopped => RecordState::Stopped,
            Settled::Failed => RecordState::Failed,
        }
    }
}

/// How the supervisor came to look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeenBy {
    /// A pass over every unit (the first one, or a periodic one): what it
    /// finds may have happened while no supervisor was watching.
    Scan,
    /// A PropertiesChanged signal: it happened just now.
    Signal,
}

impl SeenBy {
    pub fn as_str(self) -> &'static str {
        match self {
            SeenBy::Scan => "scan",
            SeenBy::Signal => "signal",
        }
    }
}

/// What to do with the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing new.
    Nothing,
    /// Same instance still running: note its InvocationID (an observation,
    /// not a transition).
    NoteInvocation,
    /// Found running with no record of it: adopted, left untouched (no
    /// transition: the generation does not advance).
    Adopt,
    /// Not running before nor now: only stopped vs failed is refined.
    Refine,
    /// A transition nobody else recorded.
    Transition(TransitionReason),
}

/// Whether a job can take a unit down: a stop, a restart, and a job whose
/// type could not be read (it was gone when asked: a quick stop ends
/// before the question arrives; see [`JOB_GONE`]). A start, reload or
/// verify job cannot, nor a helper's job ([`JOB_OF_HELPER`]): the helper
/// records what its own job did, and a later exit is not its doing.
fn may_stop(job: &JobType) -> bool {
    match job {
        JobType::Start | JobType::Reload | JobType::ReloadOrStart | JobType::VerifyActive | JobType::Nop => {
            false
        }
        JobType::Other(kind) => kind != JOB_OF_HELPER,
        _ => true,
    }
}

/// What the supervisor notes for a job that was gone before its type
/// could be read.
pub const JOB_GONE: &str = "gone";

/// What the supervisor notes for a job queued while a helper held the
/// workload's lock: the helper records what its job did, and the type
/// was not asked for.
pub const JOB_OF_HELPER: &str = "helper";

/// The rule: `record` as the supervisor last wrote it (or a fresh one),
/// `now` the settled state seen with its InvocationID (`None` when not
/// known), `job` a start or stop job seen for the unit recently,
/// `restarted` whether systemd's NRestarts grew since the record's.
pub fn classify(
    record: &Record,
    now: Settled,
    invocation_id: Option<&str>,
    job: Option<&JobType>,
    seen_by: SeenBy,
    restarted: bool,
) -> Decision {
    let running = now == Settled::Running;
    match (&record.state, running) {
        // systemd's own restart (Restart=), whatever job it queued for it
        // and whether its exit was seen: the admin's policy, not a user.
        (RecordState::Running, true)
            if restarted
                && record.invocation_id.is_some()
                && invocation_id.is_some()
                && record.invocation_id.as_deref() != invocation_id =>
        {
            Decision::Transition(TransitionReason::SystemdRestart)
        }
        (RecordState::Stopped | RecordState::Failed, true) if restarted => {
            Decision::Transition(TransitionReason::SystemdRestart)
        }
        // Running before and now: a new invocation is a restart someone
        // else made; otherwise at most note the invocation.
        (RecordState::Running, true) => match (record.invocation_id.as_deref(), invocation_id) {
            // Seen by a pass with no job to explain it: the exit and the
            // start both happened unwatched (the daemon was down).
            (Some(old), Some(new)) if old != new && seen_by == SeenBy::Scan && job.is_none() => {
                Decision::Transition(TransitionReason::Replaced)
            }
            (Some(old), Some(new)) if old != new => Decision::Transition(TransitionReason::StartUser),
            (None, Some(_)) => Decision::NoteInvocation,
            _ => Decision::Nothing,
        },
        // A start it did not see (first pass, a record rebuilt after
        // corruption, a workload new to it): adopted.
        (RecordState::Unknown, true) if seen_by == SeenBy::Scan => Decision::Adopt,
        (_, true) => Decision::Transition(TransitionReason::StartUser),
        (RecordState::Running, false) => match job {
            Some(job) if may_stop(job) => Decision::Transition(TransitionReason::StopUser),
            _ => Decision::Transition(TransitionReason::UnexpectedExit),
        },
        (_, false) if record.state == now.record_state() => Decision::Nothing,
        (_, false) => Decision::Refine,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RecordState as R;
    use SeenBy::{Scan, Signal};
    use Settled::{Failed, Running, Stopped};
    use TransitionReason as T;

    fn record(state: RecordState, invocation: Option<&str>) -> Record {
        Record {
            name: "w".into(),
            state,
            invocation_id: invocation.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn the_rules() {
        let stop = Some(JobType::Stop);
        let restart = Some(JobType::Restart);
        let start = Some(JobType::Start);
        // (the rule in words, record before, its InvocationID, seen now,
        // InvocationID now, recent job, how seen, decision)
        #[allow(clippy::type_complexity)]
        let rows: Vec<(
            &str,
            RecordState,
            Option<&str>,
            Settled,
            Option<&str>,
            Option<JobType>,
            SeenBy,
            Decision,
        )> = vec![
            (
                "a running workload seen running again is nothing new",
                R::Running,
                Some("a"),
                Running,
                Some("a"),
                None,
                Signal,
                Decision::Nothing,
            ),
            (
                "a running workload with a new InvocationID was restarted by someone else",
                R::Running,
                Some("a"),
                Running,
                Some("b"),
                restart.clone(),
                Signal,
                Decision::Transition(T::StartUser),
            ),
            (
                "a scan that finds a new InvocationID with no job: replaced while unwatched",
                R::Running,
                Some("a"),
                Running,
                Some("b"),
                None,
                Scan,
                Decision::Transition(T::Replaced),
            ),
            (
                "... but a restart job seen explains it: start-user",
                R::Running,
                Some("a"),
                Running,
                Some("b"),
                restart.clone(),
                Scan,
                Decision::Transition(T::StartUser),
            ),
            (
                "a running workload's first known InvocationID is only noted",
                R::Running,
                None,
                Running,
                Some("a"),
                None,
                Signal,
                Decision::NoteInvocation,
            ),
            (
                "a running workload seen without details changes nothing",
                R::Running,
                Some("a"),
                Running,
                None,
                None,
                Scan,
                Decision::Nothing,
            ),
            (
                "a workload found running with no record is adopted on a scan",
                R::Unknown,
                None,
                Running,
                Some("a"),
                None,
                Scan,
                Decision::Adopt,
            ),
            (
                "... but one never seen that starts under a signal was started by someone",
                R::Unknown,
                None,
                Running,
                Some("a"),
                start.clone(),
                Signal,
                Decision::Transition(T::StartUser),
            ),
            (
                "a stopped workload seen running was started by someone else",
                R::Stopped,
                None,
                Running,
                Some("a"),
                start.clone(),
                Signal,
                Decision::Transition(T::StartUser),
            ),
            (
                "... also found by a scan (started while the daemon was down)",
                R::Stopped,
                None,
                Running,
                Some("a"),
                None,
                Scan,
                Decision::Transition(T::StartUser),
            ),
            (
                "a failed workload seen running again was started by someone",
                R::Failed,
                None,
                Running,
                Some("a"),
                None,
                Signal,
                Decision::Transition(T::StartUser),
            ),
            (
                "a running workload that stopped under a stop job was stopped by a user",
                R::Running,
                Some("a"),
                Stopped,
                None,
                stop.clone(),
                Signal,
                Decision::Transition(T::StopUser),
            ),
            (
                "... and under a restart job too (the stop half of it)",
                R::Running,
                Some("a"),
                Stopped,
                None,
                restart,
                Signal,
                Decision::Transition(T::StopUser),
            ),
            (
                "a running workload that went down with no job exited on its own",
                R::Running,
                Some("a"),
                Failed,
                None,
                None,
                Signal,
                Decision::Transition(T::UnexpectedExit),
            ),
            (
                "... even when it exited cleanly (Stopped, not Failed)",
                R::Running,
                Some("a"),
                Stopped,
                None,
                None,
                Signal,
                Decision::Transition(T::UnexpectedExit),
            ),
            (
                "a job gone before its type was read, then down: a quick stop",
                R::Running,
                Some("a"),
                Stopped,
                None,
                Some(JobType::Other(JOB_GONE.into())),
                Signal,
                Decision::Transition(T::StopUser),
            ),
            (
                "a helper's job (the autostart's start) explains no later exit",
                R::Running,
                Some("a"),
                Failed,
                None,
                Some(JobType::Other(JOB_OF_HELPER.into())),
                Signal,
                Decision::Transition(T::UnexpectedExit),
            ),
            (
                "a try-restart job is a stop too",
                R::Running,
                Some("a"),
                Stopped,
                None,
                Some(JobType::TryRestart),
                Signal,
                Decision::Transition(T::StopUser),
            ),
            (
                "... and a start job is no excuse for going down",
                R::Running,
                Some("a"),
                Failed,
                None,
                start,
                Signal,
                Decision::Transition(T::UnexpectedExit),
            ),
            (
                "an exit while the daemon was down is found by a scan",
                R::Running,
                Some("a"),
                Failed,
                None,
                None,
                Scan,
                Decision::Transition(T::UnexpectedExit),
            ),
            (
                "a stopped workload that is now failed is only refined",
                R::Stopped,
                None,
                Failed,
                None,
                None,
                Scan,
                Decision::Refine,
            ),
            (
                "a failed workload reset to inactive is only refined",
                R::Failed,
                None,
                Stopped,
                None,
                stop.clone(),
                Signal,
                Decision::Refine,
            ),
            (
                "a never-seen workload that is not running gets its state, no transition",
                R::Unknown,
                None,
                Stopped,
                None,
                None,
                Scan,
                Decision::Refine,
            ),
            (
                "a stopped workload seen stopped again is nothing new",
                R::Stopped,
                None,
                Stopped,
                None,
                stop,
                Scan,
                Decision::Nothing,
            ),
        ];
        assert!(rows.len() >= 15);
        for (spec, before, old, now, new, job, seen_by, want) in rows {
            let got = classify(&record(before, old), now, new, job.as_ref(), seen_by, false);
            assert_eq!(got, want, "{spec}");
        }
    }

    /// With systemd's NRestarts grown since the record's.
    #[test]
    fn a_restart_by_systemd_is_its_own_reason() {
        let restart = Some(JobType::Restart);
        #[allow(clippy::type_complexity)]
        let rows: Vec<(
            &str,
            RecordState,
            Option<&str>,
            Settled,
            Option<&str>,
            Option<JobType>,
            SeenBy,
            Decision,
        )> = vec![
            (
                "its exit unseen, the new instance by a signal with systemd's restart job",
                R::Running,
                Some("a"),
                Running,
                Some("b"),
                restart.clone(),
                Signal,
                Decision::Transition(T::SystemdRestart),
            ),
            (
                "both while the daemon was down: not replaced by a user",
                R::Running,
                Some("a"),
                Running,
                Some("b"),
                None,
                Scan,
                Decision::Transition(T::SystemdRestart),
            ),
            (
                "its exit recorded, then the new instance",
                R::Failed,
                None,
                Running,
                Some("b"),
                None,
                Signal,
                Decision::Transition(T::SystemdRestart),
            ),
            (
                "after a clean exit (restart = always)",
                R::Stopped,
                None,
                Running,
                Some("b"),
                None,
                Signal,
                Decision::Transition(T::SystemdRestart),
            ),
            (
                "the same instance is nothing new",
                R::Running,
                Some("a"),
                Running,
                Some("a"),
                None,
                Signal,
                Decision::Nothing,
            ),
            (
                "adopted with no InvocationID: the first one seen is noted, whatever the count",
                R::Running,
                None,
                Running,
                Some("b"),
                None,
                Signal,
                Decision::NoteInvocation,
            ),
            (
                "a first pass adopts it",
                R::Unknown,
                None,
                Running,
                Some("b"),
                None,
                Scan,
                Decision::Adopt,
            ),
            (
                "its exit is an exit, whatever its count",
                R::Running,
                Some("a"),
                Failed,
                Some("a"),
                None,
                Signal,
                Decision::Transition(T::UnexpectedExit),
            ),
        ];
        for (spec, before, old, now, new, job, seen_by, want) in rows {
            let got = classify(&record(before, old), now, new, job.as_ref(), seen_by, true);
            assert_eq!(got, want, "{spec}");
        }
    }

    #[test]
    fn a_unit_waiting_for_its_restart_is_down() {
        let waiting = |active: ActiveState, sub: &str, result: ServiceResult| UnitDetails {
            active_state: active,
            sub_state: sub.into(),
            result,
            ..Default::default()
        };
        // Activating on 252 and 257; failed or inactive to other versions.
        for active in [ActiveState::Failed, ActiveState::Activating] {
            for sub in ["auto-restart", "auto-restart-queued"] {
                assert_eq!(
                    Settled::of_unit(&waiting(active.clone(), sub, ServiceResult::ExitCode)),
                    Some(Failed)
                );
                assert_eq!(
                    Settled::of_unit(&waiting(active.clone(), sub, ServiceResult::Success)),
                    Some(Stopped)
                );
            }
        }
        assert_eq!(
            Settled::of_unit(&waiting(ActiveState::Activating, "start", ServiceResult::Success)),
            None
        );
    }

    #[test]
    fn only_settled_states_are_classified() {
        assert_eq!(Settled::of(&ActiveState::Active), Some(Running));
        assert_eq!(Settled::of(&ActiveState::Reloading), Some(Running));
        assert_eq!(Settled::of(&ActiveState::Inactive), Some(Stopped));
        assert_eq!(Settled::of(&ActiveState::Failed), Some(Failed));
        for mid_job in [
            ActiveState::Activating,
            ActiveState::Deactivating,
            ActiveState::Other("x".into()),
        ] {
            assert_eq!(Settled::of(&mid_job), None, "{mid_job}");
        }
    }
}
