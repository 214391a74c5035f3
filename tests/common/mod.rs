//! Shared helpers for integration tests.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

pub fn berth_bin() -> &'static str {
    env!("CARGO_BIN_EXE_berth")
}

pub fn generator_bin() -> &'static str {
    env!("CARGO_BIN_EXE_berth-generator")
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// True under CI: a test whose requirement is missing must fail, not skip.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Returns false (after saying so loudly) when a requirement is missing
/// outside CI; panics under CI=true, so CI never counts a skip as a pass.
pub fn require(ok: bool, what: &str) -> bool {
    if ok {
        return true;
    }
    if in_ci() {
        panic!("required for this test and missing under CI=true: {what}");
    }
    eprintln!("SKIPPED (not CI): missing {what}");
    false
}

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

pub fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Units built by `make units PREFIX=/usr` (the Makefile substitutes BINDIR).
/// Built once per test binary: tests run in parallel threads. The harness
/// runs test binaries of both suites at once, and `make units` replaces
/// the directory: a lock on it is held until this process exits.
pub fn built_units() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    static HELD: std::sync::OnceLock<fs::File> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            fs::create_dir_all(repo().join("target")).expect("create target/");
            let lock = fs::File::create(repo().join("target/test-units.lock"))
                .expect("create target/test-units.lock");
            lock.lock().expect("lock target/test-units.lock");
            let _ = HELD.set(lock);
            let mut make = Command::new("make");
            make.args(["-s", "units", "PREFIX=/usr", "BUILD_DIR=target/test-units"])
                .current_dir(repo());
            // `make units` runs the release build. What `cargo test` sets
            // for this test binary (CARGO_MANIFEST_DIR, CARGO_PKG_*, ...)
            // is not the build's environment: ring's build script tracks
            // CARGO_MANIFEST_DIR, so with it the release build is
            // compiled again, here and at the next plain `make`.
            for (key, _) in std::env::vars_os() {
                if is_cargo_test_var(&key.to_string_lossy()) {
                    make.env_remove(&key);
                }
            }
            let status = make.status().expect("run make units");
            assert!(status.success(), "make units failed");
            repo().join("target/test-units/units/system")
        })
        .clone()
}

/// The variables cargo sets for a test binary, as opposed to those that
/// configure cargo itself (CARGO_HOME, CARGO_TARGET_DIR, CARGO_BUILD_*).
pub fn is_cargo_test_var(key: &str) -> bool {
    const PREFIXES: [&str; 4] = ["CARGO_MANIFEST_", "CARGO_PKG_", "CARGO_CRATE_", "CARGO_BIN_"];
    const NAMES: [&str; 3] = [
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
    ];
    PREFIXES.iter().any(|p| key.starts_with(p)) || NAMES.contains(&key)
}

/// Every file and symlink under `dir`, relative, sorted.
pub fn tree(dir: &Path) -> Vec<(String, Entry)> {
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Entry {
    File(String),
    Link(String),
}

fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, Entry)>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let path = e.path();
        let rel = path.strip_prefix(base).unwrap().to_string_lossy().into_owned();
        let ft = e.file_type().unwrap();
        if ft.is_symlink() {
            out.push((
                rel,
                Entry::Link(fs::read_link(&path).unwrap().to_string_lossy().into_owned()),
            ));
        } else if ft.is_dir() {
            walk(base, &path, out);
        } else {
            out.push((rel, Entry::File(fs::read_to_string(&path).unwrap())));
        }
    }
}

/// The golden cases under tests/generator, sorted.
pub fn golden_cases() -> Vec<PathBuf> {
    let mut cases: Vec<PathBuf> = fs::read_dir(repo().join("tests/generator"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("root").is_dir())
        .collect();
    cases.sort();
    assert!(!cases.is_empty(), "no golden cases found");
    cases
}
