//! Unit state changes and new jobs as they happen, for the supervisor.
//!
//! One match rule (`path_namespace` on systemd's objects) covers every
//! unit's PropertiesChanged and the manager's JobNew: a proxy per unit
//! would not scale, and one stream keeps them in the order systemd sent
//! them. A stop's JobNew comes before the unit's change to inactive; with
//! a stream each, the supervisor saw the change first now and then and
//! took a `systemctl stop` for an unexpected exit. A task drains the
//! stream into an unbounded channel at once and never calls the manager
//! itself, so a slow consumer can never stall the connection (an unpolled
//! stream blocks every later call on it).

use std::collections::HashMap;

use futures_util::StreamExt;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use zbus::{MatchRule, MessageStream};
use zbus::{OwnedVariant as OwnedValue, Variant as Value};

use super::connection::Systemd;
use super::error::SystemdError;
use super::proxies::SERVICE;
use super::types::{ActiveState, Change, ExitCode, LoadState, ServiceResult, UnitDetails};

const UNIT_INTERFACE: &str = "org.freedesktop.systemd1.Unit";
const SERVICE_INTERFACE: &str = "org.freedesktop.systemd1.Service";
const SYSTEMD_PATH: &str = "/org/freedesktop/systemd1";
const UNITS_PATH: &str = "/org/freedesktop/systemd1/unit/";

impl Systemd {
    pub(super) async fn watch_changes(&self) -> Result<UnboundedReceiver<Change>, SystemdError> {
        let rule = MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender(SERVICE)
            .path_namespace(SYSTEMD_PATH)
            .build()
            .map_err(|e| SystemdError::new("match", "unit changes", e))?;
        let mut signals = MessageStream::for_match_rule(rule, &self.conn, None)
            .await
            .map_err(|e| SystemdError::new("listen for", "unit changes", e))?;
        let (tx, rx) = unbounded_channel();
        tokio::spawn(async move {
            let mut services = HashMap::new();
            while let Some(Ok(message)) = signals.next().await {
                if let Some(change) = change_of(&message, &mut services)
                    && tx.send(change).is_err()
                {
                    return;
                }
            }
        });
        Ok(rx)
    }
}

/// The Service properties a unit's last signal showed: systemd sends a
/// unit's Service PropertiesChanged just before its Unit one ("clients may
/// rely on this order", its source says), so the exit cause that goes
/// with a state is at hand when the state arrives.
#[derive(Default, Clone)]
struct ServiceSeen {
    result: Option<String>,
    exec_main_code: Option<i32>,
    exec_main_status: Option<i32>,
    main_pid: Option<u32>,
}

type Changed = HashMap<String, OwnedValue>;

/// What a signal from systemd means to the supervisor, if anything.
fn change_of(message: &zbus::Message, services: &mut HashMap<String, ServiceSeen>) -> Option<Change> {
    let header = message.header();
    let path = header.path()?.as_str();
    let interface = header.interface()?.as_str();
    let member = header.member()?.as_str();
    match (interface, member) {
        ("org.freedesktop.DBus.Properties", "PropertiesChanged") if path.starts_with(UNITS_PATH) => {
            let (of, changed, _invalidated): (String, Changed, Vec<String>) =
                message.body().deserialize().ok()?;
            match of.as_str() {
                SERVICE_INTERFACE => {
                    let seen = services.entry(path.to_string()).or_default();
                    seen.result = text(&changed, "Result").or(seen.result.take());
                    seen.exec_main_code = int(&changed, "ExecMainCode").or(seen.exec_main_code);
                    seen.exec_main_status = int(&changed, "ExecMainStatus").or(seen.exec_main_status);
                    seen.main_pid = uint(&changed, "MainPID").or(seen.main_pid);
                    None
                }
                UNIT_INTERFACE => Some(Change::Properties {
                    path: path.to_string(),
                    observed: observed(&changed, services.get(path)),
                }),
                _ => None,
            }
        }
        ("org.freedesktop.systemd1.Manager", "JobNew") if path == SYSTEMD_PATH => {
            let (_id, job, unit): (u32, zbus::OwnedObjectPath, String) = message.body().deserialize().ok()?;
            Some(Change::JobNew {
                job: job.as_str().to_string(),
                unit,
            })
        }
        _ => None,
    }
}

/// The unit's settled-state properties from a Unit signal and the Service
/// signal before it; None when the signal lacks one of them.
fn observed(changed: &Changed, service: Option<&ServiceSeen>) -> Option<UnitDetails> {
    let service = service.cloned().unwrap_or_default();
    Some(UnitDetails {
        load_state: LoadState::from(text(changed, "LoadState")?),
        active_state: ActiveState::from(text(changed, "ActiveState")?),
        invocation_id: bytes(changed, "InvocationID")?
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
        result: ServiceResult::from(service.result?),
        exec_main_code: ExitCode::from_code(service.exec_main_code?),
        exec_main_status: service.exec_main_status?,
        main_pid: service.main_pid?,
        // The pending job, (id, path): 0 when none.
        job_id: match changed.get("Job").map(|v| &**v) {
            Some(Value::Structure(job)) => match job.fields().first() {
                Some(Value::U32(id)) => *id,
                _ => 0,
            },
            _ => 0,
        },
    })
}

fn text(changed: &Changed, key: &str) -> Option<String> {
    match &**changed.get(key)? {
        Value::Str(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}

fn int(changed: &Changed, key: &str) -> Option<i32> {
    match &**changed.get(key)? {
        Value::I32(i) => Some(*i),
        _ => None,
    }
}

fn uint(changed: &Changed, key: &str) -> Option<u32> {
    match &**changed.get(key)? {
        Value::U32(u) => Some(*u),
        _ => None,
    }
}

fn bytes(changed: &Changed, key: &str) -> Option<Vec<u8>> {
    match &**changed.get(key)? {
        Value::Array(a) => a
            .iter()
            .map(|v| match v {
                Value::U8(b) => Some(*b),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}
