//! The last autostart's summary, `last-autostart.json` in the state
//! directory: when it ran, how long it took, and what it did, for the
//! daemon's metrics (the journal has each start).

use std::io;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::paths::Root;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub started_at: String,
    pub elapsed_ms: u64,
    pub started: usize,
    pub failed: usize,
    pub skipped: usize,
    /// Found running and left alone.
    pub adopted: usize,
    /// Why nothing was started, when the node was frozen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_frozen: Option<String>,
}

pub fn path(root: &Root) -> PathBuf {
    root.state_dir().join("last-autostart.json")
}

pub fn write(root: &Root, report: &Report) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(report).map_err(io::Error::from)?;
    super::atomic::write_json(&path(root), &bytes)
}

/// None when there is none yet; an error for one that does not read.
pub fn read(root: &Root) -> io::Result<Option<Report>> {
    match std::fs::read(path(root)) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path(root).display()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path());
        assert_eq!(read(&root).unwrap(), None);
        std::fs::create_dir_all(root.state_dir()).unwrap();
        let report = Report {
            started_at: "2026-12-06T04:00:00Z".into(),
            elapsed_ms: 1200,
            started: 3,
            failed: 1,
            skipped: 2,
            adopted: 4,
            node_frozen: None,
        };
        write(&root, &report).unwrap();
        assert_eq!(read(&root).unwrap(), Some(report));
        std::fs::write(path(&root), "{").unwrap();
        assert_eq!(read(&root).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }
}
