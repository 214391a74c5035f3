//! What `berth install` did, `install.json` in the state directory:
//! uninstall reverses exactly that, and both stay idempotent.

use std::io;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::macros::string_enum;
use crate::paths::Root;

string_enum! {
    /// Where the units came from.
    #[derive(Default)]
    pub enum Source {
        /// A package put them in the vendor directory: install wrote none.
        Package = "package",
        /// A source install: install wrote the binary, units, generator.
        #[default]
        Files = "files",
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    pub source: Source,
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

pub fn path(root: &Root) -> PathBuf {
    root.state_dir().join("install.json")
}

/// A manifest that cannot be read or parsed, with its path.
#[derive(Debug)]
pub struct ManifestError {
    pub path: PathBuf,
    pub error: io::Error,
}

impl std::fmt::Display for ManifestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.error)
    }
}

impl std::error::Error for ManifestError {}

/// The recorded install; `None` when there is none.
pub fn read(root: &Root) -> Result<Option<Manifest>, ManifestError> {
    let path = path(root);
    let parsed = match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(io::Error::from),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    };
    parsed.map_err(|error| ManifestError { path, error })
}

pub fn write(root: &Root, manifest: &Manifest) -> Result<(), ManifestError> {
    let path = path(root);
    serde_json::to_vec_pretty(manifest)
        .map_err(io::Error::from)
        .and_then(|bytes| super::atomic::write_json(&path, &bytes))
        .map_err(|error| ManifestError { path, error })
}
