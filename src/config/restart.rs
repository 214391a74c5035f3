//! `restart` and its delay and start limit: when systemd itself starts a
//! workload again after it ended. berth never decides a restart; it
//! writes the admin's choice as systemd's own `Restart=`, `RestartSec=`,
//! `StartLimitIntervalSec=` and `StartLimitBurst=`.

use super::read::Reader;

/// When systemd starts the workload again after its main process ended
/// (never after a stop job: the drain's, an admin's or the fence's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Restart {
    No,
    /// After an exit with a failure: a non-zero status, a signal, a core
    /// dump, a timeout or the watchdog.
    OnFailure,
    /// After any exit, a clean one too.
    Always,
}

impl Restart {
    /// As `Restart=` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Restart::No => "no",
            Restart::OnFailure => "on-failure",
            Restart::Always => "always",
        }
    }

    fn parse(s: &str) -> Option<Restart> {
        [Restart::No, Restart::OnFailure, Restart::Always]
            .into_iter()
            .find(|r| r.as_str() == s)
    }
}

/// A workload's restart, resolved against the host's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RestartPolicy {
    pub restart: Restart,
    pub delay_s: u64,
    /// 0: no start limit (systemd's own meaning).
    pub limit_interval_s: u64,
    pub limit_burst: u32,
}

impl Default for RestartPolicy {
    /// Restart=no; when asked for: a second's delay, and systemd's own
    /// start limit (5 starts in 10 s), so that a workload that crashes at
    /// once ends failed within seconds instead of looping.
    fn default() -> Self {
        RestartPolicy {
            restart: Restart::No,
            delay_s: 1,
            limit_interval_s: 10,
            limit_burst: 5,
        }
    }
}

impl RestartPolicy {
    pub fn restarts(&self) -> bool {
        self.restart != Restart::No
    }

    /// Whether a workload that fails at once each time ends failed at
    /// its start limit: its starts come `delay_s` apart (or more), and the
    /// limit refuses the one after `limit_burst` starts within
    /// `limit_interval_s`.
    pub fn limit_reachable(&self) -> bool {
        self.limit_interval_s > 0 && self.delay_s * u64::from(self.limit_burst) < self.limit_interval_s
    }

    /// For `berth check`: what systemd does.
    pub fn describe(&self) -> String {
        let limit = if self.limit_interval_s == 0 {
            "no start limit: it is restarted for ever".to_string()
        } else if self.limit_reachable() {
            format!(
                "at most {} starts in {} s, then left failed",
                self.limit_burst, self.limit_interval_s
            )
        } else {
            format!(
                "restarted for ever: {} starts {} s apart take longer than its start limit's {} s",
                u64::from(self.limit_burst) + 1,
                self.delay_s,
                self.limit_interval_s
            )
        };
        format!("{} after {} s, {limit}", self.restart.as_str(), self.delay_s)
    }
}

pub const MAX_RESTART_DELAY_S: i64 = 3600;
pub const MAX_LIMIT_INTERVAL_S: i64 = 86_400;
pub const MAX_LIMIT_BURST: i64 = 10_000;

/// The keys, each named `{prefix}{key}`: `restart`, `restart_delay_s`,
/// `start_limit_interval_s`, `start_limit_burst` in a workload file,
/// `default_…` in berth.toml. `default` holds what an absent key takes.
pub(super) fn read(r: &mut Reader, prefix: &str, default: RestartPolicy) -> RestartPolicy {
    let key = |k: &str| format!("{prefix}{k}");
    let restart = match r.opt_text(&key("restart")) {
        None => default.restart,
        Some(s) => Restart::parse(&s).unwrap_or_else(|| {
            r.error(
                &key("restart"),
                format!(
                    "must be \"no\", \"on-failure\" or \"always\", not \"{}\"",
                    s.escape_debug()
                ),
            );
            default.restart
        }),
    };
    let delay_s = r.int(
        &key("restart_delay_s"),
        default.delay_s as i64,
        0,
        MAX_RESTART_DELAY_S,
    ) as u64;
    let limit_interval_s = r.int(
        &key("start_limit_interval_s"),
        default.limit_interval_s as i64,
        0,
        MAX_LIMIT_INTERVAL_S,
    ) as u64;
    let limit_burst = r.int(
        &key("start_limit_burst"),
        default.limit_burst as i64,
        1,
        MAX_LIMIT_BURST,
    ) as u32;
    let policy = RestartPolicy {
        restart,
        delay_s,
        limit_interval_s,
        limit_burst,
    };
    if policy.restarts() && delay_s == 0 && limit_interval_s == 0 {
        // A workload that fails at once would be forked again and again
        // by PID 1, with nothing to end it.
        r.error(
            &key("restart_delay_s"),
            format!(
                "is 0 and {} is 0: a workload that fails at once would be restarted in a tight loop for ever; \
                 give it a delay or a start limit",
                key("start_limit_interval_s")
            ),
        );
        return RestartPolicy { delay_s: 1, ..policy };
    }
    policy
}

/// The workload keys [`read`] takes.
pub(super) const KEYS: &[&str] = &[
    "restart",
    "restart_delay_s",
    "start_limit_interval_s",
    "start_limit_burst",
];

/// Whether a workload file sets any of them (an existing unit keeps its
/// own `Restart=` unless it does).
pub(super) fn any_set(table: &toml::Table) -> bool {
    KEYS.iter().any(|k| table.contains_key(*k))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::read::Origin;
    use std::path::Path;

    fn read_text(text: &str, prefix: &str) -> (RestartPolicy, Vec<String>) {
        let table: toml::Table = text.parse().unwrap();
        let origin = Origin::single(Path::new("/etc/berth/workloads/w.toml"));
        let mut r = Reader::new(&table, "", &origin);
        let p = read(&mut r, prefix, RestartPolicy::default());
        let errors = r.errors.iter().map(|e| e.to_string()).collect();
        (p, errors)
    }

    #[test]
    fn defaults_and_every_key() {
        assert_eq!(read_text("", "").0, RestartPolicy::default());
        let (p, errors) = read_text(
            "restart = \"on-failure\"\nrestart_delay_s = 0\nstart_limit_interval_s = 45\nstart_limit_burst = 3",
            "",
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            p,
            RestartPolicy {
                restart: Restart::OnFailure,
                delay_s: 0,
                limit_interval_s: 45,
                limit_burst: 3
            }
        );
        assert_eq!(
            read_text("default_restart = \"always\"", "default_").0.restart,
            Restart::Always
        );
    }

    #[test]
    fn bad_values_are_named_and_take_the_default() {
        for (text, want) in [
            (
                "restart = \"on-abort\"",
                "restart: must be \"no\", \"on-failure\" or \"always\", not \"on-abort\"",
            ),
            ("restart = true", "restart: must be a string"),
            (
                "restart_delay_s = -1",
                "restart_delay_s: must be from 0 to 3600, not -1",
            ),
            (
                "start_limit_interval_s = 86401",
                "start_limit_interval_s: must be from 0 to 86400, not 86401",
            ),
            (
                "start_limit_burst = 0",
                "start_limit_burst: must be from 1 to 10000, not 0",
            ),
        ] {
            let (p, errors) = read_text(text, "");
            assert_eq!(p, RestartPolicy::default(), "{text}");
            assert_eq!(errors.len(), 1, "{text}: {errors:?}");
            assert!(errors[0].contains(want), "{text}: {} lacks {want}", errors[0]);
            assert!(
                errors[0].starts_with("/etc/berth/workloads/w.toml: "),
                "{}",
                errors[0]
            );
        }
    }

    #[test]
    fn described_for_check() {
        let p = RestartPolicy {
            restart: Restart::OnFailure,
            ..Default::default()
        };
        assert_eq!(
            p.describe(),
            "on-failure after 1 s, at most 5 starts in 10 s, then left failed"
        );
        let p = RestartPolicy {
            restart: Restart::Always,
            limit_interval_s: 0,
            ..Default::default()
        };
        assert_eq!(
            p.describe(),
            "always after 1 s, no start limit: it is restarted for ever"
        );
        // 6 starts at 0, 2, 4, 6, 8 and 10 s: the window of 10 s has
        // begun again by the sixth.
        let p = RestartPolicy {
            restart: Restart::OnFailure,
            delay_s: 2,
            ..Default::default()
        };
        assert!(!p.limit_reachable());
        assert_eq!(
            p.describe(),
            "on-failure after 2 s, restarted for ever: 6 starts 2 s apart take longer than its start limit's 10 s"
        );
    }

    #[test]
    fn no_delay_and_no_limit_is_refused() {
        let (p, errors) = read_text(
            "restart = \"always\"\nrestart_delay_s = 0\nstart_limit_interval_s = 0",
            "",
        );
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].contains("restart_delay_s: is 0 and start_limit_interval_s is 0"),
            "{}",
            errors[0]
        );
        assert_eq!(p.delay_s, 1);
        // Without a restart the numbers mean nothing: no error.
        assert!(
            read_text("restart_delay_s = 0\nstart_limit_interval_s = 0", "")
                .1
                .is_empty()
        );
    }
}
