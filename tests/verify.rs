//! Every generated unit set passes `systemd-analyze verify`, with the
//! packaged units, for every golden case (broken configs included: whatever
//! the generator writes must load).
//!
//! verify ignores ROOT/run/systemd/generator* under --root, so the
//! generator's output is staged into ROOT/run/systemd/system, next to the
//! packaged units in ROOT/usr/lib/systemd/system, systemd's own units, and
//! a stub for every program a unit names (verify rejects a command that is
//! not executable in ROOT). verify exits 0 on warnings such as an unknown
//! key, so any output at all fails the test.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::{Entry, built_units, golden_cases, have, require, tree};

fn stub(root: &Path, program: &str) {
    let path = if program.starts_with('/') {
        root.join(program.trim_start_matches('/'))
    } else {
        root.join("usr/bin").join(program)
    };
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, "#!/bin/sh\n").unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
}

fn first_word(line: &str) -> Option<String> {
    let rest = line
        .strip_prefix("ExecStart=\"")
        .or_else(|| line.strip_prefix("ExecStop=\""))
        .or_else(|| line.strip_prefix("ExecStartPost=\""))
        .or_else(|| line.strip_prefix("ExecStartPre=+\""))?;
    Some(rest[..rest.find('"')?].to_string())
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    let status = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", from.display()))
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
}

/// Both of a case's expected trees, with and without cluster mode.
fn verify_case(case: &Path, units: &Path) -> Result<(), String> {
    verify_tree(&case.join("expected"), units)?;
    let without = case.join("expected-without-cluster");
    if without.is_dir() {
        verify_tree(&without, units)?;
    }
    Ok(())
}

/// Stages `generated` (a generator output tree) with the packaged units and
/// verifies every unit in it.
fn verify_tree(generated: &Path, units: &Path) -> Result<(), String> {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let unit_dir = root.join("usr/lib/systemd/system");
    copy_dir(Path::new("/lib/systemd/system"), &unit_dir);
    copy_dir(units, &unit_dir);
    let run_dir = root.join("run/systemd/system");
    copy_dir(generated, &run_dir);

    // Every program the packaged units run (berth, /bin/true, the
    // daemon's mkdir), as their unquoted Exec lines name it.
    for entry in fs::read_dir(units).unwrap().flatten() {
        let text = fs::read_to_string(entry.path()).unwrap_or_default();
        for line in text.lines().filter(|l| l.starts_with("Exec")) {
            let Some((_, value)) = line.split_once('=') else {
                continue;
            };
            let program = value.trim_start_matches(['+', '-', '@', '!', ':']);
            if let Some(word) = program.split_whitespace().next().filter(|w| w.starts_with('/')) {
                stub(root, word);
            }
        }
    }
    let mut names = vec![
        "berth.target".to_string(),
        "berth.slice".into(),
        "berth-drain.service".into(),
        "berth-autostart.service".into(),
        "berth-daemon.service".into(),
        "berth-fence-watch.service".into(),
        // The template alone, without any drop-in, must load too.
        "berth@undefined-workload.service".into(),
    ];
    for (path, entry) in tree(&run_dir) {
        let Entry::File(text) = entry else { continue };
        for program in text.lines().filter_map(first_word) {
            stub(root, &program);
        }
        if let Some(unit) = path.strip_suffix(".d/10-berth.conf")
            && unit.ends_with(".service")
            && !unit.starts_with("berth-")
        {
            if !unit.starts_with("berth@") {
                // An existing unit (`unit =`): a plain service of that
                // name (its template, for an instance) for the drop-in.
                let file = match unit.split_once('@') {
                    Some((prefix, _)) => format!("{prefix}@.service"),
                    None => unit.to_string(),
                };
                let dir = root.join("etc/systemd/system");
                fs::create_dir_all(&dir).unwrap();
                fs::write(dir.join(file), "[Service]\nExecStart=/bin/true\n").unwrap();
            }
            names.push(unit.to_string());
        }
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no", "--recursive-errors=no"])
        .arg(format!("--root={}", root.display()))
        .args(&names)
        .current_dir(root)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() || !text.trim().is_empty() {
        return Err(format!(
            "verify {names:?} exited {:?}:\n{text}",
            out.status.code()
        ));
    }
    Ok(())
}

#[test]
fn generated_units_pass_systemd_analyze_verify() {
    if !require(
        have("systemd-analyze"),
        "systemd-analyze (Debian package systemd)",
    ) {
        return;
    }
    let units = built_units();
    let mut failures = Vec::new();
    let cases = golden_cases();
    for case in &cases {
        if let Err(e) = verify_case(case, &units) {
            failures.push(format!("{}: {e}", case.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Every pass-through value the validator accepts at its boundaries is
/// parsed by systemd without a warning (a warning means systemd ignored
/// it). One workload per sample, so that repeated keys are all seen.
#[test]
fn every_accepted_passthrough_sample_passes_verify() {
    if !require(
        have("systemd-analyze"),
        "systemd-analyze (Debian package systemd)",
    ) {
        return;
    }
    let units = built_units();
    let root = tempfile::tempdir().unwrap();
    let workloads = root.path().join("etc/berth/workloads");
    fs::create_dir_all(&workloads).unwrap();
    for (i, (key, value, _)) in berth::config::ACCEPTED_SAMPLES.iter().enumerate() {
        fs::write(
            workloads.join(format!("s{i}.toml")),
            format!("exec = [\"/usr/bin/app\"]\n[service]\n{key} = {value}\n"),
        )
        .unwrap();
    }
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(common::generator_bin())
        .arg(out.path())
        .env("BERTH_ROOT", root.path())
        .status()
        .unwrap();
    assert!(status.success(), "the generator refused a sample");
    let written = tree(out.path())
        .iter()
        .filter(|(p, _)| p.starts_with("berth@s"))
        .count();
    assert_eq!(written, berth::config::ACCEPTED_SAMPLES.len());
    verify_tree(out.path(), &units).unwrap();
}

/// The check above must be able to fail: a unit with an unknown key and a
/// missing program is caught.
#[test]
fn verify_check_catches_a_bad_unit() {
    if !require(
        have("systemd-analyze"),
        "systemd-analyze (Debian package systemd)",
    ) {
        return;
    }
    let units = built_units();
    // An unknown key, and a value systemd parses with a warning and drops.
    for (line, needle) in [("Frobnicate=yes", "Frobnicate"), ("MemoryMax=101%", "101%")] {
        let tree = tempfile::tempdir().unwrap();
        let dropin = tree.path().join("berth@bad.service.d");
        fs::create_dir_all(&dropin).unwrap();
        fs::write(dropin.join("10-berth.conf"), format!("[Service]\n{line}\n")).unwrap();
        let err = verify_tree(tree.path(), &units).unwrap_err();
        assert!(err.contains(needle), "{err}");
    }
}

/// Issue 10, defect 5: berth accepted values that systemd parses with
/// "out of range, ignoring" (MemoryMax=0, a u64::MAX limit, 10^8 weeks) —
/// a limit silently not applied. Every numeric setting gets the same
/// edge values; whatever berth accepts must reach systemd without a word.
/// Here against the host's systemd-analyze; scenario 17 loads the same
/// files (BERTH_KEEP_EDGES=DIR keeps them) in systemd 252 and 257 as PID 1.
#[test]
fn numeric_edges_berth_accepts_are_applied_by_systemd() {
    use berth::config::PassthroughKind::*;
    if !require(
        have("systemd-analyze"),
        "systemd-analyze (Debian package systemd)",
    ) {
        return;
    }
    const EDGES: &[&str] = &[
        "0",
        "\"0\"",
        "\"0%\"",
        "\"0K\"",
        "\"0000\"",
        "1",
        "\"1\"",
        "\"1%\"",
        "\"100%\"",
        "\"101%\"",
        "\"100000%\"",
        "\"infinity\"",
        "-1",
        "10000",
        "10001",
        "9223372036854775807",
        "\"18446744073709551614\"",
        "\"18446744073709551615\"",
        "\"15E\"",
        "\"16E\"",
        // Fractions and sums of parts, as parse_size reads them.
        "\"1.5G\"",
        "\"1.5X\"",
        "\"0.4\"",
        "\"1G 512M 3\"",
        "\"14.5E\"",
        "\"15.9E\"",
        "\"0.9999999999999999999K\"",
        "\" 1G \"",
        "\"0.01%\"",
        "\"50.55%\"",
        "\"50.555%\"",
        "\"17179869183G\"",
        "\"0s\"",
        "\"1us\"",
        "\"30500000w\"",
        "\"30500569w\"",
        "\"99999999w\"",
        "\"999999999d\"",
        "\"999999999h 999999999h 999999999h 999999999h 999999999h 999999999h\"",
        "\"8191\"",
        "\"0-8191\"",
        "\"8192\"",
        "-1000",
        "1000",
        "-20",
        "19",
    ];
    let units = built_units();
    let root = tempfile::tempdir().unwrap();
    let workloads = root.path().join("etc/berth/workloads");
    fs::create_dir_all(&workloads).unwrap();
    let mut tried = 0;
    for (key, kind) in berth::config::TYPED_SETTINGS {
        if !matches!(
            kind,
            Bytes { .. } | Tasks | RlimitCount | RlimitSize | Weight | CpuQuota | Duration | Int(..) | CpuSet
        ) {
            continue;
        }
        for (i, value) in EDGES.iter().enumerate() {
            fs::write(
                workloads.join(format!("{}-{i}.toml", key.to_lowercase())),
                format!("exec = [\"/usr/bin/app\"]\nautostart = false\n[service]\n{key} = {value}\n"),
            )
            .unwrap();
            tried += 1;
        }
    }
    // Scenario 17 boots both systemd versions on the same files.
    if let Some(keep) = std::env::var_os("BERTH_KEEP_EDGES") {
        copy_dir(&workloads, Path::new(&keep));
    }
    let out = tempfile::tempdir().unwrap();
    // Exit 1: most edges are refused, and those files are skipped.
    Command::new(common::generator_bin())
        .arg(out.path())
        .env("BERTH_ROOT", root.path())
        .output()
        .unwrap();
    let accepted = tree(out.path())
        .iter()
        .filter(|(p, _)| p.starts_with("berth@"))
        .count();
    assert!(accepted > 0 && accepted < tried, "{accepted} of {tried} accepted");
    verify_tree(out.path(), &units).unwrap();
}
