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

use std::time::Duration;

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
