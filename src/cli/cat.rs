//! `berth cat NAME`: the workload file and the drop-in berth-generator
//! makes of it, one after the other like `systemctl cat`, and whether the
//! drop-in systemd has loaded is still that one.

use std::path::{Path, PathBuf};

use super::{say, say_error};
use crate::config::{self, shown_path};
use crate::names::is_valid_workload_name;
use crate::paths::{Manager, Root};
use crate::render;

pub(super) fn run(root: &Root, name: &str) -> i32 {
    if !is_valid_workload_name(name) {
        say_error(&format!(
            "berth cat: {}: not a workload name (1-64 characters from A-Z a-z 0-9 _ . -, starting with a letter or digit)",
            printable(name)
        ));
        return 1;
    }
    let w = match config::load_one(root, name) {
        Ok(w) => w,
        Err(problems) if problems.is_empty() => {
            say_error(&format!("berth cat: no workload {name:?} is configured"));
            return 1;
        }
        Err(problems) => {
            let lines: Vec<String> = problems.iter().map(|e| format!("  {e}")).collect();
            say_error(&format!(
                "berth cat: the workload file of {name:?} is not valid:\n{}",
                lines.join("\n")
            ));
            return 1;
        }
    };
    // A guest covered by `guests = "all"` has no file: what it would say.
    let file = if w.from_all_guests {
        format!(
            "# no workload file: the libvirt domain defined in {} is covered by [libvirt] guests = \"all\"\n",
            shown_path(&w.source)
        )
        .into_bytes()
    } else {
        match std::fs::read(&w.source) {
            Ok(bytes) => bytes,
            Err(e) => {
                say_error(&format!("berth cat: {}: {e}", shown_path(&w.source)));
                return 1;
            }
        }
    };
    let drop_in = render::workload_drop_in(root, &w);
    let loaded_path = generator_dir(root).join(format!("{}.d/10-berth.conf", w.unit_name()));
    let mut out = format!(
        "# {}\n{}",
        shown_path(&w.source),
        printable(&String::from_utf8_lossy(&file))
    );
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&format!(
        "\n# {} (what berth-generator makes of it)\n{}",
        shown_path(&loaded_path),
        printable(&drop_in)
    ));
    match std::fs::read(&loaded_path) {
        Ok(in_effect) if in_effect == drop_in.as_bytes() => {}
        Ok(_) => out.push_str(
            "\n# The drop-in systemd loaded differs: the configuration changed since the last\n# daemon-reload. `systemctl daemon-reload` (or `berth reload`) applies it.\n",
        ),
        Err(_) => out.push_str(
            "\n# systemd has loaded no such drop-in yet: `systemctl daemon-reload` (or `berth reload`)\n# runs the generator.\n",
        ),
    }
    say(&out);
    0
}

/// Where the manager's generators write (the normal directory).
fn generator_dir(root: &Root) -> PathBuf {
    match (root.manager(), root.user_dirs()) {
        (Manager::User, Some(u)) => root.join(u.runtime_dir.join("systemd/generator")),
        _ => root.join(Path::new("/run/systemd/generator")),
    }
}

/// File text for a terminal: control characters other than newline and
/// tab (a comment may hold an escape sequence) shown as `\xNN`.
fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("\\x{b:02x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_never_reach_the_terminal() {
        assert_eq!(
            printable("a\tb\nc\x1b[31md\r\u{85}"),
            "a\tb\nc\\x1b[31md\\x0d\\xc2\\x85"
        );
    }
}
