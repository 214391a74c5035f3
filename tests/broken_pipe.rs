//! No verb panics on a closed stdout or stderr (issue 10, defect 7):
//! `berth check | head -1` and a drain whose stderr is gone exited 101.
//! Not by restoring SIGPIPE's default either: they exit with their own
//! status, not by a signal.

mod common;

use std::fs;
use std::process::{Command, Stdio};

use common::berth_bin;

/// Runs `cmd` with the read end of its stdout (or stderr) closed at once.
fn with_closed(mut cmd: Command, stderr: bool) -> std::process::ExitStatus {
    if stderr {
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    } else {
        cmd.stdout(Stdio::piped()).stderr(Stdio::null());
    }
    let mut child = cmd.spawn().unwrap();
    drop(child.stdout.take());
    drop(child.stderr.take());
    child.wait().unwrap()
}

fn many_workloads(n: usize) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("etc/berth/workloads");
    fs::create_dir_all(&dir).unwrap();
    for i in 0..n {
        fs::write(
            dir.join(format!("w{i:04}.toml")),
            "exec = [\"/usr/bin/sleep\", \"infinity\"]\n",
        )
        .unwrap();
    }
    root
}

#[test]
fn check_into_a_closed_pipe_exits_with_its_status() {
    let root = many_workloads(3000);
    let mut cmd = Command::new(berth_bin());
    cmd.env("BERTH_ROOT", root.path()).arg("check");
    let status = with_closed(cmd, false);
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn a_drain_without_stderr_exits_0() {
    let root = many_workloads(3);
    let mut cmd = Command::new(berth_bin());
    cmd.env("BERTH_ROOT", root.path())
        // No bus: the drain reports that it could not reach systemd.
        .env("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent/bus")
        .arg("drain");
    let status = with_closed(cmd, true);
    assert_eq!(status.code(), Some(0), "{status:?}");
}
