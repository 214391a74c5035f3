//! The escaper against a real systemd: for fixed hostile argvs and a few
//! hundred random ones, the process systemd starts receives exactly the
//! argv (and the environment value) that went into `unit_text::exec_line` and
//! `unit_text::environment_assignment`.
//!
//! Runs a private systemd user manager (about 80 ms to start): a private
//! mount namespace with a tmpfs on /run/systemd, its own XDG_RUNTIME_DIR and
//! XDG_CONFIG_HOME, so the host's service manager is never touched. Needs
//! root (unshare, mount).

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use berth::unit_text::{environment_assignment, exec_line};
use common::{have, is_root, require};

/// Deterministic xorshift, so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Characters that mean something to unit-file parsing, plus ordinary
/// ones, tab/DEL (escaped as \xNN) and multi-byte UTF-8.
const ALPHABET: &[&str] = &[
    "%", "%%", "%h", "%n", "$", "$$", "${", "}", "$HOME", "\\", "\\\\", "\"", "'", ";", " ", "  ", "#", "-",
    "@", ":", "+", "!", "=", "a", "b", "x", "n", "0", "\t", "\u{7f}", "é", "✓", "𝄞", "\\x41", "\\n", "*",
    "?", "~",
];

fn random_word(rng: &mut Rng) -> String {
    (0..rng.below(7))
        .map(|_| ALPHABET[rng.below(ALPHABET.len())])
        .collect()
}

fn fixed_cases() -> Vec<Vec<String>> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    vec![
        s(&[]),
        s(&[""]),
        s(&["", "", ""]),
        s(&[
            "%h",
            "$HOME",
            "${X}",
            "'q'",
            "\"dq\"",
            "back\\slash",
            ";",
            "a b",
            "",
            "ünï€",
        ]),
        s(&["trailing\\"]),
        s(&["\\;", ";;", "; ", " ;"]),
        s(&["-", "@x", ":y", "+z", "!w", "!!v"]),
        s(&["%%%%", "$$$$", "%$%$"]),
        s(&["\\x41", "\\u00e9", "\\n", "\\t", "\\\""]),
        s(&["line\tand\u{7f}del"]),
    ]
}

struct Manager {
    child: Child,
    runtime: std::path::PathBuf,
}

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = Command::new("systemctl")
            .args(["--user", "exit"])
            .env("XDG_RUNTIME_DIR", &self.runtime)
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_manager(dir: &Path) -> Manager {
    let runtime = dir.join("runtime");
    fs::create_dir(&runtime).unwrap();
    fs::set_permissions(&runtime, fs::Permissions::from_mode(0o700)).unwrap();
    let child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs tmpfs /run/systemd && mkdir /run/systemd/system && exec /lib/systemd/systemd --user")
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a private systemd user manager");
    let mut manager = Manager {
        child,
        runtime: runtime.clone(),
    };
    let socket = runtime.join("systemd/private");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        if let Ok(Some(status)) = manager.child.try_wait() {
            panic!("systemd --user exited early: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "systemd --user did not come up in 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    manager
}

#[test]
fn argv_and_environment_arrive_exactly() {
    if !require(is_root(), "root (for unshare and mount)")
        || !require(
            have("unshare") && Path::new("/lib/systemd/systemd").exists(),
            "unshare and /lib/systemd/systemd",
        )
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let units = dir.path().join("config/systemd/user");
    let out = dir.path().join("out");
    fs::create_dir_all(&units).unwrap();
    fs::create_dir(&out).unwrap();

    // Writes the path it ran as, argc, the argv and $V, NUL-separated.
    let dump = dir.path().join("dump");
    fs::write(
        &dump,
        "#!/bin/sh\nf=$1; shift; printf '%s\\0' \"$0\" \"$#\" \"$@\" \"$V\" > \"$f\"\n",
    )
    .unwrap();
    fs::set_permissions(&dump, fs::Permissions::from_mode(0o755)).unwrap();

    // The program path is hostile too (quotes and backslashes there systemd
    // refuses outright; config rejects them): systemd expands specifiers in it
    // but not `$` variables.
    let mut programs = vec![dump.clone()];
    let hostile_dirs = [
        "dir$HOME",
        "${X}",
        "$$",
        "100%",
        "%h",
        "a b",
        "semi;colon",
        "ünï",
        "-dash",
    ];
    for name in hostile_dirs {
        let d = dir.path().join("programs").join(name);
        fs::create_dir_all(&d).unwrap();
        std::os::unix::fs::symlink(&dump, d.join("dump")).unwrap();
        programs.push(d.join("dump"));
    }
    let program_of = |i: usize| programs[i % programs.len()].to_string_lossy().into_owned();

    let mut cases = fixed_cases();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..300 {
        cases.push((0..rng.below(6)).map(|_| random_word(&mut rng)).collect());
    }
    let mut names = Vec::new();
    for (i, args) in cases.iter().enumerate() {
        let mut argv = vec![
            program_of(i),
            out.join(i.to_string()).to_string_lossy().into_owned(),
        ];
        argv.extend(args.iter().cloned());
        // Environment values: no control characters (config rejects them).
        let env_value: String = args.concat().chars().filter(|c| !c.is_control()).collect();
        let unit = format!(
            "[Service]\nType=oneshot\nExecStart={}\nEnvironment={}\n",
            exec_line(&argv),
            environment_assignment("V", &env_value)
        );
        let name = format!("argv-{i}.service");
        fs::write(units.join(&name), unit).unwrap();
        names.push(name);
    }

    let manager = start_manager(dir.path());
    let status = Command::new("systemctl")
        .args(["--user", "start"])
        .args(&names)
        .env("XDG_RUNTIME_DIR", &manager.runtime)
        .status()
        .unwrap();
    assert!(status.success(), "systemctl --user start failed");

    let mut failures = Vec::new();
    for (i, args) in cases.iter().enumerate() {
        let got = fs::read(out.join(i.to_string())).unwrap_or_else(|e| panic!("case {i} wrote nothing: {e}"));
        let got = String::from_utf8(got).expect("UTF-8 back");
        let mut fields: Vec<&str> = got.split('\0').collect();
        assert_eq!(fields.pop(), Some(""), "case {i}: output ends with NUL");
        let env_value: String = args.concat().chars().filter(|c| !c.is_control()).collect();
        let mut want = vec![program_of(i), args.len().to_string()];
        want.extend(args.iter().cloned());
        want.push(env_value);
        if fields != want {
            failures.push(format!("case {i}:\n  sent {want:?}\n  got  {fields:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
