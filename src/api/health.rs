//! One health aggregate for the journal event, the status file
//! (`/run/berthd/status.json`) and `/healthz`.

use std::time::SystemTime;

use serde::Serialize;

use crate::macros::string_enum;
use crate::paths::Root;
use crate::time::rfc3339;

string_enum! {
    #[derive(Default)]
    pub enum HealthStatus {
        #[default]
        Healthy = "healthy",
        /// A workload is failed or could not be converged.
        Degraded = "degraded",
    }
}

/// Healthy, or degraded with the failed workloads and those it could not
/// converge (records it could not lock) listed apart.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Health {
    pub status: HealthStatus,
    pub failed: Vec<String>,
    pub unconverged: Vec<String>,
}

impl Health {
    pub fn new(mut failed: Vec<String>, mut unconverged: Vec<String>) -> Health {
        failed.sort();
        failed.dedup();
        unconverged.sort();
        unconverged.dedup();
        let status = if failed.is_empty() && unconverged.is_empty() {
            HealthStatus::Healthy
        } else {
            HealthStatus::Degraded
        };
        Health {
            status,
            failed,
            unconverged,
        }
    }
}

/// The heartbeat file: its timestamp advances every pass. Replaced whole
/// (rename) so a reader never sees half of it; /run is a tmpfs, so no fsync.
pub fn write_status(
    root: &Root,
    heartbeat: SystemTime,
    running: usize,
    health: &Health,
) -> std::io::Result<()> {
    let doc = serde_json::json!({
        "pid": std::process::id(),
        "heartbeat_at": rfc3339(heartbeat),
        "health": health.status,
        "running": running,
        "failed": health.failed,
        "unconverged": health.unconverged,
    });
    let path = status_path(root);
    let tmp = path.with_extension("json.tmp");
    std::fs::write(
        &tmp,
        serde_json::to_vec_pretty(&doc).map_err(std::io::Error::from)?,
    )?;
    std::fs::rename(&tmp, &path)
}

pub fn status_path(root: &Root) -> std::path::PathBuf {
    root.runtime_dir().join("status.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn degraded_lists_failed_and_unconverged_apart() {
        assert_eq!(Health::new(vec![], vec![]).status, HealthStatus::Healthy);
        let h = Health::new(vec!["b".into(), "a".into()], vec!["c".into(), "c".into()]);
        assert_eq!(h.status, HealthStatus::Degraded);
        assert_eq!(
            (h.failed.as_slice(), h.unconverged.as_slice()),
            (&["a".to_string(), "b".into()][..], &["c".to_string()][..])
        );
    }
}
