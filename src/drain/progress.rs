//! What a person watching the console sees while the host shuts down:
//! a line per finished stop and, while stops are pending, a periodic
//! "waiting for N workloads, S s left" (systemd itself shows only "A stop
//! job is running for berth host-shutdown drain"). The same goes to
//! systemd as `STATUS=` (berth-drain.service has `NotifyAccess=exec`: the
//! drain is its ExecStop, a control process), so `systemctl status` shows
//! it too. The journal has the structured events, not these lines.

use crate::names::WorkloadUnits;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use tokio::time::Instant;

use crate::state::drain_report::{Outcome, StopResult};

/// How often the waiting line is repeated while stops are pending.
pub const WAITING_EVERY: Duration = Duration::from_secs(5);

/// Names shown in a waiting line; the rest are counted.
const NAMES_SHOWN: usize = 5;

pub struct Progress<W: Write> {
    out: W,
    /// Running workloads the drain stops.
    total: usize,
    done: usize,
    /// A person at a terminal already sees each outcome (the events echo
    /// them to stderr): only the waiting lines are added.
    outcomes_echoed: bool,
    /// Whether STATUS= goes to systemd (not in tests).
    notify: bool,
    /// The units the lines name.
    units: WorkloadUnits,
}

impl Progress<Box<dyn Write>> {
    /// Run by systemd (the drain unit's ExecStop at shutdown): to the
    /// console, which is where a person watching a shutdown looks. Its
    /// standard output goes to the journal, which has the events already;
    /// a console that cannot be opened (a container without one) is no
    /// reason to fail: STATUS= alone then. Run by hand: to standard
    /// output.
    pub fn for_drain(total: usize, outcomes_echoed: bool) -> Self {
        let console = std::env::var_os("INVOCATION_ID").and_then(|_| {
            OpenOptions::new()
                .write(true)
                // Never its controlling terminal; never a blocked drain on
                // a console that does not take the bytes.
                .custom_flags(nix::libc::O_NOCTTY | nix::libc::O_NONBLOCK)
                .open("/dev/console")
                .ok()
        });
        let out: Box<dyn Write> = match console {
            Some(c) => Box::new(c),
            // Under systemd without a console, standard output is the
            // journal, which has the events already: STATUS= only.
            None if std::env::var_os("INVOCATION_ID").is_some() => Box::new(std::io::sink()),
            None => Box::new(std::io::stdout()),
        };
        Progress {
            out,
            total,
            done: 0,
            outcomes_echoed,
            notify: std::env::var_os("NOTIFY_SOCKET").is_some(),
            units: WorkloadUnits::default(),
        }
    }
}

impl<W: Write> Progress<W> {
    /// Lines name `units`' units (a `unit =` workload's own).
    pub fn naming(mut self, units: WorkloadUnits) -> Self {
        self.units = units;
        self
    }

    #[cfg(test)]
    pub fn to(out: W, total: usize) -> Self {
        Progress {
            out,
            total,
            done: 0,
            outcomes_echoed: false,
            notify: false,
            units: WorkloadUnits::default(),
        }
    }

    #[cfg(test)]
    pub fn into_inner(self) -> W {
        self.out
    }

    /// One workload's stop is over. Nothing is said of one that was not
    /// running.
    pub fn finished(&mut self, r: &StopResult) {
        if r.outcome == Outcome::AlreadyOff {
            return;
        }
        self.done += 1;
        let line = format!(
            "berth: {} {} after {:.1} s ({} of {} done)",
            r.unit_name(),
            r.outcome.as_str(),
            r.elapsed_ms as f64 / 1000.0,
            self.done,
            self.total
        );
        if !self.outcomes_echoed {
            self.say(&line);
        }
        self.status(&format!("draining: {} of {} done", self.done, self.total));
    }

    /// Stops still pending, `stopping` those under way now, with the time
    /// left before the deadline.
    pub fn waiting<'a>(&mut self, stopping: impl Iterator<Item = &'a str>, deadline: Instant) {
        let pending = self.total.saturating_sub(self.done);
        if pending == 0 {
            return;
        }
        let left = deadline.saturating_duration_since(Instant::now()).as_secs();
        let stopping: Vec<&str> = stopping.collect();
        let mut names: Vec<String> = stopping
            .iter()
            .take(NAMES_SHOWN)
            .map(|n| self.units.unit_of(n))
            .collect();
        if stopping.len() > NAMES_SHOWN {
            names.push(format!("{} more", stopping.len() - NAMES_SHOWN));
        }
        let line = format!(
            "berth: waiting for {pending} workload{}, {left} s left before the deadline (stopping: {})",
            if pending == 1 { "" } else { "s" },
            names.join(", ")
        );
        self.say(&line);
        self.status(&format!(
            "draining: {} of {} done, waiting for {pending}, {left} s left",
            self.done, self.total
        ));
    }

    /// A console that went away (or a closed stdout) must not stop the
    /// drain: errors are ignored.
    /// Each line in one write: on a console that takes no more bytes
    /// (non-blocking) a line is dropped, not cut and glued to the next.
    fn say(&mut self, line: &str) {
        let _ = self.out.write(format!("{line}\n").as_bytes());
        let _ = self.out.flush();
    }

    fn status(&self, text: &str) {
        if self.notify {
            let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(text)]);
        }
    }
}
