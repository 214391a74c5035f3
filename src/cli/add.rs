//! `berth add NAME [flags] -- ARGV…` / `berth add NAME --unit UNIT|--libvirt DOMAIN
//! [flags]` / `berth add NAME --from FILE`, and
//! `berth remove NAME [--stop]`: the user interface; the mechanism is
//! [`crate::manage`].

use std::path::PathBuf;

use super::{say, say_error, with_systemd};
use crate::manage::{self, ChangeError, Done, Place};
use crate::paths::Root;
use crate::systemd::JobResult;

#[derive(clap::Args, Debug)]
pub(super) struct AddArgs {
    /// The workload's name (its file is NAME.toml).
    name: String,
    /// Write to /run/berth (gone at the next boot) instead of /etc/berth.
    #[arg(long)]
    runtime: bool,
    /// Start it once systemd is reloaded, and wait for its start job.
    #[arg(long)]
    now: bool,
    /// When NAME overrides a running workload of lower precedence (in
    /// /run/berth, or a package's): stop it first, and wait for the stop.
    #[arg(long)]
    stop: bool,
    /// Take the whole workload file from FILE instead of the flags.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["exec", "unit", "libvirt", "shutdown_mode", "description", "order", "no_autostart", "start_delay", "stop_action", "stop_delay", "ready", "ready_exec", "after", "wants", "env", "run_as", "run_as_group"])]
    from: Option<PathBuf>,
    /// Take over an existing service unit instead of running a command.
    #[arg(long, value_name = "UNIT", conflicts_with = "exec")]
    unit: Option<String>,
    /// Make a libvirt domain of qemu:///system the workload.
    #[arg(long, value_name = "DOMAIN", conflicts_with_all = ["exec", "unit", "ready", "ready_exec", "env", "run_as", "run_as_group"])]
    libvirt: Option<String>,
    /// How a libvirt guest is asked to shut down: agent, acpi, or agent,acpi.
    #[arg(long, value_name = "MODES", value_delimiter = ',')]
    shutdown_mode: Vec<String>,
    #[arg(long)]
    description: Option<String>,
    #[arg(long, allow_negative_numbers = true)]
    order: Option<i64>,
    /// autostart = false.
    #[arg(long)]
    no_autostart: bool,
    #[arg(long, value_name = "SECONDS")]
    start_delay: Option<u64>,
    /// guest_shutdown, power_off, or save (a libvirt guest).
    #[arg(long)]
    stop_action: Option<String>,
    #[arg(long, value_name = "SECONDS")]
    stop_delay: Option<u64>,
    /// exec or notify.
    #[arg(long)]
    ready: Option<String>,
    /// A readiness probe, as one shell-free word list: --ready-exec /usr/bin/test --ready-exec -e ...
    #[arg(long, value_name = "WORD", allow_hyphen_values = true)]
    ready_exec: Vec<String>,
    #[arg(long, value_name = "UNIT")]
    after: Vec<String>,
    #[arg(long, value_name = "UNIT")]
    wants: Vec<String>,
    /// An environment variable, NAME=VALUE; repeatable.
    #[arg(long, value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// The workload's `user` (--user is berth's own: the user manager).
    #[arg(long = "run-as", value_name = "USER")]
    run_as: Option<String>,
    /// The workload's `group`.
    #[arg(long = "run-as-group", value_name = "GROUP")]
    run_as_group: Option<String>,
    /// The command to run, after `--`.
    #[arg(last = true, value_name = "ARGV")]
    exec: Vec<String>,
}

/// A TOML basic string: what it holds, read back exactly.
fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn toml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| toml_string(i)).collect();
    format!("[{}]", quoted.join(", "))
}

/// The workload file the flags describe. Values are written as given and
/// checked afterwards by the same rules as any file.
fn file_from_flags(a: &AddArgs) -> Result<String, String> {
    let mut t = match (&a.unit, &a.libvirt) {
        (Some(unit), _) => format!("unit = {}\n", toml_string(unit)),
        (None, Some(domain)) => format!("libvirt = {}\n", toml_string(domain)),
        (None, None) if a.exec.is_empty() => {
            return Err(
                "the command to run goes after `--` (or name an existing unit with --unit UNIT, a libvirt guest with \
                 --libvirt DOMAIN, or give the whole file with --from FILE)"
                    .into(),
            );
        }
        (None, None) => format!("exec = {}\n", toml_list(&a.exec)),
    };
    let mut line = |key: &str, value: String| t.push_str(&format!("{key} = {value}\n"));
    if let Some(d) = &a.description {
        line("description", toml_string(d));
    }
    if let Some(o) = a.order {
        line("order", o.to_string());
    }
    if a.no_autostart {
        line("autostart", "false".into());
    }
    if let Some(s) = a.start_delay {
        line("start_delay_s", s.to_string());
    }
    if let Some(s) = &a.stop_action {
        line("stop_action", toml_string(s));
    }
    if let Some(s) = a.stop_delay {
        line("stop_delay_s", s.to_string());
    }
    if let Some(r) = &a.ready {
        line("ready", toml_string(r));
    }
    if !a.ready_exec.is_empty() {
        line("ready_exec", toml_list(&a.ready_exec));
    }
    if !a.after.is_empty() {
        line("after", toml_list(&a.after));
    }
    if !a.wants.is_empty() {
        line("wants", toml_list(&a.wants));
    }
    if !a.shutdown_mode.is_empty() {
        if a.libvirt.is_none() {
            return Err("--shutdown-mode is for a libvirt guest (--libvirt DOMAIN)".into());
        }
        line("shutdown_mode", toml_list(&a.shutdown_mode));
    }
    if let Some(u) = &a.run_as {
        line("user", toml_string(u));
    }
    if let Some(g) = &a.run_as_group {
        line("group", toml_string(g));
    }
    if !a.env.is_empty() {
        t.push_str("\n[environment]\n");
        for pair in &a.env {
            let Some((name, value)) = pair.split_once('=') else {
                return Err(format!("--env {pair:?}: NAME=VALUE expected"));
            };
            t.push_str(&format!("{} = {}\n", toml_string(name), toml_string(value)));
        }
    }
    Ok(t)
}

/// The most `--from` reads: a workload file is a few lines, and
/// `--from /dev/zero` must end in an error, not in all of memory.
const MAX_FROM_BYTES: u64 = 1024 * 1024;

fn read_bounded(file: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(file)?
        .take(MAX_FROM_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FROM_BYTES {
        return Err(std::io::Error::other("larger than 1 MiB: not a workload file"));
    }
    String::from_utf8(bytes).map_err(|_| std::io::Error::other("not UTF-8 text: not a workload file"))
}

pub(super) fn add(root: &Root, a: Box<AddArgs>) -> i32 {
    let text = match &a.from {
        Some(file) => match read_bounded(file) {
            Ok(text) => text,
            Err(e) => {
                say_error(&format!("berth add: {}: {e}", crate::config::shown_path(file)));
                return 1;
            }
        },
        None => match file_from_flags(&a) {
            Ok(text) => text,
            Err(e) => {
                say_error(&format!("berth add: {e}"));
                return 2;
            }
        },
    };
    let place = if a.runtime { Place::Runtime } else { Place::Admin };
    // Refused before systemd is even asked (it is checked again, the
    // same way, under the lock).
    let path = place.dir(root).join(format!("{}.toml", a.name));
    if let Err(errors) = crate::config::check_workload_text(root, &a.name, &path, &text) {
        say_error(&format!("berth add: {}", ChangeError::Invalid(errors)));
        return 1;
    }
    let done = with_systemd(root, |sd| async move {
        Ok(manage::add(&sd, root, &a.name, &text, place, a.now, a.stop).await)
    });
    report("add", done, "added")
}

pub(super) fn remove(root: &Root, name: &str, stop: bool) -> i32 {
    let done = with_systemd(root, |sd| async move {
        Ok(manage::remove(&sd, root, name, stop).await)
    });
    report("remove", done, "removed")
}

fn report(verb: &str, done: anyhow::Result<Result<Done, ChangeError>>, did: &str) -> i32 {
    match done {
        Err(e) => super::fail(verb, &e),
        Ok(Err(e)) => {
            say_error(&format!("berth {verb}: {e}"));
            1
        }
        Ok(Ok(done)) => {
            if let Some((unit, result)) = &done.overridden {
                say(&format!("stopped {unit} ({result}), the workload it overrides\n"));
            }
            say(&format!(
                "{did} {}; systemd reloaded{}\n",
                crate::config::shown_path(&done.path),
                if done.reloaded {
                    ""
                } else {
                    " (by a concurrent add or remove)"
                }
            ));
            match done.job {
                None | Some(JobResult::Done) => 0,
                Some(other) => {
                    say_error(&format!("berth {verb}: the job ended {other}"));
                    1
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_strings_read_back_exactly() {
        for s in [
            "plain",
            "a\"b",
            "c\\d",
            "tab\there",
            "nl\nx",
            "\u{7f}\u{85}",
            "ünï $HOME %h",
        ] {
            let text = format!("v = {}\n", toml_string(s));
            let table: toml::Table = text.parse().unwrap();
            assert_eq!(table["v"].as_str(), Some(s), "{text}");
        }
    }

    #[derive(clap::Parser)]
    struct Add {
        #[command(flatten)]
        args: AddArgs,
    }

    fn flags(argv: &[&str]) -> Result<String, String> {
        use clap::Parser;
        let add = Add::try_parse_from(std::iter::once("add").chain(argv.iter().copied()))
            .map_err(|e| e.to_string())?;
        file_from_flags(&add.args)
    }

    #[test]
    fn a_libvirt_guest_from_flags() {
        assert_eq!(
            flags(&[
                "vm",
                "--libvirt",
                "vm-1.prod",
                "--stop-delay",
                "90",
                "--shutdown-mode",
                "agent,acpi"
            ])
            .unwrap(),
            "libvirt = \"vm-1.prod\"\nstop_delay_s = 90\nshutdown_mode = [\"agent\", \"acpi\"]\n"
        );
        for refused in [
            &["vm", "--libvirt", "d", "--", "/bin/true"][..],
            &["vm", "--libvirt", "d", "--unit", "x.service"],
            &["vm", "--libvirt", "d", "--run-as", "nobody"],
            &["vm", "--shutdown-mode", "acpi", "--", "/bin/true"],
        ] {
            assert!(flags(refused).is_err(), "{refused:?}");
        }
    }
}
