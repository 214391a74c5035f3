//! The `berth` command line. Exit codes: 0 success, 1 runtime or config
//! error, 2 usage error (clap's default).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::config::{self, Loaded, WorkloadKind};
use crate::freeze::{self, Freeze, Scope};
use crate::paths::{Manager, Root};
use crate::plan;
use crate::report::Events;
use crate::systemd::{self, Systemd};

#[derive(Parser, Debug)]
#[command(
    name = "berth",
    version,
    about = "Workloads that outlive their control plane and drain on real shutdown"
)]
struct Cli {
    /// Talk to the calling user's service manager (like systemctl --user) and use the user's
    /// config (~/.config/berth), state and runtime directories.
    #[arg(long, global = true)]
    user: bool,
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Subcommand, Debug)]
enum Verb {
    /// Validate the configuration and show what the generator makes of it.
    Check {
        /// Read config under this directory instead of / (default: $BERTH_ROOT or /).
        #[arg(long, value_name = "DIR")]
        root: Option<PathBuf>,
        /// Also inspect the loaded units (admin drop-ins included) for anything that breaks the
        /// lifecycle invariants.
        #[arg(long, conflicts_with = "root")]
        live: bool,
    },
    /// Start enabled workloads that are not running, in order (run by berth-autostart.service).
    Autostart,
    /// Stop every workload in reverse start order (ExecStop of berth-drain.service).
    Drain {
        /// Show the plan, budgets and worst case; stop nothing.
        #[arg(long)]
        dry_run: bool,
        /// With --dry-run or --last: print JSON.
        #[arg(long)]
        json: bool,
        /// Show the report of the last drain (e.g. after the next boot); stop nothing.
        #[arg(long, conflicts_with = "dry_run")]
        last: bool,
    },
    /// The resident supervisor (run by berth-daemon.service).
    Daemon {
        /// Run by hand: relaunch in place when the daemon asks to (exit 75).
        #[arg(long)]
        foreground: bool,
        /// Seconds between reconcile passes (default: [daemon] reconcile_interval_s).
        #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=3600))]
        reconcile_interval: Option<u64>,
        /// Serve no read-only API socket.
        #[arg(long)]
        no_api: bool,
        /// Seconds between sweeps of records of workloads gone from config and systemd (0: never).
        #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(0..=86_400))]
        gc_interval: Option<u64>,
    },
    /// Is berth installed, loaded, healthy, frozen; what did the last drain do. Never fails.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Freeze the node (no workload starts at boot) or one workload (autostart skips it).
    Freeze {
        /// The workload; without it, the whole node.
        name: Option<String>,
        /// Why, shown by berth status and berth check.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Remove the node's or a workload's freeze.
    Thaw { name: Option<String> },
    /// List the workloads: live state from systemd and the records.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Show one workload: live state and its record.
    Inspect {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Enable and start berth.target and prove it works; from a source tree, also install the
    /// binary, units and generator. Idempotent.
    Install {
        /// Where a source install puts the binary (default: /usr/local/bin, or ~/.local/bin with --user).
        #[arg(long, value_name = "DIR")]
        bindir: Option<PathBuf>,
        /// Replace files that berth install did not write, or that changed since it did.
        #[arg(long)]
        force: bool,
    },
    /// Reverse what install did (files, enablement); workloads keep running. Idempotent.
    Uninstall {
        /// Also delete berth's state: records, freeze flags, the last drain report.
        #[arg(long)]
        purge: bool,
    },
    /// Apply a config change: rewrite the per-user units (when there is no generator), reload systemd.
    Reload,
    /// Render the packaged units for a binary directory into DIR (used by make).
    #[command(hide = true)]
    RenderUnits {
        #[arg(long, value_name = "DIR")]
        bindir: PathBuf,
        out: PathBuf,
    },
    /// Print a shell completion script (bash, zsh or fish); `make install` installs them.
    #[command(hide = true)]
    Completions { shell: clap_complete::Shell },
    /// Fallback ExecStart of berth@.service: explains why a workload cannot start.
    #[command(hide = true)]
    NotConfigured { name: String },
}

pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    let manager = if cli.user { Manager::User } else { Manager::System };
    // Build-time verbs: no user environment needed (a package build has none).
    match &cli.verb {
        Verb::RenderUnits { bindir, out } => return render_units(manager, bindir, out),
        Verb::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(*shell, &mut Cli::command(), "berth", &mut std::io::stdout());
            return 0;
        }
        _ => {}
    }
    let root = Root::for_manager(manager);
    // `berth status` never fails: it reports a user environment it cannot use.
    if let Verb::Status { json } = cli.verb {
        let v = match &root {
            Ok(root) => crate::status::gather(root),
            Err(reason) => crate::status::unusable(manager, reason),
        };
        if json {
            println!("{}", serde_json::to_string_pretty(&v).expect("serializes"));
        } else {
            print!("{}", crate::status::text(&v));
        }
        return 0;
    }
    let root = match root {
        Ok(root) => root,
        Err(reason) => {
            eprintln!("berth --user: {reason}");
            return 1;
        }
    };
    match cli.verb {
        Verb::Check { root: Some(dir), .. } => match root.user_dirs() {
            Some(user) => check(&Root::new_user(dir, user.clone())),
            None => check(&Root::new(dir)),
        },
        Verb::Check { root: None, live } => {
            let rc = check(&root);
            if live { check_live(&root).max(rc) } else { rc }
        }
        Verb::Autostart => autostart(&root),
        Verb::Drain { last: true, json, .. } => drain_last(&root, json),
        Verb::Drain {
            dry_run: true, json, ..
        } => drain_dry_run(&root, json),
        Verb::Drain { json: true, .. } => {
            eprintln!("berth drain: --json goes with --dry-run or --last");
            2
        }
        Verb::Drain { .. } => drain(&root),
        Verb::Daemon {
            foreground,
            reconcile_interval,
            no_api,
            gc_interval,
        } => {
            let options = || crate::daemon::Options {
                reconcile_interval: reconcile_interval.map(Duration::from_secs),
                no_api,
                gc_interval: gc_interval.map(Duration::from_secs),
            };
            loop {
                let rc = crate::daemon::main(&root, options());
                if !(foreground && rc == crate::daemon::EXIT_RELAUNCH) {
                    return rc;
                }
                eprintln!("berth daemon: relaunching (exit {rc})");
            }
        }
        Verb::Status { .. } => unreachable!("handled above"),
        Verb::Freeze { name, reason } => freeze_cmd(&root, name.as_deref(), Some(&reason)),
        Verb::Thaw { name } => freeze_cmd(&root, name.as_deref(), None),
        Verb::Completions { .. } | Verb::RenderUnits { .. } => unreachable!("handled above"),
        Verb::List { json } => list(&root, None, json),
        Verb::Inspect { name, json } => list(&root, Some(name), json),
        Verb::NotConfigured { name } => not_configured(&root, &name),
        Verb::Install { bindir, force } => install_verb("install", |rt| {
            rt.block_on(crate::install::install(&root, bindir, force))
        }),
        Verb::Uninstall { purge } => install_verb("uninstall", |rt| {
            rt.block_on(crate::install::uninstall(&root, purge))
        }),
        Verb::Reload => install_verb("reload", |rt| rt.block_on(crate::install::reload(&root))),
    }
}

/// Runs install, uninstall or reload and reports: each step done on
/// stdout; the failed step on stderr, exit 1.
fn install_verb(
    verb: &str,
    run: impl FnOnce(&tokio::runtime::Runtime) -> Result<crate::install::Report, crate::install::Error>,
) -> i32 {
    let Ok(rt) = systemd::runtime() else {
        eprintln!("berth {verb}: cannot start the async runtime");
        return 1;
    };
    match run(&rt) {
        Ok(report) => {
            for line in &report.lines {
                println!("{line}");
            }
            0
        }
        Err(e) => {
            eprintln!("berth {verb}: {e}");
            1
        }
    }
}

fn render_units(manager: Manager, bindir: &std::path::Path, out: &std::path::Path) -> i32 {
    if !bindir.is_absolute() {
        eprintln!(
            "berth render-units: --bindir must be absolute, not {}",
            bindir.display()
        );
        return 2;
    }
    for (name, text) in crate::units::render(manager, bindir) {
        let path = out.join(name);
        if let Err(e) = std::fs::create_dir_all(out).and_then(|()| std::fs::write(&path, text)) {
            eprintln!("berth render-units: {}: {e}", path.display());
            return 1;
        }
    }
    0
}

fn check(root: &Root) -> i32 {
    if !root.dir().is_dir() {
        eprintln!("berth check: {}: no such directory", root.dir().display());
        return 1;
    }
    let loaded = config::load(root);
    print!("{}", check_report(&loaded));
    print!("{}", freeze_report(root, &loaded));
    if loaded.is_clean() { 0 } else { 1 }
}

/// `berth check --live`: the loaded units against the invariants.
fn check_live(root: &Root) -> i32 {
    let loaded = config::load(root);
    let configured: Vec<String> = loaded.workloads.iter().map(|w| w.unit_name()).collect();
    let Ok(rt) = systemd::runtime() else {
        eprintln!("berth check --live: cannot start the async runtime");
        return 1;
    };
    let gathered = rt.block_on(async {
        let sd = Systemd::connect(root.manager()).await?;
        crate::live::gather(&sd, &configured).await
    });
    match gathered {
        Ok((workloads, units)) => {
            let expected = crate::live::Expected {
                drain_timeout_stop_s: plan::drain_timeout_stop_s(loaded.host.drain_deadline_s),
            };
            let problems = crate::live::problems(&workloads, &units, expected);
            for p in &problems {
                println!("live: problem: {p}");
            }
            if problems.is_empty() {
                println!(
                    "live: the drain, berth.slice and {} workload unit(s) keep the lifecycle invariants",
                    workloads.len()
                );
                0
            } else {
                println!("live: {} problem(s); see berth.units(7)", problems.len());
                1
            }
        }
        Err(e) => {
            eprintln!("berth check --live: cannot inspect the loaded units: {e}");
            1
        }
    }
}

/// Freezes that would make the boot autostart skip the node or a workload.
fn freeze_report(root: &Root, loaded: &Loaded) -> String {
    let mut out = String::new();
    let mut line = |what: &str, result: std::io::Result<Option<Freeze>>| match result {
        Ok(None) => {}
        Ok(Some(f)) => out.push_str(&format!(
            "frozen: {what} since {} ({}): autostart skips it\n",
            f.since(),
            f.why()
        )),
        Err(e) => out.push_str(&format!("warning: cannot read the freeze flag of {what}: {e}\n")),
    };
    line("node", freeze::read(&freeze::node_flag(root), Scope::Node, None));
    for w in &loaded.workloads {
        let flag = freeze::instance_flag(root, &w.name);
        line(
            &w.unit_name(),
            freeze::read(&flag, Scope::Instance, Some(&w.name)),
        );
    }
    out
}

/// What `berth check` prints: problems per file, or the units in short.
pub fn check_report(loaded: &Loaded) -> String {
    let mut out = String::new();
    if !loaded.is_clean() {
        for e in &loaded.errors {
            out.push_str(&format!("error: {e}\n"));
        }
        if loaded.host_has_errors {
            out.push_str(&format!("note: {}\n", crate::generator::HOST_ERRORS_NOTE));
        }
        out.push_str(&format!(
            "{} problem(s); the generator skips the files named above and writes the rest\n",
            loaded.errors.len()
        ));
        return out;
    }
    let host = &loaded.host;
    match loaded.host_files.as_slice() {
        [] => out.push_str("host: no berth.toml, built-in defaults\n"),
        files => {
            for f in files {
                out.push_str(&format!("host: {} ok\n", f.display()));
            }
        }
    }
    out.push_str(&format!(
        "berth-drain.service: TimeoutStopSec={}s (deadline {}s + {}s), {} at a time, after {}\n",
        plan::drain_timeout_stop_s(host.drain_deadline_s),
        host.drain_deadline_s,
        plan::DRAIN_EXIT_MARGIN_S,
        host.drain_parallelism,
        plan::drain_after(host, &loaded.workloads).join(" "),
    ));
    if host.daemon.enabled {
        out.push_str(&format!(
            "berth-daemon.service: wanted by berth.target, WatchdogSec={}\n",
            host.daemon.watchdog_s
        ));
    } else {
        out.push_str("berth-daemon.service: not wanted ([daemon] enabled = false)\n");
    }
    if loaded.workloads.is_empty() {
        out.push_str("no workloads\n");
    }
    for group in plan::start_groups(&loaded.workloads) {
        out.push_str(&format!("order {}:\n", group[0].order));
        for w in group {
            let WorkloadKind::Command { exec, .. } = &w.kind;
            let stop = match w.stop_action {
                config::StopAction::PowerOff => "power_off".to_string(),
                config::StopAction::GuestShutdown => format!(
                    "guest_shutdown within {}s{}",
                    w.stop_delay_s,
                    if w.force_off_on_timeout {
                        ", then force off"
                    } else {
                        ", never forced"
                    }
                ),
            };
            out.push_str(&format!(
                "  {} ({}){}{}: {} — stop: {}\n",
                w.unit_name(),
                w.source.display(),
                if w.autostart { "" } else { " [no autostart]" },
                if w.start_delay_s > 0 {
                    format!(" [then wait {}s]", w.start_delay_s)
                } else {
                    String::new()
                },
                exec[0],
                stop,
            ));
        }
    }
    for m in &loaded.masked {
        out.push_str(&format!("masked: {m}\n"));
    }
    if !loaded.workloads.is_empty() {
        out.push_str(&format!(
            "worst-case drain: {}s without the deadline; the deadline is {}s\n",
            plan::worst_case_drain_s(host, &loaded.workloads),
            host.drain_deadline_s
        ));
    }
    out
}

/// What both helpers start with: the root, the config (its problems
/// logged, the rest used) and the journal.
fn helper_context(root: &Root) -> (Loaded, Events) {
    let loaded = config::load(root);
    let events = Events::new("berth");
    for e in &loaded.errors {
        events.warn(&format!("config: {e}"));
    }
    (loaded, events)
}

fn autostart(root: &Root) -> i32 {
    let (loaded, events) = helper_context(root);
    let Ok(rt) = systemd::runtime() else {
        eprintln!("berth autostart: cannot start the async runtime");
        return 1;
    };
    rt.block_on(async {
        let sd = match Systemd::connect(root.manager()).await {
            Ok(sd) => sd,
            Err(e) => {
                eprintln!("berth autostart: cannot reach systemd: {e}");
                return 1;
            }
        };
        match crate::autostart::run(&sd, root, &loaded, freeze::node_frozen(root), &events).await {
            Ok(_) => 0,
            Err(e) => {
                eprintln!("berth autostart: cannot ask systemd about the workloads: {e}");
                1
            }
        }
    })
}

/// Best effort: whatever happens, it reports and exits 0, well inside the
/// drain unit's TimeoutStopSec.
fn drain(root: &Root) -> i32 {
    let (loaded, events) = helper_context(root);
    let Ok(rt) = systemd::runtime() else {
        eprintln!("berth drain: cannot start the async runtime");
        return 0;
    };
    rt.block_on(async {
        match Systemd::connect(root.manager()).await {
            Ok(sd) => {
                crate::drain::run(&sd, root, &loaded, &events).await;
            }
            Err(e) => {
                events.emit(
                    log::Level::Error,
                    crate::drain::SUMMARY_MESSAGE_ID,
                    &[("BERTH_CODE", "E_SYSTEMD".into())],
                    &format!("drain impossible: cannot reach systemd: {e}"),
                );
                crate::drain::unreachable(root, &loaded, &e, &events);
            }
        }
    });
    0
}

fn drain_last(root: &Root, json: bool) -> i32 {
    let path = root.state_dir().join("last-drain.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("no drain recorded yet ({} does not exist)", path.display());
            return 0;
        }
        Err(e) => {
            eprintln!("berth drain --last: cannot read {}: {e}", path.display());
            return 1;
        }
    };
    if json {
        print!("{text}");
        return 0;
    }
    match serde_json::from_str::<crate::drain::Report>(&text) {
        Ok(report) => {
            print!("{}", report.text());
            0
        }
        Err(e) => {
            eprintln!("berth drain --last: {}: not a drain report: {e}", path.display());
            1
        }
    }
}

fn drain_dry_run(root: &Root, json: bool) -> i32 {
    let loaded = config::load(root);
    let live = systemd::runtime().ok().and_then(|rt| {
        rt.block_on(async {
            let sd = Systemd::connect(root.manager()).await.ok()?;
            sd.list_units("berth@*.service").await.ok()
        })
    });
    let plan = crate::drain::dry_run(&loaded, live.as_deref());
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&plan).expect("plan serializes")
        );
    } else {
        print!("{}", plan.text());
    }
    0
}

fn not_configured(root: &Root, name: &str) -> i32 {
    match config::load_one(root, name) {
        Ok(_) => eprintln!(
            "berth: workload {name:?} is configured, but this unit has no command from the generator; \
             run `systemctl daemon-reload`"
        ),
        Err(errors) if errors.is_empty() => eprintln!(
            "berth: workload {name:?} is not defined: there is no workloads/{name}.toml in any berth \
             config directory (see berth.toml(5))"
        ),
        Err(errors) => {
            eprintln!("berth: workload {name:?} cannot start, its file has errors:");
            for e in errors {
                eprintln!("  {e}");
            }
        }
    }
    1
}

/// `berth list` / `berth inspect`: the same data with or without a
/// daemon, from systemd (when reachable) and the records.
fn list(root: &Root, only: Option<String>, json: bool) -> i32 {
    let loaded = config::load(root);
    let live: Option<Vec<(String, crate::systemd::UnitDetails)>> = systemd::runtime().ok().and_then(|rt| {
        rt.block_on(async {
            let sd = Systemd::connect(root.manager()).await.ok()?;
            let units = sd.list_units("berth@*.service").await.ok()?;
            let mut out = Vec::new();
            for u in units {
                if let (Some(name), Ok(d)) =
                    (crate::autostart::instance_of(&u.name), sd.details(&u.name).await)
                {
                    out.push((name, d));
                }
            }
            Some(out)
        })
    });
    let mut names: Vec<String> = loaded.workloads.iter().map(|w| w.name.clone()).collect();
    for (n, _) in live.iter().flatten() {
        if !names.contains(n) {
            names.push(n.clone());
        }
    }
    names.sort();
    if let Some(only) = &only {
        if !names.contains(only) && crate::records::load(root, only).ok().flatten().is_none() {
            eprintln!("berth inspect: no workload {only:?} (not configured, not loaded, no record)");
            return 1;
        }
        names = vec![only.clone()];
    }
    let mut rows = Vec::new();
    for name in &names {
        let record = crate::records::load(root, name).ok().flatten();
        let details = live
            .as_ref()
            .and_then(|l| l.iter().find(|(n, _)| n == name))
            .map(|(_, d)| d);
        rows.push(serde_json::json!({
            "name": name,
            "unit": config::unit_name(name),
            "configured": loaded.workload(name).is_some(),
            "active_state": details.map(|d| d.active_state.clone()).unwrap_or_else(|| if live.is_some() { "inactive".into() } else { "unknown".into() }),
            "main_pid": details.map(|d| d.main_pid),
            "invocation_id": details.map(|d| d.invocation_id.clone()),
            "restart_pending": restart_pending(root, &loaded, name, details, record.as_ref()),
            "record": record,
        }));
    }
    if json {
        let value = if only.is_some() {
            rows.remove(0)
        } else {
            serde_json::Value::Array(rows)
        };
        println!("{}", serde_json::to_string_pretty(&value).expect("serializes"));
        return 0;
    }
    if live.is_none() {
        println!("(systemd not reachable: live state unknown)");
    }
    for r in &rows {
        if r["restart_pending"] == true {
            println!(
                "note: {} runs an older definition; it applies at its next start (restart pending)",
                r["unit"].as_str().unwrap_or("")
            );
        }
    }
    println!(
        "{:<24} {:<10} {:>8} {:>4}  {:<16} AT",
        "WORKLOAD", "STATE", "PID", "GEN", "LAST"
    );
    for r in &rows {
        let rec = &r["record"];
        println!(
            "{:<24} {:<10} {:>8} {:>4}  {:<16} {}",
            r["name"].as_str().unwrap_or(""),
            r["active_state"].as_str().unwrap_or(""),
            r["main_pid"]
                .as_u64()
                .map(|p| p.to_string())
                .unwrap_or_else(|| "-".into()),
            rec["transition_generation"]
                .as_u64()
                .map(|g| g.to_string())
                .unwrap_or_else(|| "-".into()),
            rec["last_transition_reason"].as_str().unwrap_or("-"),
            rec["last_transition_at"].as_str().unwrap_or("-"),
        );
        if only.is_some() && !rec.is_null() {
            println!("{}", serde_json::to_string_pretty(rec).expect("serializes"));
        }
    }
    0
}

/// A running workload whose definition changed since it started: the
/// change applies at its next start.
fn restart_pending(
    root: &Root,
    loaded: &Loaded,
    name: &str,
    details: Option<&crate::systemd::UnitDetails>,
    record: Option<&crate::records::Record>,
) -> bool {
    let running = details.is_some_and(|d| d.active_state == "active");
    match (
        running,
        loaded.workload(name),
        record.and_then(|r| r.definition.as_deref()),
    ) {
        (true, Some(w), Some(started_with)) => crate::render::definition_fingerprint(root, w) != started_with,
        _ => false,
    }
}

/// `berth freeze [NAME]` (reason given) and `berth thaw [NAME]` (none).
fn freeze_cmd(root: &Root, name: Option<&str>, reason: Option<&str>) -> i32 {
    if let Some(n) = name
        && !config::is_valid_workload_name(n)
    {
        eprintln!("berth: {n:?} is not a valid workload name");
        return 2;
    }
    let what = name.map(config::unit_name).unwrap_or_else(|| "the node".into());
    match reason {
        Some(reason) => match freeze::freeze(root, name, reason) {
            Ok(f) => {
                println!("frozen: {what} since {}", f.frozen_at);
                0
            }
            Err(e) => {
                eprintln!("berth freeze: cannot write the flag for {what}: {e}");
                1
            }
        },
        None => match freeze::thaw(root, name) {
            Ok(true) => {
                println!("thawed: {what}");
                0
            }
            Ok(false) => {
                println!("{what} was not frozen");
                0
            }
            Err(e) => {
                eprintln!("berth thaw: cannot remove the flag for {what}: {e}");
                1
            }
        },
    }
}
