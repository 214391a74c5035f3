//! `berth daemon`: the resident supervisor (run by berth-daemon.service).

use std::time::Duration;

use super::say_error;
use crate::daemon::{self, Exit, Options};
use crate::paths::Root;

pub(super) fn run(
    root: &Root,
    foreground: bool,
    reconcile_interval: Option<u64>,
    no_api: bool,
    gc_interval: Option<u64>,
) -> i32 {
    loop {
        let options = Options {
            reconcile_interval: reconcile_interval.map(Duration::from_secs),
            no_api,
            gc_interval: gc_interval.map(Duration::from_secs),
        };
        match daemon::main(root, options) {
            // Under systemd, Restart=always relaunches; by hand, this loop does.
            Ok(Exit::Relaunch) if foreground => {
                say_error(&format!(
                    "berth daemon: relaunching (exit {})",
                    Exit::Relaunch.code()
                ));
            }
            Ok(exit) => return exit.code(),
            Err(e) => {
                say_error(&format!("berth daemon: {e}"));
                return 1;
            }
        }
    }
}
