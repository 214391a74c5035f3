//! Structured events for the journal: one record per workload outcome and a
//! summary, each with a MESSAGE_ID that the shipped catalog
//! (`catalog/berth.catalog`) explains for `journalctl -x`. Falls back to
//! stderr where there is no journal, and also echoes to a terminal when a
//! person runs the command.

use std::io::{IsTerminal, Write};

use log::kv::{Key, Value};
use systemd_journal_logger::JournalLog;

use crate::state::records::{Record, Updated};

pub struct Events {
    journal: Option<JournalLog>,
    echo: bool,
}

impl Events {
    pub fn new(identifier: &str) -> Events {
        let journal = JournalLog::new()
            .ok()
            .map(|j| j.with_syslog_identifier(identifier.to_string()));
        let echo = journal.is_none() || std::io::stderr().is_terminal();
        Events { journal, echo }
    }

    /// Sends `message` with `fields` (journal field names, e.g.
    /// `BERTH_WORKLOAD`) and `message_id` (32 hex digits, or empty).
    pub fn emit(&self, level: log::Level, message_id: &str, fields: &[(&str, String)], message: &str) {
        let mut sent = false;
        if let Some(journal) = &self.journal {
            let mut kvs: Vec<(Key<'_>, Value<'_>)> = Vec::with_capacity(fields.len() + 1);
            if !message_id.is_empty() {
                kvs.push((Key::from_str("MESSAGE_ID"), Value::from(message_id)));
            }
            for (k, v) in fields {
                kvs.push((Key::from_str(k), Value::from(v.as_str())));
            }
            sent = journal
                .journal_send(
                    &log::Record::builder()
                        .args(format_args!("{message}"))
                        .level(level)
                        .target("berth")
                        .key_values(&kvs)
                        .build(),
                )
                .is_ok();
        }
        if self.echo || !sent {
            let extra: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
            // A closed stderr must not stop a drain: errors are ignored.
            let mut stderr = std::io::stderr().lock();
            let _ = if extra.is_empty() {
                writeln!(stderr, "{message}")
            } else {
                writeln!(stderr, "{message} [{}]", extra.join(" "))
            };
        }
    }

    /// Whether events are echoed to stderr (a person at a terminal, or no
    /// journal).
    pub fn echoes(&self) -> bool {
        self.echo
    }

    pub fn info(&self, message: &str) {
        self.emit(log::Level::Info, "", &[], message)
    }

    pub fn warn(&self, message: &str) {
        self.emit(log::Level::Warn, "", &[], message)
    }

    /// Logs what a record update had to say (a corrupt record moved aside,
    /// a record that could not be written) and hands the record on.
    pub fn recorded(&self, name: &str, result: std::io::Result<Updated>) -> Option<Record> {
        match result {
            Ok(updated) => {
                if let Some(message) = &updated.quarantined {
                    self.warn(message);
                }
                Some(updated.record)
            }
            Err(e) => {
                self.warn(&format!("cannot record {name}: {e}"));
                None
            }
        }
    }
}
