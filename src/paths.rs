//! Where berth reads and writes. Every path is part of the product and
//! documented in berth.toml(5); `BERTH_ROOT` re-roots all of them for tests.

use std::path::{Path, PathBuf};

/// Config directories, highest precedence first. A same-named file in an
/// earlier directory masks the one in a later directory.
pub const CONFIG_DIRS: [&str; 4] = [
    "/etc/berth",
    "/run/berth",
    "/usr/local/lib/berth",
    "/usr/lib/berth",
];

/// State: freeze flags, records, the last drain report.
pub const STATE_DIR: &str = "/var/lib/berth";
/// The node freeze flag; also named by `ConditionPathExists=` in
/// berth-autostart.service, so the two must agree.
pub const NODE_FREEZE_FLAG: &str = "/var/lib/berth/freeze/node";
/// Daemon runtime directory (lock, API socket), apart from `/run/berth`,
/// which is a config directory.
pub const DAEMON_RUNTIME_DIR: &str = "/run/berthd";

pub const HOST_FILE: &str = "berth.toml";
pub const HOST_FRAGMENT_DIR: &str = "berth.toml.d";
pub const WORKLOAD_DIR: &str = "workloads";

/// The file system berth looks at: `/` in production, a test tree under
/// `BERTH_ROOT` (or `--root`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root(PathBuf);

impl Root {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Root(dir.into())
    }

    /// `BERTH_ROOT` if set and non-empty, else `/`.
    pub fn from_env() -> Self {
        match std::env::var_os("BERTH_ROOT") {
            Some(dir) if !dir.is_empty() => Root(PathBuf::from(dir)),
            _ => Root(PathBuf::from("/")),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.0
    }

    /// Re-roots an absolute product path.
    pub fn join(&self, product_path: &str) -> PathBuf {
        self.0.join(product_path.trim_start_matches('/'))
    }
}
