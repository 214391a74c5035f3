//! berth's unit text at its lowest level: the one escaper every argv,
//! environment value, path and free text goes through on its way into a
//! unit file, and the fingerprint of what was written. Below config, the
//! units and the drop-ins alike, so that all of them may use it.

use std::fmt::Write as _;
use std::path::Path;

// ---------------------------------------------------------------------------
// The escaper.
//
// systemd reads ExecStart=/ExecStop= like this (systemd.service(5),
// "Command lines"): first specifiers are expanded over the whole value
// (`%%` → `%`), then the value is split into words with C-style unquoting
// (`"…"` groups, `\\` and `\"` unescape, `\xNN` decodes), and finally
// `$NAME`/`${NAME}` are replaced in each word (`$$` → `$`). Environment=
// is the same minus the `$` step. A bare `;` word separates commands and a
// leading `-@:+!` on the first word is a prefix, but only when unquoted.
//
// So every word is written inside double quotes, with `\` and `"`
// backslash-escaped, control characters as `\xNN`, `%` doubled, and `$`
// doubled where the setting expands variables (arguments, not the program
// path). Quoting every word also keeps empty arguments, spaces, `;` and
// leading prefix characters literal.
// Non-ASCII text passes through unchanged (unit files are UTF-8).
// ---------------------------------------------------------------------------

fn quote_word(word: &str, expands_dollar: bool, out: &mut String) {
    out.push('"');
    for c in word.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '%' => out.push_str("%%"),
            '$' if expands_dollar => out.push_str("$$"),
            '\0' => unreachable!("config validation rejects NUL; argv cannot hold one"),
            c if c.is_control() && (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            // C1 controls: \u escapes are decoded by systemd's cunescape.
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The value of an `ExecStart=`/`ExecStop=` line that runs exactly `argv`.
/// systemd replaces `$` variables in the arguments but not in the program
/// path, so `$` is doubled everywhere except in the first word.
pub fn exec_line(argv: &[String]) -> String {
    let mut out = String::new();
    for (i, word) in argv.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        quote_word(word, i > 0, &mut out);
    }
    out
}

/// The value of an `Environment=` line that sets `name` to exactly `value`.
pub fn environment_assignment(name: &str, value: &str) -> String {
    let mut out = String::new();
    quote_word(&format!("{name}={value}"), false, &mut out);
    out
}

/// Free text for settings that expand specifiers but do not unquote
/// (`Description=`). Config validation rejects what cannot be represented
/// there (control characters, a trailing backslash).
pub fn plain_text(text: &str) -> String {
    text.replace('%', "%%")
}

/// `c` as unit text: `%` doubled (specifiers), a control character as
/// `\\xNN` bytes.
pub fn push_specifier_safe(out: &mut String, c: char) {
    match c {
        '%' => out.push_str("%%"),
        c if c.is_control() => {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
        c => out.push(c),
    }
}

/// One word of a setting that takes a list of paths (ReadWritePaths=):
/// `prefix` and the path in double quotes, `"` and `\\` escaped, control
/// characters as \\xNN, `%` doubled (specifiers are expanded after the
/// quotes are taken off).
pub fn path_word(prefix: &str, path: &Path) -> String {
    let mut out = String::from("\"");
    out.push_str(prefix);
    for c in path.to_string_lossy().chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => push_specifier_safe(&mut out, c),
        }
    }
    out.push('"');
    out
}

/// FNV-1a, 64 bits: a stable fingerprint, not a defence against tampering.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}
