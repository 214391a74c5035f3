//! `[cluster]` in berth.toml: the etcd cluster this node shares
//! maintenance, freezes and HA ownership through. Without the section
//! berth is single-host, exactly as before.

use std::path::PathBuf;
use std::time::Duration;

use toml::Table;

use super::ConfigError;
use super::read::{Origin, Reader};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    /// This node's name in the cluster; the hostname when unset.
    pub node: Option<String>,
    /// etcd's client URLs, all `http://` or all `https://`.
    pub endpoints: Vec<String>,
    /// Where berth's keys live, `/` at both ends.
    pub prefix: String,
    /// The TTL asked for the node's lease.
    pub lease_ttl_s: u64,
    pub maintenance_grace_period_s: u64,
    pub rejoin_grace_period_s: u64,
    pub tls: Option<Tls>,
    /// A hardware watchdog berth-fence-watch holds (sbd-style): peers then
    /// wait its timeout, not the stop bound, after this node's lease.
    pub watchdog: Option<Watchdog>,
}

/// `watchdog = "/dev/watchdogN"` and `watchdog_timeout_s`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watchdog {
    pub device: PathBuf,
    pub timeout_s: u64,
}

pub const DEFAULT_WATCHDOG_TIMEOUT_S: u64 = 10;
/// Below 5 s a busy host could miss a pet (they come every quarter of
/// the timeout); above 60 s a device that fires a few percent late (the
/// i6300esb's two stages of 1024 ticks per second count 1.024 times the
/// timeout) would outrun the peers' fixed margin of 3 s.
pub const MIN_WATCHDOG_TIMEOUT_S: u64 = 5;
pub const MAX_WATCHDOG_TIMEOUT_S: u64 = 60;

/// Only the kernel's watchdog nodes: the path also lands in unit text
/// (DeviceAllow=), so nothing else gets that far.
pub fn check_watchdog_device(path: &str) -> Result<(), String> {
    let n = path
        .strip_prefix("/dev/watchdog")
        .ok_or("must be a watchdog device, /dev/watchdog or /dev/watchdogN")?;
    if n.len() > 3 || !n.bytes().all(|b| b.is_ascii_digit()) {
        return Err("must be a watchdog device, /dev/watchdog or /dev/watchdogN (N at most 3 digits)".into());
    }
    Ok(())
}

/// TLS towards etcd: the CA that signed its certificate, and a client
/// certificate and key when etcd asks for one (both or neither).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    pub ca: PathBuf,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

pub const DEFAULT_PREFIX: &str = "/berth/";
pub const DEFAULT_LEASE_TTL_S: u64 = 10;
/// etcd's minimum TTL is about 2 s at default election settings (it
/// raises shorter ones); 3 leaves room for the margin.
pub const MIN_LEASE_TTL_S: u64 = 3;
const MAX_LEASE_TTL_S: i64 = 3600;
const MAX_ENDPOINTS: usize = 16;
const MAX_NODE_NAME: usize = 63;
/// A URL of a host name (at most 253 bytes) and a port, with room.
const MAX_ENDPOINT: usize = 300;
/// PATH_MAX, less its terminating NUL.
const MAX_PATH: usize = 4095;

impl ClusterSettings {
    /// How often the lease is kept alive: five times per TTL, so that two
    /// lost keep-alives still leave time to fence.
    pub fn keep_alive_interval(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_s * 1000 / 5)
    }

    /// How long before the lease's end the owner begins to fence: two
    /// keep-alive intervals (issue 13: at least two).
    pub fn fence_margin(&self) -> Duration {
        2 * self.keep_alive_interval()
    }

    /// The largest WatchdogSec= of the daemon that is below the TTL minus
    /// the margin: a hung daemon is killed (and its node fenced) before
    /// its lease could outlive it.
    pub fn max_watchdog_s(&self) -> u64 {
        let window_ms = self.lease_ttl_s * 1000 - self.fence_margin().as_millis() as u64;
        window_ms.div_ceil(1000) - 1
    }
}

/// A node name: a key component etcd and a hostname can both carry.
pub fn check_node_name(name: &str) -> Result<(), String> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if name.is_empty() || name.len() > MAX_NODE_NAME {
        Err(format!("must be 1 to {MAX_NODE_NAME} characters long"))
    } else if !ok_chars {
        Err("may hold only letters, digits, '-', '_' and '.'".into())
    } else if !name.as_bytes()[0].is_ascii_alphanumeric() {
        Err("must begin with a letter or a digit".into())
    } else {
        Ok(())
    }
}

fn check_endpoint(e: &str) -> Result<(), String> {
    if e.len() > MAX_ENDPOINT {
        return Err(format!("is {} bytes long; at most {MAX_ENDPOINT}", e.len()));
    }
    let rest = e
        .strip_prefix("http://")
        .or_else(|| e.strip_prefix("https://"))
        .ok_or("must begin with http:// or https://")?;
    let hostport = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) = hostport.rsplit_once(':').ok_or("must name a port (host:port)")?;
    if host.is_empty()
        || !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-_[]:".contains(&b))
    {
        return Err("must name a host (a name or an address)".into());
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!("port must be 1 to 65535, not {port:?}")),
    }
}

pub(super) const CLUSTER_KEYS: &[&str] = &[
    "node",
    "endpoints",
    "prefix",
    "lease_ttl_s",
    "maintenance_grace_period_s",
    "rejoin_grace_period_s",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "watchdog",
    "watchdog_timeout_s",
];

/// Reads `[cluster]`; None when it has errors (they go to `errors`: a
/// node that cannot join as configured runs single-host rather than
/// guess).
pub(super) fn read(table: &Table, origin: &Origin, errors: &mut Vec<ConfigError>) -> Option<ClusterSettings> {
    let mut r = Reader::new(table, "cluster", origin);
    let node = r.opt_text("node");
    if let Some(n) = &node
        && let Err(why) = check_node_name(n)
    {
        r.error("node", format!("{:?} {why}", n.escape_debug().to_string()));
    }
    let endpoints = r.text_list("endpoints", "URL").unwrap_or_default();
    if endpoints.is_empty() {
        r.error(
            "endpoints",
            "missing: etcd's client URLs, e.g. endpoints = [\"http://10.0.0.1:2379\"]",
        );
    } else if endpoints.len() > MAX_ENDPOINTS {
        r.error(
            "endpoints",
            format!("has {} URLs; at most {MAX_ENDPOINTS}", endpoints.len()),
        );
    }
    for (i, e) in endpoints.iter().enumerate() {
        if let Err(why) = check_endpoint(e) {
            r.error(
                &format!("endpoints[{i}]"),
                format!("{:?} {why}", e.escape_debug().to_string()),
            );
        }
    }
    let https = endpoints.iter().filter(|e| e.starts_with("https://")).count();
    if https != 0 && https != endpoints.len() {
        r.error("endpoints", "mixes http:// and https://: use one for all");
    }
    let prefix = r.opt_text("prefix").unwrap_or_else(|| DEFAULT_PREFIX.into());
    if !prefix.starts_with('/') || !prefix.ends_with('/') || prefix.contains("//") || prefix.len() > 128 {
        r.error(
            "prefix",
            format!(
                "{:?} must begin and end with '/', have no empty component and be at most 128 bytes",
                prefix.escape_debug().to_string()
            ),
        );
    }
    let lease_ttl_s = r.int(
        "lease_ttl_s",
        DEFAULT_LEASE_TTL_S as i64,
        MIN_LEASE_TTL_S as i64,
        MAX_LEASE_TTL_S,
    ) as u64;
    let maintenance_grace_period_s = r.int("maintenance_grace_period_s", 60, 1, 86_400) as u64;
    let rejoin_grace_period_s = r.int("rejoin_grace_period_s", 90, 1, 86_400) as u64;
    let path = |r: &mut Reader, key: &str| {
        let p = r.opt_text(key)?;
        if p.len() > MAX_PATH {
            r.error(key, format!("is {} bytes long; at most {MAX_PATH}", p.len()));
            None
        } else if p.starts_with('/') {
            Some(PathBuf::from(p))
        } else {
            r.error(
                key,
                format!("must be an absolute path, not {:?}", p.escape_debug().to_string()),
            );
            None
        }
    };
    let ca = path(&mut r, "tls_ca");
    let cert = path(&mut r, "tls_cert");
    let key = path(&mut r, "tls_key");
    if cert.is_some() != key.is_some() {
        r.error(
            if cert.is_some() { "tls_key" } else { "tls_cert" },
            "missing: a client certificate needs its key (tls_cert and tls_key go together)",
        );
    }
    let tls = match ca {
        Some(ca) => Some(Tls { ca, cert, key }),
        // A CA given but refused has its error already.
        None if table.contains_key("tls_ca") => None,
        None => {
            if https > 0 {
                r.error(
                    "tls_ca",
                    "missing: https:// endpoints need the CA that signed etcd's certificate",
                );
            } else if cert.is_some() {
                r.error(
                    "tls_ca",
                    "missing: a client certificate is for https:// endpoints, with their CA",
                );
            }
            None
        }
    };
    if tls.is_some() && https == 0 && !endpoints.is_empty() {
        r.error(
            "tls_ca",
            "is set, but the endpoints are http://: use https:// URLs for TLS",
        );
    }
    let device = r.opt_text("watchdog");
    if let Some(d) = &device
        && let Err(why) = check_watchdog_device(d)
    {
        r.error("watchdog", format!("{:?} {why}", d.escape_debug().to_string()));
    }
    let timeout_s = r.int(
        "watchdog_timeout_s",
        DEFAULT_WATCHDOG_TIMEOUT_S as i64,
        MIN_WATCHDOG_TIMEOUT_S as i64,
        MAX_WATCHDOG_TIMEOUT_S as i64,
    ) as u64;
    if device.is_none() && table.contains_key("watchdog_timeout_s") {
        r.error(
            "watchdog_timeout_s",
            "is set, but there is no watchdog = \"/dev/watchdogN\" for it",
        );
    }
    let watchdog = device.map(|d| Watchdog {
        device: PathBuf::from(d),
        timeout_s,
    });
    let mut own = r.finish(CLUSTER_KEYS);
    let clean = own.is_empty();
    errors.append(&mut own);
    clean.then_some(ClusterSettings {
        node,
        endpoints,
        prefix,
        lease_ttl_s,
        maintenance_grace_period_s,
        rejoin_grace_period_s,
        tls,
        watchdog,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(ttl: u64) -> ClusterSettings {
        ClusterSettings {
            node: None,
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: DEFAULT_PREFIX.into(),
            lease_ttl_s: ttl,
            maintenance_grace_period_s: 60,
            rejoin_grace_period_s: 90,
            tls: None,
            watchdog: None,
        }
    }

    #[test]
    fn watchdog_devices() {
        for ok in ["/dev/watchdog", "/dev/watchdog0", "/dev/watchdog123"] {
            assert_eq!(check_watchdog_device(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "/dev/watchdog1234",
            "/dev/watchdog0 ",
            "/dev/watchdog/../sda",
            "/dev/sda",
            "dev/watchdog0",
            "/dev/watchdogx",
            "/dev/watchdog0\n",
        ] {
            assert!(check_watchdog_device(bad).is_err(), "{bad:?}");
        }
    }

    /// TTL → keep-alive interval, margin, largest watchdog.
    #[test]
    fn the_watchdog_fits_inside_the_lease_minus_the_margin() {
        for (ttl, interval_ms, margin_ms, watchdog) in [
            (3, 600, 1200, 1),
            (4, 800, 1600, 2),
            (10, 2000, 4000, 5),
            (60, 12000, 24000, 35),
        ] {
            let s = settings(ttl);
            assert_eq!(s.keep_alive_interval().as_millis(), interval_ms, "ttl {ttl}");
            assert_eq!(s.fence_margin().as_millis(), margin_ms, "ttl {ttl}");
            assert_eq!(s.max_watchdog_s(), watchdog, "ttl {ttl}");
            assert!(
                s.max_watchdog_s() * 1000 < ttl * 1000 - margin_ms as u64,
                "ttl {ttl}"
            );
        }
    }

    #[test]
    fn node_names() {
        for ok in ["n1", "host-a.example.com", "A_1"] {
            assert_eq!(check_node_name(ok), Ok(()), "{ok}");
        }
        for bad in ["", "-a", ".a", "a/b", "a b", "é", &"x".repeat(64), "a\nb"] {
            assert!(check_node_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn endpoints() {
        for ok in [
            "http://10.0.0.1:2379",
            "https://etcd.example:2379/",
            "http://[::1]:2379",
        ] {
            assert_eq!(check_endpoint(ok), Ok(()), "{ok}");
        }
        for bad in [
            "10.0.0.1:2379",
            "http://host",
            "http://:2379",
            "http://h:0",
            "http://h:99999",
            "http://a b:1",
        ] {
            assert!(check_endpoint(bad).is_err(), "{bad}");
        }
    }
}
