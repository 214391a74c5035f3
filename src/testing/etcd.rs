//! A single-member etcd on loopback, in a fresh data directory, for the
//! tests that need a real one: the library's own (the agent's phases) and
//! `tests/etcd_presence.rs`, which includes this file. Only std and
//! tempfile here, so that both can.
//!
//! Needs the `etcd` binary (`make deps` installs etcd-server). Without it
//! a test says so and passes, except under CI=true, where it fails.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};

pub struct Etcd {
    child: Child,
    pub url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A fresh etcd (it may still be starting); None when there is no etcd
/// here (a failure under CI=true).
pub fn etcd() -> Option<Etcd> {
    if Command::new("etcd").arg("--version").output().is_err() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "etcd is not installed: CI needs it (make deps installs etcd-server)"
        );
        eprintln!("SKIPPED: no etcd binary (install etcd-server, or run make deps)");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = (free_port(), free_port());
    let url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new("etcd")
        .args(["--name", "t", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
        .args([
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
        ])
        .args(["--initial-cluster", &format!("t={peer_url}")])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("etcd.log")).unwrap())
        .spawn()
        .unwrap();
    Some(Etcd {
        child,
        url,
        _dir: dir,
    })
}
