//! The fence's backstop, `berth fence-watch` (berth-fence-watch.service):
//! a resident process of its own that stops this node's HA workloads when
//! the lease deadline the daemon last recorded has passed, whatever
//! happened to the daemon and to the timer its `ExecStopPost=` arms.
//!
//! The daemon's own fence and `berth-fence.timer` come first; this one
//! acts [`LATE`] after the deadline, so it normally finds nothing running
//! and says nothing. It needs nothing at the daemon's stop but the
//! deadline file the daemon writes at every acknowledged keep-alive and
//! at the maintenance hand-over, and it counts on `CLOCK_BOOTTIME`, which
//! goes on across a suspend: its sleeps are at most a second long, so a
//! host that resumes past the deadline fences within a second.
//!
//! ```text
//!   read deadline ──▶ ahead ──────────────▶ sleep ≤ 1 s ─┐
//!        ▲            passed + LATE ──▶ fence, then ─────┤
//!        │                              every AGAIN      │
//!        └───────────────────────────────────────────────┘
//! ```

use std::time::Duration;

/// How long after the deadline the backstop looks: the daemon's fence
/// (every 100 ms) and the timer (to the microsecond) go first, and the
/// margin before the lease itself ends (two keep-alive intervals) is
/// longer.
pub const LATE: Duration = Duration::from_secs(1);
/// While the deadline stays passed, it looks again this often: a start
/// that passed `owner-check` just before the deadline is stopped too.
pub const AGAIN: Duration = Duration::from_secs(5);
/// The longest sleep: a new deadline (the daemon back) or a resume is
/// seen within it.
pub const NAP: Duration = Duration::from_secs(1);

/// What the backstop does on this look (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// Sleep this long, then read the deadline again.
    Sleep(Duration),
    /// Stop the HA workloads that run here.
    Fence,
}

/// `last_fence`: when it last fenced for the deadline now in force
/// (`None` once the deadline is ahead again).
pub fn look(deadline: Option<Duration>, now: Duration, last_fence: Option<Duration>) -> Look {
    let Some(d) = deadline else {
        return Look::Sleep(NAP);
    };
    let due = d + LATE;
    if now < due {
        return Look::Sleep((due - now).min(NAP));
    }
    match last_fence {
        Some(t) if now.saturating_sub(t) < AGAIN => Look::Sleep((t + AGAIN - now).min(NAP)),
        _ => Look::Fence,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const MS: Duration = Duration::from_millis(1);

    /// (deadline, now, last fence) → look.
    #[test]
    fn the_backstop_fences_a_second_after_the_deadline_and_again_while_it_stays_passed() {
        let cases = [
            // Never joined: nothing was taken, nothing to fence.
            (None, 10 * S, None, Look::Sleep(NAP)),
            // Far ahead: a nap, then the file is read again.
            (Some(60 * S), 10 * S, None, Look::Sleep(NAP)),
            // Close: it wakes when the backstop is due, not a nap later.
            (Some(10 * S), 10 * S + 700 * MS, None, Look::Sleep(300 * MS)),
            // Just passed: the daemon's fence and the timer go first.
            (Some(10 * S), 10 * S, None, Look::Sleep(S)),
            (Some(10 * S), 11 * S, None, Look::Fence),
            // A resume long past it (CLOCK_BOOTTIME counted the sleep).
            (Some(10 * S), 500 * S, None, Look::Fence),
            // Fenced 2 s ago, still passed: again 5 s after the last.
            (Some(10 * S), 13 * S, Some(11 * S), Look::Sleep(S)),
            (
                Some(10 * S),
                15 * S + 600 * MS,
                Some(11 * S),
                Look::Sleep(400 * MS),
            ),
            (Some(10 * S), 16 * S, Some(11 * S), Look::Fence),
        ];
        for (deadline, now, last, want) in cases {
            assert_eq!(look(deadline, now, last), want, "{deadline:?} {now:?} {last:?}");
        }
    }
}
