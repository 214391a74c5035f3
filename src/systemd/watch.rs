//! Unit state changes and new jobs as they happen, for the supervisor.
//!
//! One match rule (`path_namespace` on the unit objects) covers every
//! unit's PropertiesChanged: a proxy per unit would not scale. A task per
//! stream drains it into an unbounded channel at once and never calls the
//! manager itself, so a slow consumer can never stall the connection (an
//! unpolled stream blocks every later call on it).

use futures_util::StreamExt;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use zbus::{MatchRule, MessageStream};

use super::connection::Systemd;
use super::error::SystemdError;
use super::proxies::SERVICE;
use super::types::Change;

const UNITS_PATH: &str = "/org/freedesktop/systemd1/unit";

impl Systemd {
    pub(super) async fn watch_changes(&self) -> Result<UnboundedReceiver<Change>, SystemdError> {
        let rule = MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender(SERVICE)
            .interface("org.freedesktop.DBus.Properties")
            .member("PropertiesChanged")
            .path_namespace(UNITS_PATH)
            .build()
            .map_err(|e| SystemdError::new("match", "unit changes", e))?;
        let mut changed = MessageStream::for_match_rule(rule, &self.conn, None)
            .await
            .map_err(|e| SystemdError::new("listen for", "unit changes", e))?;
        let mut jobs = self
            .manager
            .receive_job_new()
            .await
            .map_err(|e| SystemdError::new("listen for", "JobNew", e))?;
        let (tx, rx) = unbounded_channel();
        let properties = tx.clone();
        tokio::spawn(async move {
            while let Some(Ok(message)) = changed.next().await {
                if let Some(path) = message.header().path()
                    && properties
                        .send(Change::Properties {
                            path: path.as_str().to_string(),
                        })
                        .is_err()
                {
                    return;
                }
            }
        });
        tokio::spawn(async move {
            while let Some(signal) = jobs.next().await {
                let Ok(args) = signal.args() else { continue };
                let change = Change::JobNew {
                    job: args.job.as_str().to_string(),
                    unit: args.unit.clone(),
                };
                if tx.send(change).is_err() {
                    return;
                }
            }
        });
        Ok(rx)
    }
}
