//! The hardware watchdog's verdict, sbd-style: the watchdog
//! resets the host unless it is petted, and it is petted only while this
//! node provably cannot run an HA workload past its lease. Peers that
//! know a node has one can then take over once its lease expired plus
//! the watchdog's timeout, instead of the stop bound.
//!
//! [`verdict`] is the whole rule, pure. Pet while:
//! - no HA workload runs here; or
//! - the lease deadline (`t_send + TTL − margin`) is ahead; or
//! - it passed, but the lease has not expired yet (the deadline plus the
//!   margin), and every HA workload still up is being stopped, each stop
//!   younger than its own bound (the fence began within [`FENCE_LATE`]
//!   of the deadline).
//!
//! Anything else starves the device: an HA workload still up once the
//! lease expired, one the fence did not begin to stop, a stop older than
//! its bound. The host then resets within the watchdog's timeout of the
//! last pet, which came before the lease's expiry: a peer that waits the
//! expiry plus the timeout (and a margin) after the key went cannot run
//! the workload while this host still does.
//!
//! - [`device`]: the device itself (the kernel's watchdog API), and a
//!   fake for tests.
//! - [`holder`]: the thread of `berth fence-watch` that holds it: looks,
//!   judges, pets, and at its stop closes it only when that is safe.
//!
//! ```text
//!   open + set timeout ─▶ write the armed file
//!        │
//!        ▼
//!   read deadline ─▶ passed? ─ yes ─▶ ask systemd for each HA unit ─┐
//!        ▲              │ no                                        │
//!        │              ▼                                           ▼
//!        │            pet ◀────────────────── Ok ──────────── verdict
//!        │              │                                           │ Starve
//!        └── sleep T/4 ─┴────────────── no pet (said once) ◀────────┘
//!
//!   SIGTERM ─▶ remove the armed file ─▶ every HA unit down? ─ yes ─▶ magic close
//!                                              │ no
//!                                              └─▶ exit without it: reset in ≤ T
//! ```

pub mod device;
pub mod holder;

use std::time::Duration;

use crate::systemd::ActiveState;

/// Beyond the lease's expiry and the watchdog's timeout, how much longer
/// a peer waits: the device firing late (timeouts are whole seconds, an
/// emulated one runs on a busy host's timers) and this host's clock
/// running apart from etcd's over a lease. Measured in the guest
/// scenario: see berth.toml(5).
pub const MARGIN: Duration = Duration::from_secs(3);

/// How long a peer waits after the owner key of a workload went before
/// starting it: the stop bound of its unit, or with a watchdog the
/// timeout and [`MARGIN`] when that is shorter.
pub fn takeover_wait_s(stop_bound_s: u64, watchdog_timeout_s: Option<u64>) -> u64 {
    match watchdog_timeout_s {
        Some(t) => stop_bound_s.min(t + MARGIN.as_secs()),
        None => stop_bound_s,
    }
}

/// A unit as the verdict sees it (pure): `left_active` and `now` are
/// CLOCK_MONOTONIC, as systemd stamps `ActiveExitTimestampMonotonic`;
/// `processes` whether its control group still holds any. A unit that
/// failed with processes left (they outlived the final SIGKILL: a task in
/// uninterruptible sleep) still counts as stopping, since it left active.
pub fn unit_of(
    state: &ActiveState,
    left_active: Duration,
    now: Duration,
    processes: bool,
    bound: Duration,
) -> Unit {
    let stopping = Unit::Stopping {
        for_: now.saturating_sub(left_active),
        bound,
    };
    match state {
        ActiveState::Deactivating => stopping,
        s if s.is_down() && processes => stopping,
        s if s.is_down() => Unit::Down,
        _ => Unit::Up,
    }
}

/// Whether `owner-check` may start an HA workload as far as the watchdog
/// goes: with one configured, only while berth-fence-watch holds that
/// device with that timeout (peers count on it from the owner key on).
pub fn start_refusal(
    configured: Option<(&std::path::Path, u64)>,
    armed: Option<(&std::path::Path, u64)>,
) -> Option<String> {
    let (device, timeout_s) = configured?;
    match armed {
        // A device may count shorter than asked (it rounds): safe.
        Some((d, t)) if d == device && t <= timeout_s => None,
        Some((d, t)) => Some(format!(
            "berth.toml sets watchdog = {} with {timeout_s} s, but berth-fence-watch.service holds {} with {t} s: restart it to apply the change",
            device.display(),
            d.display()
        )),
        None => Some(format!(
            "berth.toml sets watchdog = {}, and berth-fence-watch.service does not hold it (see its journal)",
            device.display()
        )),
    }
}

/// Whether an owner key's wait may be counted on here (pure): a key
/// written with a watchdog of `key_s` is started only where a watchdog of
/// at most that timeout is held (`armed`), whatever berth.toml says now.
pub fn key_refusal(key_s: Option<u64>, armed: Option<u64>) -> Option<String> {
    let key_s = key_s?;
    match armed {
        Some(t) if t <= key_s => None,
        Some(t) => Some(format!(
            "its owner key counts on a watchdog of {key_s} s, and the one held here counts {t} s: stop the HA workloads and restart berth-fence-watch.service, or let a peer take it"
        )),
        None => Some(format!(
            "its owner key counts on a watchdog of {key_s} s, and none is held here (see berth-fence-watch.service's journal)"
        )),
    }
}

/// At the holder's stop, after the armed file went (`owner-check`
/// refuses every start from then on): the device may be closed without a
/// reset only if every HA workload is down.
pub fn may_close(ha: &[(&str, Unit)]) -> Result<(), String> {
    let up: Vec<&str> = ha
        .iter()
        .filter(|(_, u)| *u != Unit::Down)
        .map(|(n, _)| *n)
        .collect();
    if up.is_empty() {
        Ok(())
    } else {
        let verb = if up.len() == 1 { "runs" } else { "run" };
        Err(format!("{} still {verb} here", up.join(", ")))
    }
}

/// How long after the deadline a workload may still be up and not yet
/// stopping: the daemon's fence acts at the deadline, the backstop a
/// second later.
pub const FENCE_LATE: Duration = Duration::from_secs(2);

/// What one HA workload's unit is doing, as far as the verdict cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Inactive or failed.
    Down,
    /// Active, activating or reloading.
    Up,
    /// Deactivating: left active `for_` ago, and may take `bound`.
    Stopping { for_: Duration, bound: Duration },
}

/// Why the device is not petted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Starve {
    /// The lease has expired and the workload is still up: a peer may
    /// take it once the expiry plus the watchdog's timeout passed.
    LeaseExpired { workload: String },
    /// The deadline passed more than [`FENCE_LATE`] ago and nothing is
    /// stopping the workload.
    NotStopping { workload: String },
    /// Its stop has taken longer than its own bound.
    StopTooLong {
        workload: String,
        for_: Duration,
        bound: Duration,
    },
    /// The deadline passed and systemd did not tell how the HA workloads
    /// are: nothing proves they are going.
    Unobserved { why: String },
}

impl std::fmt::Display for Starve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Starve::LeaseExpired { workload } => {
                write!(f, "the lease has expired and {workload} still runs here")
            }
            Starve::NotStopping { workload } => write!(
                f,
                "the lease deadline passed {} s ago and nothing stops {workload}",
                FENCE_LATE.as_secs()
            ),
            Starve::StopTooLong {
                workload,
                for_,
                bound,
            } => write!(
                f,
                "the stop of {workload} has taken {} ms, past its bound of {} s",
                for_.as_millis(),
                bound.as_secs()
            ),
            Starve::Unobserved { why } => write!(
                f,
                "the lease deadline passed and the HA workloads' units cannot be seen: {why}"
            ),
        }
    }
}

/// Whether to pet the device now (pure). `deadline`: the fence deadline
/// the daemon last recorded (CLOCK_BOOTTIME), `None` when no lease was
/// held in this boot; `margin`: from the deadline to the lease's expiry;
/// `ha`: each HA workload with its unit's state.
pub fn verdict(
    deadline: Option<Duration>,
    margin: Duration,
    now: Duration,
    ha: &[(&str, Unit)],
) -> Result<(), Starve> {
    let Some(deadline) = deadline else {
        // No lease in this boot: nothing was taken, and owner-check
        // starts nothing.
        return Ok(());
    };
    if now < deadline {
        return Ok(());
    }
    for (name, unit) in ha {
        let workload = name.to_string();
        match *unit {
            Unit::Down => {}
            _ if now >= deadline + margin => return Err(Starve::LeaseExpired { workload }),
            Unit::Up if now >= deadline + FENCE_LATE => return Err(Starve::NotStopping { workload }),
            Unit::Up => {}
            Unit::Stopping { for_, bound } if for_ > bound => {
                return Err(Starve::StopTooLong {
                    workload,
                    for_,
                    bound,
                });
            }
            Unit::Stopping { .. } => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const MS: Duration = Duration::from_millis(1);

    fn stopping(for_: Duration, bound: Duration) -> Unit {
        Unit::Stopping { for_, bound }
    }

    /// (deadline, now, units) → verdict, with a margin of 4 s (TTL 10):
    /// the lease expires at the deadline + 4 s.
    #[test]
    fn the_device_is_petted_only_while_no_workload_can_outlive_the_lease() {
        let margin = 4 * S;
        let up = |n| ("db", n);
        let expired = || {
            Err(Starve::LeaseExpired {
                workload: "db".into(),
            })
        };
        type Case = (
            Option<Duration>,
            Duration,
            Vec<(&'static str, Unit)>,
            Result<(), Starve>,
        );
        let cases: Vec<Case> = vec![
            // No lease in this boot.
            (None, 100 * S, vec![up(Unit::Up)], Ok(())),
            // Nothing runs: petted whatever the lease.
            (Some(10 * S), 100 * S, vec![up(Unit::Down)], Ok(())),
            (Some(10 * S), 100 * S, vec![], Ok(())),
            // The deadline ahead: petted.
            (Some(10 * S), 9 * S, vec![up(Unit::Up)], Ok(())),
            // Just passed: the fence is about to act.
            (Some(10 * S), 10 * S + 500 * MS, vec![up(Unit::Up)], Ok(())),
            // Passed 2 s ago and nothing stops it.
            (
                Some(10 * S),
                12 * S,
                vec![up(Unit::Up)],
                Err(Starve::NotStopping {
                    workload: "db".into(),
                }),
            ),
            // Stopping within its bound, before the expiry.
            (Some(10 * S), 13 * S, vec![up(stopping(3 * S, 5 * S))], Ok(())),
            // A stop past its bound.
            (
                Some(10 * S),
                13 * S,
                vec![up(stopping(6 * S, 5 * S))],
                Err(Starve::StopTooLong {
                    workload: "db".into(),
                    for_: 6 * S,
                    bound: 5 * S,
                }),
            ),
            // The lease expired with the stop still under way.
            (Some(10 * S), 14 * S, vec![up(stopping(4 * S, 35 * S))], expired()),
            (Some(10 * S), 30 * S, vec![up(Unit::Up)], expired()),
            // One of two still up at the expiry is enough.
            (
                Some(10 * S),
                14 * S,
                vec![("web", Unit::Down), ("db", Unit::Up)],
                expired(),
            ),
        ];
        for (deadline, now, units, want) in cases {
            assert_eq!(
                verdict(deadline, margin, now, &units),
                want,
                "{deadline:?} {now:?} {units:?}"
            );
        }
    }

    /// (state, left active at, processes left) → unit, at now = 100 s
    /// with a bound of 35 s.
    #[test]
    fn units_as_the_verdict_sees_them() {
        let bound = 35 * S;
        for (state, left, processes, want) in [
            (ActiveState::Active, Duration::ZERO, true, Unit::Up),
            (ActiveState::Activating, Duration::ZERO, true, Unit::Up),
            (ActiveState::Reloading, Duration::ZERO, true, Unit::Up),
            (ActiveState::Deactivating, 90 * S, true, stopping(10 * S, bound)),
            (ActiveState::Inactive, 90 * S, false, Unit::Down),
            (ActiveState::Failed, 90 * S, false, Unit::Down),
            // The final SIGKILL did not end it: still counted from the
            // moment it left active, so it soon passes its bound.
            (ActiveState::Failed, 50 * S, true, stopping(50 * S, bound)),
        ] {
            assert_eq!(
                unit_of(&state, left, 100 * S, processes, bound),
                want,
                "{state:?}"
            );
        }
    }

    #[test]
    fn starts_need_the_configured_watchdog_held() {
        use std::path::Path;
        let w0 = Path::new("/dev/watchdog0");
        let w1 = Path::new("/dev/watchdog1");
        assert_eq!(start_refusal(None, None), None);
        assert_eq!(start_refusal(None, Some((w0, 10))), None);
        assert_eq!(start_refusal(Some((w0, 10)), Some((w0, 10))), None);
        assert_eq!(start_refusal(Some((w0, 10)), Some((w0, 9))), None, "rounded down");
        for armed in [None, Some((w0, 20)), Some((w1, 10))] {
            assert!(start_refusal(Some((w0, 10)), armed).is_some(), "{armed:?}");
        }
    }

    /// (the key's watchdog, the one held) → refused?
    #[test]
    fn a_key_counting_on_a_watchdog_starts_only_under_one_as_short() {
        for (key, armed, refused) in [
            (None, None, false),
            (None, Some(10), false),
            (Some(10), Some(10), false),
            (Some(10), Some(5), false),
            (Some(10), Some(20), true),
            (Some(10), None, true),
        ] {
            assert_eq!(key_refusal(key, armed).is_some(), refused, "{key:?} {armed:?}");
        }
    }

    #[test]
    fn takeover_waits() {
        assert_eq!(takeover_wait_s(36, None), 36);
        assert_eq!(takeover_wait_s(36, Some(10)), 13);
        // Never longer than without the watchdog.
        assert_eq!(takeover_wait_s(8, Some(10)), 8);
    }

    #[test]
    fn the_device_is_closed_only_when_nothing_runs() {
        assert_eq!(may_close(&[]), Ok(()));
        assert_eq!(may_close(&[("db", Unit::Down), ("web", Unit::Down)]), Ok(()));
        assert_eq!(
            may_close(&[("db", Unit::Down), ("web", Unit::Up), ("q", stopping(S, S))]),
            Err("web, q still run here".into())
        );
    }

    #[test]
    fn each_starvation_says_why() {
        let s = Starve::StopTooLong {
            workload: "db".into(),
            for_: 6 * S,
            bound: 5 * S,
        };
        assert_eq!(
            s.to_string(),
            "the stop of db has taken 6000 ms, past its bound of 5 s"
        );
        assert!(
            Starve::LeaseExpired {
                workload: "db".into()
            }
            .to_string()
            .contains("db still runs")
        );
    }
}
