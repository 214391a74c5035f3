//! Bytes from file and directory names never reach unit text or a log
//! line unescaped (issue 10, defect 1). The names are made at run time:
//! a newline in a file name does not belong in the repository.

mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use common::{berth_bin, generator_bin};

/// A host fragment whose name, written raw into the drain drop-in's
/// header comment, would add `[Service]`, an empty `ExecStop=` (no drain
/// at all) and a 1 s stop timeout.
const FORGED: &str = "a\n[Service]\nExecStop=\nTimeoutStopSec=1\n#.toml";

fn generate(root: &Path, out: &Path, env: &[(&str, &str)]) -> Output {
    for d in ["normal", "early", "late"] {
        fs::create_dir_all(out.join(d)).unwrap();
    }
    let mut cmd = Command::new(generator_bin());
    cmd.env("BERTH_ROOT", root);
    for var in ["SYSTEMD_SCOPE", "XDG_CONFIG_HOME", "XDG_RUNTIME_DIR"] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied())
        .args(["normal", "early", "late"].map(|d| out.join(d)))
        .output()
        .unwrap()
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// No line of `text` is one of the forged lines (`[Service]` is a real
/// line of the drain drop-in, so only what follows it is checked).
fn assert_unforged(what: &str, text: &str) {
    for line in text.lines() {
        assert!(
            !matches!(line, "ExecStop=" | "TimeoutStopSec=1"),
            "{what} has a forged line {line:?}:\n{text}"
        );
    }
}

#[test]
fn a_newline_in_a_host_fragment_name_forges_nothing() {
    let root = tempfile::tempdir().unwrap();
    let etc = root.path().join("etc/berth");
    fs::create_dir_all(etc.join("berth.toml.d")).unwrap();
    fs::create_dir_all(etc.join("workloads")).unwrap();
    fs::write(etc.join("berth.toml.d").join(FORGED), "drain_parallelism = 2\n").unwrap();
    fs::write(etc.join("berth.toml.d/20-ok.toml"), "drain_deadline_s = 300\n").unwrap();
    fs::write(
        etc.join("workloads/web.toml"),
        "exec = [\"/usr/bin/sleep\", \"infinity\"]\n",
    )
    .unwrap();
    let out = tempfile::tempdir().unwrap();

    let o = generate(root.path(), out.path(), &[]);
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "a skipped file fails the run: {stderr}");
    assert_unforged("stderr", &stderr);
    assert!(
        stderr.contains(r#"a\n[Service]\nExecStop="#),
        "the file is named, escaped: {stderr}"
    );

    let normal = out.path().join("normal");
    let drain = read(&normal.join("berth-drain.service.d/10-berth.conf"));
    assert_unforged("the drain drop-in", &drain);
    assert!(drain.contains("/etc/berth/berth.toml.d/20-ok.toml"), "{drain}");
    // The deadline of the fragment that was read, plus the drain's margin.
    assert!(
        drain.contains("TimeoutStopSec=330"),
        "the other fragment still applies: {drain}"
    );
    assert!(
        !drain.contains("a\\n"),
        "the skipped file is not a source: {drain}"
    );
    assert!(
        normal.join("berth@web.service.d/10-berth.conf").exists(),
        "everything else is written"
    );

    let o = Command::new(berth_bin())
        .env("BERTH_ROOT", root.path())
        .args(["check"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(1), "berth check fails: {text}");
    assert_unforged("berth check", &text);
    assert!(text.contains("control character"), "{text}");
}

#[test]
fn a_newline_in_the_user_config_home_forges_nothing() {
    let root = tempfile::tempdir().unwrap();
    let home = "/home/u";
    let config_home = "/home/u/conf\n[Service]\nExecStop=\n";
    let dir = root.path().join(&config_home[1..]).join("berth/workloads");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("w.toml"), "exec = [\"/usr/bin/sleep\", \"infinity\"]\n").unwrap();
    fs::create_dir_all(root.path().join("run/user/1000")).unwrap();
    let out = tempfile::tempdir().unwrap();

    let o = generate(
        root.path(),
        out.path(),
        &[
            ("SYSTEMD_SCOPE", "user"),
            ("HOME", home),
            ("XDG_RUNTIME_DIR", "/run/user/1000"),
            ("XDG_CONFIG_HOME", config_home),
        ],
    );
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert_unforged("stderr", &stderr);
    assert!(stderr.contains("its files are ignored"), "{stderr}");
    for entry in walk(&out.path().join("normal")) {
        assert_unforged(&entry.display().to_string(), &read(&entry));
    }
    assert!(
        !out.path().join("normal/berth@w.service.d").exists(),
        "nothing is read from a refused directory"
    );
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() && !path.is_symlink() {
            files.extend(walk(&path));
        } else if path.is_file() {
            files.push(path);
        }
    }
    files
}
