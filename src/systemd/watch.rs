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
use super::ops::hex;
use super::proxies::{SERVICE, SERVICE_INTERFACE, UNIT_INTERFACE};
use super::types::{ActiveState, Change, ExitCode, LoadState, ServiceResult, UnitDetails, WatchedPaths};
use crate::names::WORKLOAD_PATH_PREFIX;

const SYSTEMD_PATH: &str = "/org/freedesktop/systemd1";

impl Systemd {
    pub(super) async fn watch_changes(
        &self,
        existing: WatchedPaths,
    ) -> Result<UnboundedReceiver<Change>, SystemdError> {
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
                if let Some(change) = change_of(&message, &mut services, &existing)
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
    n_restarts: Option<u32>,
}

type Changed = HashMap<String, OwnedValue>;

/// What a signal from systemd means to the supervisor, if anything.
fn change_of(
    message: &zbus::Message,
    services: &mut HashMap<String, ServiceSeen>,
    existing: &WatchedPaths,
) -> Option<Change> {
    let header = message.header();
    let path = header.path()?.as_str();
    let interface = header.interface()?.as_str();
    let member = header.member()?.as_str();
    match (interface, member) {
        // Only berth's units: every other unit's signals are dropped
        // before their property dictionaries are read.
        ("org.freedesktop.DBus.Properties", "PropertiesChanged")
            if path.starts_with(WORKLOAD_PATH_PREFIX)
                || existing.read().is_ok_and(|paths| paths.contains(path)) =>
        {
            let (of, changed, _invalidated): (String, Changed, Vec<String>) =
                message.body().deserialize().ok()?;
            match of.as_str() {
                SERVICE_INTERFACE => {
                    let seen = services.entry(path.to_string()).or_default();
                    seen.result = text(&changed, "Result").or(seen.result.take());
                    seen.exec_main_code = int(&changed, "ExecMainCode").or(seen.exec_main_code);
                    seen.exec_main_status = int(&changed, "ExecMainStatus").or(seen.exec_main_status);
                    seen.main_pid = uint(&changed, "MainPID").or(seen.main_pid);
                    seen.n_restarts = uint(&changed, "NRestarts").or(seen.n_restarts);
                    None
                }
                UNIT_INTERFACE => {
                    // Used once: systemd sends a unit's Service signal
                    // before each of its Unit signals. Kept, they were
                    // 1 MB at 5000 workloads.
                    let service = services.remove(path);
                    let (observed, exit_known) = match observed(&changed, service.as_ref()) {
                        Some((details, exit_known)) => (Some(details), exit_known),
                        None => (None, false),
                    };
                    Some(Change::Properties {
                        path: path.to_string(),
                        observed,
                        exit_known,
                    })
                }
                _ => None,
            }
        }
        ("org.freedesktop.systemd1.Manager", "Reloading") if path == SYSTEMD_PATH => {
            let (active,): (bool,) = message.body().deserialize().ok()?;
            (!active).then_some(Change::Reloaded)
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

/// The unit's settled-state properties from a Unit signal, with the exit
/// cause from the Service signal before it when one was seen (the bool);
/// None when the Unit signal lacks one of them.
fn observed(changed: &Changed, service: Option<&ServiceSeen>) -> Option<(UnitDetails, bool)> {
    let mut details = UnitDetails {
        // Not among what systemd sends (252 and 257 alike): a unit that
        // sends signals is loaded.
        load_state: text(changed, "LoadState").map_or(LoadState::Loaded, LoadState::from),
        active_state: ActiveState::from(text(changed, "ActiveState")?),
        sub_state: text(changed, "SubState").unwrap_or_default(),
        invocation_id: hex(&bytes(changed, "InvocationID")?),
        // The pending job, (id, path): 0 when none.
        job_id: match changed.get("Job").map(|v| &**v) {
            Some(Value::Structure(job)) => match job.fields().first() {
                Some(Value::U32(id)) => *id,
                _ => 0,
            },
            _ => 0,
        },
        ..Default::default()
    };
    let exit = service.and_then(|s| {
        Some((
            s.result.clone()?,
            s.exec_main_code?,
            s.exec_main_status?,
            s.main_pid?,
        ))
    });
    let exit_known = exit.is_some();
    details.n_restarts = service.and_then(|s| s.n_restarts);
    if let Some((result, code, status, pid)) = exit {
        details.result = ServiceResult::from(result);
        details.exec_main_code = ExitCode::from_code(code);
        details.exec_main_status = status;
        details.main_pid = pid;
    }
    Some((details, exit_known))
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

#[cfg(test)]
mod tests {
    use super::*;
    use zbus::ObjectPath;

    const WEB: &str = "/org/freedesktop/systemd1/unit/berth_40web_2eservice";

    fn none() -> WatchedPaths {
        WatchedPaths::default()
    }

    fn changed(path: &str, interface: &str, properties: Vec<(&str, Value<'static>)>) -> zbus::Message {
        let properties: HashMap<String, Value> =
            properties.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        zbus::Message::signal(path, "org.freedesktop.DBus.Properties", "PropertiesChanged")
            .build(&(interface, properties, Vec::<String>::new()))
            .unwrap()
    }

    fn service(path: &str) -> zbus::Message {
        changed(
            path,
            SERVICE_INTERFACE,
            vec![
                ("Result", Value::from("signal")),
                ("ExecMainCode", Value::from(2i32)),
                ("ExecMainStatus", Value::from(9i32)),
                ("MainPID", Value::from(0u32)),
            ],
        )
    }

    fn unit(path: &str, active: &'static str, job: u32) -> zbus::Message {
        let job_path = ObjectPath::try_from(if job == 0 {
            "/"
        } else {
            "/org/freedesktop/systemd1/job/7"
        })
        .unwrap();
        changed(
            path,
            UNIT_INTERFACE,
            // What systemd 252 and 257 send, less the properties berth
            // does not read: no LoadState among them.
            vec![
                ("ActiveState", Value::from(active)),
                ("InvocationID", Value::from(vec![0xabu8; 16])),
                ("Job", Value::from((job, job_path))),
            ],
        )
    }

    /// A signal's own values reach the supervisor, with the Service
    /// signal sent just before it; nothing else is asked of systemd.
    #[test]
    fn a_unit_signal_carries_the_state_it_showed() {
        let mut services = HashMap::new();
        assert_eq!(
            change_of(&service(WEB), &mut services, &none()),
            None,
            "kept for the Unit signal"
        );
        let Some(Change::Properties {
            path,
            observed: Some(d),
            exit_known: true,
        }) = change_of(&unit(WEB, "failed", 0), &mut services, &none())
        else {
            panic!("no observation")
        };
        assert_eq!(path, WEB);
        assert_eq!(d.active_state, ActiveState::Failed);
        assert_eq!(d.invocation_id, "ab".repeat(16));
        assert_eq!(
            (
                d.result.to_string(),
                d.exec_main_code,
                d.exec_main_status,
                d.job_id
            ),
            ("signal".to_string(), ExitCode::Killed, 9, 0)
        );
        assert!(
            services.is_empty(),
            "the Service signal's values are dropped once used"
        );
        let Some(Change::Properties {
            observed: Some(d), ..
        }) = change_of(&unit(WEB, "active", 7), &mut services, &none())
        else {
            panic!("no observation")
        };
        assert_eq!(d.job_id, 7, "a job still pending is seen");
    }

    #[test]
    fn other_units_are_dropped_and_a_first_signal_keeps_its_state() {
        let mut services = HashMap::new();
        let other = "/org/freedesktop/systemd1/unit/dbus_2eservice";
        assert_eq!(change_of(&service(other), &mut services, &none()), None);
        assert_eq!(
            change_of(&unit(other, "active", 0), &mut services, &none()),
            None,
            "not berth's unit"
        );
        assert!(services.is_empty(), "nothing kept for other units");
        // Unless it is an existing unit a workload names (`unit =`).
        let existing = none();
        existing.write().unwrap().insert(other.to_string());
        assert_eq!(change_of(&service(other), &mut services, &existing), None);
        let Some(Change::Properties { path, .. }) =
            change_of(&unit(other, "active", 0), &mut services, &existing)
        else {
            panic!("a `unit =` workload's signal is passed on")
        };
        assert_eq!(path, other);
        // No Service signal seen yet: the state is the signal's, the exit
        // cause is for the supervisor to read.
        let Some(Change::Properties {
            observed: Some(d),
            exit_known: false,
            ..
        }) = change_of(&unit(WEB, "active", 7), &mut services, &none())
        else {
            panic!("the Unit signal's own state is kept")
        };
        assert_eq!((d.active_state, d.job_id), (ActiveState::Active, 7));
        let job = zbus::Message::signal(SYSTEMD_PATH, "org.freedesktop.systemd1.Manager", "JobNew")
            .build(&(
                7u32,
                ObjectPath::try_from("/org/freedesktop/systemd1/job/7").unwrap(),
                "berth@web.service",
            ))
            .unwrap();
        assert_eq!(
            change_of(&job, &mut services, &none()),
            Some(Change::JobNew {
                job: "/org/freedesktop/systemd1/job/7".into(),
                unit: "berth@web.service".into()
            })
        );
        // The end of a daemon-reload, not its start.
        let reloading = |active: bool| {
            zbus::Message::signal(SYSTEMD_PATH, "org.freedesktop.systemd1.Manager", "Reloading")
                .build(&(active,))
                .unwrap()
        };
        assert_eq!(change_of(&reloading(true), &mut services, &none()), None);
        assert_eq!(
            change_of(&reloading(false), &mut services, &none()),
            Some(Change::Reloaded)
        );
    }
}
