//! The boot-time helper and the template's fallback: `berth autostart`
//! (ExecStart of berth-autostart.service) and `berth not-configured`
//! (what berth@.service runs when a workload has no definition).

use super::{fail, say_error, with_systemd};
use crate::autostart::last_state::{self, LastState, Unknown};
use crate::config::{self, Loaded};
use crate::events::Events;
use crate::paths::Root;
use crate::state::{boots, drain_report, freeze};

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
    let last = last_state(root, &events);
    let ran = with_systemd(root, |sd| async move {
        crate::autostart::run(&sd, root, &loaded, freeze::node_frozen(root), &last, &events)
            .await
            .map_err(|e| anyhow::anyhow!("cannot ask systemd about the workloads: {e}"))
    });
    match ran {
        Ok(_) => 0,
        Err(e) => fail("autostart", &e),
    }
}

/// Notes this boot, then judges the last drain's report by it.
fn last_state(root: &Root, events: &Events) -> LastState {
    let boots = match boots::note_current(root) {
        Ok(b) => b,
        Err(e) => {
            events.warn(&e);
            // Without this boot's id no report can be placed.
            return LastState::Unknown(Unknown::Unreadable(e));
        }
    };
    last_state::judge(drain_report::read(root).map(|(_, r)| r), &boots)
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
