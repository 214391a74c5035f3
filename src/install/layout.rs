//! Where a source install puts things, and whether it may: no bus here,
//! only the file system, so every refusal comes before anything changes.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::files::FileContent;
use crate::config;
use crate::paths::{self, Root};
use crate::render::{self, Content};
use crate::units;

/// Why a source install refuses to go ahead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

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
                bindir: bindir.unwrap_or_else(|| paths::LOCAL_BINDIR.into()),
                unit_dir: paths::LOCAL_SYSTEM_UNIT_DIR.into(),
                generator_dir: Some(paths::LOCAL_SYSTEM_GENERATOR_DIR.into()),
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
pub fn check_stable_bindir(dir: &Path, runtime_dir: Option<&Path>) -> Result<(), Refused> {
    if !dir.is_absolute() {
        return Err(Refused(format!("{} is not an absolute path", dir.display())));
    }
    if dir.to_str().is_none() {
        return Err(Refused(format!("{} is not valid UTF-8", dir.display())));
    }
    let volatile = ["/tmp", "/var/tmp", "/dev/shm", "/run", "/proc", "/sys"];
    if let Some(v) = volatile.iter().find(|v| dir.starts_with(v)) {
        return Err(Refused(format!(
            "{} is under {v}, which does not keep files (or is not for programs)",
            dir.display()
        )));
    }
    if let Some(r) = runtime_dir.filter(|r| dir.starts_with(r)) {
        return Err(Refused(format!(
            "{} is under $XDG_RUNTIME_DIR ({}), which is removed at logout",
            dir.display(),
            r.display()
        )));
    }
    if let Some(tree) = build_tree_around(dir) {
        return Err(Refused(format!(
            "{} is inside a build or source tree ({}): a rebuild or `cargo clean` would pull the binary \
             from under the units",
            dir.display(),
            tree.display()
        )));
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
pub fn check_executable(path: &Path) -> Result<(), Refused> {
    let meta = fs::metadata(path).map_err(|e| Refused(format!("{}: {e}", path.display())))?;
    if !meta.is_file() {
        return Err(Refused(format!("{} is not a regular file", path.display())));
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(Refused(format!("{} is not executable", path.display())));
    }
    Ok(())
}

/// Whether a package installed berth's units for this manager (the vendor
/// directories), as opposed to a source install in /usr/local or ~/.config.
pub fn packaged_unit(root: &Root) -> Option<PathBuf> {
    paths::vendor_unit_dirs(root.manager())
        .iter()
        .map(|d| root.join(d).join(crate::names::DRAIN))
        .find(|p| p.exists())
}

/// A per-user install without a package: is there a system-wide user
/// generator? Without one, berth writes the generator's output itself.
pub fn user_generator_installed(root: &Root) -> bool {
    paths::USER_GENERATOR_DIRS
        .iter()
        .any(|d| root.join(d).join("berth-generator").exists())
}

/// Every file a source install puts in place (re-rooted paths).
pub fn planned_files(
    root: &Root,
    layout: &Layout,
    exe: &Path,
) -> Result<Vec<(PathBuf, FileContent)>, Refused> {
    check_stable_bindir(&layout.bindir, root.user_dirs().map(|u| u.runtime_dir.as_path()))?;
    check_executable(exe)?;
    let read = |p: &Path| fs::read(p).map_err(|e| Refused(format!("cannot read {}: {e}", p.display())));
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
        check_executable(&generator)
            .map_err(|e| Refused(format!("the generator must sit next to berth: {e}")))?;
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
pub fn generated_files(root: &Root, layout: &Layout) -> Vec<(PathBuf, FileContent)> {
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
        assert!(e.0.contains("XDG_RUNTIME_DIR"), "{e}");
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

    #[test]
    fn only_regular_executables_are_installed() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        fs::write(&f, b"x").unwrap();
        assert!(check_executable(&f).unwrap_err().0.contains("not executable"));
        fs::set_permissions(&f, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(check_executable(&f).is_ok());
        assert!(
            check_executable(dir.path())
                .unwrap_err()
                .0
                .contains("not a regular file")
        );
        assert!(check_executable(&dir.path().join("missing")).is_err());
    }
}
