//! Workloads a control plane adds and removes while the host runs
//! (`berth add`, `berth remove`): the workload file written atomically
//! where the generator reads it, one daemon-reload shared by concurrent
//! writers ([`reload`]), then the start or after the stop.

pub mod reload;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::config::{self, ConfigError};
use crate::names::unit_name;
use crate::paths::{Root, WORKLOAD_DIR};
use crate::state::atomic::{self, Replacement};
use crate::systemd::{JobResult, Ops};

pub use reload::ReloadError;

/// Where a workload file goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// `/etc/berth/workloads`: kept across reboots.
    Admin,
    /// `/run/berth/workloads`: gone at the next boot.
    Runtime,
}

impl Place {
    /// The workloads directory (the first two of the configuration
    /// directories, in precedence order).
    pub fn dir(self, root: &Root) -> PathBuf {
        let dirs = root.config_dirs();
        let i = match self {
            Place::Admin => 0,
            Place::Runtime => 1,
        };
        dirs[i].join(WORKLOAD_DIR)
    }
}

#[derive(Debug)]
pub enum ChangeError {
    /// The text breaks the configuration rules, as the generator says.
    Invalid(Vec<ConfigError>),
    /// A file of that name is there already (a remove comes first).
    Exists(PathBuf),
    /// A file of that name in a directory of higher precedence would mask
    /// the new one.
    Masked(PathBuf),
    /// No workload file of that name.
    Missing(String),
    /// A guest `[libvirt] guests = "all"` covers: it has no file to remove.
    CoveredGuest(String),
    /// The add would override the file of a workload whose unit runs,
    /// and no stop was asked for.
    OverridesRunning(String, PathBuf),
    /// Only the admin and runtime directories are berth's to change.
    Packaged(PathBuf),
    /// Still running, and no stop was asked for: its file must stay while
    /// it runs (the drop-in carries its stop).
    Running(String),
    /// The host is shutting down.
    Stopping,
    /// The file was replaced or removed meanwhile (another add or remove).
    Changed(PathBuf),
    Io(PathBuf, std::io::Error),
    Systemd(String),
    /// Before anything was changed.
    Reload(ReloadError),
    /// After the change: the file is written (or gone), systemd has not
    /// loaded it yet.
    NotLoaded(PathBuf, ReloadError),
}

impl std::fmt::Display for ChangeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = |p: &Path| config::shown_path(p);
        match self {
            ChangeError::Invalid(errors) => {
                let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
                write!(f, "refused, nothing written:\n{}", lines.join("\n"))
            }
            ChangeError::Exists(p) => write!(f, "{} exists already; `berth remove` it first", shown(p)),
            ChangeError::Masked(p) => write!(
                f,
                "{} would take precedence over the new file (/etc/berth wins over /run/berth); nothing written",
                shown(p)
            ),
            ChangeError::Missing(name) => write!(f, "no workload {name:?} is configured"),
            ChangeError::CoveredGuest(name) => write!(
                f,
                "{name} is a libvirt guest covered by [libvirt] guests = \"all\", with no file to remove: add it to \
                 [libvirt] exclude in berth.toml, or mask it (ln -s /dev/null /etc/berth/workloads/{name}.toml), \
                 then `berth reload`"
            ),
            ChangeError::Packaged(p) => write!(
                f,
                "{} belongs to a package; mask it instead (a symlink to /dev/null of the same name in /etc/berth/workloads)",
                shown(p)
            ),
            ChangeError::Running(unit) => write!(
                f,
                "{unit} is running; its file stays while it runs (its stop is in the drop-in made from it): use --stop"
            ),
            ChangeError::OverridesRunning(unit, p) => write!(
                f,
                "{unit} is running as {} defines it; an override would leave it running without the drop-in \
                 made from that file: use --stop to stop it first, or add once it is down; nothing written",
                shown(p)
            ),
            ChangeError::Stopping => write!(f, "the system is shutting down; nothing changed"),
            ChangeError::Changed(p) => write!(
                f,
                "{} was replaced or removed meanwhile by another add or remove; nothing changed",
                shown(p)
            ),
            ChangeError::Io(p, e) => write!(f, "{}: {e}", shown(p)),
            ChangeError::Systemd(e) => write!(f, "{e}"),
            ChangeError::Reload(e) => write!(f, "{e}; nothing changed"),
            ChangeError::NotLoaded(p, e) => write!(
                f,
                "{} is changed, but {e}: `systemctl daemon-reload` loads it",
                shown(p)
            ),
        }
    }
}

/// What an add or a remove did.
#[derive(Debug)]
pub struct Done {
    pub path: PathBuf,
    /// This call ran the daemon-reload (false: another writer's covered it).
    pub reloaded: bool,
    /// With --now / --stop: how the start or stop job ended.
    pub job: Option<JobResult>,
    /// An add that overrode a running workload: its unit, stopped first.
    pub overridden: Option<(String, JobResult)>,
}

/// Refused while the system shuts down: a unit loaded then would be
/// stopped by the shutdown transaction, or miss the drain.
async fn refuse_if_stopping<O: Ops>(ops: &O) -> Result<(), ChangeError> {
    match ops.system_state().await {
        Ok(state) if state == "stopping" => Err(ChangeError::Stopping),
        Ok(_) => Ok(()),
        Err(e) => Err(ChangeError::Systemd(e.to_string())),
    }
}

/// Adds workload `name` defined by `text`: checked like the generator
/// checks it, written atomically (a temporary name that never matches
/// `*.toml`), systemd reloaded (or covered by a concurrent writer's
/// reload), and with `start` the unit started and its job waited for.
/// A file of the name in a directory of lower precedence is overridden;
/// if its workload runs, it is stopped first with `stop_overridden`, and
/// the add refused without (as `remove` refuses).
pub async fn add<O: Ops>(
    ops: &O,
    root: &Root,
    name: &str,
    text: &str,
    place: Place,
    start: bool,
    stop_overridden: bool,
) -> Result<Done, ChangeError> {
    let path = place.dir(root).join(format!("{name}.toml"));
    let w = config::check_workload_text(root, name, &path, text).map_err(ChangeError::Invalid)?;
    if let Some(existing) = w.existing_unit() {
        // What only the loaded unit tells: an alias, an ordering cycle
        // with the drain, no such unit. Refused before anything is written.
        let problems = crate::live::takeover_check(ops, existing)
            .await
            .map_err(|e| ChangeError::Systemd(e.to_string()))?;
        if !problems.is_empty() {
            return Err(ChangeError::Invalid(
                problems
                    .into_iter()
                    .map(|p| config::ConfigError::key(&path, "unit", p))
                    .collect(),
            ));
        }
    }
    let unit = w.unit_name();
    refuse_if_stopping(ops).await?;
    let overridden = stop_overridden_workload(ops, root, name, &path, stop_overridden).await?;
    let reloaded = change_then_reload(ops, root, &path, || {
        // Checked under the lock, so that two adds of one name cannot
        // both find it free, nor two adds of one unit both find it
        // unclaimed. A file of the name in a directory of lower
        // precedence (runtime, packages) is overridden, as asked.
        config::check_against_others(root, &w).map_err(ChangeError::Invalid)?;
        let here = path.clone();
        let admin = Place::Admin.dir(root).join(format!("{name}.toml"));
        if here.symlink_metadata().is_ok() {
            return Err(ChangeError::Exists(here));
        }
        if place == Place::Runtime && admin.symlink_metadata().is_ok() {
            return Err(ChangeError::Masked(admin));
        }
        atomic::replace(&path, &Replacement::File(text.as_bytes(), 0o644))
            .map_err(|e| ChangeError::Io(path.clone(), e))
    })
    .await?;
    let job = if start {
        let job = ops
            .start(&unit)
            .await
            .map_err(|e| ChangeError::Systemd(e.to_string()))?;
        ops.wait(&job, None).await
    } else {
        None
    };
    Ok(Done {
        path,
        reloaded,
        job,
        overridden,
    })
}

/// The workload an add to `path` overrides (its file, of lower
/// precedence, wins now): a running one would be left running without
/// the drop-in made from its file (or, when the override names another
/// unit, unmanaged altogether), so it is stopped first when asked, and
/// the add refused otherwise. An existing unit (`unit =`) keeps running
/// under its own rules, as at a remove. Returns the stop's result.
async fn stop_overridden_workload<O: Ops>(
    ops: &O,
    root: &Root,
    name: &str,
    path: &Path,
    stop: bool,
) -> Result<Option<(String, JobResult)>, ChangeError> {
    // Only a file of lower precedence is overridden: an admin file masks
    // a runtime add, which is refused under the lock.
    let admin = Place::Admin.dir(root);
    let Some(current) =
        config::find_workload_file(root, name).filter(|p| p != path && p.parent() != Some(admin.as_path()))
    else {
        return Ok(None);
    };
    let (unit, existing, running) = unit_and_state(ops, root, name).await?;
    if !running || (existing && !stop) {
        return Ok(None);
    }
    if !stop {
        return Err(ChangeError::OverridesRunning(unit, current));
    }
    let result = stop_and_wait(ops, &unit).await?;
    Ok(Some((unit, result)))
}

/// Workload `name`'s unit as its file now defines it, whether that is an
/// existing unit (`unit =`), and whether it runs. A file that no longer
/// parses is taken for a `berth@` unit's: that is the unit whose drop-in
/// would be lost. Starting (a readiness wait can last its whole start
/// timeout) and stopping count as running.
async fn unit_and_state<O: Ops>(
    ops: &O,
    root: &Root,
    name: &str,
) -> Result<(String, bool, bool), ChangeError> {
    let existing = config::load_workload(root, name).and_then(|w| w.existing_unit().map(str::to_string));
    let unit = existing.clone().unwrap_or_else(|| unit_name(name));
    let running = !ops
        .active_state(&unit)
        .await
        .map_err(|e| ChangeError::Systemd(e.to_string()))?
        .is_down();
    Ok((unit, existing.is_some(), running))
}

/// Stops `unit` and waits for its job: anything but done is an error,
/// and nothing is changed.
async fn stop_and_wait<O: Ops>(ops: &O, unit: &str) -> Result<JobResult, ChangeError> {
    let job = ops
        .stop(unit)
        .await
        .map_err(|e| ChangeError::Systemd(e.to_string()))?;
    match ops.wait(&job, None).await {
        Some(JobResult::Done) => Ok(JobResult::Done),
        result => Err(ChangeError::Systemd(format!(
            "the stop of {unit} ended {}; nothing changed",
            result.map_or("without a result".to_string(), |r| r.to_string())
        ))),
    }
}

/// Removes workload `name`'s file (the one that wins) and reloads. A
/// running workload is stopped first with `stop`, refused without.
pub async fn remove<O: Ops>(ops: &O, root: &Root, name: &str, stop: bool) -> Result<Done, ChangeError> {
    if !crate::names::is_valid_workload_name(name) {
        return Err(ChangeError::Missing(name.to_string()));
    }
    let path = config::find_workload_file(root, name).ok_or_else(|| {
        if config::load_workload(root, name).is_some_and(|w| w.from_all_guests) {
            ChangeError::CoveredGuest(name.to_string())
        } else {
            ChangeError::Missing(name.to_string())
        }
    })?;
    if path.parent() != Some(Place::Admin.dir(root).as_path())
        && path.parent() != Some(Place::Runtime.dir(root).as_path())
    {
        return Err(ChangeError::Packaged(path));
    }
    let identity = std::fs::symlink_metadata(&path).ok().map(|m| (m.dev(), m.ino()));
    refuse_if_stopping(ops).await?;
    // Only a unit that is down may lose its drop-in. An existing unit
    // (`unit =`) keeps running under its own rules without it, the
    // shutdown transaction stopping it again.
    let (unit, existing, running) = unit_and_state(ops, root, name).await?;
    let job = if running && (stop || !existing) {
        if !stop {
            return Err(ChangeError::Running(unit));
        }
        Some(stop_and_wait(ops, &unit).await?)
    } else {
        None
    };
    let reloaded = change_then_reload(ops, root, &path, || {
        // Still the file that was found: another remove and an add of the
        // same name may have come in between, and the new file is not
        // this remove's to take.
        match std::fs::symlink_metadata(&path) {
            Ok(now) if Some((now.dev(), now.ino())) == identity => {}
            _ => return Err(ChangeError::Changed(path.clone())),
        }
        std::fs::remove_file(&path).map_err(|e| ChangeError::Io(path.clone(), e))
    })
    .await?;
    Ok(Done {
        path,
        reloaded,
        job,
        overridden: None,
    })
}

/// `change` to the file at `path`, counted under the write lock, then a
/// daemon-reload that covers it; true when this call ran the reload.
async fn change_then_reload<O: Ops>(
    ops: &O,
    root: &Root,
    path: &Path,
    change: impl FnOnce() -> Result<(), ChangeError>,
) -> Result<bool, ChangeError> {
    let generation = reload::counted(root, change)
        .await
        .map_err(ChangeError::Reload)??;
    reload::reload_covering(ops, root, generation)
        .await
        .map_err(|e| ChangeError::NotLoaded(path.to_path_buf(), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::systemd::fake::{Behaviour, FakeOps};
    use std::time::Duration;

    const WEB: &str = "exec = [\"/usr/bin/web\"]\n";

    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    #[tokio::test]
    async fn an_add_writes_reloads_and_starts() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let ops = FakeOps::default().unit("web", false, Behaviour::Takes(Duration::ZERO));
        let done = add(&ops, &root, "web", WEB, Place::Admin, true, false)
            .await
            .unwrap();
        assert_eq!(done.path, dir.path().join("etc/berth/workloads/web.toml"));
        assert_eq!(std::fs::read_to_string(&done.path).unwrap(), WEB);
        assert!(done.reloaded);
        assert_eq!(done.job, Some(JobResult::Done));
        assert_eq!(*ops.reloads.borrow(), 1);
        assert!(matches!(
            add(&ops, &root, "web", WEB, Place::Admin, false, false).await,
            Err(ChangeError::Exists(_))
        ));
        assert!(
            matches!(
                add(&ops, &root, "web", WEB, Place::Runtime, false, false).await,
                Err(ChangeError::Masked(_))
            ),
            "/etc wins: a runtime file would never be read"
        );
        assert_eq!(files(&Place::Runtime.dir(&root)), Vec::<String>::new());
    }

    /// Refused input names file, key and reason, and leaves nothing
    /// behind (no file, no temporary file, no reload).
    #[tokio::test]
    async fn a_refused_add_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let ops = FakeOps::default();
        let Err(ChangeError::Invalid(errors)) = add(
            &ops,
            &root,
            "web",
            "exec = \"/bin/x\"\norder = \"first\"\n",
            Place::Admin,
            true,
            false,
        )
        .await
        else {
            panic!("accepted")
        };
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert!(
            text.iter()
                .any(|e| e.contains("etc/berth/workloads/web.toml: exec: must be a list")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|e| e.contains("web.toml: order: must be an integer")),
            "{text:?}"
        );
        assert!(matches!(
            add(&ops, &root, "../x", WEB, Place::Admin, false, false).await,
            Err(ChangeError::Invalid(_))
        ));
        assert_eq!(files(&Place::Admin.dir(&root)), Vec::<String>::new());
        assert_eq!(*ops.reloads.borrow(), 0);
    }

    #[tokio::test]
    async fn nothing_changes_while_the_system_stops() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let ops = FakeOps::default();
        *ops.system_state.borrow_mut() = Some("stopping".into());
        assert!(matches!(
            add(&ops, &root, "web", WEB, Place::Runtime, false, false).await,
            Err(ChangeError::Stopping)
        ));
        assert_eq!(files(&Place::Runtime.dir(&root)), Vec::<String>::new());
    }

    #[tokio::test]
    async fn a_running_workload_keeps_its_file_unless_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let ops = FakeOps::default().unit("web", true, Behaviour::Takes(Duration::ZERO));
        let path = add(&ops, &root, "web", WEB, Place::Runtime, false, false)
            .await
            .unwrap()
            .path;
        assert!(matches!(
            remove(&ops, &root, "web", false).await,
            Err(ChangeError::Running(_))
        ));
        assert!(path.exists());
        let done = remove(&ops, &root, "web", true).await.unwrap();
        assert_eq!(done.job, Some(JobResult::Done));
        assert!(!path.exists());
        assert_eq!(*ops.reloads.borrow(), 2);
        assert!(matches!(
            remove(&ops, &root, "web", true).await,
            Err(ChangeError::Missing(_))
        ));
        let packaged = dir.path().join("usr/lib/berth/workloads");
        std::fs::create_dir_all(&packaged).unwrap();
        std::fs::write(packaged.join("pkg.toml"), WEB).unwrap();
        assert!(matches!(
            remove(&ops, &root, "pkg", false).await,
            Err(ChangeError::Packaged(_))
        ));
    }

    /// Review of issue 11: a workload still starting (a readiness wait
    /// lasts up to its start timeout) counted as not running, and lost its
    /// drop-in to a remove without --stop.
    #[tokio::test]
    async fn a_workload_still_starting_keeps_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let ops = FakeOps::default();
        let path = add(&ops, &root, "web", WEB, Place::Admin, false, false)
            .await
            .unwrap()
            .path;
        for state in [
            crate::systemd::ActiveState::Activating,
            crate::systemd::ActiveState::Deactivating,
        ] {
            ops.states.borrow_mut().insert(unit_name("web"), state);
            assert!(matches!(
                remove(&ops, &root, "web", false).await,
                Err(ChangeError::Running(_))
            ));
            assert!(path.exists());
        }
    }

    /// Review of issue 11: an existing unit that the loaded units show
    /// unfit (ordered before what the drain starts after, an alias, no
    /// such unit) is refused before anything is written.
    #[tokio::test]
    async fn an_unfit_existing_unit_is_refused_before_anything_is_written() {
        use crate::systemd::{LoadState, UnitTopology};
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let ops = FakeOps::default();
        let loaded = |id: &str, before: &[&str]| UnitTopology {
            load_state: LoadState::Loaded,
            id: id.into(),
            before: before.iter().map(|b| b.to_string()).collect(),
            ..Default::default()
        };
        ops.topologies.borrow_mut().extend([
            (
                crate::names::DRAIN.to_string(),
                UnitTopology {
                    after: vec!["network.target".into()],
                    ..loaded(crate::names::DRAIN, &[])
                },
            ),
            (
                "nm.service".to_string(),
                loaded("nm.service", &["network.target"]),
            ),
            ("mysql.service".to_string(), loaded("mariadb.service", &[])),
            (
                "gone.service".to_string(),
                UnitTopology {
                    load_state: LoadState::NotFound,
                    ..Default::default()
                },
            ),
            (
                "pg.service".to_string(),
                loaded("pg.service", &["multi-user.target"]),
            ),
        ]);
        for (unit, why) in [
            ("nm.service", "an ordering cycle"),
            ("mysql.service", "is an alias of mariadb.service"),
            ("gone.service", "is not-found: there is no such unit to take over"),
        ] {
            let text = format!("unit = \"{unit}\"\n");
            match add(&ops, &root, "w", &text, Place::Admin, false, false).await {
                Err(ChangeError::Invalid(e)) => {
                    assert!(e[0].to_string().contains(why), "{unit}: {e:?}");
                    assert_eq!(e[0].key.as_deref(), Some("unit"));
                }
                other => panic!("{unit}: {other:?}"),
            }
            assert_eq!(files(&Place::Admin.dir(&root)), Vec::<String>::new());
        }
        assert_eq!(*ops.reloads.borrow(), 0);
        add(
            &ops,
            &root,
            "pg",
            "unit = \"pg.service\"\n",
            Place::Admin,
            false,
            false,
        )
        .await
        .unwrap();
    }

    /// Issue 31, item 3: the one-workload-per-unit check ran before the
    /// lock, so two adds of one unit under different names both passed
    /// it and both said "added"; the generator then dropped one.
    #[tokio::test]
    async fn an_add_checks_the_other_workloads_under_the_lock() {
        use crate::state::lock::{self, ConfigLock};
        use crate::systemd::{LoadState, UnitTopology};
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let ops = FakeOps::default();
        ops.topologies.borrow_mut().insert(
            "pg.service".to_string(),
            UnitTopology {
                load_state: LoadState::Loaded,
                id: "pg.service".into(),
                ..Default::default()
            },
        );
        // Another writer holds the lock, and writes b with the same unit
        // while this add waits for it.
        let held = lock::config_within(&root, ConfigLock::Write, Duration::from_secs(1))
            .await
            .unwrap();
        let other = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let dir = Place::Admin.dir(&root);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("b.toml"), "unit = \"pg.service\"\n").unwrap();
            drop(held);
        };
        let (added, ()) = tokio::join!(
            add(
                &ops,
                &root,
                "a",
                "unit = \"pg.service\"\n",
                Place::Admin,
                false,
                false
            ),
            other
        );
        match added {
            Err(ChangeError::Invalid(e)) => assert!(
                e[0].to_string()
                    .contains("pg.service is already the unit of workload b"),
                "{e:?}"
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(files(&Place::Admin.dir(&root)), ["b.toml"]);
        assert_eq!(*ops.reloads.borrow(), 0);
    }

    /// Issue 31, item 4: on a per-user install (no generator) add and
    /// remove only reloaded, never wrote the generator's output: the new
    /// workload's unit ran `berth not-configured`, the removed one's
    /// drop-in stayed.
    #[tokio::test]
    async fn a_per_user_install_gets_its_units_written_by_add_and_remove() {
        use crate::paths::UserDirs;
        use crate::state::manifest::{self, Manifest, Source};
        let dir = tempfile::tempdir().unwrap();
        let home = PathBuf::from("/home/u");
        let root = Root::new_user(
            dir.path(),
            UserDirs {
                config_home: home.join(".config"),
                runtime_dir: "/run/user/1000".into(),
                home,
            },
        );
        manifest::write(
            &root,
            &Manifest {
                source: Source::Files,
                files: Vec::new(),
                enabled_target: false,
                started_target: false,
            },
        )
        .unwrap();
        let ops = FakeOps::default().unit("web", false, Behaviour::Takes(Duration::ZERO));
        let drop_in = root.join("/home/u/.config/systemd/user/berth@web.service.d/10-berth.conf");
        add(&ops, &root, "web", WEB, Place::Admin, true, false)
            .await
            .unwrap();
        let text = std::fs::read_to_string(&drop_in).unwrap();
        assert!(text.contains("/usr/bin/web"), "{text}");
        remove(&ops, &root, "web", true).await.unwrap();
        assert!(!drop_in.exists(), "the removed workload's drop-in stayed");
        assert_eq!(*ops.reloads.borrow(), 2);
    }

    /// Issue 31, item 5: an add to /etc/berth that overrode a running
    /// runtime workload left its unit running without a drop-in (and,
    /// when the override named another unit, unmanaged altogether).
    #[tokio::test]
    async fn an_override_of_a_running_workload_stops_it_first_or_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let ops = FakeOps::default().unit("web", true, Behaviour::Takes(Duration::ZERO));
        add(&ops, &root, "web", WEB, Place::Runtime, false, false)
            .await
            .unwrap();
        let other = "exec = [\"/usr/bin/other\"]\n";
        match add(&ops, &root, "web", other, Place::Admin, false, false).await {
            Err(e @ ChangeError::OverridesRunning(..)) => {
                let said = e.to_string();
                assert!(
                    said.contains("berth@web.service is running as ")
                        && said.contains("/run/berth/workloads/web.toml defines it"),
                    "{said}"
                );
                assert!(said.contains("use --stop"), "{said}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(files(&Place::Admin.dir(&root)), Vec::<String>::new());
        let done = add(&ops, &root, "web", other, Place::Admin, true, true)
            .await
            .unwrap();
        assert_eq!(
            done.overridden,
            Some(("berth@web.service".to_string(), JobResult::Done)),
            "stopped first"
        );
        assert_eq!(
            done.job,
            Some(JobResult::Done),
            "then started as the override defines it"
        );
        assert_eq!(files(&Place::Admin.dir(&root)), ["web.toml"]);
        // A workload that is down is overridden without a word.
        let ops = FakeOps::default().unit("db", false, Behaviour::Takes(Duration::ZERO));
        add(&ops, &root, "db", WEB, Place::Runtime, false, false)
            .await
            .unwrap();
        let done = add(&ops, &root, "db", other, Place::Admin, false, false)
            .await
            .unwrap();
        assert_eq!(done.overridden, None);
    }

    /// Review of issue 11: a daemon-reload that outlasted the call's 10 s
    /// timeout (a big host) failed the add although systemd finished it.
    #[tokio::test]
    async fn a_slow_reload_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        let ops = FakeOps::default();
        ops.reload_times_out.set(true);
        let done = add(&ops, &root, "web", WEB, Place::Admin, false, false)
            .await
            .unwrap();
        assert!(done.reloaded);
    }
}
