//! Golden trees: for each tests/generator/NN-case, run the real generator
//! binary on `root/` and compare its output with `expected/` (file list
//! first, then content), its exit status with `exit-status` and its stderr
//! with `stderr` (the root path written as $ROOT).
//!
//! A case may hold an `env` file of KEY=VALUE lines for the generator's
//! environment (e.g. SYSTEMD_SCOPE=user, HOME, XDG_RUNTIME_DIR for a user
//! manager's generator; those paths are taken under `root/`).
//!
//! A build without the `cluster` feature refuses `[cluster]`: a case
//! whose berth.toml has one is compared with `expected-without-cluster/`,
//! `exit-status-without-cluster` and `stderr-without-cluster` instead.
//!
//! BERTH_UPDATE_GOLDEN=1 rewrites the expectations (of the build's own
//! variant); review the diff.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::{Entry, generator_bin, golden_cases, tree};

/// The generator, with the case's environment and nothing of the caller's
/// that would change its behaviour.
fn generator(case: &Path) -> Command {
    let mut cmd = Command::new(generator_bin());
    cmd.env("BERTH_ROOT", case.join("root"));
    for var in ["SYSTEMD_SCOPE", "XDG_CONFIG_HOME", "XDG_RUNTIME_DIR"] {
        cmd.env_remove(var);
    }
    if let Ok(text) = fs::read_to_string(case.join("env")) {
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let (k, v) = line.split_once('=').expect("env lines are KEY=VALUE");
            cmd.env(k, v);
        }
    }
    cmd
}

/// The suffix of the expectations this build compares with.
fn variant(case: &Path) -> &'static str {
    let has_cluster = fs::read_to_string(case.join("root/etc/berth/berth.toml"))
        .is_ok_and(|t| t.lines().any(|l| l.trim() == "[cluster]"));
    if has_cluster && !cfg!(feature = "cluster") {
        "-without-cluster"
    } else {
        ""
    }
}

fn run_case(case: &Path) -> Result<(), String> {
    let root = case.join("root");
    let variant = variant(case);
    let out = tempfile::tempdir().unwrap();
    let normal = out.path().join("normal");
    let (early, late) = (out.path().join("early"), out.path().join("late"));
    for d in [&normal, &early, &late] {
        fs::create_dir(d).unwrap();
    }
    let result = generator(case).args([&normal, &early, &late]).output().unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr).replace(&*root.to_string_lossy(), "$ROOT");
    let status = result.status.code().unwrap_or(-1).to_string();

    assert!(
        tree(&early).is_empty() && tree(&late).is_empty(),
        "{}: wrote outside the normal directory",
        case.display()
    );

    let expected_dir = case.join(format!("expected{variant}"));
    if std::env::var_os("BERTH_UPDATE_GOLDEN").is_some() {
        let _ = fs::remove_dir_all(&expected_dir);
        fs::create_dir_all(&expected_dir).unwrap();
        copy_tree(&normal, &expected_dir);
        fs::write(case.join(format!("exit-status{variant}")), format!("{status}\n")).unwrap();
        fs::write(case.join(format!("stderr{variant}")), &stderr).unwrap();
        return Ok(());
    }

    let got = tree(&normal);
    let want = tree(&expected_dir);
    let names = |t: &[(String, Entry)]| t.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    if names(&got) != names(&want) {
        return Err(format!(
            "file list differs:\n  got:  {:?}\n  want: {:?}",
            names(&got),
            names(&want)
        ));
    }
    for ((name, g), (_, w)) in got.iter().zip(&want) {
        if g != w {
            return Err(format!("{name} differs:\n--- got\n{g:?}\n--- want\n{w:?}"));
        }
    }
    let want_status = fs::read_to_string(case.join(format!("exit-status{variant}"))).unwrap();
    if status != want_status.trim() {
        return Err(format!(
            "exit status {status}, want {}; stderr:\n{stderr}",
            want_status.trim()
        ));
    }
    let want_stderr = fs::read_to_string(case.join(format!("stderr{variant}"))).unwrap();
    if stderr != want_stderr {
        return Err(format!(
            "stderr differs:\n--- got\n{stderr}--- want\n{want_stderr}"
        ));
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) {
    for (rel, entry) in tree(from) {
        let dest = to.join(&rel);
        fs::create_dir_all(dest.parent().unwrap()).unwrap();
        match entry {
            Entry::File(text) => fs::write(&dest, text).unwrap(),
            Entry::Link(target) => std::os::unix::fs::symlink(target, &dest).unwrap(),
        }
    }
}

#[test]
fn golden_trees() {
    let mut failures = Vec::new();
    let cases = golden_cases();
    for case in &cases {
        if let Err(e) = run_case(case) {
            failures.push(format!("{}: {e}", case.file_name().unwrap().to_string_lossy()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

/// --dry-run prints exactly what a real run writes.
#[test]
fn dry_run_matches_written_output() {
    // In update mode the other test is rewriting expected/ concurrently.
    if std::env::var_os("BERTH_UPDATE_GOLDEN").is_some() {
        return;
    }
    for case in golden_cases() {
        let out = generator(&case).arg("--dry-run").output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        for (name, entry) in tree(&case.join(format!("expected{}", variant(&case)))) {
            match entry {
                Entry::File(content) => assert!(
                    text.contains(&format!("# {name}\n{content}")),
                    "{}: --dry-run lacks {name}",
                    case.display()
                ),
                Entry::Link(target) => assert!(text.contains(&format!("# {name} -> {target}\n"))),
            }
        }
    }
}
