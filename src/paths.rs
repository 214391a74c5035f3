//! Where berth reads and writes. Every path is part of the product and
//! documented in berth.toml(5); `BERTH_ROOT` re-roots all of them for tests.
//!
//! Two managers, two sets of paths. The system manager's are fixed. A user
//! manager's come from the user's environment, resolved the way that
//! manager resolves the specifiers its packaged units use: `%h` (`$HOME`)
//! and `%t` (`$XDG_RUNTIME_DIR`). User state lives in
//! `%h/.local/state/berth`, the XDG state directory's default. Not `%S`:
//! measured, a user manager resolves `%S` to `~/.config` on systemd 252 but
//! to `~/.local/state` on systemd 257, so a `%S` path would need berth to
//! guess the manager's version; `%h` means the same on both.

use std::path::{Path, PathBuf};

/// System config directories, highest precedence first. A same-named file
/// in an earlier directory masks the one in a later directory.
pub const CONFIG_DIRS: [&str; 4] = [
    "/etc/berth",
    "/run/berth",
    "/usr/local/lib/berth",
    "/usr/lib/berth",
];

/// System state: freeze flags, records, the last drain report.
pub const STATE_DIR: &str = "/var/lib/berth";
/// Daemon runtime directory (lock, API socket), apart from `/run/berth`,
/// which is a config directory.
pub const DAEMON_RUNTIME_DIR: &str = "/run/berthd";

pub const HOST_FILE: &str = "berth.toml";
pub const HOST_FRAGMENT_DIR: &str = "berth.toml.d";
pub const WORKLOAD_DIR: &str = "workloads";

/// Which service manager the units are for: decides the paths, the bus,
/// and which deadlines fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Manager {
    #[default]
    System,
    User,
}

impl Manager {
    /// The `systemctl` flag that talks to this manager.
    pub fn flag(self) -> &'static str {
        match self {
            Manager::System => "--system",
            Manager::User => "--user",
        }
    }
}

/// A user's directories, as the user manager sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserDirs {
    /// `$XDG_CONFIG_HOME`, else `~/.config`.
    pub config_home: PathBuf,
    /// `$XDG_RUNTIME_DIR`: the user manager's `%t`.
    pub runtime_dir: PathBuf,
    /// `~` (the units' `%h`): state in `~/.local/state/berth`, the binary
    /// of a per-user install in `~/.local/bin`.
    pub home: PathBuf,
}

/// Why a user's directories cannot be known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserEnvError {
    HomeUnset,
    HomeNotAbsolute(PathBuf),
    RuntimeDirUnset,
}

impl std::fmt::Display for UserEnvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UserEnvError::HomeUnset => f.write_str("HOME is not set"),
            UserEnvError::HomeNotAbsolute(home) => {
                write!(f, "HOME is not an absolute path: {}", home.display())
            }
            UserEnvError::RuntimeDirUnset => f.write_str(
                "XDG_RUNTIME_DIR is not set (log in, or enable lingering: loginctl enable-linger)",
            ),
        }
    }
}

impl std::error::Error for UserEnvError {}

impl UserDirs {
    /// From the environment; the error says which variable is missing.
    pub fn from_env() -> Result<UserDirs, UserEnvError> {
        let var = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let home = var("HOME").ok_or(UserEnvError::HomeUnset)?;
        let config_home = var("XDG_CONFIG_HOME")
            .filter(|p| p.is_absolute())
            .unwrap_or_else(|| home.join(".config"));
        let runtime_dir = var("XDG_RUNTIME_DIR")
            .filter(|p| p.is_absolute())
            .ok_or(UserEnvError::RuntimeDirUnset)?;
        if !home.is_absolute() {
            return Err(UserEnvError::HomeNotAbsolute(home));
        }
        Ok(UserDirs {
            config_home,
            runtime_dir,
            home,
        })
    }
}

/// The file system berth looks at: `/` in production, a test tree under
/// `BERTH_ROOT` (or `--root`), and whose paths: the system's or a user's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    dir: PathBuf,
    user: Option<UserDirs>,
}

impl Root {
    /// The system paths under `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Root {
            dir: dir.into(),
            user: None,
        }
    }

    /// A user's paths under `dir`.
    pub fn new_user(dir: impl Into<PathBuf>, user: UserDirs) -> Self {
        Root {
            dir: dir.into(),
            user: Some(user),
        }
    }

    /// `BERTH_ROOT` if set and non-empty, else `/`.
    pub fn from_env() -> Self {
        Root::new(env_root())
    }

    /// The paths for `manager`, from the environment.
    pub fn for_manager(manager: Manager) -> Result<Self, UserEnvError> {
        match manager {
            Manager::System => Ok(Root::from_env()),
            Manager::User => Ok(Root::new_user(env_root(), UserDirs::from_env()?)),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn manager(&self) -> Manager {
        if self.user.is_some() {
            Manager::User
        } else {
            Manager::System
        }
    }

    pub fn user_dirs(&self) -> Option<&UserDirs> {
        self.user.as_ref()
    }

    /// Re-roots an absolute product path.
    pub fn join(&self, product_path: impl AsRef<Path>) -> PathBuf {
        let p = product_path.as_ref();
        self.dir.join(p.strip_prefix("/").unwrap_or(p))
    }

    /// Config directories, highest precedence first, re-rooted.
    pub fn config_dirs(&self) -> Vec<PathBuf> {
        match &self.user {
            None => CONFIG_DIRS.iter().map(|d| self.join(d)).collect(),
            Some(u) => vec![
                self.join(u.config_home.join("berth")),
                self.join(u.runtime_dir.join("berth")),
            ],
        }
    }

    /// State: records, freeze flags, the last drain report.
    pub fn state_dir(&self) -> PathBuf {
        match &self.user {
            None => self.join(STATE_DIR),
            Some(u) => self.join(u.home.join(".local/state/berth")),
        }
    }

    /// The daemon's lock, status file and default API socket.
    pub fn runtime_dir(&self) -> PathBuf {
        match &self.user {
            None => self.join(DAEMON_RUNTIME_DIR),
            Some(u) => self.join(u.runtime_dir.join("berthd")),
        }
    }

    /// The node freeze flag; also named by `ConditionPathExists=` in
    /// berth-autostart.service (`/var/lib/berth/freeze/node`, or
    /// `%h/.local/state/berth/freeze/node` for a user), so the two must agree.
    pub fn node_freeze_flag(&self) -> PathBuf {
        self.state_dir().join("freeze/node")
    }

    /// The default API socket path, as a product path (not re-rooted).
    pub fn default_socket(&self) -> PathBuf {
        match &self.user {
            None => PathBuf::from(DAEMON_RUNTIME_DIR).join("api.sock"),
            Some(u) => u.runtime_dir.join("berthd/api.sock"),
        }
    }
}

/// Where a source install puts the binary, the units and the generator
/// for the system manager (a per-user install uses the user's own).
pub const LOCAL_BINDIR: &str = "/usr/local/bin";
pub const LOCAL_SYSTEM_UNIT_DIR: &str = "/usr/local/lib/systemd/system";
pub const LOCAL_SYSTEM_GENERATOR_DIR: &str = "/usr/local/lib/systemd/system-generators";

/// Where systemd reads user generators from (system directories only).
pub const USER_GENERATOR_DIRS: [&str; 4] = [
    "/etc/systemd/user-generators",
    "/usr/local/lib/systemd/user-generators",
    "/usr/lib/systemd/user-generators",
    "/lib/systemd/user-generators",
];

/// The vendor unit directories, where a package puts units (Debian's /lib
/// included): units there mean berth came from a package.
pub fn vendor_unit_dirs(manager: Manager) -> [&'static str; 2] {
    match manager {
        Manager::System => ["/usr/lib/systemd/system", "/lib/systemd/system"],
        Manager::User => ["/usr/lib/systemd/user", "/lib/systemd/user"],
    }
}

/// Where the manager reads unit files, highest precedence first (Debian's
/// /lib included); re-rooted.
pub fn unit_dirs(root: &Root) -> Vec<PathBuf> {
    let fixed: &[&str] = match root.manager() {
        Manager::System => &[
            "/etc/systemd/system",
            "/run/systemd/system",
            "/usr/local/lib/systemd/system",
            "/usr/lib/systemd/system",
            "/lib/systemd/system",
        ],
        Manager::User => &[
            "/etc/systemd/user",
            "/usr/local/lib/systemd/user",
            "/usr/lib/systemd/user",
            "/lib/systemd/user",
        ],
    };
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(u) = root.user_dirs() {
        dirs.push(root.join(u.config_home.join("systemd/user")));
        dirs.push(root.join(u.runtime_dir.join("systemd/user")));
        dirs.push(root.join(u.home.join(".local/share/systemd/user")));
    }
    dirs.extend(fixed.iter().map(|d| root.join(d)));
    dirs
}

fn env_root() -> PathBuf {
    match std::env::var_os("BERTH_ROOT") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from("/"),
    }
}

/// Gives `path` `mode` and, when the group `berth` exists, that group:
/// how berth shares its runtime directory and API socket with the
/// group's members. A failing chgrp (a user manager whose user is not in
/// the group) is harmless and ignored.
pub fn share_with_berth_group(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    if let Ok(Some(group)) = nix::unistd::Group::from_name("berth") {
        let _ = nix::unistd::chown(path, None, Some(group.gid));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> UserDirs {
        UserDirs {
            config_home: "/home/u/.config".into(),
            runtime_dir: "/run/user/1000".into(),
            home: "/home/u".into(),
        }
    }

    #[test]
    fn system_paths_match_the_packaged_units() {
        let r = Root::new("/");
        assert_eq!(r.node_freeze_flag(), Path::new("/var/lib/berth/freeze/node"));
        assert_eq!(r.runtime_dir(), Path::new("/run/berthd"));
        assert_eq!(r.config_dirs()[0], Path::new("/etc/berth"));
        // The autostart unit's condition names the same flag.
        let unit = include_str!("../units/berth-autostart.service.in");
        assert!(unit.contains("ConditionPathExists=!@STATE_DIR@/freeze/node"));
    }

    #[test]
    fn user_paths_follow_the_specifiers() {
        let r = Root::new_user("/", user());
        assert_eq!(r.manager(), Manager::User);
        assert_eq!(
            r.config_dirs(),
            vec![
                PathBuf::from("/home/u/.config/berth"),
                PathBuf::from("/run/user/1000/berth")
            ]
        );
        // %h/.local/state/berth.
        assert_eq!(r.state_dir(), Path::new("/home/u/.local/state/berth"));
        assert_eq!(r.runtime_dir(), Path::new("/run/user/1000/berthd"));
        assert_eq!(r.default_socket(), Path::new("/run/user/1000/berthd/api.sock"));
        let rerooted = Root::new_user("/t", user());
        assert_eq!(rerooted.state_dir(), Path::new("/t/home/u/.local/state/berth"));
    }
}
