//! The boot-time helper and the template's fallback: `berth autostart`
//! (ExecStart of berth-autostart.service) and `berth not-configured`
//! (what berth@.service runs when a workload has no definition).

use super::{fail, say_error, with_systemd};
use crate::config::{self, Loaded};
use crate::events::Events;
use crate::paths::Root;
use crate::state::freeze;

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
        crate::autostart::run(&sd, root, &loaded, freeze::node_frozen(root), &events)
            .await
            .map_err(|e| anyhow::anyhow!("cannot ask systemd about the workloads: {e}"))
    });
    match ran {
        Ok(_) => 0,
        Err(e) => fail("autostart", &e),
    }
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
