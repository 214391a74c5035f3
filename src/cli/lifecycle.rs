//! The boot-time helper and the template's fallback: `berth autostart`
//! (ExecStart of berth-autostart.service) and `berth not-configured`
//! (what berth@.service runs when a workload has no definition).

use super::{fail, say_error, with_systemd};
use crate::autostart::last_state::{self, LastState};
use crate::config::{self, Loaded};
use crate::events::Events;
use crate::paths::Root;
use crate::state::{drain_report, freeze, runs};
use crate::systemd::{Ops, SystemdError};

/// What both helpers start with: the config (its problems logged, the
/// rest used) and the journal.
pub(super) fn helper_context(root: &Root) -> (Loaded, Events) {
    let loaded = config::load(root);
    let events = Events::new("berth");
    for e in &loaded.errors {
        events.warn(&format!("config: {e}"));
    }
    (loaded, events)
}

pub(super) fn autostart(root: &Root) -> i32 {
    let (loaded, events) = helper_context(root);
    let ran = with_systemd(root, |sd| async move {
        let last = last_state(root, sd.manager_started_us().await, &events);
        crate::autostart::run(&sd, root, &loaded, freeze::node_frozen(root), &last, &events)
            .await
            .map_err(|e| anyhow::anyhow!("cannot ask systemd about the workloads: {e}"))
    });
    match ran {
        Ok(_) => 0,
        Err(e) => fail("autostart", &e),
    }
}

/// Notes this run of the manager, then judges the last drain's report by
/// it.
fn last_state(root: &Root, manager_started: Result<u64, SystemdError>, events: &Events) -> LastState {
    let runs = manager_started
        .map_err(|e| format!("cannot ask when the manager started: {e}"))
        .and_then(|started| runs::note_current(root, started));
    if let Err(e) = &runs {
        events.warn(e);
    }
    last_state::judge(
        drain_report::read(root).map(|(_, r)| r),
        runs.as_ref().map_err(String::as_str),
    )
}

pub(super) fn not_configured(root: &Root, name: &str) -> i32 {
    match config::load_one(root, name) {
        Ok(_) => say_error(&format!(
            "berth: workload {name:?} is configured, but this unit has no command from the generator; \
             run `systemctl daemon-reload`"
        )),
        Err(errors) if errors.is_empty() => say_error(&format!(
            "berth: workload {name:?} is not defined: there is no workloads/{name}.toml in any berth \
             config directory (see berth.toml(5))"
        )),
        Err(errors) => {
            say_error(&format!(
                "berth: workload {name:?} cannot start, its file has errors:"
            ));
            for e in errors {
                say_error(&format!("  {e}"));
            }
        }
    }
    1
}
