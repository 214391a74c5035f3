//! `berth install`, `berth uninstall`, `berth reload`.
//!
//! Two sources of units:
//! - a package put them in the vendor directory (`/usr/lib/systemd/…`):
//!   install only enables and starts `berth.target` and proves it works; it
//!   never writes copies that would shadow the packaged files (and removes
//!   copies an earlier source install left, for the same reason);
//! - otherwise (a source tree, or a per-user install without root) it also
//!   installs the binary, the units and, system-wide, the generator. A
//!   per-user install cannot add a user generator (systemd reads those only
//!   from system directories), so it writes the generator's output itself,
//!   and `berth reload` writes it again after a config change.
//!
//! What install did is kept in `install.json` in the state directory, so
//! that uninstall reverses exactly that and both are idempotent. Success is
//! reported only after proof: the daemon active with a live MainPID that is
//! still the same after a settle, or (without the daemon) the drain active
//! and the target reached.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::config;
use crate::paths::{Manager, Root};
use crate::records::{self, Replacement};
use crate::render::{self, Content};
use crate::systemd::{Systemd, SystemdError};
use crate::units::{self, DAEMON, DRAIN, TARGET};

/// How long the daemon must keep the same live MainPID to count as up: a
/// daemon that crashes right after READY shows here, not later.
const SETTLE: Duration = Duration::from_secs(2);
/// Bound on waiting for a unit to come up or an old daemon to go.
const UNIT_WAIT: Duration = Duration::from_secs(90);
/// Attempts at a step that failed for a transient reason (timeout, bus
/// hiccup); an error that is an answer surfaces at once.
const ATTEMPTS: u32 = 3;

/// The step that failed, named in the error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Preflight,
    Connect,
    StopOldDaemon,
    WriteFiles,
    Reload,
    Enable,
    Start,
    Verify,
    Stop,
    Disable,
    RemoveFiles,
    Purge,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Preflight => "preflight",
            Step::Connect => "connect",
            Step::StopOldDaemon => "stop the old daemon",
            Step::WriteFiles => "write files",
            Step::Reload => "reload systemd",
            Step::Enable => "enable berth.target",
            Step::Start => "start berth.target",
            Step::Verify => "verify",
            Step::Stop => "stop berth's units",
            Step::Disable => "disable berth.target",
            Step::RemoveFiles => "remove files",
            Step::Purge => "purge state",
        })
    }
}

#[derive(Debug)]
pub struct Error {
    pub step: Step,
    pub reason: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step '{}' failed: {}", self.step, self.reason)
    }
}

impl std::error::Error for Error {}

fn fail(step: Step, reason: impl fmt::Display) -> Error {
    Error {
        step,
        reason: reason.to_string(),
    }
}

/// What install did; uninstall reads it back.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    /// `package` or `files`.
    pub source: String,
    /// Files install wrote, with a fingerprint of what it wrote.
    pub files: Vec<InstalledFile>,
    /// Whether install enabled berth.target (it was not enabled before).
    pub enabled_target: bool,
    /// Whether install started berth.target (it was not active before).
    #[serde(default)]
    pub started_target: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct InstalledFile {
    pub path: PathBuf,
    pub fingerprint: String,
}

fn manifest_path(root: &Root) -> PathBuf {
    root.state_dir().join("install.json")
}

fn read_manifest(root: &Root) -> Result<Option<Manifest>, String> {
    let path = manifest_path(root);
    match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

fn write_manifest(root: &Root, m: &Manifest) -> Result<(), String> {
    let path = manifest_path(root);
    let text = serde_json::to_vec_pretty(m).expect("manifest serializes");
    write_atomic(&path, &FileContent::Bytes(text, 0o644)).map_err(|e| format!("{}: {e}", path.display()))
}

/// One file a source install puts in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileContent {
    Bytes(Vec<u8>, u32),
    Symlink(String),
}

impl FileContent {
    fn fingerprint(&self) -> String {
        let (kind, bytes) = match self {
            FileContent::Bytes(b, mode) => (format!("file {mode:o}"), b.as_slice()),
            FileContent::Symlink(t) => ("symlink".to_string(), t.as_bytes()),
        };
        format!("{kind} {:016x}", render::fnv1a(bytes))
    }

    /// Whether `path` already holds exactly this.
    fn is_at(&self, path: &Path) -> bool {
        match self {
            FileContent::Bytes(bytes, mode) => {
                fs::symlink_metadata(path).is_ok_and(|m| {
                    m.is_file() && m.permissions().mode() & 0o7777 == *mode && m.len() == bytes.len() as u64
                }) && fs::read(path).is_ok_and(|b| &b == bytes)
            }
            FileContent::Symlink(target) => fs::read_link(path).is_ok_and(|t| t == Path::new(target)),
        }
    }
}

fn fingerprint_of(path: &Path) -> Option<String> {
    let meta = fs::symlink_metadata(path).ok()?;
    let content = if meta.file_type().is_symlink() {
        FileContent::Symlink(fs::read_link(path).ok()?.to_string_lossy().into_owned())
    } else {
        FileContent::Bytes(fs::read(path).ok()?, meta.permissions().mode() & 0o7777)
    };
    Some(content.fingerprint())
}

/// Written atomically, like berth's other state (see [`records::replace`]).
fn write_atomic(path: &Path, content: &FileContent) -> io::Result<()> {
    records::replace(
        path,
        &match content {
            FileContent::Bytes(bytes, mode) => Replacement::File(bytes, *mode),
            FileContent::Symlink(target) => Replacement::Symlink(target),
        },
    )
}

/// Where a source install puts things, for one manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub bindir: PathBuf,
    pub unit_dir: PathBuf,
    /// System only: a user generator must live in a system directory.
    pub generator_dir: Option<PathBuf>,
}

impl Layout {
    pub fn for_root(root: &Root, bindir: Option<PathBuf>) -> Layout {
        match root.user_dirs() {
            None => Layout {
                bindir: bindir.unwrap_or_else(|| "/usr/local/bin".into()),
                unit_dir: "/usr/local/lib/systemd/system".into(),
                generator_dir: Some("/usr/local/lib/systemd/system-generators".into()),
            },
            Some(u) => Layout {
                bindir: bindir.unwrap_or_else(|| u.home.join(".local/bin")),
                unit_dir: u.config_home.join("systemd/user"),
                generator_dir: None,
            },
        }
    }
}

/// A directory the binary may live in for good: the units name it by
/// absolute path, so it must survive reboots and rebuilds.
pub fn check_stable_bindir(dir: &Path, runtime_dir: Option<&Path>) -> Result<(), String> {
    if !dir.is_absolute() {
        return Err(format!("{} is not an absolute path", dir.display()));
    }
    if dir.to_str().is_none() {
        return Err(format!("{} is not valid UTF-8", dir.display()));
    }
    let volatile = ["/tmp", "/var/tmp", "/dev/shm", "/run", "/proc", "/sys"];
    if let Some(v) = volatile.iter().find(|v| dir.starts_with(v)) {
        return Err(format!(
            "{} is under {v}, which does not keep files (or is not for programs)",
            dir.display()
        ));
    }
    if let Some(r) = runtime_dir.filter(|r| dir.starts_with(r)) {
        return Err(format!(
            "{} is under $XDG_RUNTIME_DIR ({}), which is removed at logout",
            dir.display(),
            r.display()
        ));
    }
    if let Some(tree) = build_tree_around(dir) {
        return Err(format!(
            "{} is inside a build or source tree ({}): a rebuild or `cargo clean` would pull the binary \
             from under the units",
            dir.display(),
            tree.display()
        ));
    }
    Ok(())
}

/// The closest directory at or above `dir` that is a build or source tree:
/// Cargo marks its target directory with CACHEDIR.TAG, and a Cargo.toml
/// means a source tree. Either is rebuilt or cleaned at will.
fn build_tree_around(dir: &Path) -> Option<&Path> {
    dir.ancestors()
        .find(|a| a.join("CACHEDIR.TAG").exists() || a.join("Cargo.toml").exists())
}

/// A regular, executable file: what may be copied to the bindir.
pub fn check_executable(path: &Path) -> Result<(), String> {
    let meta = fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(format!("{} is not executable", path.display()));
    }
    Ok(())
}

/// Whether a package installed berth's units for this manager (the vendor
/// directories), as opposed to a source install in /usr/local or ~/.config.
fn packaged_unit(root: &Root) -> Option<PathBuf> {
    let vendor = match root.manager() {
        Manager::System => ["/usr/lib/systemd/system", "/lib/systemd/system"],
        Manager::User => ["/usr/lib/systemd/user", "/lib/systemd/user"],
    };
    vendor
        .iter()
        .map(|d| root.join(d).join(DRAIN))
        .find(|p| p.exists())
}

/// A per-user install without a package: is there a system-wide user
/// generator? Without one, berth writes the generator's output itself.
fn user_generator_installed(root: &Root) -> bool {
    [
        "/etc/systemd/user-generators",
        "/usr/local/lib/systemd/user-generators",
        "/usr/lib/systemd/user-generators",
        "/lib/systemd/user-generators",
    ]
    .iter()
    .any(|d| root.join(d).join("berth-generator").exists())
}

/// Every file a source install puts in place (re-rooted paths).
pub fn planned_files(
    root: &Root,
    layout: &Layout,
    exe: &Path,
) -> Result<Vec<(PathBuf, FileContent)>, String> {
    check_stable_bindir(&layout.bindir, root.user_dirs().map(|u| u.runtime_dir.as_path()))?;
    check_executable(exe)?;
    let read = |p: &Path| fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()));
    let mut files = vec![(
        root.join(layout.bindir.join("berth")),
        FileContent::Bytes(read(exe)?, 0o755),
    )];
    if let Some(gdir) = &layout.generator_dir {
        // Next to the binary in a build; where install put it when the
        // installed binary runs install again.
        let beside = exe.with_file_name("berth-generator");
        let installed = root.join(gdir.join("berth-generator"));
        let generator = if beside.exists() || !installed.exists() {
            beside
        } else {
            installed
        };
        check_executable(&generator).map_err(|e| format!("the generator must sit next to berth: {e}"))?;
        files.push((
            root.join(gdir.join("berth-generator")),
            FileContent::Bytes(read(&generator)?, 0o755),
        ));
    }
    for (name, text) in units::render(root.manager(), &layout.bindir) {
        files.push((
            root.join(layout.unit_dir.join(name)),
            FileContent::Bytes(text.into_bytes(), 0o644),
        ));
    }
    if layout.generator_dir.is_none() && !user_generator_installed(root) {
        files.extend(generated_files(root, layout));
    }
    Ok(files)
}

/// The generator's output, for a per-user install that has no generator.
fn generated_files(root: &Root, layout: &Layout) -> Vec<(PathBuf, FileContent)> {
    let loaded = config::load(root);
    render::render_all(root, &loaded)
        .into_iter()
        .map(|f| {
            let content = match f.content {
                Content::Text(t) => FileContent::Bytes(t.into_bytes(), 0o644),
                Content::Symlink(t) => FileContent::Symlink(t),
            };
            (root.join(layout.unit_dir.join(&f.path)), content)
        })
        .collect()
}

/// Retries a step that failed for a transient reason, a bounded number of
/// times; any other error surfaces at once.
async fn retrying<T, F, Fut>(step: Step, mut attempt: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, SystemdError>>,
{
    let mut n = 1;
    loop {
        match attempt().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_transient() && n < ATTEMPTS => {
                eprintln!("berth: {step}: {e}; retrying ({n}/{ATTEMPTS})");
                tokio::time::sleep(Duration::from_millis(500 * u64::from(n))).await;
                n += 1;
            }
            Err(e) => return Err(fail(step, e)),
        }
    }
}

/// Stops `unit` and waits until it is really down: no job pending, and
/// inactive or failed.
async fn stop_and_wait(sd: &Systemd, unit: &str, step: Step) -> Result<bool, Error> {
    let state = retrying(step, || sd.active_state(unit)).await?;
    let job = retrying(step, || sd.pending_job(unit)).await?;
    if matches!(state.as_str(), "inactive" | "failed") && job == 0 {
        return Ok(false);
    }
    let stop = retrying(step, || sd.stop_unit(unit)).await?;
    sd.wait(&stop, Some(UNIT_WAIT)).await;
    let started = Instant::now();
    loop {
        let state = retrying(step, || sd.active_state(unit)).await?;
        let job = retrying(step, || sd.pending_job(unit)).await?;
        if matches!(state.as_str(), "inactive" | "failed") && job == 0 {
            return Ok(true);
        }
        if started.elapsed() > UNIT_WAIT {
            return Err(fail(
                step,
                format!(
                    "{unit} is still {state} (job {job}) after {} s",
                    UNIT_WAIT.as_secs()
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Enabled for good: `enabled-runtime` is gone at the next boot, and a
/// `linked` or `alias` unit has no wants-link, so those get enabled too.
fn is_enabled(state: &str) -> bool {
    state == "enabled"
}

/// What install reports on success.
#[derive(Debug, Default)]
pub struct Report {
    pub lines: Vec<String>,
}

impl Report {
    fn say(&mut self, line: impl Into<String>) {
        self.lines.push(line.into());
    }
}

pub async fn install(root: &Root, bindir: Option<PathBuf>, force: bool) -> Result<Report, Error> {
    let mut report = Report::default();
    if root.manager() == Manager::System && !nix::unistd::geteuid().is_root() {
        return Err(fail(
            Step::Preflight,
            "installing for the system manager needs root (for your own user: berth --user install)",
        ));
    }
    let old = read_manifest(root)
        .map_err(|e| fail(Step::Preflight, e))?
        .unwrap_or_default();
    let packaged = packaged_unit(root);
    let layout = Layout::for_root(root, bindir);
    let wanted: Vec<(PathBuf, FileContent)> = match &packaged {
        Some(_) => Vec::new(),
        None => {
            let exe = std::env::current_exe().map_err(|e| fail(Step::Preflight, e))?;
            planned_files(root, &layout, &exe).map_err(|e| fail(Step::Preflight, e))?
        }
    };
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
    // Files an earlier install wrote that this one does not want: copies
    // that would now shadow packaged units, or units no longer rendered.
    let stale: Vec<&InstalledFile> = old
        .files
        .iter()
        .filter(|f| !wanted.iter().any(|(p, _)| *p == f.path))
        .collect();
    // What install owns from now on: what it writes now and what it wrote
    // before. A file that is already there, identical, and was never
    // written by install (a `cargo install` binary, say) stays the user's.
    let owned: Vec<InstalledFile> = wanted
        .iter()
        .filter(|(p, c)| recorded(p).is_some() || !c.is_at(p))
        .map(|(path, c)| InstalledFile {
            path: path.clone(),
            fingerprint: c.fingerprint(),
        })
        .collect();
    let mut manifest = Manifest {
        source: if packaged.is_some() { "package" } else { "files" }.into(),
        files: owned.clone(),
        enabled_target: old.enabled_target,
        started_target: old.started_target,
    };

    let sd = retrying(Step::Connect, || Systemd::connect(root.manager())).await?;

    if !to_write.is_empty() || !stale.is_empty() {
        // Recorded first, stale files included, so that uninstall can undo
        // whatever part of the writing below happens.
        manifest.files.extend(stale.iter().map(|f| (*f).clone()));
        write_manifest(root, &manifest).map_err(|e| fail(Step::WriteFiles, e))?;
        // The daemon may be running from the very files being replaced.
        let stopped = stop_and_wait(&sd, DAEMON, Step::StopOldDaemon).await?;
        if stopped {
            report.say(format!(
                "stopped {DAEMON} before replacing its files (workloads untouched)"
            ));
        }
        let written = replace_files(&to_write, &stale);
        if let Err(e) = written {
            if stopped {
                // Best effort: the old daemon back, from whatever is there.
                let _ = sd.start_unit(DAEMON).await;
            }
            return Err(e);
        }
        manifest.files = owned;
        write_manifest(root, &manifest).map_err(|e| fail(Step::WriteFiles, e))?;
        if !to_write.is_empty() {
            report.say(format!("wrote {} file(s) of {}", to_write.len(), wanted.len()));
        }
        let removed = stale.iter().filter(|f| !f.path.exists()).count();
        if removed > 0 {
            report.say(format!(
                "removed {removed} file(s) of an earlier install that this one does not use"
            ));
        }
    } else if old != manifest {
        write_manifest(root, &manifest).map_err(|e| fail(Step::WriteFiles, e))?;
    }
    // Always: it also reruns the generators, so config written since the
    // last boot is what the target starts with. A reload changes no unit's
    // state, so a repeated install stays a no-op.
    retrying(Step::Reload, || sd.reload()).await?;

    let state = retrying(Step::Enable, || sd.unit_file_state(TARGET)).await?;
    if !is_enabled(&state) {
        retrying(Step::Enable, || sd.enable_unit_file(TARGET)).await?;
        retrying(Step::Reload, || sd.reload()).await?;
        manifest.enabled_target = true;
        write_manifest(root, &manifest).map_err(|e| fail(Step::Enable, e))?;
        report.say(format!("enabled {TARGET}"));
    }

    let loaded = config::load(root);
    if retrying(Step::Start, || sd.active_state(TARGET)).await? != "active" && !manifest.started_target {
        manifest.started_target = true;
        write_manifest(root, &manifest).map_err(|e| fail(Step::Start, e))?;
    }
    let job = retrying(Step::Start, || sd.start_unit(TARGET)).await?;
    match sd.wait(&job, Some(UNIT_WAIT)).await.as_deref() {
        Some("done") => {}
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
    if loaded.host.daemon.enabled {
        // Also after a reinstall that stopped it: berth.target was active
        // already, so starting it again need not restart what it wants.
        let job = retrying(Step::Start, || sd.start_unit(DAEMON)).await?;
        sd.wait(&job, Some(UNIT_WAIT)).await;
    }
    report.say(verify(&sd, loaded.host.daemon.enabled).await?);
    if root.manager() == Manager::User {
        let user = nix::unistd::User::from_uid(nix::unistd::geteuid()).ok().flatten();
        if let Some(note) = user.and_then(|u| linger_note(root, &u.name)) {
            report.say(note);
        }
    }
    Ok(report)
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
fn replace_files(to_write: &[&(PathBuf, FileContent)], stale: &[&InstalledFile]) -> Result<(), Error> {
    for (path, content) in to_write {
        write_atomic(path, content)
            .map_err(|e| fail(Step::WriteFiles, format!("{}: {e}", path.display())))?;
    }
    for f in stale {
        match fingerprint_of(&f.path) {
            Some(fp) if fp == f.fingerprint => remove_file(&f.path).map_err(|e| fail(Step::WriteFiles, e))?,
            Some(_) => eprintln!(
                "berth install: {} changed since install; left in place",
                f.path.display()
            ),
            None => {}
        }
    }
    Ok(())
}

/// The proof install reports: the daemon up with a live, unchanged MainPID
/// after a settle; or, without the daemon, the drain armed and the target
/// reached.
async fn verify(sd: &Systemd, daemon: bool) -> Result<String, Error> {
    let step = Step::Verify;
    let started = Instant::now();
    if !daemon {
        // berth.target is not ordered after the drain: its start job may
        // finish while the drain's ExecStart still runs.
        loop {
            let drain = retrying(step, || sd.active_state(DRAIN)).await?;
            let target = retrying(step, || sd.active_state(TARGET)).await?;
            if drain == "active" && target == "active" {
                return Ok(format!(
                    "verified: {DRAIN} active (drain armed), {TARGET} active; no daemon ([daemon] enabled = false)"
                ));
            }
            if drain == "failed" || target == "failed" || started.elapsed() > UNIT_WAIT {
                return Err(fail(step, format!("{DRAIN} is {drain}, {TARGET} is {target}")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // A daemon that relaunches itself (exit 75, e.g. on a binary a package
    // upgrade just replaced) gets another settle; one that keeps dying
    // does not pass.
    for _ in 0..3 {
        let pid = loop {
            let state = retrying(step, || sd.active_state(DAEMON)).await?;
            let pid: u32 = retrying(step, || sd.unit_property(DAEMON, "Service", "MainPID")).await?;
            if state == "active" && pid > 0 {
                break pid;
            }
            if state == "failed" || started.elapsed() > UNIT_WAIT {
                let result: String = sd
                    .unit_property(DAEMON, "Service", "Result")
                    .await
                    .unwrap_or_default();
                return Err(fail(
                    step,
                    format!("{DAEMON} is {state} (Result={result}); see journalctl -u {DAEMON}"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        tokio::time::sleep(SETTLE).await;
        let state = retrying(step, || sd.active_state(DAEMON)).await?;
        let now: u32 = retrying(step, || sd.unit_property(DAEMON, "Service", "MainPID")).await?;
        let result: String = retrying(step, || sd.unit_property(DAEMON, "Service", "Result")).await?;
        if state == "active" && now == pid && Path::new(&format!("/proc/{pid}")).exists() {
            let drain = retrying(step, || sd.active_state(DRAIN)).await?;
            if drain != "active" {
                return Err(fail(step, format!("{DRAIN} is {drain}: the drain is not armed")));
            }
            return Ok(format!(
                "verified: {DAEMON} active, MainPID {pid} alive after {} s; {DRAIN} active",
                SETTLE.as_secs()
            ));
        }
        if result != "success" {
            return Err(fail(
                step,
                format!(
                    "{DAEMON} did not stay up: MainPID {pid} became {now} ({state}, Result={result}) within {} s",
                    SETTLE.as_secs()
                ),
            ));
        }
    }
    Err(fail(
        step,
        format!("{DAEMON} relaunched itself three times in a row"),
    ))
}

fn remove_file(path: &Path) -> Result<(), String> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", path.display())),
    }
    // Drop-in and wants directories install created: gone when empty.
    if let Some(dir) = path.parent()
        && dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with(".d") || n.ends_with(".wants"))
    {
        let _ = fs::remove_dir(dir);
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
    let manifest = read_manifest(root).map_err(|e| fail(Step::Preflight, e))?;
    let Some(manifest) = manifest else {
        report.say("nothing to undo: no install recorded");
        if purge {
            purge_state(root, &mut report)?;
        }
        return Ok(report);
    };
    let sd = retrying(Step::Connect, || Systemd::connect(root.manager())).await?;
    if manifest.enabled_target {
        retrying(Step::Disable, || sd.disable_unit_file(TARGET)).await?;
        report.say(format!("disabled {TARGET}"));
    }
    // What install started, except the drain: it refuses a manual stop,
    // and stopping it would drain. Stopping these touches no workload. Left
    // alone when the target already ran before install and no file goes.
    if manifest.started_target || !manifest.files.is_empty() {
        for unit in [DAEMON, "berth-autostart.service", TARGET] {
            if stop_and_wait(&sd, unit, Step::Stop).await? {
                report.say(format!("stopped {unit}"));
            }
        }
    }
    let mut left = 0;
    for f in &manifest.files {
        match fingerprint_of(&f.path) {
            None => {}
            Some(fp) if fp == f.fingerprint => {
                remove_file(&f.path).map_err(|e| fail(Step::RemoveFiles, e))?
            }
            Some(_) => {
                left += 1;
                eprintln!(
                    "berth uninstall: {} changed since install; left in place",
                    f.path.display()
                );
            }
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
    retrying(Step::Reload, || sd.reload()).await?;
    let running = sd
        .list_units("berth@*.service")
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
        remove_file(&manifest_path(root)).map_err(|e| fail(Step::RemoveFiles, e))?;
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
    let mut report = Report::default();
    if let Some(mut manifest) = read_manifest(root).map_err(|e| fail(Step::Preflight, e))?
        && manifest.source == "files"
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
            match fingerprint_of(&f.path) {
                Some(fp) if fp == f.fingerprint => {
                    remove_file(&f.path).map_err(|e| fail(Step::WriteFiles, e))?;
                    changed += 1;
                }
                Some(_) => {
                    eprintln!(
                        "berth reload: {} changed since berth wrote it; left in place",
                        f.path.display()
                    );
                    manifest.files.push(f.clone());
                }
                None => {}
            }
        }
        for (path, content) in &generated {
            if !content.is_at(path) {
                write_atomic(path, content)
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
        write_manifest(root, &manifest).map_err(|e| fail(Step::WriteFiles, e))?;
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
    let sd = retrying(Step::Connect, || Systemd::connect(root.manager())).await?;
    retrying(Step::Reload, || sd.reload()).await?;
    report.say("reloaded systemd (generators rerun)");
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stable_bindir_is_neither_temporary_nor_a_build_tree() {
        assert!(check_stable_bindir(Path::new("/usr/local/bin"), None).is_ok());
        for bad in ["/tmp/x", "/var/tmp", "/run/user/1000/bin", "relative/bin"] {
            assert!(check_stable_bindir(Path::new(bad), None).is_err(), "{bad}");
        }
        let e = check_stable_bindir(Path::new("/home/u/rt/bin"), Some(Path::new("/home/u/rt"))).unwrap_err();
        assert!(e.contains("XDG_RUNTIME_DIR"), "{e}");
        // Wherever the checkout is (a tempdir may itself be under /tmp).
        let tree = tempfile::tempdir().unwrap();
        let bin = tree.path().join("target/release");
        fs::create_dir_all(&bin).unwrap();
        assert_eq!(build_tree_around(&bin), None);
        fs::write(tree.path().join("Cargo.toml"), "").unwrap();
        assert_eq!(build_tree_around(&bin), Some(tree.path()));
        fs::write(bin.parent().unwrap().join("CACHEDIR.TAG"), "").unwrap();
        assert_eq!(build_tree_around(&bin), Some(bin.parent().unwrap()));
    }

    fn err(name: &str) -> SystemdError {
        SystemdError {
            operation: "StopUnit",
            unit: "berth-daemon.service".into(),
            error_name: name.into(),
            message: "m".into(),
        }
    }

    #[test]
    fn transient_failures_are_retried_a_bounded_number_of_times() {
        let rt = crate::systemd::runtime().unwrap();
        let calls = std::cell::Cell::new(0);
        // Two timeouts, then an answer: retried, succeeds.
        let r = rt.block_on(retrying(Step::StopOldDaemon, || {
            calls.set(calls.get() + 1);
            let n = calls.get();
            async move {
                if n < 3 {
                    Err(err("org.freedesktop.DBus.Error.NoReply"))
                } else {
                    Ok(n)
                }
            }
        }));
        assert_eq!(r.unwrap(), 3);
        // Always transient: gives up after ATTEMPTS, naming the step.
        calls.set(0);
        let r: Result<(), Error> = rt.block_on(retrying(Step::StopOldDaemon, || {
            calls.set(calls.get() + 1);
            async { Err(err("")) }
        }));
        assert_eq!(calls.get(), ATTEMPTS);
        assert!(
            r.unwrap_err()
                .to_string()
                .starts_with("step 'stop the old daemon' failed")
        );
        // A real answer surfaces at once.
        calls.set(0);
        let r: Result<(), Error> = rt.block_on(retrying(Step::StopOldDaemon, || {
            calls.set(calls.get() + 1);
            async { Err(err("org.freedesktop.DBus.Error.AccessDenied")) }
        }));
        assert_eq!(calls.get(), 1);
        assert!(r.unwrap_err().reason.contains("AccessDenied"));
    }

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

    #[test]
    fn only_regular_executables_are_installed() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        fs::write(&f, b"x").unwrap();
        assert!(check_executable(&f).unwrap_err().contains("not executable"));
        fs::set_permissions(&f, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(check_executable(&f).is_ok());
        assert!(
            check_executable(dir.path())
                .unwrap_err()
                .contains("not a regular file")
        );
        assert!(check_executable(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn written_files_are_recognized_and_fingerprinted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b.service");
        let content = FileContent::Bytes(b"[Unit]\n".to_vec(), 0o644);
        assert!(!content.is_at(&path));
        write_atomic(&path, &content).unwrap();
        assert!(content.is_at(&path));
        assert_eq!(fingerprint_of(&path), Some(content.fingerprint()));
        assert!(!FileContent::Bytes(b"[Unit]\n".to_vec(), 0o755).is_at(&path));
        let link = dir.path().join("a/x.wants/l");
        let target = FileContent::Symlink("../b.service".into());
        write_atomic(&link, &target).unwrap();
        assert!(target.is_at(&link));
        remove_file(&link).unwrap();
        assert!(
            !dir.path().join("a/x.wants").exists(),
            "an emptied .wants directory goes too"
        );
    }
}
