//! Build-time verbs, used by `make`: the packaged units for a binary
//! directory, and shell completions from the CLI definition.

use std::path::Path;

use super::{Cli, say, say_error};
use crate::paths::Manager;

pub(super) fn render_units(manager: Manager, bindir: &Path, out: &Path) -> i32 {
    if !bindir.is_absolute() {
        say_error(&format!(
            "berth render-units: --bindir must be absolute, not {}",
            bindir.display()
        ));
        return 2;
    }
    for (name, text) in crate::units::render(manager, bindir) {
        let path = out.join(name);
        if let Err(e) = std::fs::create_dir_all(out).and_then(|()| std::fs::write(&path, text)) {
            say_error(&format!("berth render-units: {}: {e}", path.display()));
            return 1;
        }
    }
    0
}

pub(super) fn completions(shell: clap_complete::Shell) -> i32 {
    use clap::CommandFactory;
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "berth", &mut script);
    say(&String::from_utf8_lossy(&script));
    0
}
