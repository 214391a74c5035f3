//! The exit-code contract of both binaries: 0 success, 1 runtime or
//! config error, 2 usage error.

mod common;

use std::fs;
use std::process::{Command, Output};

use common::{berth_bin, generator_bin, repo};

fn run(bin: &str, args: &[&str], root: Option<&std::path::Path>) -> Output {
    let mut cmd = Command::new(bin);
    cmd.args(args);
    match root {
        Some(r) => cmd.env("BERTH_ROOT", r),
        None => cmd.env_remove("BERTH_ROOT"),
    };
    cmd.output().unwrap()
}

/// A root with one workload, `web`; and its workloads directory.
fn root_with_web() -> (tempfile::TempDir, std::path::PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("etc/berth/workloads");
    fs::create_dir_all(&dir).unwrap();
    fs::write(
        dir.join("web.toml"),
        "exec = [\"/usr/bin/sleep\", \"infinity\"]\n",
    )
    .unwrap();
    (root, dir)
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited, not killed")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn generator_usage_errors_exit_2() {
    for args in [
        &[][..],
        &["a", "b"],
        &["-x", "/tmp"],
        &["--dry-run", "/tmp"],
        &["a", "b", "c", "d"],
    ] {
        let o = run(
            generator_bin(),
            args,
            Some(&repo().join("tests/generator/01-minimal/root")),
        );
        assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("usage: berth-generator"), "{args:?}");
    }
}

#[test]
fn generator_success_config_error_and_runtime_error() {
    let good = repo().join("tests/generator/01-minimal/root");
    let broken = repo().join("tests/generator/04-broken/root");
    let out = tempfile::tempdir().unwrap();

    let dir = out.path().join("good");
    fs::create_dir(&dir).unwrap();
    assert_eq!(
        code(&run(generator_bin(), &[dir.to_str().unwrap()], Some(&good))),
        0
    );

    // A bad file: reported, the rest written, exit 1 at the end.
    let dir = out.path().join("broken");
    fs::create_dir(&dir).unwrap();
    let o = run(generator_bin(), &[dir.to_str().unwrap()], Some(&broken));
    assert_eq!(code(&o), 1);
    assert!(dir.join("berth@good.service.d/10-berth.conf").is_file());
    assert!(dir.join("berth-drain.service.d/10-berth.conf").is_file());

    // Output directory that cannot be written: runtime error, exit 1.
    let o = run(generator_bin(), &["/nonexistent/berth-out"], Some(&good));
    assert_eq!(code(&o), 1);
    assert!(
        stderr(&o).contains("cannot create /nonexistent/berth-out/"),
        "{}",
        stderr(&o)
    );

    // A non-empty output directory is not silently overwritten.
    let dir = out.path().join("good");
    let o = run(generator_bin(), &[dir.to_str().unwrap()], Some(&good));
    assert_eq!(code(&o), 1, "{}", stderr(&o));

    // --dry-run writes nothing and exits like a real run.
    assert_eq!(code(&run(generator_bin(), &["--dry-run"], Some(&good))), 0);
    assert_eq!(code(&run(generator_bin(), &["--dry-run"], Some(&broken))), 1);
}

#[test]
fn berth_check_contract() {
    let good = repo().join("tests/generator/02-full/root");
    let broken = repo().join("tests/generator/04-broken/root");

    let o = run(berth_bin(), &["check", "--root", good.to_str().unwrap()], None);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("berth@vm1.service"), "{text}");
    assert!(text.contains("TimeoutStopSec=630s"), "{text}");

    // Freezes are shown, and do not make the config invalid.
    let frozen = tempfile::tempdir().unwrap();
    std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", good.display()))
        .arg(frozen.path())
        .status()
        .unwrap();
    let flags = frozen.path().join("var/lib/berth/freeze");
    fs::create_dir_all(flags.join("instance")).unwrap();
    fs::write(
        flags.join("node"),
        r#"{"scope":"node","frozen_at":"2026-11-29T10:00:00Z","reason":"disk swap"}"#,
    )
    .unwrap();
    fs::write(flags.join("instance/batch"), "garbled").unwrap();
    let o = run(
        berth_bin(),
        &["check", "--root", frozen.path().to_str().unwrap()],
        None,
    );
    assert_eq!(code(&o), 0);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("frozen: node since 2026-11-29T10:00:00Z (disk swap)"),
        "{text}"
    );
    assert!(
        text.contains("frozen: berth@batch.service since ? (unreadable freeze flag"),
        "{text}"
    );

    // A root that does not exist is an error, not an empty config.
    let o = run(berth_bin(), &["check", "--root", "/nonexistent/berth-root"], None);
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("no such directory"), "{}", stderr(&o));

    // BERTH_ROOT works as well as --root.
    assert_eq!(code(&run(berth_bin(), &["check"], Some(&good))), 0);

    let o = run(berth_bin(), &["check", "--root", broken.to_str().unwrap()], None);
    assert_eq!(code(&o), 1);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("no-exec.toml: exec: missing"), "{text}");
    assert!(text.contains("lifecycle.toml: service.Restart:"), "{text}");

    for args in [
        &[][..],
        &["frobnicate"],
        &["check", "--bogus"],
        &["check", "--root"],
    ] {
        assert_eq!(code(&run(berth_bin(), args, None)), 2, "{args:?}");
    }
    assert_eq!(code(&run(berth_bin(), &["--help"], None)), 0);
    assert_eq!(code(&run(berth_bin(), &["--version"], None)), 0);
}

#[test]
fn template_fallback_explains_and_fails() {
    let root = repo().join("tests/generator/04-broken/root");
    let o = run(berth_bin(), &["not-configured", "nosuch"], Some(&root));
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("\"nosuch\" is not defined"), "{}", stderr(&o));
    let o = run(berth_bin(), &["not-configured", "no-exec"], Some(&root));
    assert_eq!(code(&o), 1);
    assert!(
        stderr(&o).contains("no-exec.toml: exec: missing"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn status_never_fails() {
    // Not installed: no D-Bus call, a reason, exit 0.
    let empty = tempfile::tempdir().unwrap();
    let o = run(berth_bin(), &["status", "--json"], Some(empty.path()));
    assert_eq!(code(&o), 0);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["installed"], false);
    assert_eq!(v["loaded"], false);
    // Installed, but no usable systemd on this machine (or in this root):
    // loaded false with the reason, still exit 0.
    let installed = tempfile::tempdir().unwrap();
    let units = installed.path().join("etc/systemd/system");
    fs::create_dir_all(&units).unwrap();
    fs::write(units.join("berth-drain.service"), "[Service]\n").unwrap();
    let o = Command::new(berth_bin())
        .args(["status", "--json"])
        .env("BERTH_ROOT", installed.path())
        .env("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent/bus")
        .output()
        .unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["installed"], true);
    if v["loaded"] == false {
        assert!(
            v["reason"]
                .as_str()
                .unwrap()
                .contains("systemd is not usable here"),
            "{v}"
        );
    }
}

#[test]
fn completions_for_each_shell() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef berth"),
        ("fish", "complete -c berth"),
    ] {
        let o = run(berth_bin(), &["completions", shell], None);
        assert_eq!(code(&o), 0, "{shell}");
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(text.contains(marker), "{shell}: no {marker:?}");
        for verb in ["check", "drain", "status", "freeze"] {
            assert!(text.contains(verb), "{shell}: no {verb}");
        }
    }
    assert_eq!(code(&run(berth_bin(), &["completions", "tcsh"], None)), 2);
}

#[test]
fn drain_json_goes_with_dry_run_or_last() {
    let empty = tempfile::tempdir().unwrap();
    let o = run(berth_bin(), &["drain", "--json"], Some(empty.path()));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("--dry-run"), "{}", stderr(&o));
    let o = run(berth_bin(), &["drain", "--dry-run", "--last"], Some(empty.path()));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let o = run(berth_bin(), &["drain", "--dry-run", "--json"], Some(empty.path()));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        o.stdout.starts_with(b"{"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

#[test]
fn freeze_refuses_a_typo_unless_forced() {
    let (root, _) = root_with_web();
    let o = run(berth_bin(), &["freeze", "webb"], Some(root.path()));
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no workload \"webb\" is configured"),
        "{}",
        stderr(&o)
    );
    assert!(!root.path().join("var/lib/berth/freeze/instance/webb").exists());
    let o = run(berth_bin(), &["freeze", "webb", "--force"], Some(root.path()));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(berth_bin(), &["freeze", "web"], Some(root.path()));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

/// A reason longer than 1024 bytes is a usage error, local or cluster,
/// and nothing is written.
#[test]
fn freeze_refuses_a_reason_too_long() {
    let (root, _) = root_with_web();
    let long = "x".repeat(1025);
    let cluster = ["freeze", "--cluster", "--reason", long.as_str()];
    if !cfg!(feature = "cluster") {
        let o = run(berth_bin(), &cluster, Some(root.path()));
        assert_eq!(code(&o), 1, "{}", stderr(&o));
        assert!(stderr(&o).contains(NOT_BUILT), "{}", stderr(&o));
    }
    let both = [&["freeze", "web", "--reason", long.as_str()][..], &cluster];
    for args in &both[..if cfg!(feature = "cluster") { 2 } else { 1 }] {
        let o = run(berth_bin(), args, Some(root.path()));
        assert_eq!(code(&o), 2, "{}", stderr(&o));
        assert!(
            stderr(&o).contains("--reason is 1025 bytes; at most 1024"),
            "{}",
            stderr(&o)
        );
    }
    assert!(!root.path().join("var/lib/berth/freeze/instance/web").exists());
    let fits = "x".repeat(1024);
    let o = run(
        berth_bin(),
        &["freeze", "web", "--reason", fits.as_str()],
        Some(root.path()),
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

/// What a build without the `cluster` feature says to a cluster verb.
const NOT_BUILT: &str =
    "cluster mode is not in this build of berth (built without the cargo feature \"cluster\")";

/// A build without cluster mode: the unit-side verbs say so, and
/// owner-check still fails closed (255 fails an ExecCondition=).
#[cfg(not(feature = "cluster"))]
#[test]
fn unit_side_cluster_verbs_in_a_build_without_cluster_mode() {
    let (root, _) = root_with_web();
    for (args, want) in [
        (&["owner-check", "web"][..], 255),
        (&["fence-arm"], 1),
        (&["fence"], 1),
        (&["fence-watch"], 1),
    ] {
        let o = run(berth_bin(), args, Some(root.path()));
        assert_eq!(code(&o), want, "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(NOT_BUILT), "{args:?}: {}", stderr(&o));
    }
}

/// Issue 14: the cluster's verbs outside cluster mode are runtime errors
/// naming the missing section (or, in a build without cluster mode,
/// saying so); a bad name is a usage error.
#[test]
fn cluster_verbs_without_a_cluster_and_with_bad_names() {
    let (root, _) = root_with_web();
    for args in [
        &["freeze", "--cluster"][..],
        &["freeze", "web", "--cluster"],
        &["thaw", "--cluster"],
        &["cluster", "forget", "n3"],
    ] {
        let o = run(berth_bin(), args, Some(root.path()));
        assert_eq!(code(&o), 1, "{args:?}: {}", stderr(&o));
        let said = if cfg!(feature = "cluster") {
            "no valid [cluster] section in berth.toml"
        } else {
            NOT_BUILT
        };
        assert!(stderr(&o).contains(said), "{args:?}: {}", stderr(&o));
    }
    for args in [
        &["freeze", "a/b", "--cluster"][..],
        &["thaw", "../x", "--cluster"],
        &["cluster", "forget", "n/3"],
    ] {
        let o = run(berth_bin(), args, Some(root.path()));
        if cfg!(feature = "cluster") {
            assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
        } else {
            assert_eq!(code(&o), 1, "{args:?}: {}", stderr(&o));
            assert!(stderr(&o).contains(NOT_BUILT), "{args:?}: {}", stderr(&o));
        }
    }
    // A typo is refused with --cluster too.
    let o = run(berth_bin(), &["freeze", "webb", "--cluster"], Some(root.path()));
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(
        stderr(&o).contains(if cfg!(feature = "cluster") {
            "no workload \"webb\" is configured"
        } else {
            NOT_BUILT
        }),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_mistyped_verb_gets_a_suggestion() {
    let o = run(berth_bin(), &["stauts"], None);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("status"), "{}", stderr(&o));
}

#[test]
fn check_json_for_ci() {
    let (root, dir) = root_with_web();
    let o = run(berth_bin(), &["check", "--json"], Some(root.path()));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["workloads"][0]["unit"], "berth@web.service");
    assert_eq!(v["drain"]["parallelism"].as_u64().map(|p| p > 0), Some(true));

    fs::write(dir.join("bad.toml"), "exec = \"not a list\"\n").unwrap();
    let o = run(berth_bin(), &["check", "--json"], Some(root.path()));
    assert_eq!(code(&o), 1);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["errors"][0]["key"], "exec");
    assert!(v["errors"][0]["file"].as_str().unwrap().ends_with("bad.toml"));
}

/// Issue 11, part 4: `berth cat NAME` shows the file and the drop-in, and
/// says when the drop-in systemd loaded is not the one the file makes.
#[test]
fn cat_shows_the_file_and_its_drop_in() {
    let (root, dir) = root_with_web();
    fs::write(dir.join("bad.toml"), "exec = \"/bin/x\"\n").unwrap();
    let o = run(berth_bin(), &["cat", "web"], Some(root.path()));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let r = root.path().display();
    assert!(
        out.starts_with(&format!("# {r}/etc/berth/workloads/web.toml\nexec = ")),
        "{out}"
    );
    assert!(
        out.contains(&format!("# {r}/run/systemd/generator/berth@web.service.d/10-berth.conf (what berth-generator makes of it)\n# Automatically generated")),
        "{out}"
    );
    assert!(out.contains("ExecStart=\"/usr/bin/sleep\" \"infinity\""), "{out}");
    assert!(out.contains("systemd has loaded no such drop-in yet"), "{out}");
    // The generator's own output in place: nothing more to say.
    let generated = root.path().join("run/systemd/generator");
    fs::create_dir_all(&generated).unwrap();
    let g = run(generator_bin(), &[generated.to_str().unwrap()], Some(root.path()));
    assert_eq!(code(&g), 1, "bad.toml makes the generator exit 1: {}", stderr(&g));
    let o = run(berth_bin(), &["cat", "web"], Some(root.path()));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(!out.contains("daemon-reload"), "{out}");
    fs::write(dir.join("web.toml"), "exec = [\"/usr/bin/sleep\", \"10\"]\n").unwrap();
    let out =
        String::from_utf8_lossy(&run(berth_bin(), &["cat", "web"], Some(root.path())).stdout).into_owned();
    assert!(out.contains("The drop-in systemd loaded differs"), "{out}");

    let o = run(berth_bin(), &["cat", "bad"], Some(root.path()));
    assert_eq!(code(&o), 1);
    assert!(
        stderr(&o).contains("bad.toml: exec: must be a list of strings"),
        "{}",
        stderr(&o)
    );
    assert_eq!(code(&run(berth_bin(), &["cat", "nope"], Some(root.path()))), 1);
    assert_eq!(
        code(&run(berth_bin(), &["cat", "../etc/passwd"], Some(root.path()))),
        1
    );
}

/// Issue 11, part 2: refused input names file, key and reason, exits 1
/// and leaves nothing behind, whether or not systemd can be reached.
#[test]
fn add_refuses_bad_input_before_asking_systemd() {
    let root = tempfile::tempdir().unwrap();
    let o = run(
        berth_bin(),
        &["add", "web", "--stop-action", "halt", "--", "/bin/true"],
        Some(root.path()),
    );
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("etc/berth/workloads/web.toml: stop_action: must be \"guest_shutdown\", \"power_off\" or \"save\", not \"halt\""),
        "{}",
        stderr(&o)
    );
    assert!(
        !root.path().join("etc/berth/workloads").exists(),
        "nothing written"
    );
    let o = run(berth_bin(), &["add", "web"], Some(root.path()));
    assert_eq!(code(&o), 2, "no command: a usage error: {}", stderr(&o));
    let o = run(
        berth_bin(),
        &["add", "web", "--env", "NOEQUALS", "--", "/bin/true"],
        Some(root.path()),
    );
    assert_eq!(code(&o), 2, "{}", stderr(&o));
}

/// Issue 11, part 2: hostile values for `berth add` (a newline in the
/// name or a value, a huge value, an endless --from file) are refused
/// with the key and the reason, and nothing is written.
#[test]
fn add_refuses_hostile_values() {
    let root = tempfile::tempdir().unwrap();
    // An argument cannot exceed the kernel's 128 KiB: a huge value comes
    // in a file.
    let huge = root.path().join("huge.toml");
    fs::write(
        &huge,
        format!(
            "exec = [\"/bin/true\"]\n[environment]\nX = \"{}\"\n",
            "a".repeat(200 * 1024)
        ),
    )
    .unwrap();
    let huge = huge.to_str().unwrap();
    for (args, expect) in [
        (
            &["add", "we\nb", "--", "/bin/true"][..],
            "is not a valid workload name",
        ),
        (
            &["add", "web", "--description", "a\nb", "--", "/bin/true"][..],
            "web.toml: description:",
        ),
        (
            &["add", "web", "--", "/bin/true", "a\nb"][..],
            "web.toml: exec[1]:",
        ),
        (
            &["add", "web", "--from", huge][..],
            "web.toml: environment.X: is 204800 bytes long",
        ),
        (
            &["add", "web", "--from", "/dev/zero"][..],
            "/dev/zero: larger than 1 MiB",
        ),
    ] {
        let o = run(berth_bin(), args, Some(root.path()));
        assert_eq!(code(&o), 1, "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(expect), "{args:?}: {}", stderr(&o));
    }
    assert!(
        !root.path().join("etc/berth/workloads").exists(),
        "nothing written"
    );
}
