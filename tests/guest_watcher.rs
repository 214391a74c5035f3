//! `berth guest`, the watcher a libvirt workload's unit runs, against a
//! stand-in `virsh` (a script keeping the domain's state in a file and
//! logging every call). The state machine is what is tested here: start
//! or adopt, READY=1, the unit ending with the guest, ACPI then destroy at
//! the stop delay, destroy at once on SIGUSR2 or with --power-off, a
//! paused guest resumed first. The real libvirt and QEMU are the container
//! scenario's.

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::berth_bin;

/// A fake virsh: `--quiet -c URI VERB --domain D [...]`. The state is in
/// $VLAB/state; `shutdown` shuts the guest off unless $VLAB/ignore-acpi
/// exists; every call is appended to $VLAB/calls.
const FAKE_VIRSH: &str = r#"#!/bin/sh
shift 3
verb=$1
echo "$*" >>"$VLAB/calls"
state=$(cat "$VLAB/state")
case "$verb" in
    domstate) echo "$state" ;;
    start) echo running >"$VLAB/state" ;;
    shutdown) [ -e "$VLAB/ignore-acpi" ] || echo "shut off" >"$VLAB/state" ;;
    destroy)
        if [ "$state" = "shut off" ]; then echo "error: Requested operation is not valid: domain is not running" >&2; exit 1; fi
        echo "shut off" >"$VLAB/state" ;;
    resume) echo running >"$VLAB/state" ;;
    managedsave)
        if [ -e "$VLAB/save-fails" ]; then echo "error: Requested operation is not supported: domain has assigned non-USB host devices" >&2; exit 1; fi
        echo "shut off" >"$VLAB/state" ;;
    *) echo "error: unknown verb $verb" >&2; exit 1 ;;
esac
"#;

struct Lab {
    dir: tempfile::TempDir,
}

impl Lab {
    fn new(state: &str) -> Lab {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let virsh = bin.join("virsh");
        std::fs::write(&virsh, FAKE_VIRSH).unwrap();
        std::fs::set_permissions(&virsh, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        std::fs::write(dir.path().join("state"), format!("{state}\n")).unwrap();
        Lab { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn state(&self) -> String {
        std::fs::read_to_string(self.path("state"))
            .unwrap()
            .trim()
            .to_string()
    }

    fn set_state(&self, s: &str) {
        std::fs::write(self.path("state"), format!("{s}\n")).unwrap();
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .filter(|l| !l.starts_with("domstate"))
            .collect()
    }

    /// `berth guest vm ARGS`, with NOTIFY_SOCKET on a socket of ours,
    /// polling virsh (no events helper).
    fn spawn(&self, args: &[&str]) -> (Child, UnixDatagram) {
        spawn_with(self, args, &[("BERTH_LIBVIRT_HELPER", "")])
    }
}

/// `berth guest vm ARGS` with more environment.
fn spawn_with(lab: &Lab, args: &[&str], env: &[(&str, &str)]) -> (Child, UnixDatagram) {
    {
        let this = lab;
        let sock_path = this.path("notify");
        let sock = UnixDatagram::bind(&sock_path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let path = format!(
            "{}:{}",
            this.path("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let child = Command::new(berth_bin())
            .args(["guest", "vm"])
            .args(args)
            .env("PATH", path)
            .env("VLAB", this.dir.path())
            .env("BERTH_ROOT", this.dir.path())
            .env("NOTIFY_SOCKET", &sock_path)
            .envs(env.iter().copied())
            .spawn()
            .unwrap();
        (child, sock)
    }
}

fn ready(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).expect("a notification within 10 s");
    String::from_utf8_lossy(&buf[..n]).to_string()
}

fn exit_within(child: &mut Child, limit: Duration) -> i32 {
    let began = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        if began.elapsed() > limit {
            let _ = child.kill();
            panic!("berth guest still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
}

#[test]
fn a_guest_is_started_said_ready_and_its_end_ends_the_unit() {
    let lab = Lab::new("shut off");
    let (mut child, sock) = lab.spawn(&[]);
    assert!(ready(&sock).contains("READY=1"));
    assert_eq!(lab.state(), "running");
    assert_eq!(lab.calls(), ["start --domain vm"]);
    lab.set_state("shut off");
    assert_eq!(
        exit_within(&mut child, Duration::from_secs(5)),
        0,
        "the guest shut itself down"
    );
}

/// `restart = "on-failure"` restarts a guest whose QEMU died or that
/// crashed (libvirt's default on_crash destroys it: shut off, reason
/// crashed), not one that shut itself down or that someone destroyed.
#[test]
fn a_crashed_guest_ends_its_unit_with_a_failure() {
    for (end, status) in [
        ("shut off (crashed)", 1),
        ("crashed (panicked)", 1),
        ("shut off (shutdown)", 0),
        ("shut off (destroyed)", 0),
    ] {
        let lab = Lab::new("shut off");
        let (mut child, sock) = lab.spawn(&[]);
        assert!(ready(&sock).contains("READY=1"));
        lab.set_state(end);
        assert_eq!(exit_within(&mut child, Duration::from_secs(5)), status, "{end}");
    }
}

#[test]
fn a_running_guest_is_adopted_and_a_crash_fails_the_unit() {
    let lab = Lab::new("running");
    let (mut child, sock) = lab.spawn(&[]);
    assert!(ready(&sock).contains("READY=1"));
    assert!(lab.calls().is_empty(), "adopted, not started: {:?}", lab.calls());
    lab.set_state("crashed");
    assert_eq!(exit_within(&mut child, Duration::from_secs(5)), 1);
}

#[test]
fn a_stop_is_an_acpi_shutdown() {
    let lab = Lab::new("running");
    let (mut child, sock) = lab.spawn(&["--stop-delay", "30"]);
    ready(&sock);
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(exit_within(&mut child, Duration::from_secs(5)), 0);
    assert_eq!(lab.calls(), ["shutdown --domain vm --mode agent,acpi"]);

    // The mode the workload names goes to virsh as it is.
    let lab = Lab::new("running");
    let (mut child, sock) = lab.spawn(&["--stop-delay", "30", "--shutdown-mode", "acpi"]);
    ready(&sock);
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(exit_within(&mut child, Duration::from_secs(5)), 0);
    assert_eq!(lab.calls(), ["shutdown --domain vm --mode acpi"]);
}

/// A mode virsh does not know is a usage error (exit 2), not a panic.
#[test]
fn an_unknown_shutdown_mode_is_refused() {
    let lab = Lab::new("running");
    let out = Command::new(berth_bin())
        .args(["guest", "vm", "--shutdown-mode", "initctl"])
        .env("VLAB", lab.dir.path())
        .env("BERTH_ROOT", lab.dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a list of agent and acpi"),
        "{out:?}"
    );
    assert!(lab.calls().is_empty());
}

/// With the events helper, the guest's end reaches the unit as the
/// helper reports it, not at the next poll; a helper that exits (the
/// daemon restarting) is run again, and no end is taken from it.
#[test]
fn libvirts_events_end_the_unit_at_once() {
    let lab = Lab::new("running");
    let helper = lab.path("bin/berth-libvirt");
    std::fs::write(
        &helper,
        "#!/bin/sh\n[ \"$1\" != state ] || { echo 'state 1 1'; exit 0; }\necho run >>\"$VLAB/helper-runs\"\necho 'state 1 1'\n\
         [ -e \"$VLAB/second\" ] || { touch \"$VLAB/second\"; exit 0; }\n\
         while [ ! -e \"$VLAB/stop-now\" ]; do sleep 0.02; done\necho 'event 4 0'\necho 'event 5 0'\nsleep 60\n",
    )
    .unwrap();
    std::fs::set_permissions(&helper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (mut child, sock) = spawn_with(&lab, &[], &[("BERTH_LIBVIRT_HELPER", helper.to_str().unwrap())]);
    ready(&sock);
    // The first run exits at once; the watcher runs it again.
    let began = Instant::now();
    while std::fs::read_to_string(lab.path("helper-runs"))
        .unwrap_or_default()
        .lines()
        .count()
        < 2
    {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "the helper was not run again"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        child.try_wait().unwrap().is_none(),
        "a resume event or a helper's exit is no end"
    );
    // The domain still reads running for virsh: only the event says it
    // ended; and with the helper no state is read through virsh.
    std::fs::write(lab.path("stop-now"), "").unwrap();
    assert_eq!(exit_within(&mut child, Duration::from_secs(1)), 0);
    assert!(lab.calls().is_empty(), "{:?}", lab.calls());
    let virsh_reads = std::fs::read_to_string(lab.path("calls")).unwrap_or_default();
    assert!(!virsh_reads.contains("domstate"), "{virsh_reads}");
}

/// A hostile or missing helper named in the environment (a newline, a
/// `%`, a huge value) is no helper: the watcher polls virsh as without.
#[test]
fn a_helper_path_that_is_not_there_means_polling() {
    let huge = format!("/{}", "x".repeat(100_000));
    for value in ["/nonexistent\n[Service]", "/tmp/%h/berth-libvirt", huge.as_str()] {
        let lab = Lab::new("shut off");
        let (mut child, sock) = spawn_with(&lab, &[], &[("BERTH_LIBVIRT_HELPER", value)]);
        assert!(ready(&sock).contains("READY=1"), "{value:.40}");
        lab.set_state("shut off");
        assert_eq!(exit_within(&mut child, Duration::from_secs(5)), 0, "{value:.40}");
        assert_eq!(lab.calls(), ["start --domain vm"], "{value:.40}");
    }
}

/// A crash by event fails the unit.
#[test]
fn a_crash_event_fails_the_unit() {
    let lab = Lab::new("running");
    let helper = lab.path("bin/berth-libvirt");
    std::fs::write(
        &helper,
        "#!/bin/sh\n[ \"$1\" != state ] || { echo 'state 1 1'; exit 0; }\necho 'state 1 1'\necho 'event 5 2'\nsleep 60\n",
    )
    .unwrap();
    std::fs::set_permissions(&helper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (mut child, sock) = spawn_with(&lab, &[], &[("BERTH_LIBVIRT_HELPER", helper.to_str().unwrap())]);
    ready(&sock);
    assert_eq!(exit_within(&mut child, Duration::from_secs(5)), 1);
}

#[test]
fn a_guest_ignoring_acpi_is_destroyed_at_its_stop_delay_unless_force_off_is_off() {
    let lab = Lab::new("running");
    std::fs::write(lab.path("ignore-acpi"), "").unwrap();
    let (mut child, sock) = lab.spawn(&["--stop-delay", "1"]);
    ready(&sock);
    let began = Instant::now();
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(exit_within(&mut child, Duration::from_secs(10)), 0);
    assert!(
        began.elapsed() >= Duration::from_secs(1),
        "destroyed at the delay, not before"
    );
    assert_eq!(
        lab.calls(),
        ["shutdown --domain vm --mode agent,acpi", "destroy --domain vm"]
    );

    // Without force-off it keeps waiting; the drain's SIGUSR2 destroys it.
    let lab = Lab::new("running");
    std::fs::write(lab.path("ignore-acpi"), "").unwrap();
    let (mut child, sock) = lab.spawn(&["--stop-delay", "1", "--no-force-off"]);
    ready(&sock);
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(child.try_wait().unwrap(), None, "still waiting past its delay");
    assert_eq!(lab.state(), "running");
    signal(&child, nix::sys::signal::Signal::SIGUSR2);
    assert_eq!(exit_within(&mut child, Duration::from_secs(5)), 0);
    assert_eq!(
        lab.calls().last().map(String::as_str),
        Some("destroy --domain vm")
    );
}

#[test]
fn power_off_destroys_at_once_and_a_paused_guest_is_resumed_before_acpi() {
    let lab = Lab::new("running");
    let (mut child, sock) = lab.spawn(&["--power-off"]);
    ready(&sock);
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(exit_within(&mut child, Duration::from_secs(5)), 0);
    assert_eq!(lab.calls(), ["destroy --domain vm"]);

    let lab = Lab::new("paused");
    let (mut child, sock) = lab.spawn(&[]);
    ready(&sock);
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(exit_within(&mut child, Duration::from_secs(5)), 0);
    assert_eq!(
        lab.calls(),
        ["resume --domain vm", "shutdown --domain vm --mode agent,acpi"]
    );
}

#[test]
fn a_domain_that_cannot_be_read_fails_the_start() {
    let lab = Lab::new("running");
    std::fs::remove_file(lab.path("bin/virsh")).unwrap();
    let (mut child, _sock) = lab.spawn(&[]);
    assert_eq!(exit_within(&mut child, Duration::from_secs(5)), 1);
}

#[test]
fn save_is_a_managed_save_and_a_failed_one_falls_back_to_acpi() {
    let lab = Lab::new("running");
    let (mut child, sock) = lab.spawn(&["--save"]);
    ready(&sock);
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(exit_within(&mut child, Duration::from_secs(5)), 3, "EXIT_SAVED");
    assert_eq!(lab.calls(), ["managedsave --domain vm"]);
    let left = |lab: &Lab| std::fs::read_to_string(lab.path("run/berthd/guests/vm")).unwrap_or_default();
    assert_eq!(left(&lab), "saved\n", "for the drain's outcome");

    // A guest that cannot be saved (host devices) is shut down at once.
    let lab = Lab::new("running");
    std::fs::write(lab.path("save-fails"), "").unwrap();
    let (mut child, sock) = lab.spawn(&["--save", "--stop-delay", "30"]);
    ready(&sock);
    let began = Instant::now();
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(
        exit_within(&mut child, Duration::from_secs(5)),
        4,
        "EXIT_SAVE_FAILED"
    );
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "at once, not after the delay"
    );
    assert_eq!(
        lab.calls(),
        [
            "managedsave --domain vm",
            "shutdown --domain vm --mode agent,acpi"
        ]
    );
    assert_eq!(left(&lab), "save-failed\n");
}

/// A stand-in berth-libvirt taking the actions, with libvirt's numbers:
/// the state ("STATE REASON") is in $VLAB/hstate; `destroy` of a guest
/// that is not running exits 3 (VIR_ERR_OPERATION_INVALID), and so does
/// one whose guest went down in between ($VLAB/down-before-destroy);
/// $VLAB/destroy-fails makes it fail otherwise. Every action is appended
/// to $VLAB/helper-calls.
const FAKE_HELPER: &str = r#"#!/bin/sh
verb=$1
state=$(cat "$VLAB/hstate")
case "$verb" in
    state) echo "state $state"; exit 0 ;;
    follow) echo "state $state"; exec sleep 60 ;;
esac
echo "$*" >>"$VLAB/helper-calls"
case "$verb" in
    start) echo "1 1" >"$VLAB/hstate" ;;
    shutdown) [ -e "$VLAB/ignore-acpi" ] || echo "5 1" >"$VLAB/hstate" ;;
    destroy)
        [ ! -e "$VLAB/destroy-fails" ] || { echo "berth-libvirt: destroy failed: internal error" >&2; exit 1; }
        if [ "$state" = "5 1" ] || [ -e "$VLAB/down-before-destroy" ]; then
            echo "5 1" >"$VLAB/hstate"
            echo "berth-libvirt: destroy failed: Requested operation is not valid: domain is not running" >&2
            exit 3
        fi
        echo "5 2" >"$VLAB/hstate" ;;
    *) echo "berth-libvirt: unexpected $verb" >&2; exit 2 ;;
esac
"#;

fn with_fake_helper(lab: &Lab, state: &str) -> String {
    let helper = lab.path("bin/berth-libvirt");
    std::fs::write(&helper, FAKE_HELPER).unwrap();
    std::fs::set_permissions(&helper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(lab.path("hstate"), format!("{state}\n")).unwrap();
    helper.to_str().unwrap().to_string()
}

fn helper_calls(lab: &Lab) -> Vec<String> {
    std::fs::read_to_string(lab.path("helper-calls"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// With berth-libvirt installed, the guest's start, shutdown and destroy
/// go through it (libvirt's API), and virsh is never run.
#[test]
fn with_the_helper_every_action_goes_through_libvirts_api() {
    let lab = Lab::new("running");
    let helper = with_fake_helper(&lab, "5 1");
    std::fs::write(lab.path("ignore-acpi"), "").unwrap();
    let (mut child, sock) = spawn_with(&lab, &["--stop-delay", "1"], &[("BERTH_LIBVIRT_HELPER", &helper)]);
    assert!(ready(&sock).contains("READY=1"));
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(exit_within(&mut child, Duration::from_secs(10)), 0);
    assert_eq!(
        helper_calls(&lab),
        ["start vm", "shutdown vm agent,acpi", "destroy vm"]
    );
    assert!(!lab.path("calls").exists(), "virsh was run");
}

/// A destroy libvirt refuses because the guest is already down is what
/// was asked (the state read confirms it); any other failure of it fails
/// the stop.
#[test]
fn a_destroy_refused_for_a_guest_gone_down_is_a_success() {
    for (file, status) in [("down-before-destroy", 0), ("destroy-fails", 1)] {
        let lab = Lab::new("running");
        let helper = with_fake_helper(&lab, "1 1");
        std::fs::write(lab.path(file), "").unwrap();
        let (mut child, sock) = spawn_with(&lab, &["--power-off"], &[("BERTH_LIBVIRT_HELPER", &helper)]);
        assert!(ready(&sock).contains("READY=1"));
        signal(&child, nix::sys::signal::Signal::SIGTERM);
        assert_eq!(exit_within(&mut child, Duration::from_secs(15)), status, "{file}");
        assert_eq!(helper_calls(&lab), ["destroy vm"], "{file}");
    }
}
