//! `berth-generator`: systemd.generator(7) that turns berth's config into
//! drop-ins and wants-links on top of the packaged units.
//!
//! A pure function of (root, environment, config): everything it writes
//! comes from [`render::render_all`]. It writes only into the first
//! (normal-priority) directory, never wants a workload instance (systemd
//! would start it at boot, ignoring freezes and start order), and never
//! stops at a bad file: that file is reported and left out, everything else
//! is written, and the exit status is 1 at the end.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use crate::config;
use crate::log::Logger;
use crate::paths::{Manager, Root};
use crate::render::{self, Content, OutputFile};

pub const EXIT_OK: i32 = 0;
pub const EXIT_FAILURE: i32 = 1;
pub const EXIT_USAGE: i32 = 2;

/// What host config errors mean, for the generator's log and `berth check`.
pub const HOST_ERRORS_NOTE: &str = "host config has errors: each host setting named above (all settings of \
     a host file that could not be read) uses its built-in default, for the drain, the daemon and the \
     workloads' stop defaults alike; every other host setting applies";

const USAGE: &str =
    "usage: berth-generator NORMAL-DIR [EARLY-DIR LATE-DIR]\n       berth-generator --dry-run";

#[derive(Debug, PartialEq, Eq)]
pub enum Mode {
    Write(PathBuf),
    DryRun,
}

/// A command line the generator does not take; the text includes the usage.
#[derive(Debug, PartialEq, Eq)]
pub struct UsageError(String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

pub fn parse_args(args: &[String]) -> Result<Mode, UsageError> {
    let dry_run = args.iter().any(|a| a == "--dry-run");
    if let Some(bad) = args.iter().find(|a| a.starts_with('-') && *a != "--dry-run") {
        return Err(UsageError(format!("unknown option {bad}\n{USAGE}")));
    }
    let dirs: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    match (dry_run, dirs.as_slice()) {
        (true, []) => Ok(Mode::DryRun),
        (false, [normal]) | (false, [normal, _, _]) => Ok(Mode::Write(PathBuf::from(normal))),
        _ => Err(UsageError(USAGE.to_string())),
    }
}

/// A file or directory the generator could not write.
#[derive(Debug)]
pub struct WriteError {
    pub what: &'static str,
    pub path: PathBuf,
    pub error: io::Error,
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot {} {}: {}", self.what, self.path.display(), self.error)
    }
}

impl std::error::Error for WriteError {}

/// Runs the generator; returns the exit status.
pub fn run(args: &[String]) -> i32 {
    let mode = match parse_args(args) {
        Ok(m) => m,
        Err(msg) => {
            Logger::new("berth-generator", false).error(&msg.to_string());
            return EXIT_USAGE;
        }
    };
    let argv0 = std::env::args().next().unwrap_or_default();
    let manager = manager_of(std::env::var("SYSTEMD_SCOPE").ok().as_deref(), &argv0);
    let root = match Root::for_manager(manager) {
        Ok(root) => root,
        Err(reason) => {
            Logger::new("berth-generator", false).error(&format!("user generator: {reason}"));
            return EXIT_FAILURE;
        }
    };
    // Test runs (a re-rooted tree, --dry-run) keep the host's kernel log clean.
    // A user manager cannot write the kernel log: its generator logs to stderr,
    // which the manager puts in the journal.
    let real_boot =
        mode != Mode::DryRun && root.dir() == std::path::Path::new("/") && manager == Manager::System;
    let mut log = Logger::new("berth-generator", real_boot);

    let loaded = config::load(&root);
    for e in &loaded.errors {
        log.error(&e.to_string());
    }
    if loaded.host_has_errors {
        log.warning(HOST_ERRORS_NOTE);
    }
    let files = render::render_all(&root, &loaded);

    let written = match &mode {
        Mode::DryRun => {
            let mut out = io::stdout().lock();
            out.write_all(dry_run_text(&files).as_bytes())
                .and_then(|()| out.flush())
                .map_err(|error| WriteError {
                    what: "write to",
                    path: PathBuf::from("stdout"),
                    error,
                })
        }
        Mode::Write(dir) => write_files(dir, &files),
    };
    if let Err(e) = written {
        log.error(&e.to_string());
        return EXIT_FAILURE;
    }
    if loaded.is_clean() { EXIT_OK } else { EXIT_FAILURE }
}

/// Which manager runs the generator: `$SYSTEMD_SCOPE` (systemd ≥ 251 sets
/// it), else the directory it was run from (the user-generators link).
pub fn manager_of(scope: Option<&str>, argv0: &str) -> Manager {
    match scope {
        Some("user") => Manager::User,
        Some("system") => Manager::System,
        _ if argv0.contains("/user-generators/") => Manager::User,
        _ => Manager::System,
    }
}

/// Writes `files` under `dir`. Generator output directories start empty
/// on every run; an existing file is an error, not something to overwrite.
pub fn write_files(dir: &Path, files: &[OutputFile]) -> Result<(), WriteError> {
    for f in files {
        let path = dir.join(&f.path);
        if let Some((parent, _)) = f.path.rsplit_once('/') {
            let parent = dir.join(parent);
            match fs::create_dir(&parent) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(error) => {
                    return Err(WriteError {
                        what: "create",
                        path: parent,
                        error,
                    });
                }
            }
        }
        let result = match &f.content {
            Content::Text(text) => fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .and_then(|mut file| file.write_all(text.as_bytes())),
            Content::Symlink(target) => symlink(target, &path),
        };
        result.map_err(|error| WriteError {
            what: "write",
            path: path.clone(),
            error,
        })?;
    }
    Ok(())
}

/// `--dry-run` output: each file under a `# path` header.
pub fn dry_run_text(files: &[OutputFile]) -> String {
    let mut out = String::new();
    for f in files {
        match &f.content {
            Content::Text(text) => {
                out.push_str(&format!("# {}\n", f.path));
                out.push_str(text);
                out.push('\n');
            }
            Content::Symlink(target) => out.push_str(&format!("# {} -> {target}\n\n", f.path)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_manager_comes_from_the_scope_then_the_path() {
        assert_eq!(
            manager_of(Some("user"), "/usr/lib/systemd/system-generators/x"),
            Manager::User
        );
        assert_eq!(
            manager_of(Some("system"), "/usr/lib/systemd/user-generators/x"),
            Manager::System
        );
        assert_eq!(
            manager_of(None, "/usr/lib/systemd/user-generators/berth-generator"),
            Manager::User
        );
        assert_eq!(
            manager_of(None, "/lib/systemd/system-generators/berth-generator"),
            Manager::System
        );
    }

    #[test]
    fn arguments() {
        assert_eq!(parse_args(&args(&["/a"])), Ok(Mode::Write("/a".into())));
        assert_eq!(
            parse_args(&args(&["/a", "/b", "/c"])),
            Ok(Mode::Write("/a".into()))
        );
        assert_eq!(parse_args(&args(&["--dry-run"])), Ok(Mode::DryRun));
        assert!(parse_args(&args(&[])).is_err());
        assert!(parse_args(&args(&["/a", "/b"])).is_err());
        assert!(parse_args(&args(&["--dry-run", "/a"])).is_err());
        assert!(parse_args(&args(&["-x", "/a"])).is_err());
    }
}
