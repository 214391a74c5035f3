//! The `[service]` table: resource and sandbox settings passed through to
//! the workload's unit.
//!
//! An allowlist, not a denylist: a setting is passed only when berth knows
//! it cannot change the lifecycle, and its value is checked against the
//! syntax systemd accepts, so the generator never writes a line systemd
//! would reject or silently ignore. Values never contain `%`, quotes,
//! backslashes or whitespace except where a kind allows it, so nothing here
//! needs escaping; the escaper in `render` is for argv and environment.

use std::path::Path;

use toml::{Table, Value};

use super::ConfigError;

/// One validated `Key=value` line for the `[Service]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSetting {
    pub key: &'static str,
    pub value: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassthroughKind {
    Bool,
    /// 1-10000.
    Weight,
    /// `N%` or `N.N%`.
    Percent,
    /// Bytes with an optional K/M/G/T/P/E suffix, a percentage, or `infinity`.
    Bytes,
    /// A count, a percentage or `infinity`.
    Tasks,
    /// A count with an optional size suffix, or `infinity`.
    Rlimit,
    Int(i64, i64),
    /// CPU indices and ranges: `0-3,6`.
    CpuSet,
    Signal,
    /// A time span (`90`, `5min 20s`, `1h`) or `infinity`.
    Duration,
    Enum(&'static [&'static str]),
    /// A boolean or one of the words.
    BoolOr(&'static [&'static str]),
    /// Space-separated tokens of `[A-Za-z0-9_@:~+.-]` (syscall filters,
    /// capabilities, address families); a TOML list or a string.
    Words,
    /// A boolean, or words as for `Words` (RestrictNamespaces=).
    BoolOrWords,
    /// Space-separated absolute paths, each optionally prefixed by `-` or `+`.
    Paths,
    /// Octal file mode mask: `0027`.
    UMask,
    /// `[A-Za-z0-9_.-]+`.
    Identifier,
}

use PassthroughKind::*;

const BOOL_SETTINGS: &[&str] = &[
    "CPUAccounting",
    "MemoryAccounting",
    "IOAccounting",
    "TasksAccounting",
    "IPAccounting",
    "Delegate",
    "NoNewPrivileges",
    "PrivateDevices",
    "PrivateNetwork",
    "PrivateUsers",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectClock",
    "ProtectHostname",
    "RestrictRealtime",
    "RestrictSUIDSGID",
    "LockPersonality",
    "MemoryDenyWriteExecute",
    "RemoveIPC",
];

/// The allowlist, sorted by key. Everything here was checked not to add a
/// `Requires=`/`BindsTo=` on a unit that is stopped at shutdown.
const TYPED_SETTINGS: &[(&str, PassthroughKind)] = &[
    ("AllowedCPUs", CpuSet),
    ("AmbientCapabilities", Words),
    ("CPUAffinity", CpuSet),
    ("CPUQuota", Percent),
    (
        "CPUSchedulingPolicy",
        Enum(&["other", "batch", "idle", "fifo", "rr"]),
    ),
    ("CPUWeight", Weight),
    ("CapabilityBoundingSet", Words),
    ("DevicePolicy", Enum(&["auto", "closed", "strict"])),
    ("IOSchedulingClass", Enum(&["realtime", "best-effort", "idle"])),
    ("IOSchedulingPriority", Int(0, 7)),
    ("IOWeight", Weight),
    ("InaccessiblePaths", Paths),
    ("KillSignal", Signal),
    ("LimitAS", Rlimit),
    ("LimitCORE", Rlimit),
    ("LimitMEMLOCK", Rlimit),
    ("LimitNOFILE", Rlimit),
    ("LimitNPROC", Rlimit),
    ("LimitSTACK", Rlimit),
    (
        "LogLevelMax",
        Enum(&[
            "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug",
        ]),
    ),
    ("MemoryHigh", Bytes),
    ("MemoryLow", Bytes),
    ("MemoryMax", Bytes),
    ("MemoryMin", Bytes),
    ("MemorySwapMax", Bytes),
    ("Nice", Int(-20, 19)),
    ("OOMScoreAdjust", Int(-1000, 1000)),
    ("ProtectHome", BoolOr(&["read-only", "tmpfs"])),
    ("ProtectSystem", BoolOr(&["full", "strict"])),
    ("ReadOnlyPaths", Paths),
    ("ReadWritePaths", Paths),
    ("RestrictAddressFamilies", Words),
    ("RestrictNamespaces", BoolOrWords),
    (
        "StandardError",
        Enum(&[
            "inherit",
            "null",
            "journal",
            "kmsg",
            "journal+console",
            "kmsg+console",
        ]),
    ),
    (
        "StandardOutput",
        Enum(&[
            "inherit",
            "null",
            "journal",
            "kmsg",
            "journal+console",
            "kmsg+console",
        ]),
    ),
    ("StartupCPUWeight", Weight),
    ("StartupIOWeight", Weight),
    ("SyslogIdentifier", Identifier),
    ("SystemCallArchitectures", Words),
    ("SystemCallErrorNumber", Identifier),
    ("SystemCallFilter", Words),
    ("TasksMax", Tasks),
    ("TimeoutStartSec", Duration),
    ("UMask", UMask),
];

/// Why a known setting is refused, for the message.
const REFUSED: &[(&[&str], &str)] = &[
    (
        &[
            "Restart",
            "RestartSec",
            "RestartPreventExitStatus",
            "RestartForceExitStatus",
            "StartLimitIntervalSec",
            "StartLimitBurst",
            "StartLimitAction",
        ],
        "berth never restarts a workload behind the admin's back: a restart by systemd would race the drain at shutdown and undo a deliberate stop",
    ),
    (
        &[
            "Slice",
            "DefaultDependencies",
            "Requires",
            "Requisite",
            "BindsTo",
            "PartOf",
            "Upholds",
            "Conflicts",
            "Before",
            "After",
            "Wants",
            "OnFailure",
            "OnSuccess",
            "PropagatesStopTo",
            "StopPropagatedFrom",
            "JoinsNamespaceOf",
            "IgnoreOnIsolate",
        ],
        "placement and dependencies decide when the workload is stopped; berth owns them (use the `after` and `wants` keys for ordering)",
    ),
    (
        &[
            "ExecStart",
            "ExecStartPre",
            "ExecStartPost",
            "ExecStop",
            "ExecStopPost",
            "ExecReload",
            "ExecCondition",
        ],
        "commands come from the `exec` and `stop_exec` keys",
    ),
    (
        &[
            "WorkingDirectory",
            "RootDirectory",
            "RootImage",
            "RequiresMountsFor",
            "PrivateTmp",
            "DynamicUser",
            "BindPaths",
            "BindReadOnlyPaths",
            "TemporaryFileSystem",
            "StateDirectory",
            "RuntimeDirectory",
            "CacheDirectory",
            "LogsDirectory",
            "ConfigurationDirectory",
            "LogNamespace",
            "NetworkNamespacePath",
            "StandardInput",
        ],
        "adds an implicit Requires= on a mount or unit that is stopped at shutdown, which would stop the workload before the drain runs (see berth.units(7))",
    ),
    (
        &[
            "Type",
            "RemainAfterExit",
            "KillMode",
            "SendSIGKILL",
            "SendSIGHUP",
            "TimeoutStopSec",
            "TimeoutSec",
            "TimeoutAbortSec",
            "FinalKillSignal",
            "NotifyAccess",
            "PIDFile",
        ],
        "how the workload is started and stopped is berth's (stop_delay_s, stop_action, force_off_on_timeout)",
    ),
    (&["User", "Group"], "use the `user` and `group` keys"),
    (
        &[
            "Environment",
            "EnvironmentFile",
            "PassEnvironment",
            "UnsetEnvironment",
        ],
        "use the [environment] table",
    ),
];

pub fn passthrough_rule(key: &str) -> Result<PassthroughKind, &'static str> {
    if BOOL_SETTINGS.contains(&key) {
        return Ok(Bool);
    }
    if let Ok(i) = TYPED_SETTINGS.binary_search_by(|(k, _)| k.cmp(&key)) {
        return Ok(TYPED_SETTINGS[i].1);
    }
    for (keys, why) in REFUSED {
        if keys.contains(&key) {
            return Err(why);
        }
    }
    Err("not a setting berth passes through; see berth.toml(5) for the list")
}

pub(super) fn validate(table: &Table, file: &Path, errors: &mut Vec<ConfigError>) -> Vec<ServiceSetting> {
    let mut out = Vec::new();
    for (key, value) in table {
        let at = format!("service.{key}");
        let kind = match passthrough_rule(key) {
            Ok(kind) => kind,
            Err(why) => {
                errors.push(ConfigError::key(file, at, why));
                continue;
            }
        };
        match render_value(kind, value) {
            Ok(text) => out.push(ServiceSetting {
                key: static_key(key),
                value: text,
            }),
            Err(why) => errors.push(ConfigError::key(file, at, why)),
        }
    }
    out
}

/// The allowlist's own `&'static str` for a key already known to be on it.
fn static_key(key: &str) -> &'static str {
    BOOL_SETTINGS
        .iter()
        .copied()
        .chain(TYPED_SETTINGS.iter().map(|(k, _)| *k))
        .find(|k| *k == key)
        .expect("key was found on the allowlist")
}

fn render_value(kind: PassthroughKind, value: &Value) -> Result<String, String> {
    match (kind, value) {
        (Bool, Value::Boolean(b)) => Ok(yes_no(*b)),
        (Bool, other) => Err(format!("must be true or false, not {}", other.type_str())),
        (BoolOr(_) | BoolOrWords, Value::Boolean(b)) => Ok(yes_no(*b)),
        (BoolOr(words) | Enum(words), Value::String(s)) => {
            if words.contains(&s.as_str()) {
                Ok(s.clone())
            } else {
                let alts = words
                    .iter()
                    .map(|w| format!("{w:?}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let also = if matches!(kind, BoolOr(_)) {
                    "true, false, "
                } else {
                    ""
                };
                Err(format!("must be one of {also}{alts}; not {s:?}"))
            }
        }
        (Int(min, max), Value::Integer(n)) => {
            if (min..=max).contains(n) {
                Ok(n.to_string())
            } else {
                Err(format!("must be from {min} to {max}, not {n}"))
            }
        }
        (Weight, Value::Integer(n)) => {
            if (1..=10000).contains(n) {
                Ok(n.to_string())
            } else {
                Err(format!("must be from 1 to 10000, not {n}"))
            }
        }
        (Bytes | Tasks | Rlimit, Value::Integer(n)) if *n >= 0 => Ok(n.to_string()),
        (Words | BoolOrWords | Paths, Value::Array(items)) => {
            let mut words = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    Value::String(s) => words.push(s.as_str()),
                    other => return Err(format!("list items must be strings, not {}", other.type_str())),
                }
            }
            check_words(kind, &words)?;
            Ok(words.join(" "))
        }
        (_, Value::String(s)) => check_string(kind, s).map(|()| s.clone()),
        (_, other) => Err(format!("must be {}, not {}", expectation(kind), other.type_str())),
    }
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_string()
}

fn expectation(kind: PassthroughKind) -> &'static str {
    match kind {
        Bool => "true or false",
        Weight => "an integer from 1 to 10000",
        Percent => "a percentage string like \"50%\"",
        Bytes => "a size like \"512M\", a percentage, or \"infinity\"",
        Tasks => "a count, a percentage or \"infinity\"",
        Rlimit => "a count (size suffixes allowed) or \"infinity\"",
        Int(..) => "an integer",
        CpuSet => "a CPU list like \"0-3,6\"",
        Signal => "a signal name like \"SIGINT\"",
        Duration => "a time span like \"90s\" or \"5min\", or \"infinity\"",
        Enum(_) | BoolOr(_) => "a string",
        Words => "a list of words or one string of space-separated words",
        BoolOrWords => "true, false, or a list of words",
        Paths => "a list of absolute paths",
        UMask => "an octal mask string like \"0027\"",
        Identifier => "a string of A-Z a-z 0-9 _ . -",
    }
}

fn check_string(kind: PassthroughKind, s: &str) -> Result<(), String> {
    let bad = || Err(format!("must be {}, not {s:?}", expectation(kind)));
    let ok = match kind {
        Percent => percent(s),
        Bytes => s == "infinity" || percent(s) || size(s),
        Tasks => s == "infinity" || percent(s) || digits(s),
        Rlimit => s == "infinity" || size(s),
        CpuSet => cpu_set(s),
        Signal => SIGNALS.contains(&s.strip_prefix("SIG").unwrap_or(s)),
        Duration => s == "infinity" || duration(s),
        UMask => s.len() <= 4 && !s.is_empty() && s.chars().all(|c| ('0'..='7').contains(&c)),
        Identifier => {
            !s.is_empty()
                && s.len() <= 64
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        }
        Words | BoolOrWords | Paths => {
            return check_words(kind, &s.split(' ').filter(|w| !w.is_empty()).collect::<Vec<_>>());
        }
        Weight | Int(..) | Bool => false,
        Enum(_) | BoolOr(_) => unreachable!("handled by render_value"),
    };
    if ok { Ok(()) } else { bad() }
}

fn check_words(kind: PassthroughKind, words: &[&str]) -> Result<(), String> {
    if words.is_empty() {
        return Err("must not be empty".into());
    }
    for w in words {
        let ok = match kind {
            Words | BoolOrWords => {
                !w.is_empty()
                    && w.chars().all(|c| {
                        c.is_ascii_alphanumeric() || matches!(c, '_' | '@' | ':' | '~' | '+' | '.' | '-')
                    })
            }
            Paths => {
                let p = w.trim_start_matches(['-', '+']);
                p.starts_with('/')
                    && p.len() < 4096
                    && !p
                        .chars()
                        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '%' | '"' | '\'' | '\\'))
            }
            _ => unreachable!("only word lists"),
        };
        if !ok {
            let what = if kind == Paths {
                "an absolute path (optionally prefixed by - or +) without whitespace, quotes, backslashes or %"
            } else {
                "a word of A-Z a-z 0-9 _ @ : ~ + . -"
            };
            return Err(format!("{w:?} is not {what}"));
        }
    }
    Ok(())
}

fn digits(s: &str) -> bool {
    !s.is_empty() && s.len() <= 20 && s.chars().all(|c| c.is_ascii_digit())
}

fn decimal(s: &str) -> bool {
    match s.split_once('.') {
        Some((a, b)) => digits(a) && digits(b),
        None => digits(s),
    }
}

fn percent(s: &str) -> bool {
    s.strip_suffix('%').is_some_and(decimal)
}

fn size(s: &str) -> bool {
    let n = s.strip_suffix(['K', 'M', 'G', 'T', 'P', 'E']).unwrap_or(s);
    decimal(n)
}

fn cpu_set(s: &str) -> bool {
    !s.is_empty()
        && s.split(',').all(|part| match part.split_once('-') {
            Some((a, b)) => digits(a) && digits(b),
            None => digits(part),
        })
}

fn duration(s: &str) -> bool {
    const UNITS: &[&str] = &[
        "usec", "us", "msec", "ms", "seconds", "second", "sec", "s", "minutes", "minute", "min", "m",
        "hours", "hour", "hr", "h", "days", "day", "d", "weeks", "week", "w",
    ];
    let mut any = false;
    for part in s.split(' ').filter(|p| !p.is_empty()) {
        let split = part.find(|c: char| !c.is_ascii_digit()).unwrap_or(part.len());
        let (n, unit) = part.split_at(split);
        if !digits(n) || !(unit.is_empty() || UNITS.contains(&unit)) {
            return false;
        }
        any = true;
    }
    any
}

/// Signal names as systemd's KillSignal= takes them (without `SIG`).
const SIGNALS: &[&str] = &[
    "HUP", "INT", "QUIT", "ILL", "TRAP", "ABRT", "BUS", "FPE", "KILL", "USR1", "SEGV", "USR2", "PIPE",
    "ALRM", "TERM", "STKFLT", "CHLD", "CONT", "STOP", "TSTP", "TTIN", "TTOU", "URG", "XCPU", "XFSZ",
    "VTALRM", "PROF", "WINCH", "IO", "PWR", "SYS", "RTMIN",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn one(key: &str, value: &str) -> Result<String, String> {
        let table: Table = format!("{key} = {value}").parse().unwrap();
        let mut errors = Vec::new();
        let out = validate(&table, Path::new("/w.toml"), &mut errors);
        match errors.pop() {
            Some(e) => Err(e.to_string()),
            None => Ok(format!("{}={}", out[0].key, out[0].value)),
        }
    }

    #[test]
    fn allowlist_is_sorted_for_binary_search() {
        let keys: Vec<_> = TYPED_SETTINGS.iter().map(|(k, _)| *k).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }

    #[test]
    fn accepted_values_render_as_systemd_syntax() {
        for (key, value, line) in [
            ("MemoryMax", "\"512M\"", "MemoryMax=512M"),
            ("MemoryMax", "1073741824", "MemoryMax=1073741824"),
            ("MemoryHigh", "\"80%\"", "MemoryHigh=80%"),
            ("CPUQuota", "\"150%\"", "CPUQuota=150%"),
            ("CPUWeight", "200", "CPUWeight=200"),
            ("TasksMax", "\"infinity\"", "TasksMax=infinity"),
            ("NoNewPrivileges", "true", "NoNewPrivileges=yes"),
            ("ProtectSystem", "\"strict\"", "ProtectSystem=strict"),
            ("ProtectHome", "false", "ProtectHome=no"),
            (
                "SystemCallFilter",
                "[\"@system-service\", \"~@mount\"]",
                "SystemCallFilter=@system-service ~@mount",
            ),
            (
                "ReadWritePaths",
                "[\"/var/lib/vm\", \"-/srv/x\"]",
                "ReadWritePaths=/var/lib/vm -/srv/x",
            ),
            ("KillSignal", "\"SIGINT\"", "KillSignal=SIGINT"),
            ("TimeoutStartSec", "\"5min 20s\"", "TimeoutStartSec=5min 20s"),
            ("AllowedCPUs", "\"0-3,6\"", "AllowedCPUs=0-3,6"),
            ("UMask", "\"0027\"", "UMask=0027"),
            ("RestrictNamespaces", "true", "RestrictNamespaces=yes"),
            (
                "RestrictNamespaces",
                "[\"~user\", \"~net\"]",
                "RestrictNamespaces=~user ~net",
            ),
        ] {
            assert_eq!(one(key, value), Ok(line.to_string()), "{key} = {value}");
        }
    }

    #[test]
    fn lifecycle_settings_are_refused_with_a_reason() {
        for (key, value, reason) in [
            ("Restart", "\"always\"", "service.Restart: berth never restarts"),
            ("Slice", "\"x.slice\"", "placement and dependencies"),
            ("ExecStop", "\"/bin/x\"", "stop_exec"),
            ("WorkingDirectory", "\"/srv\"", "implicit Requires="),
            ("PrivateTmp", "true", "implicit Requires="),
            ("TimeoutStopSec", "10", "stop_delay_s"),
            ("Frobnicate", "1", "not a setting berth passes through"),
        ] {
            let err = one(key, value).unwrap_err();
            assert!(err.contains(reason), "{key}: {err}");
        }
    }

    #[test]
    fn bad_values_are_refused() {
        for (k, v) in [
            ("MemoryMax", "\"lots\""),
            ("MemoryMax", "-1"),
            ("CPUWeight", "0"),
            ("CPUQuota", "\"50\""),
            ("KillSignal", "\"SIGFOO\""),
            ("ReadWritePaths", "[\"relative\"]"),
            ("ReadWritePaths", "[\"/a b\"]"),
            ("ReadWritePaths", "[\"/%h\"]"),
            ("SystemCallFilter", "\"@x\\\"y\""),
            ("NoNewPrivileges", "\"yes\""),
            ("TimeoutStartSec", "\"soon\""),
            ("UMask", "\"0999\""),
            ("Nice", "20"),
            ("ProtectSystem", "\"everything\""),
        ] {
            assert!(one(k, v).is_err(), "{k} = {v} should be refused");
        }
    }
}
