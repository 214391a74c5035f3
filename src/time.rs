//! Timestamps as berth writes them everywhere (records, freeze flags,
//! reports, the daemon's status file): RFC 3339, UTC, whole seconds.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `SystemTime` as RFC 3339 UTC with whole seconds.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `t` to the microsecond as a systemd calendar event (`OnCalendar=`,
/// *systemd.time*(7)): `2026-12-05 10:03:07.250000 UTC`. Whole seconds
/// would fire up to a second before `t`.
pub fn calendar_event(t: SystemTime) -> String {
    let stamp = rfc3339(t);
    let micros = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_micros())
        .unwrap_or(0);
    format!("{} {}.{micros:06} UTC", &stamp[..10], &stamp[11..19])
}

/// The inverse of [`rfc3339`]; `None` for anything else.
pub fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() != 20 || b[4] != b'-' || b[10] != b'T' || b[19] != b'Z' {
        return None;
    }
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d, hh, mm, ss) = (n(0..4)?, n(5..7)?, n(8..10)?, n(11..13)?, n(14..16)?, n(17..19)?);
    // Days from civil (H. Hinnant).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    u64::try_from(secs)
        .ok()
        .map(|s| UNIX_EPOCH + Duration::from_secs(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(1_795_971_581)),
            "2026-11-29T16:59:41Z"
        );
    }

    #[test]
    fn calendar_events_keep_the_microseconds() {
        let t = UNIX_EPOCH + Duration::from_micros(1_795_971_581_999_999);
        assert_eq!(calendar_event(t), "2026-11-29 16:59:41.999999 UTC");
        let t = UNIX_EPOCH + Duration::from_nanos(1_795_971_581_000_000_999);
        assert_eq!(calendar_event(t), "2026-11-29 16:59:41.000000 UTC");
    }

    #[test]
    fn round_trip() {
        let t = UNIX_EPOCH + Duration::from_secs(1_795_971_581);
        assert_eq!(parse_rfc3339(&rfc3339(t)), Some(t));
        assert_eq!(parse_rfc3339("garbage"), None);
    }
}
