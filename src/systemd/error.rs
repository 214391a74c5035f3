//! A failed call to the manager, typed by what a caller does about it:
//! retry ([`SystemdError::is_transient`]) or take it as done
//! ([`SystemdError::is_gone`]).

use std::fmt;

/// A failed call, with the D-Bus error name and the unit it was about.
#[derive(Debug, Clone)]
pub struct SystemdError {
    pub operation: &'static str,
    pub unit: String,
    /// e.g. `org.freedesktop.systemd1.NoSuchUnit`; empty for transport errors.
    pub error_name: String,
    pub message: String,
}

impl fmt::Display for SystemdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if self.error_name.is_empty() {
            "transport"
        } else {
            &self.error_name
        };
        write!(f, "{} {}: {} ({})", self.operation, self.unit, self.message, name)
    }
}

impl std::error::Error for SystemdError {}

impl SystemdError {
    pub(crate) fn new(operation: &'static str, unit: &str, e: zbus::Error) -> SystemdError {
        let (error_name, message) = match &e {
            zbus::Error::MethodError(name, detail, _) => {
                (name.to_string(), detail.clone().unwrap_or_default())
            }
            zbus::Error::FDO(fdo) => (zbus::DBusError::name(fdo.as_ref()).to_string(), fdo.to_string()),
            other => (String::new(), other.to_string()),
        };
        SystemdError {
            operation,
            unit: unit.to_string(),
            error_name,
            message,
        }
    }

    /// A failure of berth's own making (a walk too large, a timeout it
    /// imposed): no D-Bus error name, so it counts as transient.
    pub fn local(operation: &'static str, unit: &str, message: impl Into<String>) -> SystemdError {
        SystemdError {
            operation,
            unit: unit.to_string(),
            error_name: String::new(),
            message: message.into(),
        }
    }

    /// The job or the unit's processes were already gone: what the call
    /// wanted had happened.
    pub fn is_gone(&self) -> bool {
        matches!(
            self.error_name.as_str(),
            "org.freedesktop.systemd1.NoSuchJob" | "org.freedesktop.systemd1.NoSuchProcess"
        )
    }

    /// Worth another try: the call timed out or the connection broke (a
    /// bus restarting, a manager busy reloading), as opposed to an answer
    /// that says no (access denied, no such unit, …).
    pub fn is_transient(&self) -> bool {
        self.error_name.is_empty()
            || matches!(
                self.error_name.as_str(),
                "org.freedesktop.DBus.Error.NoReply"
                    | "org.freedesktop.DBus.Error.Timeout"
                    | "org.freedesktop.DBus.Error.TimedOut"
                    | "org.freedesktop.DBus.Error.Disconnected"
                    | "org.freedesktop.DBus.Error.LimitsExceeded"
            )
    }
}
