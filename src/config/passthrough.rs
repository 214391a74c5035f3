//! The `[service]` table: resource and sandbox settings passed through to
//! the workload's unit.
//!
//! An allowlist, not a denylist: a setting is passed only when berth knows
//! it cannot change the lifecycle, and its value is checked against what
//! systemd 252 parses without a warning (tests/verify.rs runs every accepted
//! boundary value through `systemd-analyze verify`), so the generator never
//! writes a line systemd would reject or silently ignore. Values never hold
//! `%`, quotes, backslashes or whitespace except where a kind allows it, so
//! nothing here needs escaping; the escaper in `render` is for argv and
//! environment.

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
    /// An integer from 1 to 10000.
    Weight,
    /// A whole percentage above 0 (CPUQuota=; may exceed 100).
    CpuQuota,
    /// Bytes (integer), a whole number with a K/M/G/T/P/E suffix, a whole
    /// percentage up to 100, or `infinity`. `zero`: whether 0 (in any
    /// spelling) is a value; systemd ignores MemoryMax=0 and MemoryHigh=0
    /// ("out of range") but takes MemoryMin=0, MemoryLow=0, MemorySwapMax=0.
    Bytes {
        zero: bool,
    },
    /// A count of at least 1, a whole percentage from 1 to 100, or `infinity`.
    Tasks,
    /// A count or `infinity` (LimitNOFILE=, LimitNPROC=).
    RlimitCount,
    /// Bytes, a whole number with a size suffix, or `infinity`.
    RlimitSize,
    Int(i64, i64),
    /// CPU indices and ascending ranges below 8192: `0-3,6`.
    CpuSet,
    /// A signal whose default action ends the process.
    Signal,
    /// A time span (`90`, `5min 20s`, `1h`) or `infinity`.
    Duration,
    Enum(&'static [&'static str]),
    /// A boolean or one of the words.
    BoolOr(&'static [&'static str]),
    /// A list of known names (a TOML list or one space-separated string).
    /// `invert`: a single leading `~` inverts the whole list, as systemd
    /// reads it. `boolean`: true/false are accepted too.
    Names {
        table: &'static [&'static str],
        invert: bool,
        boolean: bool,
    },
    /// Normalized absolute paths, each with an optional `-`, `+` or `-+`
    /// prefix.
    Paths,
    /// Octal file mode mask: `0027`.
    UMask,
    /// `[A-Za-z0-9_.-]{1,64}`.
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

const CAPABILITIES: &[&str] = &[
    "CAP_AUDIT_CONTROL",
    "CAP_AUDIT_READ",
    "CAP_AUDIT_WRITE",
    "CAP_BLOCK_SUSPEND",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_KILL",
    "CAP_LEASE",
    "CAP_LINUX_IMMUTABLE",
    "CAP_MAC_ADMIN",
    "CAP_MAC_OVERRIDE",
    "CAP_MKNOD",
    "CAP_NET_ADMIN",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_RAW",
    "CAP_PERFMON",
    "CAP_SETFCAP",
    "CAP_SETGID",
    "CAP_SETPCAP",
    "CAP_SETUID",
    "CAP_SYSLOG",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_CHROOT",
    "CAP_SYS_MODULE",
    "CAP_SYS_NICE",
    "CAP_SYS_PACCT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_WAKE_ALARM",
];

/// systemd 252's system call groups. Single system calls are not accepted:
/// an unknown name is silently dropped by systemd.
const SYSCALL_GROUPS: &[&str] = &[
    "@aio",
    "@basic-io",
    "@chown",
    "@clock",
    "@cpu-emulation",
    "@debug",
    "@default",
    "@file-system",
    "@io-event",
    "@ipc",
    "@keyring",
    "@known",
    "@memlock",
    "@module",
    "@mount",
    "@network-io",
    "@obsolete",
    "@pkey",
    "@privileged",
    "@process",
    "@raw-io",
    "@reboot",
    "@resources",
    "@sandbox",
    "@setuid",
    "@signal",
    "@swap",
    "@sync",
    "@system-service",
    "@timer",
];

const ARCHITECTURES: &[&str] = &[
    "native",
    "x86",
    "x86-64",
    "x32",
    "arm",
    "arm64",
    "mips",
    "mips-le",
    "mips64",
    "mips64-le",
    "ppc",
    "ppc64",
    "ppc64-le",
    "s390",
    "s390x",
    "riscv64",
];

const NAMESPACES: &[&str] = &["cgroup", "ipc", "net", "mnt", "pid", "user", "uts"];

const ADDRESS_FAMILIES: &[&str] = &[
    "AF_UNIX",
    "AF_LOCAL",
    "AF_INET",
    "AF_INET6",
    "AF_NETLINK",
    "AF_PACKET",
    "AF_BLUETOOTH",
    "AF_ALG",
    "AF_VSOCK",
    "AF_CAN",
    "AF_XDP",
    "AF_KEY",
    "AF_TIPC",
    "AF_RDS",
    "AF_X25",
    "AF_AX25",
    "AF_APPLETALK",
    "AF_IPX",
    "AF_NFC",
    "AF_QIPCRTR",
    "AF_SMC",
];

const STANDARD_OUTPUTS: &[&str] = &[
    "inherit",
    "null",
    "journal",
    "kmsg",
    "journal+console",
    "kmsg+console",
];

/// The allowlist, sorted by key. Everything here was checked in the harness
/// not to add a `Requires=`/`BindsTo=` on a unit stopped at shutdown.
/// Every typed pass-through setting (booleans apart), sorted by key;
/// tests/verify.rs proves their edges against systemd.
pub const TYPED_SETTINGS: &[(&str, PassthroughKind)] = &[
    ("AllowedCPUs", CpuSet),
    (
        "AmbientCapabilities",
        Names {
            table: CAPABILITIES,
            invert: false,
            boolean: false,
        },
    ),
    ("CPUAffinity", CpuSet),
    ("CPUQuota", CpuQuota),
    (
        "CPUSchedulingPolicy",
        Enum(&["other", "batch", "idle", "fifo", "rr"]),
    ),
    ("CPUWeight", Weight),
    (
        "CapabilityBoundingSet",
        Names {
            table: CAPABILITIES,
            invert: true,
            boolean: false,
        },
    ),
    ("DevicePolicy", Enum(&["auto", "closed", "strict"])),
    ("IOSchedulingClass", Enum(&["realtime", "best-effort", "idle"])),
    ("IOSchedulingPriority", Int(0, 7)),
    ("IOWeight", Weight),
    ("InaccessiblePaths", Paths),
    ("KillSignal", Signal),
    ("LimitAS", RlimitSize),
    ("LimitCORE", RlimitSize),
    ("LimitMEMLOCK", RlimitSize),
    ("LimitNOFILE", RlimitCount),
    ("LimitNPROC", RlimitCount),
    ("LimitSTACK", RlimitSize),
    (
        "LogLevelMax",
        Enum(&[
            "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug",
        ]),
    ),
    ("MemoryHigh", Bytes { zero: false }),
    ("MemoryLow", Bytes { zero: true }),
    ("MemoryMax", Bytes { zero: false }),
    ("MemoryMin", Bytes { zero: true }),
    ("MemorySwapMax", Bytes { zero: true }),
    ("Nice", Int(-20, 19)),
    ("OOMScoreAdjust", Int(-1000, 1000)),
    ("ProtectHome", BoolOr(&["read-only", "tmpfs"])),
    ("ProtectSystem", BoolOr(&["full", "strict"])),
    ("ReadOnlyPaths", Paths),
    ("ReadWritePaths", Paths),
    (
        "RestrictAddressFamilies",
        Names {
            table: ADDRESS_FAMILIES,
            invert: true,
            boolean: false,
        },
    ),
    (
        "RestrictNamespaces",
        Names {
            table: NAMESPACES,
            invert: true,
            boolean: true,
        },
    ),
    ("StandardError", Enum(STANDARD_OUTPUTS)),
    ("StandardOutput", Enum(STANDARD_OUTPUTS)),
    ("StartupCPUWeight", Weight),
    ("StartupIOWeight", Weight),
    ("SyslogIdentifier", Identifier),
    (
        "SystemCallArchitectures",
        Names {
            table: ARCHITECTURES,
            invert: false,
            boolean: false,
        },
    ),
    (
        "SystemCallFilter",
        Names {
            table: SYSCALL_GROUPS,
            invert: true,
            boolean: false,
        },
    ),
    ("TasksMax", Tasks),
    ("TimeoutStartSec", Duration),
    ("UMask", UMask),
];

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
        "a workload's restart is set by its keys restart, restart_delay_s, start_limit_interval_s and \
         start_limit_burst (berth.toml(5)); exit-status lists and StartLimitAction= (a reboot or power-off at \
         the limit) are not offered",
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
        "commands come from the `exec`, `stop_exec` and `ready_exec` keys",
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
        "how the workload is started and stopped is berth's (ready, stop_delay_s, stop_action, force_off_on_timeout)",
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
            Err(why) => errors.push(ConfigError::key(file, at, why.0)),
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

/// Why a value is refused, for the key's error message.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Invalid(String);

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn render_value(kind: PassthroughKind, value: &Value) -> Result<String, Invalid> {
    match (kind, value) {
        (Bool | BoolOr(_), Value::Boolean(b)) => Ok(yes_no(*b)),
        (Names { boolean: true, .. }, Value::Boolean(b)) => Ok(yes_no(*b)),
        (BoolOr(words) | Enum(words), Value::String(s)) => {
            if words.contains(&s.as_str()) {
                Ok(s.clone())
            } else {
                let also = if matches!(kind, BoolOr(_)) {
                    "true, false, "
                } else {
                    ""
                };
                Err(Invalid(format!(
                    "must be one of {also}{}; not {s:?}",
                    quoted_list(words)
                )))
            }
        }
        (Int(min, max), Value::Integer(n)) => in_range(*n, min, max).map(|n| n.to_string()),
        (Weight, Value::Integer(n)) => in_range(*n, 1, 10_000).map(|n| n.to_string()),
        (Bytes { zero: false }, Value::Integer(n)) => in_range(*n, 1, i64::MAX).map(|n| n.to_string()),
        (Bytes { zero: true } | RlimitCount | RlimitSize, Value::Integer(n)) => {
            in_range(*n, 0, i64::MAX).map(|n| n.to_string())
        }
        (Tasks, Value::Integer(n)) => in_range(*n, 1, i64::MAX).map(|n| n.to_string()),
        (Names { .. } | Paths, Value::Array(items)) => {
            let mut words = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    Value::String(s) => words.push(s.as_str()),
                    other => {
                        return Err(Invalid(format!(
                            "list items must be strings, not {}",
                            other.type_str()
                        )));
                    }
                }
            }
            check_list(kind, &words)
        }
        (Names { .. } | Paths, Value::String(s)) => {
            check_list(kind, &s.split(' ').filter(|w| !w.is_empty()).collect::<Vec<_>>())
        }
        (_, Value::String(s)) => {
            if check_string(kind, s) {
                Ok(s.clone())
            } else {
                Err(Invalid(format!("must be {}, not {s:?}", expectation(kind))))
            }
        }
        (_, other) => Err(Invalid(format!(
            "must be {}, not {}",
            expectation(kind),
            other.type_str()
        ))),
    }
}

fn in_range(n: i64, min: i64, max: i64) -> Result<i64, Invalid> {
    if (min..=max).contains(&n) {
        Ok(n)
    } else if max == i64::MAX {
        Err(Invalid(format!("must be at least {min}, not {n}")))
    } else {
        Err(Invalid(format!("must be from {min} to {max}, not {n}")))
    }
}

fn quoted_list(words: &[&str]) -> String {
    words
        .iter()
        .map(|w| format!("{w:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_string()
}

fn expectation(kind: PassthroughKind) -> &'static str {
    match kind {
        Bool => "true or false",
        Weight => "an integer from 1 to 10000",
        CpuQuota => "a whole percentage above 0 like \"150%\"",
        Bytes { zero: true } => {
            "a size like \"512M\" or \"1.5G\", a percentage up to \"100%\" (at most two decimals), or \"infinity\""
        }
        Bytes { zero: false } => {
            "a size above 0 like \"512M\" or \"1.5G\", a percentage above 0 up to \"100%\" (at most two decimals), or \"infinity\""
        }
        Tasks => "a count of at least 1, a whole percentage up to \"100%\", or \"infinity\"",
        RlimitCount => "a count or \"infinity\"",
        RlimitSize => "a size like \"8M\" or \"infinity\"",
        Int(..) => "an integer",
        CpuSet => "a CPU list like \"0-3,6\" (ascending ranges, CPUs below 8192)",
        Signal => "a terminating signal like \"SIGINT\" or \"SIGTERM\"",
        Duration => {
            "a time span like \"90s\" or \"5min 20s\" (in all below 2^64 microseconds, about 584,542 years), or \"infinity\""
        }
        Enum(_) | BoolOr(_) => "a string",
        Names { boolean: true, .. } => "true, false, or a list of names",
        Names { .. } => "a list of names",
        Paths => "a list of absolute paths",
        UMask => "an octal mask string like \"0027\"",
        Identifier => "a string of 1-64 characters from A-Z a-z 0-9 _ . -",
    }
}

fn check_string(kind: PassthroughKind, s: &str) -> bool {
    match kind {
        CpuQuota => percent(s).is_some_and(|p| (1..=100_000).contains(&p)),
        Bytes { zero } => {
            let s = blank_trimmed(s);
            s == "infinity"
                || memory_percent(s).is_some_and(|p| zero || p > 0)
                || size(s).is_some_and(|v| zero || v > 0)
        }
        // u64::MAX itself is systemd's "infinity": spelled as a number it
        // is out of range, and ignored.
        Tasks => {
            s == "infinity"
                || percent(s).is_some_and(|p| (1..=100).contains(&p))
                || number(s).is_some_and(|n| (1..u64::MAX).contains(&n))
        }
        RlimitCount => s == "infinity" || number(s).is_some_and(|n| n < u64::MAX),
        RlimitSize => s == "infinity" || size(blank_trimmed(s)).is_some(),
        CpuSet => cpu_set(s),
        Signal => TERMINATING_SIGNALS.contains(&s.strip_prefix("SIG").unwrap_or(s)),
        Duration => s == "infinity" || duration(s),
        UMask => (1..=4).contains(&s.len()) && s.chars().all(|c| ('0'..='7').contains(&c)),
        Identifier => {
            (1..=64).contains(&s.len())
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        }
        Bool | Weight | Int(..) => false,
        Enum(_) | BoolOr(_) | Names { .. } | Paths => unreachable!("handled by render_value"),
    }
}

/// Validates a list and renders it as systemd reads it.
fn check_list(kind: PassthroughKind, words: &[&str]) -> Result<String, Invalid> {
    let Some(first) = words.first() else {
        return Err(Invalid("must not be empty".into()));
    };
    match kind {
        Names { table, invert, .. } => {
            let inverted = invert && first.starts_with('~');
            let mut names = Vec::with_capacity(words.len());
            for (i, w) in words.iter().enumerate() {
                let name = if i == 0 && inverted { &w[1..] } else { w };
                if !table.contains(&name) {
                    let hint = if name.starts_with('~') && invert {
                        " (a single ~ before the first name inverts the whole list)"
                    } else {
                        ""
                    };
                    return Err(Invalid(format!(
                        "{w:?} is not one of {}{hint}",
                        quoted_list(table)
                    )));
                }
                names.push(name);
            }
            Ok(format!("{}{}", if inverted { "~" } else { "" }, names.join(" ")))
        }
        Paths => {
            for w in words {
                if !path_entry(w) {
                    return Err(Invalid(format!(
                        "{w:?} is not a normalized absolute path (optionally prefixed by -, + or -+) \
                         without whitespace, quotes, backslashes or %"
                    )));
                }
            }
            Ok(words.join(" "))
        }
        _ => unreachable!("only lists"),
    }
}

fn path_entry(w: &str) -> bool {
    let p = w
        .strip_prefix("-+")
        .or_else(|| w.strip_prefix('-'))
        .or_else(|| w.strip_prefix('+'))
        .unwrap_or(w);
    let Some(rest) = p.strip_prefix('/') else {
        return false;
    };
    p.len() < 4096
        && (rest.is_empty()
            || rest
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".." && c.len() <= 255))
        && !p
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '%' | '"' | '\'' | '\\'))
}

/// A non-negative whole number that fits u64 (systemd's limit values).
fn number(s: &str) -> Option<u64> {
    if s.is_empty() || !s.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn percent(s: &str) -> Option<u64> {
    number(s.strip_suffix('%')?)
}

/// A size as systemd's parse_size(s, 1024) reads it, identically in 252
/// and 257: one or more parts `[blanks][+]DIGITS[.DIGITS][blanks]SUFFIX`
/// with suffixes E P T G M K B (powers of 1024) or none, upper case, each
/// part's suffix smaller than the one before and a bare number only last
/// ("1.5G", "1G 512M", "1.G"). A part's fraction is scaled in f64 and
/// truncated, the way systemd computes it (so "0.3K" is 307 bytes). The
/// sum must stay below u64::MAX, systemd's "infinity". Leading blanks are
/// read; trailing ones are not (the unit-file reader strips both, see
/// [`blank_trimmed`]).
fn size(s: &str) -> Option<u64> {
    const IEC: [(&str, u64); 8] = [
        ("E", 1 << 60),
        ("P", 1 << 50),
        ("T", 1 << 40),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("K", 1 << 10),
        ("B", 1),
        ("", 1),
    ];
    if s.bytes().any(|c| c.is_ascii_control() && c != b'\t') {
        return None;
    }
    let b = s.as_bytes();
    let digits_from = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        i
    };
    let (mut p, mut smallest_next, mut sum) = (0usize, 0usize, 0u64);
    loop {
        while p < b.len() && blank(b[p]) {
            p += 1;
        }
        // strtoull: an optional sign, then digits; '-' is refused.
        let sign = usize::from(matches!(b.get(p), Some(b'+' | b'-')));
        let end = digits_from(p + sign);
        if end == p + sign || b[p] == b'-' {
            return None;
        }
        let whole: u64 = s[p + sign..end].parse().ok()?;
        let mut e = end;
        let mut frac = 0f64;
        if b.get(e) == Some(&b'.') {
            e += 1;
            let fend = digits_from(e);
            if fend > e {
                let digits: u64 = s[e..fend].parse().ok()?;
                frac = digits as f64;
                for _ in e..fend {
                    frac /= 10.0;
                }
                e = fend;
            }
        }
        while e < b.len() && blank(b[e]) {
            e += 1;
        }
        let i = (smallest_next..IEC.len()).find(|&i| s[e..].starts_with(IEC[i].0))?;
        let factor = IEC[i].1;
        // systemd's own test, with C's wrapping addition.
        if whole.wrapping_add(u64::from(frac > 0.0)) > u64::MAX / factor {
            return None;
        }
        let part = whole
            .wrapping_mul(factor)
            .wrapping_add((frac * factor as f64) as u64);
        if part > u64::MAX - sum {
            return None;
        }
        sum += part;
        p = e + IEC[i].0.len();
        smallest_next = i + 1;
        if p >= b.len() {
            break;
        }
    }
    (sum < u64::MAX).then_some(sum)
}

/// An rlimit size as systemd reads it: bytes, or None for "infinity" or
/// a value it would not take.
pub(super) fn rlimit_bytes(value: &str) -> Option<u64> {
    size(blank_trimmed(value))
}

fn blank(c: u8) -> bool {
    c == b' ' || c == b'\t'
}

/// The value as systemd's unit-file reader hands it on: blanks around it
/// stripped.
fn blank_trimmed(s: &str) -> &str {
    s.trim_matches([' ', '\t'])
}

/// A memory percentage in hundredths: "50%", "50.5%", "50.55%", at most
/// 100%. systemd also reads "010%" (octal: 8%), "0x10%", "+50%", "5‰" and
/// "50‱"; berth refuses those, so that what a file says is what applies.
fn memory_percent(s: &str) -> Option<u64> {
    let body = s.strip_suffix('%')?;
    let (whole, fraction) = body.split_once('.').unwrap_or((body, ""));
    let plain = |d: &str| d.bytes().all(|c| c.is_ascii_digit());
    if whole.is_empty()
        || !plain(whole)
        || (whole.len() > 1 && whole.starts_with('0'))
        || fraction.len() > 2
        || (body.contains('.') && fraction.is_empty())
        || !plain(fraction)
    {
        return None;
    }
    let hundredths = number(whole)?.checked_mul(100)? + format!("{fraction:0<2}").parse::<u64>().ok()?;
    (hundredths <= 10_000).then_some(hundredths)
}

fn cpu_set(s: &str) -> bool {
    const MAX_CPU: u64 = 8192;
    !s.is_empty()
        && s.split(',').all(|part| match part.split_once('-') {
            Some((a, b)) => matches!((number(a), number(b)), (Some(a), Some(b)) if a <= b && b < MAX_CPU),
            None => number(part).is_some_and(|n| n < MAX_CPU),
        })
}

/// A time span systemd can hold: the sum, in microseconds, must stay
/// below u64::MAX (its "infinity"); beyond, systemd says "out of range"
/// and ignores the setting (10^8 weeks, or a few 999999999h, get there).
fn duration(s: &str) -> bool {
    const SEC: u64 = 1_000_000;
    const UNITS: &[(&str, u64)] = &[
        ("usec", 1),
        ("us", 1),
        ("msec", 1000),
        ("ms", 1000),
        ("seconds", SEC),
        ("second", SEC),
        ("sec", SEC),
        ("s", SEC),
        ("", SEC),
        ("minutes", 60 * SEC),
        ("minute", 60 * SEC),
        ("min", 60 * SEC),
        ("m", 60 * SEC),
        ("hours", 3600 * SEC),
        ("hour", 3600 * SEC),
        ("hr", 3600 * SEC),
        ("h", 3600 * SEC),
        ("days", 86_400 * SEC),
        ("day", 86_400 * SEC),
        ("d", 86_400 * SEC),
        ("weeks", 604_800 * SEC),
        ("week", 604_800 * SEC),
        ("w", 604_800 * SEC),
    ];
    let mut total: Option<u64> = None;
    for part in s.split(' ').filter(|p| !p.is_empty()) {
        let split = part.find(|c: char| !c.is_ascii_digit()).unwrap_or(part.len());
        let (n, unit) = part.split_at(split);
        let Some(&(_, scale)) = UNITS.iter().find(|(u, _)| *u == unit) else {
            return false;
        };
        let Some(usec) = number(n).and_then(|n| n.checked_mul(scale)) else {
            return false;
        };
        total = match total.unwrap_or(0).checked_add(usec) {
            Some(t) if t < u64::MAX => Some(t),
            _ => return false,
        };
    }
    total.is_some()
}

/// Signals whose default action ends the process: a KillSignal= that only
/// stops or is ignored would leave a stop waiting forever when force-off is
/// disabled.
const TERMINATING_SIGNALS: &[&str] = &[
    "HUP", "INT", "QUIT", "ABRT", "KILL", "USR1", "USR2", "PIPE", "ALRM", "TERM", "XCPU", "XFSZ", "VTALRM",
    "PROF", "IO", "PWR", "SYS",
];

/// Accepted boundary values, with the line each renders to. Shared with
/// tests/verify.rs, which proves systemd parses every one without a word.
pub const ACCEPTED_SAMPLES: &[(&str, &str, &str)] = &[
    ("MemoryMax", "\"512M\"", "MemoryMax=512M"),
    ("MemoryMax", "1073741824", "MemoryMax=1073741824"),
    ("MemoryMax", "\"15E\"", "MemoryMax=15E"),
    ("MemoryMax", "\"infinity\"", "MemoryMax=infinity"),
    ("MemoryHigh", "\"80%\"", "MemoryHigh=80%"),
    ("MemoryLow", "\"100%\"", "MemoryLow=100%"),
    ("MemoryMin", "\"0\"", "MemoryMin=0"),
    ("MemoryLow", "\"0%\"", "MemoryLow=0%"),
    ("MemorySwapMax", "0", "MemorySwapMax=0"),
    ("MemoryMax", "1", "MemoryMax=1"),
    ("MemoryHigh", "\"1%\"", "MemoryHigh=1%"),
    ("MemoryMax", "\"1.5G\"", "MemoryMax=1.5G"),
    ("MemoryMax", "\"1G 512M\"", "MemoryMax=1G 512M"),
    ("MemoryHigh", "\"0.01%\"", "MemoryHigh=0.01%"),
    ("MemoryHigh", "\"50.55%\"", "MemoryHigh=50.55%"),
    ("MemoryLow", "\"0.4\"", "MemoryLow=0.4"),
    ("LimitCORE", "\"1.5G\"", "LimitCORE=1.5G"),
    (
        "LimitNOFILE",
        "\"18446744073709551614\"",
        "LimitNOFILE=18446744073709551614",
    ),
    (
        "TasksMax",
        "\"18446744073709551614\"",
        "TasksMax=18446744073709551614",
    ),
    ("TimeoutStartSec", "\"30500000w\"", "TimeoutStartSec=30500000w"),
    ("TimeoutStartSec", "\"999999999h\"", "TimeoutStartSec=999999999h"),
    ("CPUQuota", "\"150%\"", "CPUQuota=150%"),
    ("CPUQuota", "\"1%\"", "CPUQuota=1%"),
    ("CPUWeight", "1", "CPUWeight=1"),
    ("CPUWeight", "10000", "CPUWeight=10000"),
    ("IOWeight", "200", "IOWeight=200"),
    ("TasksMax", "\"infinity\"", "TasksMax=infinity"),
    ("TasksMax", "1", "TasksMax=1"),
    ("TasksMax", "\"100%\"", "TasksMax=100%"),
    ("LimitNOFILE", "65536", "LimitNOFILE=65536"),
    ("LimitNPROC", "\"infinity\"", "LimitNPROC=infinity"),
    ("LimitCORE", "\"0\"", "LimitCORE=0"),
    ("LimitMEMLOCK", "\"64M\"", "LimitMEMLOCK=64M"),
    ("Nice", "-20", "Nice=-20"),
    ("OOMScoreAdjust", "1000", "OOMScoreAdjust=1000"),
    ("NoNewPrivileges", "true", "NoNewPrivileges=yes"),
    ("PrivateDevices", "false", "PrivateDevices=no"),
    ("ProtectSystem", "\"strict\"", "ProtectSystem=strict"),
    ("ProtectHome", "false", "ProtectHome=no"),
    (
        "SystemCallFilter",
        "[\"@system-service\", \"@mount\"]",
        "SystemCallFilter=@system-service @mount",
    ),
    (
        "SystemCallFilter",
        "[\"~@mount\", \"@reboot\"]",
        "SystemCallFilter=~@mount @reboot",
    ),
    (
        "SystemCallArchitectures",
        "\"native\"",
        "SystemCallArchitectures=native",
    ),
    (
        "CapabilityBoundingSet",
        "[\"~CAP_SYS_ADMIN\", \"CAP_NET_ADMIN\"]",
        "CapabilityBoundingSet=~CAP_SYS_ADMIN CAP_NET_ADMIN",
    ),
    (
        "AmbientCapabilities",
        "\"CAP_NET_BIND_SERVICE\"",
        "AmbientCapabilities=CAP_NET_BIND_SERVICE",
    ),
    (
        "RestrictAddressFamilies",
        "[\"AF_UNIX\", \"AF_INET\", \"AF_INET6\"]",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
    ),
    ("RestrictNamespaces", "true", "RestrictNamespaces=yes"),
    (
        "RestrictNamespaces",
        "[\"~user\", \"net\"]",
        "RestrictNamespaces=~user net",
    ),
    (
        "ReadWritePaths",
        "[\"/var/lib/vm\", \"-/srv/x\", \"+/run/y\", \"-+/z\"]",
        "ReadWritePaths=/var/lib/vm -/srv/x +/run/y -+/z",
    ),
    ("ReadOnlyPaths", "\"/\"", "ReadOnlyPaths=/"),
    ("KillSignal", "\"SIGINT\"", "KillSignal=SIGINT"),
    ("KillSignal", "\"TERM\"", "KillSignal=TERM"),
    ("TimeoutStartSec", "\"5min 20s\"", "TimeoutStartSec=5min 20s"),
    ("TimeoutStartSec", "\"infinity\"", "TimeoutStartSec=infinity"),
    ("AllowedCPUs", "\"0-3,6\"", "AllowedCPUs=0-3,6"),
    ("CPUAffinity", "\"8191\"", "CPUAffinity=8191"),
    ("UMask", "\"0027\"", "UMask=0027"),
    ("SyslogIdentifier", "\"vm-1.main\"", "SyslogIdentifier=vm-1.main"),
    (
        "StandardOutput",
        "\"journal+console\"",
        "StandardOutput=journal+console",
    ),
    ("LogLevelMax", "\"info\"", "LogLevelMax=info"),
    (
        "IOSchedulingClass",
        "\"best-effort\"",
        "IOSchedulingClass=best-effort",
    ),
    ("CPUSchedulingPolicy", "\"batch\"", "CPUSchedulingPolicy=batch"),
    ("DevicePolicy", "\"closed\"", "DevicePolicy=closed"),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn one(key: &str, value: &str) -> Result<String, Invalid> {
        let table: Table = format!("{key} = {value}").parse().unwrap();
        let mut errors = Vec::new();
        let out = validate(&table, Path::new("/w.toml"), &mut errors);
        match errors.pop() {
            Some(e) => Err(Invalid(e.to_string())),
            None => Ok(format!("{}={}", out[0].key, out[0].value)),
        }
    }

    const E: u64 = 1 << 60;
    const P: u64 = 1 << 50;
    const G: u64 = 1 << 30;
    const M: u64 = 1 << 20;
    const K: u64 = 1 << 10;

    /// Issue 31, item 9: "1.5G" was refused although systemd 252 loads
    /// it without a word. Each row is what parse_size gives in both 252
    /// and 257 (called from their libsystemd-shared, and seen through
    /// `systemd-analyze verify`); None: refused.
    const SIZES: &[(&str, Option<u64>)] = &[
        ("1.5G", Some(1610612736)),
        ("1.5X", None),
        ("1.5", Some(1)),
        ("0.5K", Some(512)),
        ("1.0000000000000000001G", Some(G)),
        ("1.99999999999E", Some(2305843009202164992)),
        ("16E", None),
        ("15E", Some(15 * E)),
        ("15.0E", Some(15 * E)),
        ("15.9E", None),
        ("14.5E", Some(16717361816799281152)),
        ("1.G", Some(G)),
        ("1.", Some(1)),
        ("1..", None),
        (".5G", None),
        ("1 G", Some(G)),
        ("1\tG", Some(G)),
        ("1. G", Some(G)),
        ("1 .5G", None),
        ("1. 5G", None),
        ("1G 1M", Some(G + M)),
        ("1G1M", Some(G + M)),
        ("1G+1M", Some(G + M)),
        ("1G-1M", None),
        ("1G 512M 3", Some(G + 512 * M + 3)),
        ("1M 1G", None),
        ("1G 1G", None),
        ("1 1", None),
        ("1K 1", Some(K + 1)),
        ("1B 1", Some(2)),
        ("1K 1B", Some(K + 1)),
        ("1E 1P 1T 1G 1M 1K 1B 1", Some(1154048505100108802)),
        ("1g", None),
        ("1k", None),
        ("1KB", None),
        ("1BK", None),
        ("1B", Some(1)),
        ("2.5B", Some(2)),
        ("1.5 B", Some(1)),
        ("+1G", Some(G)),
        ("-1G", None),
        ("-0", None),
        ("+ 1G", None),
        ("1.+5G", None),
        ("1.-5G", None),
        ("1e3", None),
        ("0x10", None),
        ("50%", None),
        ("infinity", None),
        ("0", Some(0)),
        ("0K", Some(0)),
        ("0.4", Some(0)),
        ("00012M", Some(12 * M)),
        (" 1G", Some(G)),
        ("\t1G", Some(G)),
        ("1G ", None), // parse_size refuses; the unit-file reader strips it
        ("1G\n", None),
        ("\x0b1G", None), // systemd takes it; refused on purpose
        ("0.1K", Some(102)),
        ("0.3K", Some(307)),
        ("0.9K", Some(921)),
        ("1.1K", Some(1126)),
        ("1.05G", Some(1127428915)),
        ("1.005G", Some(1079110533)),
        ("0.123456789M", Some(129453)),
        ("0.0009765625K", Some(1)),
        ("0.00048828125K", Some(0)),
        ("0.9999999999999999999K", Some(K)), // f64 rounds up
        ("0.99999999999999999999K", None),   // fraction digits overflow u64
        ("1.18446744073709551616K", None),
        ("1.00000000000000000000000000001K", Some(K)),
        ("7.99999999999999999E", Some(8 * E)),
        ("4.999999999999999999P", Some(5 * P)),
        ("16383P", Some(16383 * P)),
        ("16383.0P", Some(16383 * P)),
        ("16383.5P", None),
        ("16383.99999999999999P", None),
        ("18446744073709551614", Some(u64::MAX - 1)),
        ("18446744073709551614.5", Some(u64::MAX - 1)),
        ("18446744073709551615", None),
        ("18446744073709551615B", None),
        ("18446744073709551615.5", None),
        ("18446744073709551616", None),
        ("15E 1023P 1023T 1023G 1023M 1023K 1022", Some(u64::MAX - 1)),
        ("15E 1023P 1023T 1023G 1023M 1023K 1023", None),
        // systemd's wrap-around: l = ULLONG_MAX plus a fraction rounding to 1
        ("18446744073709551615.9999999999999999999", Some(0)),
        ("", None),
    ];

    #[test]
    fn sizes_are_read_as_systemd_reads_them() {
        for (s, want) in SIZES {
            assert_eq!(size(s), *want, "size({s:?})");
        }
        // A fraction whose f64 underflows to 0 is no fraction.
        assert_eq!(size(&format!("15.{}1E", "0".repeat(400))), Some(15 * E));
    }

    #[test]
    fn memory_percentages_are_plain_decimals() {
        for (s, want) in [
            ("50%", Some(5000)),
            ("50.5%", Some(5050)),
            ("50.55%", Some(5055)),
            ("0.01%", Some(1)),
            ("100.00%", Some(10_000)),
            ("0%", Some(0)),
            ("50.555%", None),
            ("100.01%", None),
            ("50.%", None),
            (".5%", None),
            ("010%", None),
            ("0x10%", None),
            ("+50%", None),
            ("50 %", None),
            ("5‰", None),
        ] {
            assert_eq!(memory_percent(s), want, "{s:?}");
        }
    }

    #[test]
    fn allowlist_is_sorted_for_binary_search() {
        let keys: Vec<_> = TYPED_SETTINGS.iter().map(|(k, _)| *k).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }

    /// Accepted values and the line each renders to. tests/verify.rs feeds
    /// this same list (ACCEPTED_SAMPLES) to `systemd-analyze verify`.
    #[test]
    fn accepted_values_render_as_systemd_syntax() {
        for (key, value, line) in ACCEPTED_SAMPLES {
            assert_eq!(one(key, value), Ok(line.to_string()), "{key} = {value}");
        }
    }

    #[test]
    fn lifecycle_settings_are_refused_with_a_reason() {
        for (key, value, reason) in [
            (
                "Restart",
                "\"always\"",
                "service.Restart: a workload's restart is set by its keys",
            ),
            ("Slice", "\"x.slice\"", "placement and dependencies"),
            ("ExecStop", "\"/bin/x\"", "stop_exec"),
            ("WorkingDirectory", "\"/srv\"", "implicit Requires="),
            ("PrivateTmp", "true", "implicit Requires="),
            ("TimeoutStopSec", "10", "stop_delay_s"),
            ("Frobnicate", "1", "not a setting berth passes through"),
        ] {
            let err = one(key, value).unwrap_err().0;
            assert!(err.contains(reason), "{key}: {err}");
        }
    }

    /// Values systemd 252 rejects or silently ignores (seen with
    /// `systemd-analyze verify`), and values that would break the lifecycle.
    #[test]
    fn bad_values_are_refused() {
        for (k, v) in [
            ("MemoryMax", "\"lots\""),
            ("MemoryMax", "-1"),
            ("MemoryMax", "\"101%\""),
            ("MemoryMax", "\"0.555%\""),
            ("MemoryMax", "\"1.5X\""),
            ("MemoryMax", "\".5G\""),
            ("MemoryMax", "\"1g\""),
            ("MemoryMax", "\"1M 1G\""),
            ("MemoryMax", "\"15.9E\""),
            ("MemoryMax", "\"0.4\""),
            ("MemoryMax", "\"010%\""),
            ("MemoryMax", "\"50.%\""),
            ("MemoryMax", "\"\""),
            ("MemoryMax", "\"99999999999999999999\""),
            ("MemoryMax", "\"16E\""),
            ("CPUWeight", "0"),
            ("CPUQuota", "\"50\""),
            ("CPUQuota", "\"0%\""),
            ("CPUQuota", "\"1.234%\""),
            ("TasksMax", "0"),
            ("TasksMax", "\"0\""),
            ("TasksMax", "\"101%\""),
            ("LimitNOFILE", "\"64K\""),
            ("LimitNPROC", "\"1K\""),
            ("AllowedCPUs", "\"3-1\""),
            ("AllowedCPUs", "\"99999\""),
            ("TimeoutStartSec", "\"99999999999999999999\""),
            ("TimeoutStartSec", "\"soon\""),
            // Issue 10, defect 5: values systemd 252 ignores ("out of range").
            ("MemoryMax", "0"),
            ("MemoryMax", "\"0\""),
            ("MemoryMax", "\"0%\""),
            ("MemoryMax", "\"0K\""),
            ("MemoryMax", "\"0000\""),
            ("MemoryHigh", "0"),
            ("MemoryHigh", "\"0%\""),
            ("LimitNOFILE", "\"18446744073709551615\""),
            ("LimitNPROC", "\"18446744073709551615\""),
            ("TasksMax", "\"18446744073709551615\""),
            ("TimeoutStartSec", "\"99999999w\""),
            ("TimeoutStartSec", "\"30500569w\""),
            ("TimeoutStartSec", "\"999999999d\""),
            (
                "TimeoutStartSec",
                "\"999999999h 999999999h 999999999h 999999999h 999999999h 999999999h\"",
            ),
            ("KillSignal", "\"SIGFOO\""),
            ("KillSignal", "\"SIGSTOP\""),
            ("KillSignal", "\"SIGCHLD\""),
            ("KillSignal", "\"SIGCONT\""),
            ("SystemCallFilter", "[\"@system-service\", \"~@mount\"]"),
            ("SystemCallFilter", "[\"write\"]"),
            ("SystemCallFilter", "\"@x\\\"y\""),
            (
                "CapabilityBoundingSet",
                "[\"~CAP_SYS_ADMIN\", \"~CAP_NET_ADMIN\"]",
            ),
            ("CapabilityBoundingSet", "[\"CAP_FROB\"]"),
            ("AmbientCapabilities", "[\"~CAP_NET_RAW\"]"),
            ("RestrictAddressFamilies", "[\"AF_FOO\"]"),
            ("SystemCallArchitectures", "[\"bogus\"]"),
            ("RestrictNamespaces", "[\"net\", \"~user\"]"),
            ("ReadWritePaths", "[\"relative\"]"),
            ("ReadWritePaths", "[\"/a b\"]"),
            ("ReadWritePaths", "[\"/%h\"]"),
            ("ReadWritePaths", "[\"+-/x\"]"),
            ("ReadWritePaths", "[\"/a/../b\"]"),
            ("ReadWritePaths", "[\"/a/\"]"),
            ("ReadWritePaths", "[]"),
            ("NoNewPrivileges", "\"yes\""),
            ("UMask", "\"0999\""),
            ("Nice", "20"),
            ("ProtectSystem", "\"everything\""),
            ("SystemCallErrorNumber", "\"EPERM\""),
        ] {
            assert!(
                one(k, v).is_err(),
                "{k} = {v} should be refused, got {:?}",
                one(k, v)
            );
        }
    }
}
