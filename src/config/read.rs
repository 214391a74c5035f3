//! Typed reads from a parsed TOML table that collect every error with the
//! file and the dotted key, and notice keys nobody asked for.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use toml::{Table, Value};

use super::ConfigError;
use super::checks::Autostart;

/// Reads and parses one TOML file.
pub(super) fn parse_file(path: &Path) -> Result<Table, ConfigError> {
    let text = fs::read_to_string(path).map_err(|e| ConfigError::file(path, format!("cannot read: {e}")))?;
    parse_text(path, &text)
}

/// `text` as the TOML file at `path` (named in the errors).
pub(super) fn parse_text(path: &Path, text: &str) -> Result<Table, ConfigError> {
    text.parse::<Table>().map_err(|e| {
        let at = match e.span() {
            Some(span) => {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                format!(" at line {line}, column {column}")
            }
            None => String::new(),
        };
        ConfigError::file(path, format!("not valid TOML{at}: {}", e.message().trim()))
    })
}

/// Which file each key came from, for merged configs.
#[derive(Debug, Clone)]
pub(super) struct Origin {
    default: PathBuf,
    by_key: BTreeMap<String, PathBuf>,
}

impl Origin {
    pub(super) fn single(file: &Path) -> Self {
        Origin {
            default: file.to_path_buf(),
            by_key: BTreeMap::new(),
        }
    }

    /// Records that every key in `table` (recursively, under `prefix`) now
    /// comes from `file`.
    pub(super) fn record(&mut self, prefix: &str, table: &Table, file: &Path) {
        for (key, value) in table {
            let path = join(prefix, key);
            if let Value::Table(sub) = value {
                self.record(&path, sub, file);
            }
            self.by_key.insert(path, file.to_path_buf());
        }
    }

    /// The file that set `key`, or the one that set its closest parent.
    pub(super) fn file_of(&self, key: &str) -> &Path {
        let mut probe = key;
        loop {
            if let Some(f) = self.by_key.get(probe) {
                return f;
            }
            match probe.rfind('.') {
                Some(i) => probe = &probe[..i],
                None => return &self.default,
            }
        }
    }
}

pub(super) fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// Merges `over` into `base` key by key: tables merge recursively, anything
/// else replaces.
pub(super) fn merge(base: &mut Table, over: Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(Value::Table(b)), Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

pub(super) fn control_char(s: &str) -> Option<char> {
    s.chars().find(|c| c.is_control())
}

pub(super) fn describe_control(c: char) -> String {
    format!(
        "contains the control character U+{:04X}; newlines and control characters are not allowed",
        c as u32
    )
}

pub(super) struct Reader<'a> {
    table: &'a Table,
    prefix: String,
    origin: &'a Origin,
    seen: Vec<&'a str>,
    pub(super) errors: Vec<ConfigError>,
}

impl<'a> Reader<'a> {
    pub(super) fn new(table: &'a Table, prefix: &str, origin: &'a Origin) -> Self {
        Reader {
            table,
            prefix: prefix.to_string(),
            origin,
            seen: Vec::new(),
            errors: Vec::new(),
        }
    }

    pub(super) fn key_path(&self, key: &str) -> String {
        join(&self.prefix, key)
    }

    pub(super) fn file_of(&self, key: &str) -> &'a Path {
        self.origin.file_of(&self.key_path(key))
    }

    pub(super) fn origin(&self) -> &'a Origin {
        self.origin
    }

    pub(super) fn error(&mut self, key: &str, reason: impl Into<String>) {
        let path = self.key_path(key);
        let file = self.origin.file_of(&path);
        self.errors.push(ConfigError::key(file, path, reason));
    }

    pub(super) fn take(&mut self, key: &str) -> Option<&'a Value> {
        let (k, v) = self.table.get_key_value(key)?;
        self.seen.push(k.as_str());
        Some(v)
    }

    fn wrong_type(&mut self, key: &str, want: &str, got: &Value) {
        self.error(key, format!("must be {want}, not {}", got.type_str()));
    }

    pub(super) fn opt_int(&mut self, key: &str, min: i64, max: i64) -> Option<i64> {
        let value = self.take(key)?;
        match value {
            Value::Integer(n) if (min..=max).contains(n) => Some(*n),
            Value::Integer(n) => {
                self.error(key, format!("must be from {min} to {max}, not {n}"));
                None
            }
            other => {
                self.wrong_type(key, "an integer", other);
                None
            }
        }
    }

    pub(super) fn int(&mut self, key: &str, default: i64, min: i64, max: i64) -> i64 {
        self.opt_int(key, min, max).unwrap_or(default)
    }

    pub(super) fn opt_bool(&mut self, key: &str) -> Option<bool> {
        match self.take(key)? {
            Value::Boolean(b) => Some(*b),
            other => {
                self.wrong_type(key, "true or false", other);
                None
            }
        }
    }

    pub(super) fn bool(&mut self, key: &str, default: bool) -> bool {
        self.opt_bool(key).unwrap_or(default)
    }

    /// `true`, `false` or `"last-state"`.
    pub(super) fn autostart(&mut self, key: &str, default: Autostart) -> Autostart {
        match self.take(key) {
            None => default,
            Some(Value::Boolean(true)) => Autostart::Yes,
            Some(Value::Boolean(false)) => Autostart::No,
            Some(Value::String(s)) if s == "last-state" => Autostart::LastState,
            Some(Value::String(s)) => {
                let s = s.escape_debug().to_string();
                self.error(key, format!("must be true, false or \"last-state\", not \"{s}\""));
                default
            }
            Some(other) => {
                self.wrong_type(key, "true, false or \"last-state\"", other);
                default
            }
        }
    }

    /// A string without control characters.
    pub(super) fn opt_text(&mut self, key: &str) -> Option<String> {
        match self.take(key)? {
            Value::String(s) => match control_char(s) {
                Some(c) => {
                    self.error(key, describe_control(c));
                    None
                }
                None => Some(s.clone()),
            },
            other => {
                self.wrong_type(key, "a string", other);
                None
            }
        }
    }

    /// A list of strings without control characters; `what` names one item
    /// in messages. Missing → empty.
    pub(super) fn text_list(&mut self, key: &str, what: &str) -> Option<Vec<String>> {
        let Some(value) = self.take(key) else {
            return Some(Vec::new());
        };
        let Value::Array(items) = value else {
            self.wrong_type(key, &format!("a list of {what}s"), value);
            return None;
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item {
                Value::String(s) => {
                    if let Some(c) = control_char(s) {
                        self.error(&format!("{key}[{i}]"), describe_control(c));
                        return None;
                    }
                    out.push(s.clone());
                }
                other => {
                    self.error(
                        &format!("{key}[{i}]"),
                        format!("must be a string ({what}), not {}", other.type_str()),
                    );
                    return None;
                }
            }
        }
        Some(out)
    }

    pub(super) fn opt_table(&mut self, key: &str) -> Option<&'a Table> {
        match self.take(key)? {
            Value::Table(t) => Some(t),
            other => {
                self.wrong_type(key, "a table", other);
                None
            }
        }
    }

    /// Reports every key that was never taken. `known` lists the accepted
    /// keys for the message.
    pub(super) fn finish(mut self, known: &[&str]) -> Vec<ConfigError> {
        let unknown: Vec<&String> = self
            .table
            .keys()
            .filter(|k| !self.seen.contains(&k.as_str()))
            .collect();
        for key in unknown {
            let hint = match known.iter().find(|k| similar(k, key)) {
                Some(k) => format!("unknown key (did you mean {k:?}?)"),
                None => format!("unknown key; known keys here: {}", known.join(", ")),
            };
            self.error(key, hint);
        }
        self.errors
    }
}

/// Close enough to be a typo: same letters ignoring case, or at most two
/// edits apart (`stop_delay` for `stop_delay_s`).
fn similar(known: &str, typed: &str) -> bool {
    known.eq_ignore_ascii_case(typed) || edit_distance(&known.to_lowercase(), &typed.to_lowercase()) <= 2
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typo_hints() {
        assert!(similar("stop_delay_s", "stop_delay"));
        assert!(similar("exec", "Exec"));
        assert!(!similar("exec", "environment"));
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn toml_errors_say_where() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.toml");
        std::fs::write(&p, "a = 1\nexec = [\"/x\"\n").unwrap();
        let e = parse_file(&p).unwrap_err().to_string();
        assert!(e.contains("not valid TOML at line 2, column"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
