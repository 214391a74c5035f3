//! The systemd steps of install and uninstall, each bounded in time: a
//! transient failure is tried again a bounded number of times, an answer
//! surfaces at once, and success is reported only after proof.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{Error, Report, Step, fail};
use crate::names::{DAEMON, DRAIN, TARGET};
use crate::systemd::{ActiveState, Ops, ServiceResult, SystemdError, UnitFileState};

/// How long the daemon must keep the same live MainPID to count as up: a
/// daemon that crashes right after READY shows here, not later.
const SETTLE: Duration = Duration::from_secs(2);
/// Bound on waiting for a unit to come up or an old daemon to go.
pub(super) const UNIT_WAIT: Duration = Duration::from_secs(90);
/// Attempts at a step that failed for a transient reason (timeout, bus
/// hiccup); an error that is an answer surfaces at once.
const ATTEMPTS: u32 = 3;

/// Retries a step that failed for a transient reason, a bounded number of
/// times; any other error surfaces at once.
pub(super) async fn retrying<T, F, Fut>(report: &mut Report, step: Step, mut attempt: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, SystemdError>>,
{
    let mut n = 1;
    loop {
        match attempt().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_transient() && n < ATTEMPTS => {
                report.warn(format!("{step}: {e}; retrying ({n}/{ATTEMPTS})"));
                tokio::time::sleep(Duration::from_millis(500 * u64::from(n))).await;
                n += 1;
            }
            Err(e) => return Err(fail(step, e)),
        }
    }
}

/// How a stop asked by install or uninstall ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stopped {
    /// It was down already: nothing asked.
    WasDown,
    Down,
    /// Its stop job is still under way after the wait.
    Stopping,
}

/// Stops `unit` and waits until it is really down: no job pending, and
/// inactive or failed. A unit still stopping after [`UNIT_WAIT`] fails the
/// step.
pub(super) async fn stop_and_wait<O: Ops>(
    sd: &O,
    report: &mut Report,
    unit: &str,
    step: Step,
) -> Result<bool, Error> {
    match stop_within(sd, report, unit, step, UNIT_WAIT).await? {
        Stopped::WasDown => Ok(false),
        Stopped::Down => Ok(true),
        Stopped::Stopping => {
            let d = retrying(report, step, || sd.details(unit)).await?;
            Err(fail(
                step,
                format!(
                    "{unit} is still {} (job {}) after {} s",
                    d.active_state,
                    d.job_id,
                    UNIT_WAIT.as_secs()
                ),
            ))
        }
    }
}

/// Stops `unit` and waits up to `limit` for it to be down; a stop still
/// under way then is left queued.
pub(super) async fn stop_within<O: Ops>(
    sd: &O,
    report: &mut Report,
    unit: &str,
    step: Step,
    limit: Duration,
) -> Result<Stopped, Error> {
    let d = retrying(report, step, || sd.details(unit)).await?;
    if d.active_state.is_down() && d.job_id == 0 {
        return Ok(Stopped::WasDown);
    }
    let started = Instant::now();
    let stop = retrying(report, step, || sd.stop(unit)).await?;
    sd.wait(&stop, Some(limit)).await;
    loop {
        let d = retrying(report, step, || sd.details(unit)).await?;
        if d.active_state.is_down() && d.job_id == 0 {
            return Ok(Stopped::Down);
        }
        if started.elapsed() > limit {
            return Ok(Stopped::Stopping);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Enabled for good: `enabled-runtime` is gone at the next boot, and a
/// `linked` or `alias` unit has no wants-link, so those get enabled too.
pub(super) fn is_enabled(state: &UnitFileState) -> bool {
    *state == UnitFileState::Enabled
}

/// The proof install reports: the daemon up with a live, unchanged MainPID
/// after a settle; or, without the daemon, the drain armed and the target
/// reached.
pub(super) async fn verify<O: Ops>(sd: &O, report: &mut Report, daemon: bool) -> Result<String, Error> {
    let step = Step::Verify;
    let started = Instant::now();
    if !daemon {
        // berth.target is not ordered after the drain: its start job may
        // finish while the drain's ExecStart still runs.
        loop {
            let drain = retrying(report, step, || sd.active_state(DRAIN)).await?;
            let target = retrying(report, step, || sd.active_state(TARGET)).await?;
            if drain == ActiveState::Active && target == ActiveState::Active {
                return Ok(format!(
                    "verified: {DRAIN} active (drain armed), {TARGET} active; no daemon ([daemon] enabled = false)"
                ));
            }
            if drain == ActiveState::Failed || target == ActiveState::Failed || started.elapsed() > UNIT_WAIT
            {
                return Err(fail(step, format!("{DRAIN} is {drain}, {TARGET} is {target}")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // A daemon that relaunches itself (exit 75, e.g. on a binary a package
    // upgrade just replaced) gets another settle; one that keeps dying
    // does not pass.
    for _ in 0..3 {
        let pid = loop {
            let d = retrying(report, step, || sd.details(DAEMON)).await?;
            let (state, pid) = (d.active_state, d.main_pid);
            if state == ActiveState::Active && pid > 0 {
                break pid;
            }
            if state == ActiveState::Failed || started.elapsed() > UNIT_WAIT {
                let result = d.result;
                return Err(fail(
                    step,
                    format!("{DAEMON} is {state} (Result={result}); see journalctl -u {DAEMON}"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        tokio::time::sleep(SETTLE).await;
        let d = retrying(report, step, || sd.details(DAEMON)).await?;
        let (state, now, result) = (d.active_state, d.main_pid, d.result);
        if state == ActiveState::Active && now == pid && Path::new(&format!("/proc/{pid}")).exists() {
            let drain = retrying(report, step, || sd.active_state(DRAIN)).await?;
            if drain != ActiveState::Active {
                return Err(fail(step, format!("{DRAIN} is {drain}: the drain is not armed")));
            }
            return Ok(format!(
                "verified: {DAEMON} active, MainPID {pid} alive after {} s; {DRAIN} active",
                SETTLE.as_secs()
            ));
        }
        if result != ServiceResult::Success {
            return Err(fail(
                step,
                format!(
                    "{DAEMON} did not stay up: MainPID {pid} became {now} ({state}, Result={result}) within {} s",
                    SETTLE.as_secs()
                ),
            ));
        }
    }
    Err(fail(
        step,
        format!("{DAEMON} relaunched itself three times in a row"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(name: &str) -> SystemdError {
        SystemdError {
            operation: "StopUnit",
            unit: "berth-daemon.service".into(),
            error_name: name.into(),
            message: "m".into(),
        }
    }

    #[test]
    fn transient_failures_are_retried_a_bounded_number_of_times() {
        let rt = crate::systemd::runtime().unwrap();
        let calls = std::cell::Cell::new(0);
        // Two timeouts, then an answer: retried, succeeds.
        let r = rt.block_on(retrying(&mut Report::default(), Step::StopOldDaemon, || {
            calls.set(calls.get() + 1);
            let n = calls.get();
            async move {
                if n < 3 {
                    Err(err("org.freedesktop.DBus.Error.NoReply"))
                } else {
                    Ok(n)
                }
            }
        }));
        assert_eq!(r.unwrap(), 3);
        // Always transient: gives up after ATTEMPTS, naming the step.
        calls.set(0);
        let r: Result<(), Error> = rt.block_on(retrying(&mut Report::default(), Step::StopOldDaemon, || {
            calls.set(calls.get() + 1);
            async { Err(err("")) }
        }));
        assert_eq!(calls.get(), ATTEMPTS);
        assert!(
            r.unwrap_err()
                .to_string()
                .starts_with("step 'stop the old daemon' failed")
        );
        // A real answer surfaces at once.
        calls.set(0);
        let r: Result<(), Error> = rt.block_on(retrying(&mut Report::default(), Step::StopOldDaemon, || {
            calls.set(calls.get() + 1);
            async { Err(err("org.freedesktop.DBus.Error.AccessDenied")) }
        }));
        assert_eq!(calls.get(), 1);
        assert!(r.unwrap_err().reason.contains("AccessDenied"));
    }

    /// A stop that outlasts the wait is left queued and said so; one
    /// within it is down; a unit down already is not asked.
    #[test]
    fn a_stop_is_waited_for_up_to_its_limit() {
        use crate::systemd::fake::{Behaviour, FakeOps};
        let rt = crate::systemd::runtime().unwrap();
        let ops = FakeOps::default()
            .unit("held", true, Behaviour::Takes(Duration::from_secs(3)))
            .unit("quick", true, Behaviour::Takes(Duration::from_millis(50)))
            .unit("down", false, Behaviour::Takes(Duration::ZERO));
        let mut report = Report::default();
        let within = |name: &str, limit| {
            let unit = crate::names::unit_name(name);
            rt.block_on(stop_within(
                &ops,
                &mut Report::default(),
                &unit,
                Step::Stop,
                limit,
            ))
            .unwrap()
        };
        let began = Instant::now();
        assert_eq!(within("held", Duration::from_millis(300)), Stopped::Stopping);
        assert!(
            began.elapsed() < Duration::from_secs(2),
            "waited {:?}",
            began.elapsed()
        );
        assert_eq!(within("quick", Duration::from_secs(2)), Stopped::Down);
        assert_eq!(within("down", Duration::from_secs(2)), Stopped::WasDown);
        assert!(
            !rt.block_on(stop_and_wait(&ops, &mut report, "down.service", Step::Stop))
                .unwrap()
        );
    }
}
