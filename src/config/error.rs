//! A problem in the configuration, as every part of config reports it:
//! the file, the key when there is one, and the reason, shown so that
//! neither a file name nor a key can forge a line of output.

use std::fmt;
use std::path::{Path, PathBuf};

/// One problem in one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// Dotted key path (`daemon.watchdog_s`, `service.MemoryMax`), when the
    /// problem is about one key.
    pub key: Option<String>,
    pub reason: String,
}

impl ConfigError {
    pub fn file(file: &Path, reason: impl Into<String>) -> Self {
        ConfigError {
            file: file.to_path_buf(),
            key: None,
            reason: reason.into(),
        }
    }

    pub fn key(file: &Path, key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            file: file.to_path_buf(),
            key: Some(key.into()),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = shown_path(&self.file);
        match &self.key {
            // Keys come from the file: anything beyond a plain key path is
            // shown quoted, so a key cannot forge a line of output.
            Some(key) if !is_plain_key(key) => write!(f, "{file}: {key:?}: {}", self.reason),
            Some(key) => write!(f, "{file}: {key}: {}", self.reason),
            None => write!(f, "{file}: {}", self.reason),
        }
    }
}

/// Whether a path can be written into a unit file or a log line as it
/// is: UTF-8 without control characters (a newline would start a line of
/// its own).
pub fn is_representable(path: &Path) -> bool {
    path.to_str().is_some_and(|s| !s.chars().any(char::is_control))
}

/// A path for a message: as it is when representable, else quoted with
/// escapes (`"a\n[Service]"`), so a file name cannot forge a line.
pub fn shown_path(path: &Path) -> String {
    if is_representable(path) {
        path.display().to_string()
    } else {
        format!("{path:?}")
    }
}

fn is_plain_key(key: &str) -> bool {
    key.chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '[' | ']'))
}

impl std::error::Error for ConfigError {}
