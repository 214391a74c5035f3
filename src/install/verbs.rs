//! The verbs: install, uninstall, reload, each a sequence of the steps in
//! [`super::steps`] over the files [`super::layout`] planned, recorded in
//! the manifest so that each can be run again, or undone.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::files::{self, FileContent, Removal, fingerprint_of};
use super::layout::{Layout, generated_files, packaged_unit, planned_files, user_generator_installed};
use super::steps::{Stopped, UNIT_WAIT, is_enabled, retrying, stop_and_wait, stop_within, verify};
use super::{Error, Report, Step, fail};
use crate::config;
use crate::names::{AUTOSTART, DAEMON, FENCE_WATCH, TARGET};
use crate::paths::{Manager, Root};
use crate::state::manifest::{self, InstalledFile, Manifest, Source};
use crate::systemd::{ActiveState, JobResult, Ops, Systemd};
use crate::units;

pub async fn install(root: &Root, bindir: Option<PathBuf>, force: bool) -> Result<Report, Error> {
    let mut report = Report::default();
    if root.manager() == Manager::System && !nix::unistd::geteuid().is_root() {
        return Err(fail(
            Step::Preflight,
            "installing for the system manager needs root (for your own user: berth --user install)",
        ));
    }
    let old = manifest::read(root)
        .map_err(|e| fail(Step::Preflight, e))?
        .unwrap_or_default();
    let packaged = packaged_unit(root).is_some();
    let wanted: Vec<(PathBuf, FileContent)> = if packaged {
        Vec::new()
    } else {
        let exe = std::env::current_exe().map_err(|e| fail(Step::Preflight, e))?;
        planned_files(root, &Layout::for_root(root, bindir), &exe).map_err(|e| fail(Step::Preflight, e))?
    };
    let plan = Plan::of(&old, &wanted, packaged, force)?;
    let sd = retrying(&mut report, Step::Connect, || Systemd::connect(root.manager())).await?;
    let mut manifest = write_planned(&sd, root, &old, plan, wanted.len(), &mut report).await?;
    // Always: it also reruns the generators, so config written since the
    // last boot is what the target starts with. A reload changes no unit's
    // state, so a repeated install stays a no-op.
    retrying(&mut report, Step::Reload, || sd.reload()).await?;
    enable_target(&sd, root, &mut manifest, &mut report).await?;
    let loaded = config::load(root);
    start_target(&sd, root, &mut manifest, loaded.host.daemon.enabled, &mut report).await?;
    let verified = verify(&sd, &mut report, loaded.host.daemon.enabled).await?;
    report.say(verified);
    if root.manager() == Manager::User {
        let user = nix::unistd::User::from_uid(nix::unistd::geteuid()).ok().flatten();
        if let Some(note) = user.and_then(|u| linger_note(root, &u.name)) {
            report.say(note);
        }
    }
    Ok(report)
}

/// What an install writes, removes and owns afterwards.
struct Plan<'a> {
    to_write: Vec<&'a (PathBuf, FileContent)>,
    /// Files an earlier install wrote that this one does not want: copies
    /// that would now shadow packaged units, or units no longer rendered.
    stale: Vec<&'a InstalledFile>,
    /// What install owns from now on: what it writes now and what it
    /// wrote before. A file that is already there, identical, and was
    /// never written by install (a `cargo install` binary, say) stays the
    /// user's.
    owned: Vec<InstalledFile>,
    manifest: Manifest,
}

impl<'a> Plan<'a> {
    fn of(
        old: &'a Manifest,
        wanted: &'a [(PathBuf, FileContent)],
        packaged: bool,
        force: bool,
    ) -> Result<Plan<'a>, Error> {
        let recorded = |p: &Path| old.files.iter().find(|f| f.path == p);
        let to_write: Vec<&(PathBuf, FileContent)> = wanted.iter().filter(|(p, c)| !c.is_at(p)).collect();
        // Never replace what berth install did not write, or what changed
        // since it did (an admin's edit), unless told to.
        let foreign: Vec<String> = to_write
            .iter()
            .filter(|(p, _)| fs::symlink_metadata(p).is_ok())
            .filter(|(p, _)| recorded(p).is_none_or(|f| fingerprint_of(p).as_ref() != Some(&f.fingerprint)))
            .map(|(p, _)| p.display().to_string())
            .collect();
        if !foreign.is_empty() && !force {
            return Err(fail(
                Step::Preflight,
                format!(
                    "{} exist(s), differ(s) from what install would write, and berth install did not write it \
                     or it changed since; remove it, or pass --force to replace it",
                    foreign.join(", ")
                ),
            ));
        }
        let stale = old
            .files
            .iter()
            .filter(|f| !wanted.iter().any(|(p, _)| *p == f.path))
            .collect();
        let owned: Vec<InstalledFile> = wanted
            .iter()
            .filter(|(p, c)| recorded(p).is_some() || !c.is_at(p))
            .map(|(path, c)| InstalledFile {
                path: path.clone(),
                fingerprint: c.fingerprint(),
            })
            .collect();
        let manifest = Manifest {
            source: if packaged { Source::Package } else { Source::Files },
            files: owned.clone(),
            enabled_target: old.enabled_target,
            started_target: old.started_target,
        };
        Ok(Plan {
            to_write,
            stale,
            owned,
            manifest,
        })
    }
}

/// Writes and removes what `plan` says, the manifest recorded before and
/// after; the manifest as it stands.
async fn write_planned(
    sd: &Systemd,
    root: &Root,
    old: &Manifest,
    plan: Plan<'_>,
    wanted: usize,
    report: &mut Report,
) -> Result<Manifest, Error> {
    let Plan {
        to_write,
        stale,
        owned,
        mut manifest,
    } = plan;
    if to_write.is_empty() && stale.is_empty() {
        if *old != manifest {
            manifest::write(root, &manifest).map_err(|e| fail(Step::WriteFiles, e))?;
        }
        return Ok(manifest);
    }
    // Recorded first, stale files included, so that uninstall can undo
    // whatever part of the writing below happens.
    manifest.files.extend(stale.iter().map(|f| (*f).clone()));
    manifest::write(root, &manifest).map_err(|e| fail(Step::WriteFiles, e))?;
    // The daemon may be running from the very files being replaced.
    let stopped = stop_and_wait(sd, report, DAEMON, Step::StopOldDaemon).await?;
    if stopped {
        report.say(format!(
            "stopped {DAEMON} before replacing its files (workloads untouched)"
        ));
    }
    let written = replace_files(&to_write, &stale, report);
    if let Err(e) = written {
        if stopped {
            // Best effort: the old daemon back, from whatever is there.
            let _ = sd.start(DAEMON).await;
        }
        return Err(e);
    }
    manifest.files = owned;
    manifest::write(root, &manifest).map_err(|e| fail(Step::WriteFiles, e))?;
    if !to_write.is_empty() {
        report.say(format!("wrote {} file(s) of {wanted}", to_write.len()));
    }
    let removed = stale.iter().filter(|f| !f.path.exists()).count();
    if removed > 0 {
        report.say(format!(
            "removed {removed} file(s) of an earlier install that this one does not use"
        ));
    }
    Ok(manifest)
}

/// Enables berth.target unless it is, noted in the manifest.
async fn enable_target(
    sd: &Systemd,
    root: &Root,
    manifest: &mut Manifest,
    report: &mut Report,
) -> Result<(), Error> {
    let state = retrying(report, Step::Enable, || sd.unit_file_state(TARGET)).await?;
    if !is_enabled(&state) {
        retrying(report, Step::Enable, || sd.enable_unit_file(TARGET)).await?;
        retrying(report, Step::Reload, || sd.reload()).await?;
        manifest.enabled_target = true;
        manifest::write(root, manifest).map_err(|e| fail(Step::Enable, e))?;
        report.say(format!("enabled {TARGET}"));
    }
    Ok(())
}

/// Starts berth.target (noted in the manifest when install is what
/// started it), and the daemon when it is enabled.
async fn start_target(
    sd: &Systemd,
    root: &Root,
    manifest: &mut Manifest,
    daemon: bool,
    report: &mut Report,
) -> Result<(), Error> {
    if retrying(report, Step::Start, || sd.active_state(TARGET)).await? != ActiveState::Active
        && !manifest.started_target
    {
        manifest.started_target = true;
        manifest::write(root, manifest).map_err(|e| fail(Step::Start, e))?;
    }
    let job = retrying(report, Step::Start, || sd.start(TARGET)).await?;
    match sd.wait(&job, Some(UNIT_WAIT)).await {
        Some(JobResult::Done) => {}
        Some(other) => {
            return Err(fail(
                Step::Start,
                format!("the start job of {TARGET} ended '{other}'"),
            ));
        }
        None => {
            return Err(fail(
                Step::Start,
                format!("{TARGET} did not start within {} s", UNIT_WAIT.as_secs()),
            ));
        }
    }
    if daemon {
        // Also after a reinstall that stopped it: berth.target was active
        // already, so starting it again need not restart what it wants.
        let job = retrying(report, Step::Start, || sd.start(DAEMON)).await?;
        sd.wait(&job, Some(UNIT_WAIT)).await;
    }
    Ok(())
}

/// A user manager without lingering stops at logout (draining the
/// workloads) and does not start at boot: worth saying at install.
fn linger_note(root: &Root, user: &str) -> Option<String> {
    if root.join("/var/lib/systemd/linger").join(user).exists() {
        return None;
    }
    Some(format!(
        "note: lingering is off for {user}: your workloads are drained when your last session ends and \
         start again only at your next login; `loginctl enable-linger` keeps them running and starts them at boot"
    ))
}

/// Writes what changed and removes stale files whose content is still what
/// install wrote (an admin's edit is left, with a message).
fn replace_files(
    to_write: &[&(PathBuf, FileContent)],
    stale: &[&InstalledFile],
    report: &mut Report,
) -> Result<(), Error> {
    for (path, content) in to_write {
        files::write(path, content)
            .map_err(|e| fail(Step::WriteFiles, format!("{}: {e}", path.display())))?;
    }
    for f in stale {
        if files::remove_if_unchanged(f).map_err(|e| fail(Step::WriteFiles, e))? == Removal::Changed {
            report.warn(format!(
                "{} changed since install; left in place",
                f.path.display()
            ));
        }
    }
    Ok(())
}

pub async fn uninstall(root: &Root, purge: bool) -> Result<Report, Error> {
    let mut report = Report::default();
    if root.manager() == Manager::System && !nix::unistd::geteuid().is_root() {
        return Err(fail(
            Step::Preflight,
            "uninstalling from the system manager needs root",
        ));
    }
    let manifest = manifest::read(root).map_err(|e| fail(Step::Preflight, e))?;
    let Some(manifest) = manifest else {
        report.say("nothing to undo: no install recorded");
        if purge {
            purge_state(root, &mut report)?;
        }
        return Ok(report);
    };
    let sd = retrying(&mut report, Step::Connect, || Systemd::connect(root.manager())).await?;
    if manifest.enabled_target {
        retrying(&mut report, Step::Disable, || sd.disable_unit_file(TARGET)).await?;
        report.say(format!("disabled {TARGET}"));
    }
    // What install started, except the drain: it refuses a manual stop,
    // and stopping it would drain. Stopping these touches no workload. Left
    // alone when the target already ran before install and no file goes.
    if manifest.started_target || !manifest.files.is_empty() {
        for unit in [DAEMON, FENCE_WATCH, AUTOSTART, TARGET] {
            if unit == FENCE_WATCH
                && let Some(device) = held_watchdog(root)
            {
                stop_fence_watch(&sd, &mut report, &device).await?;
            } else if stop_and_wait(&sd, &mut report, unit, Step::Stop).await? {
                report.say(format!("stopped {unit}"));
            }
        }
    }
    let mut left = 0;
    for f in &manifest.files {
        if files::remove_if_unchanged(f).map_err(|e| fail(Step::RemoveFiles, e))? == Removal::Changed {
            left += 1;
            report.warn(format!(
                "{} changed since install; left in place",
                f.path.display()
            ));
        }
    }
    if !manifest.files.is_empty() {
        report.say(format!(
            "removed {} file(s) install wrote{}",
            manifest.files.len() - left,
            if left > 0 {
                format!(", left {left} changed one(s)")
            } else {
                String::new()
            }
        ));
    }
    retrying(&mut report, Step::Reload, || sd.reload()).await?;
    let running = sd
        .list_workloads(&[])
        .await
        .map(|units| units.iter().filter(|u| u.is_running()).count())
        .unwrap_or(0);
    if running > 0 {
        report.say(format!(
            "{running} workload(s) left running{}",
            if manifest.files.is_empty() {
                ""
            } else {
                ": their units are gone, so no drain stops them at shutdown; stop them first if that matters"
            }
        ));
    }
    if purge {
        purge_state(root, &mut report)?;
    } else {
        files::remove(&manifest::path(root)).map_err(|e| fail(Step::RemoveFiles, e))?;
        report.say(format!("kept state in {}", root.state_dir().display()));
    }
    Ok(report)
}

/// Empties the state directory; the directory itself stays (tmpfiles.d
/// owns it, and it may be a mount point).
fn purge_state(root: &Root, report: &mut Report) -> Result<(), Error> {
    let dir = root.state_dir();
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(fail(Step::Purge, format!("{}: {e}", dir.display()))),
    };
    for entry in entries {
        let path = entry.map_err(|e| fail(Step::Purge, e))?.path();
        let removed = if path.is_dir() && !path.is_symlink() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        removed.map_err(|e| fail(Step::Purge, format!("{}: {e}", path.display())))?;
    }
    report.say(format!("purged the state in {}", dir.display()));
    Ok(())
}

/// `berth reload`: a per-user install without a generator gets the
/// generator's output rewritten; then systemd reloads (which reruns the
/// generators where there are some).
pub async fn reload(root: &Root) -> Result<Report, Error> {
    let mut report = render_per_user(root)?;
    let sd = retrying(&mut report, Step::Connect, || Systemd::connect(root.manager())).await?;
    retrying(&mut report, Step::Reload, || sd.reload()).await?;
    report.say("reloaded systemd (generators rerun)");
    Ok(report)
}

/// On a per-user install without a generator (no system-wide user
/// generator), writes what the generator would: every verb that changes
/// the configuration and reloads (`reload`, `add`, `remove`) runs it
/// before the daemon-reload, so that the reload sees the change. Nothing
/// to do elsewhere.
pub fn render_per_user(root: &Root) -> Result<Report, Error> {
    let mut report = Report::default();
    if let Some(mut manifest) = manifest::read(root).map_err(|e| fail(Step::Preflight, e))?
        && manifest.source == Source::Files
        && let Some(user) = root.user_dirs()
    {
        let unit_dir = user.config_home.join("systemd/user");
        let layout = Layout {
            bindir: PathBuf::new(),
            unit_dir: unit_dir.clone(),
            generator_dir: None,
        };
        // With a system-wide user generator now installed (a package came
        // later), its output is what counts: per-user copies would shadow it.
        let generated = if user_generator_installed(root) {
            Vec::new()
        } else {
            generated_files(root, &layout)
        };
        let unit_names: Vec<PathBuf> = units::TEMPLATES
            .iter()
            .map(|(n, _)| root.join(unit_dir.join(n)))
            .collect();
        // Generated files are everything install wrote under the unit
        // directory that is not a packaged unit (and not the binary).
        let unit_root = root.join(&unit_dir);
        let (old_generated, kept): (Vec<InstalledFile>, Vec<InstalledFile>) = manifest
            .files
            .drain(..)
            .partition(|f| f.path.starts_with(&unit_root) && !unit_names.contains(&f.path));
        manifest.files = kept;
        let mut changed = 0;
        for f in &old_generated {
            if generated.iter().any(|(p, _)| *p == f.path) {
                continue;
            }
            match files::remove_if_unchanged(f).map_err(|e| fail(Step::WriteFiles, e))? {
                Removal::Removed => changed += 1,
                Removal::Changed => {
                    report.warn(format!(
                        "{} changed since berth wrote it; left in place",
                        f.path.display()
                    ));
                    manifest.files.push(f.clone());
                }
                Removal::Absent => {}
            }
        }
        for (path, content) in &generated {
            if !content.is_at(path) {
                files::write(path, content)
                    .map_err(|e| fail(Step::WriteFiles, format!("{}: {e}", path.display())))?;
                changed += 1;
            }
        }
        manifest
            .files
            .extend(generated.iter().map(|(path, c)| InstalledFile {
                path: path.clone(),
                fingerprint: c.fingerprint(),
            }));
        manifest::write(root, &manifest).map_err(|e| fail(Step::WriteFiles, e))?;
        if user_generator_installed(root) {
            report.say(format!(
                "a system-wide user generator is installed: removed {changed} per-user copies of its output"
            ));
        } else {
            report.say(format!(
                "rendered the generator's output: {changed} file(s) changed"
            ));
        }
    }
    Ok(report)
}

/// The watchdog device fence-watch holds (its armed file), or the one
/// berth.toml gives it, if any.
fn held_watchdog(root: &Root) -> Option<PathBuf> {
    crate::state::cluster::read_armed(&root.runtime_dir())
        .map(|(device, _)| device)
        .or_else(|| config::load(root).host.cluster?.watchdog.map(|w| w.device))
}

/// How long uninstall waits for fence-watch when it holds a watchdog.
const HELD_WAIT: Duration = Duration::from_secs(5);

/// fence-watch holding a watchdog closes it only once every HA workload
/// here is down, and uninstall stops none: with one running, its stop
/// stays queued (the fence stops them when the daemon's maintenance grace
/// ends, then the device is closed without a reset). Said, not failed.
async fn stop_fence_watch<O: Ops>(sd: &O, report: &mut Report, device: &Path) -> Result<(), Error> {
    match stop_within(sd, report, FENCE_WATCH, Step::Stop, HELD_WAIT).await? {
        Stopped::WasDown => {}
        Stopped::Down => report.say(format!("stopped {FENCE_WATCH}")),
        Stopped::Stopping => report.warn(format!(
            "{FENCE_WATCH} is stopping but holds {} while an HA workload runs here; it closes it without a reset once they are down (the fence stops them when the maintenance grace ends)",
            device.display()
        )),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_without_lingering_is_told() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        assert!(
            linger_note(&root, "u")
                .unwrap()
                .contains("loginctl enable-linger")
        );
        fs::create_dir_all(dir.path().join("var/lib/systemd/linger")).unwrap();
        fs::write(dir.path().join("var/lib/systemd/linger/u"), "").unwrap();
        assert_eq!(linger_note(&root, "u"), None);
    }
}
