//! Logging for programs that run before the journal is up.
//!
//! A generator runs very early, when only the kernel log exists: it writes
//! syslog-prefixed lines to /dev/kmsg, as systemd's own generators do, and
//! falls back to stderr where /dev/kmsg cannot be opened (containers,
//! tests, unprivileged runs).

use std::fs::{File, OpenOptions};
use std::io::Write;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 3,
    Warning = 4,
    Notice = 5,
    Info = 6,
}

enum Target {
    Kmsg(File),
    Stderr,
}

pub struct Logger {
    ident: &'static str,
    target: Target,
}

/// syslog facility LOG_DAEMON.
const FACILITY_DAEMON: u8 = 3 << 3;

impl Logger {
    /// Logs to /dev/kmsg when `prefer_kmsg` and it can be opened; otherwise
    /// to stderr.
    pub fn new(ident: &'static str, prefer_kmsg: bool) -> Self {
        let target = if prefer_kmsg {
            match OpenOptions::new().write(true).open("/dev/kmsg") {
                Ok(f) => Target::Kmsg(f),
                Err(_) => Target::Stderr,
            }
        } else {
            Target::Stderr
        };
        Logger { ident, target }
    }

    pub fn log(&mut self, level: Level, msg: &str) {
        match &mut self.target {
            Target::Kmsg(f) => {
                let line = format!(
                    "<{}>{}[{}]: {msg}\n",
                    FACILITY_DAEMON + level as u8,
                    self.ident,
                    std::process::id()
                );
                // One write() per record: kmsg takes a record per write.
                if f.write_all(line.as_bytes()).is_err() {
                    let _ = writeln!(std::io::stderr(), "{}: {msg}", self.ident);
                }
            }
            Target::Stderr => {
                let _ = writeln!(std::io::stderr(), "{}: {msg}", self.ident);
            }
        }
    }

    pub fn error(&mut self, msg: &str) {
        self.log(Level::Error, msg)
    }

    pub fn warning(&mut self, msg: &str) {
        self.log(Level::Warning, msg)
    }
}
