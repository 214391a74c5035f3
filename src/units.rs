//! The packaged units, rendered for one manager and one binary location.
//!
//! One template per unit (`units/*.in`) serves both managers; the few
//! places where they differ are placeholders filled here, and only here:
//! `make` (through `berth render-units`) and `berth install` both call
//! [`render`], so a packaged unit and one installed from a source tree
//! cannot drift apart.

use std::path::Path;

use crate::names::{AUTOSTART, DAEMON, DRAIN, FENCE_WATCH, SLICE, TARGET, TEMPLATE};
use crate::paths::{Manager, STATE_DIR};
use crate::unit_text::exec_line;

/// (unit file name, template). berth.target first: it is what gets enabled.
pub const TEMPLATES: [(&str, &str); 7] = [
    (TARGET, include_str!("../units/berth.target.in")),
    (SLICE, include_str!("../units/berth.slice.in")),
    (DRAIN, include_str!("../units/berth-drain.service.in")),
    (AUTOSTART, include_str!("../units/berth-autostart.service.in")),
    (DAEMON, include_str!("../units/berth-daemon.service.in")),
    (FENCE_WATCH, include_str!("../units/berth-fence-watch.service.in")),
    (TEMPLATE, include_str!("../units/berth@.service.in")),
];

/// What every berth unit, and every existing unit berth takes over, wants
/// and is ordered after in place of the default dependencies it drops.
pub fn base_targets(manager: Manager) -> &'static str {
    match manager {
        Manager::System => "sysinit.target basic.target",
        // A user manager has no sysinit.target.
        Manager::User => "basic.target",
    }
}

/// The sandboxing of berth's own services (berth.units(7)): the end of
/// their [Service] section. A user manager without user namespaces
/// cannot set up mount namespaces or drop capabilities it does not
/// have: its units get what works there, the same for all three.
fn sandbox(manager: Manager, unit: &str) -> &'static str {
    match (manager, unit) {
        (Manager::System, DAEMON) => include_str!("../units/sandbox/daemon.system"),
        (Manager::System, DRAIN) => include_str!("../units/sandbox/drain.system"),
        (Manager::System, AUTOSTART) => include_str!("../units/sandbox/autostart.system"),
        (Manager::System, FENCE_WATCH) => include_str!("../units/sandbox/fence-watch.system"),
        (Manager::User, DAEMON) => include_str!("../units/sandbox/daemon.user"),
        (Manager::User, DRAIN | AUTOSTART | FENCE_WATCH) => include_str!("../units/sandbox/user"),
        _ => "",
    }
}

/// The unit texts for `manager`, with the `berth` binary in `bindir`.
pub fn render(manager: Manager, bindir: &Path) -> Vec<(&'static str, String)> {
    let program = bindir.join("berth").to_string_lossy().into_owned();
    // Quoted (by the one escaper) only when it has to be: the usual
    // /usr/bin/berth stays readable in `systemctl cat`.
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._+-".contains(c);
    let berth = if program.chars().all(plain) {
        program
    } else {
        exec_line(&[program])
    };
    let (berth, state_dir, base_targets, wanted_by) = match manager {
        Manager::System => (
            berth,
            STATE_DIR,
            base_targets(Manager::System),
            "multi-user.target",
        ),
        // A user manager has no sysinit.target; %h is resolved by the user
        // manager itself, the way paths::Root resolves it for berth.
        Manager::User => (
            format!("{berth} --user"),
            "%h/.local/state/berth",
            base_targets(Manager::User),
            "default.target",
        ),
    };
    TEMPLATES
        .iter()
        .map(|(name, template)| {
            let text = template
                .replace("@SANDBOX@", sandbox(manager, name))
                .replace("@BERTH@", &berth)
                .replace("@STATE_DIR@", state_dir)
                .replace("@BASE_TARGETS@", base_targets)
                .replace("@WANTED_BY@", wanted_by);
            (*name, text)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_is_filled() {
        for manager in [Manager::System, Manager::User] {
            for (name, text) in render(manager, Path::new("/usr/bin")) {
                assert!(
                    !text.contains("@BERTH@") && !text.contains("@STATE_DIR@"),
                    "{name}"
                );
                assert!(
                    !text.contains("@BASE_TARGETS@") && !text.contains("@WANTED_BY@"),
                    "{name}"
                );
            }
        }
    }

    #[test]
    fn the_user_units_talk_to_the_user_manager() {
        let units = render(Manager::User, Path::new("/home/u/.local/bin"));
        let drain = &units.iter().find(|(n, _)| *n == DRAIN).unwrap().1;
        assert!(drain.contains("ExecStop=/home/u/.local/bin/berth --user drain\n"));
        let target = &units.iter().find(|(n, _)| *n == TARGET).unwrap().1;
        assert!(target.contains("WantedBy=default.target\n"));
        let autostart = &units.iter().find(|(n, _)| *n == AUTOSTART).unwrap().1;
        assert!(autostart.contains("ConditionPathExists=!%h/.local/state/berth/freeze/node\n"));
        let system = render(Manager::System, Path::new("/usr/bin"));
        let drain = &system.iter().find(|(n, _)| *n == DRAIN).unwrap().1;
        assert!(drain.contains("ExecStop=/usr/bin/berth drain\n"));
    }
}
