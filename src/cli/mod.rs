//! The `berth` command line: one file per verb family, each the user
//! interface (arguments, text and JSON, exit status) over a mechanism that
//! lives elsewhere. Exit codes: 0 success, 1 runtime or config error, 2
//! usage error (clap's).

mod add;
mod build;
mod cat;
mod check;
#[cfg(feature = "cluster")]
mod cluster;
mod daemon;
mod drain;
#[cfg(feature = "cluster")]
mod fence_watch;
mod freeze;
mod install;
mod lifecycle;
mod list;
mod status;

use std::future::Future;
use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::paths::{Manager, Root, UserEnvError};
use crate::systemd::Systemd;

pub use check::check_report;

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
        /// Print the result as JSON (for CI): ok, errors, workloads, drain, daemon.
        #[arg(long, conflicts_with = "live")]
        json: bool,
    },
    /// Start enabled workloads that are not running, in order (run by berth-autostart.service).
    Autostart,
    /// Stop every workload in reverse start order (ExecStop of berth-drain.service).
    #[command(group(clap::ArgGroup::new("show").args(["dry_run", "last"])))]
    Drain {
        /// Show the plan, budgets and worst case; stop nothing.
        #[arg(long)]
        dry_run: bool,
        /// With --dry-run or --last: print JSON.
        #[arg(long, requires = "show")]
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
        /// Freeze NAME although no workload of that name is configured (yet).
        #[arg(long, requires = "name")]
        force: bool,
        /// Freeze every node (or NAME on every node that has it) through etcd.
        #[arg(long)]
        cluster: bool,
    },
    /// Remove the node's or a workload's freeze.
    Thaw {
        name: Option<String>,
        /// Remove the cluster (or NAME's object) freeze; every node's daemon drops its adopted one.
        #[arg(long)]
        cluster: bool,
    },
    /// Cluster membership (cluster mode).
    Cluster {
        #[command(subcommand)]
        verb: ClusterVerb,
    },
    /// List the workloads: live state from systemd and the records.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Show a workload's file and the drop-in berth-generator makes of it.
    Cat { name: String },
    /// Add a workload while the host runs: write its file, reload systemd (shared with
    /// concurrent adds), and with --now start it.
    Add(Box<add::AddArgs>),
    /// Remove a workload's file and reload systemd; a running one only with --stop.
    Remove {
        name: String,
        /// Stop the workload first (its stop needs the drop-in made from its file).
        #[arg(long)]
        stop: bool,
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
    /// ExecStartPre of an HA workload's unit: succeeds only on the node that owns it.
    #[command(hide = true)]
    OwnerCheck { name: String },
    /// ExecStopPost of berth-daemon in cluster mode: arms the fence timer at the lease deadline.
    #[command(hide = true)]
    FenceArm,
    /// What the fence timer runs: stops this node's HA workloads, recorded as the fence's.
    #[command(hide = true)]
    Fence,
    /// ExecStart of berth-fence-watch.service: the fence's backstop, a second past the deadline.
    #[command(hide = true)]
    FenceWatch,
    /// ExecStart of a libvirt workload's unit: starts or adopts the domain and follows it.
    #[command(hide = true)]
    Guest {
        domain: String,
        #[arg(long, value_name = "SECONDS", default_value_t = 60)]
        stop_delay: u64,
        #[arg(long, conflicts_with = "save")]
        power_off: bool,
        #[arg(long)]
        no_force_off: bool,
        #[arg(long)]
        save: bool,
        /// How to ask the guest to shut down: agent, acpi, or both (libvirt tries the agent first).
        #[arg(long, value_name = "MODES", default_value = "agent,acpi", value_parser = shutdown_modes)]
        shutdown_mode: String,
    },
}

/// `--shutdown-mode`: checked, and passed on to virsh as written.
fn shutdown_modes(text: &str) -> Result<String, String> {
    crate::config::ShutdownMode::split(text).map(|m| crate::config::ShutdownMode::join(&m))
}

#[derive(Subcommand, Debug)]
enum ClusterVerb {
    /// Remove a node gone for good from the members (its member and last-state keys).
    Forget { node: String },
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
    let root = Root::for_manager(manager);
    match cli.verb {
        // Build-time verbs: no user environment needed (a package build has none).
        Verb::RenderUnits { bindir, out } => build::render_units(manager, &bindir, &out),
        Verb::Completions { shell } => build::completions(shell),
        // `berth status` never fails: it reports a user environment it cannot use.
        Verb::Status { json } => status::run(manager, root, json),
        Verb::Check {
            root: dir,
            live,
            json,
        } => with_root(root, |r| check::run(r, dir, live, json)),
        Verb::Autostart => with_root(root, lifecycle::autostart),
        Verb::NotConfigured { name } => with_root(root, |r| lifecycle::not_configured(r, &name)),
        #[cfg(feature = "cluster")]
        Verb::OwnerCheck { name } => with_root(root, |r| cluster::owner_check(r, &name)),
        #[cfg(feature = "cluster")]
        Verb::FenceArm => with_root(root, cluster::fence_arm),
        #[cfg(feature = "cluster")]
        Verb::Fence => with_root(root, cluster::fence),
        #[cfg(feature = "cluster")]
        Verb::FenceWatch => with_root(root, fence_watch::fence_watch),
        // A unit of an HA workload cannot be generated without cluster
        // mode; should one start anyway, owner-check still fails closed.
        #[cfg(not(feature = "cluster"))]
        Verb::OwnerCheck { .. } => without_cluster("owner-check", 255),
        #[cfg(not(feature = "cluster"))]
        Verb::FenceArm => without_cluster("fence-arm", 1),
        #[cfg(not(feature = "cluster"))]
        Verb::Fence => without_cluster("fence", 1),
        #[cfg(not(feature = "cluster"))]
        Verb::FenceWatch => without_cluster("fence-watch", 1),
        Verb::Guest {
            domain,
            stop_delay,
            power_off,
            no_force_off,
            save,
            shutdown_mode,
        } => with_root(root, |r| {
            crate::libvirt::guest::run(
                r,
                &domain,
                &crate::libvirt::guest::Policy {
                    stop_delay: std::time::Duration::from_secs(stop_delay),
                    power_off,
                    force_off: !no_force_off,
                    save,
                    shutdown_mode,
                },
            )
        }),
        Verb::Drain { last: true, json, .. } => with_root(root, |r| drain::last(r, json)),
        Verb::Drain {
            dry_run: true, json, ..
        } => with_root(root, |r| drain::dry_run(r, json)),
        Verb::Drain { .. } => with_root(root, drain::run),
        Verb::Daemon {
            foreground,
            reconcile_interval,
            no_api,
            gc_interval,
        } => with_root(root, |r| {
            daemon::run(r, foreground, reconcile_interval, no_api, gc_interval)
        }),
        Verb::Freeze {
            name,
            reason,
            force,
            cluster: false,
        } => with_root(root, |r| freeze::freeze(r, name.as_deref(), &reason, force)),
        #[cfg(feature = "cluster")]
        Verb::Freeze {
            name,
            reason,
            force,
            cluster: true,
        } => with_root(root, |r| {
            freeze::freeze_cluster(r, name.as_deref(), &reason, force)
        }),
        Verb::Thaw { name, cluster: false } => with_root(root, |r| freeze::thaw(r, name.as_deref())),
        #[cfg(feature = "cluster")]
        Verb::Thaw { name, cluster: true } => with_root(root, |r| freeze::thaw_cluster(r, name.as_deref())),
        #[cfg(feature = "cluster")]
        Verb::Cluster {
            verb: ClusterVerb::Forget { node },
        } => with_root(root, |r| cluster::forget(r, &node)),
        #[cfg(not(feature = "cluster"))]
        Verb::Freeze { cluster: true, .. } => without_cluster("freeze --cluster", 1),
        #[cfg(not(feature = "cluster"))]
        Verb::Thaw { cluster: true, .. } => without_cluster("thaw --cluster", 1),
        #[cfg(not(feature = "cluster"))]
        Verb::Cluster { .. } => without_cluster("cluster", 1),
        Verb::List { json } => with_root(root, |r| list::run(r, None, json)),
        Verb::Cat { name } => with_root(root, |r| cat::run(r, &name)),
        Verb::Add(args) => with_root(root, |r| add::add(r, args)),
        Verb::Remove { name, stop } => with_root(root, |r| add::remove(r, &name, stop)),
        Verb::Inspect { name, json } => with_root(root, |r| list::run(r, Some(name), json)),
        Verb::Install { bindir, force } => with_root(root, |r| install::install(r, bindir, force)),
        Verb::Uninstall { purge } => with_root(root, |r| install::uninstall(r, purge)),
        Verb::Reload => with_root(root, install::reload),
    }
}

/// A cluster verb in a build without cluster mode: said, and `code`.
#[cfg(not(feature = "cluster"))]
fn without_cluster(verb: &str, code: i32) -> i32 {
    say_error(&format!(
        "berth {verb}: cluster mode is not in this build of berth (built without the cargo feature \"cluster\")"
    ));
    code
}

/// Runs a verb that needs the manager's paths; without them (a user
/// environment with no HOME or XDG_RUNTIME_DIR) it fails, saying why.
fn with_root(root: Result<Root, UserEnvError>, verb: impl FnOnce(&Root) -> i32) -> i32 {
    match root {
        Ok(root) => verb(&root),
        Err(reason) => {
            say_error(&format!("berth --user: {reason}"));
            1
        }
    }
}

/// Runs `future` on a current-thread runtime: every verb that talks to
/// systemd goes through here (or [`with_systemd`]).
fn block_on<T>(future: impl Future<Output = T>) -> anyhow::Result<T> {
    let rt = crate::systemd::runtime().context("cannot start the async runtime")?;
    Ok(rt.block_on(future))
}

/// The cluster as etcd tells it now, for `status` and `list` (a bounded
/// wait); `lease_ttls` asks each node lease's TTL too.
#[cfg(feature = "cluster")]
fn ask_cluster(
    root: &Root,
    settings: &crate::config::ClusterSettings,
    lease_ttls: bool,
) -> Result<crate::cluster::view::ClusterView, String> {
    block_on(crate::cluster::view::ask(
        settings,
        &root.runtime_dir(),
        lease_ttls,
    ))
    .map_err(|e| format!("{e:#}"))
    .and_then(|r| r)
}

/// Connects to `root`'s manager and runs `f` with the connection.
fn with_systemd<T, Fut>(root: &Root, f: impl FnOnce(Systemd) -> Fut) -> anyhow::Result<T>
where
    Fut: Future<Output = anyhow::Result<T>>,
{
    block_on(async {
        let sd = Systemd::connect(root.manager())
            .await
            .context("cannot reach systemd")?;
        f(sd).await
    })?
}

/// Prints to stdout; a closed stdout (`| head`) is not an error worth a
/// panic, so write errors are ignored.
fn say(text: &str) {
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

/// Prints a line to stderr, ignoring write errors.
fn say_error(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// An error and its causes on one line, as `{:#}` renders anyhow's chain.
fn fail(verb: &str, e: &anyhow::Error) -> i32 {
    say_error(&format!("berth {verb}: {e:#}"));
    1
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    #[test]
    fn the_definition_is_consistent() {
        super::Cli::command().debug_assert();
    }

    /// A flag named like the global --user (`berth add --user`) made every
    /// `berth add` panic as its arguments were read; clap's own check
    /// above does not see that. The verbs that take the most flags are
    /// read here with all of them.
    #[test]
    fn every_flag_of_add_and_remove_is_read() {
        for argv in [
            &[
                "berth",
                "--user",
                "add",
                "web",
                "--runtime",
                "--now",
                "--description",
                "d",
                "--order",
                "-5",
                "--no-autostart",
                "--start-delay",
                "1",
                "--stop-action",
                "power_off",
                "--stop-delay",
                "2",
                "--ready",
                "notify",
                "--ready-exec",
                "/usr/bin/test",
                "--ready-exec",
                "-e",
                "--after",
                "a.service",
                "--wants",
                "b.service",
                "--env",
                "A=1",
                "--run-as",
                "u",
                "--run-as-group",
                "g",
                "--",
                "/bin/true",
                "-x",
            ][..],
            &["berth", "add", "web", "--from", "/tmp/web.toml"],
            &[
                "berth",
                "add",
                "pg",
                "--unit",
                "postgresql.service",
                "--order",
                "1",
                "--now",
            ],
            &["berth", "remove", "web", "--stop", "--user"],
            &["berth", "cat", "web"],
        ] {
            let parsed = super::Cli::try_parse_from(argv);
            assert!(parsed.is_ok(), "{argv:?}: {parsed:?}");
        }
        // One source for the workload: a command, an existing unit or a file.
        for argv in [
            &["berth", "add", "pg", "--unit", "pg.service", "--", "/bin/true"][..],
            &[
                "berth",
                "add",
                "pg",
                "--unit",
                "pg.service",
                "--from",
                "/tmp/pg.toml",
            ],
        ] {
            assert!(super::Cli::try_parse_from(argv).is_err(), "{argv:?}");
        }
    }
}
