//! What the cluster looks like from this node (issue 13, point 7): the
//! peers (every node key, and every member without one), their states and
//! lease ages, each HA workload's owner, and this node's fence deadline.
//! `berth status` and `berth list` ask etcd for it themselves; the daemon
//! keeps one for `/v1/cluster` on a thread of its own (never the agent's,
//! whose keep-alives and fence must not wait behind it), gathered again
//! only while it is read: readers never wait for etcd, and cannot make it
//! work harder than one gathering every [`REFRESH_EVERY`], of bounded
//! size ([`MAX_KEYS`] keys per directory, [`MAX_LEASES`] leases asked).
//!
//! Everything here was written by some node of the cluster: names and
//! values are escaped when shown, and a value that does not read is shown
//! as such rather than trusted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use etcd_client::{Client, GetOptions};
use futures_util::StreamExt;
use serde::Serialize;

use super::keys::{Keys, LastState, Owner, Presence};
use super::session::{ClusterError, boottime};
use crate::config::ClusterSettings;
use crate::time::rfc3339;

/// How often the daemon gathers the view again while it is being read.
pub const REFRESH_EVERY: Duration = Duration::from_secs(2);
/// How long one gathering may take.
const GATHER_TIMEOUT: Duration = Duration::from_secs(5);
/// The most keys read per directory (nodes, members, last states, owners).
pub const MAX_KEYS: i64 = 4096;
/// The most node leases whose TTL is asked, and how many at once.
pub const MAX_LEASES: usize = 256;
const LEASES_IN_FLIGHT: usize = 8;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterView {
    /// This node's name.
    pub node: String,
    pub as_of: String,
    /// etcd's revision when it was read.
    pub revision: i64,
    /// This node's fence deadline, from now (negative: passed); None when
    /// none was seen in this boot.
    pub fence_deadline_in_ms: Option<i64>,
    /// Why this node's daemon cannot list owners and presences now (it
    /// takes nothing until it can).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listing_error: Option<String>,
    pub peers: Vec<Peer>,
    pub owners: Vec<OwnerRow>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Peer {
    pub node: String,
    /// `up`, `maintenance`, `shutting-down`, `drained` from its node key;
    /// `absent` when it has none (a member whose lease is gone);
    /// `unreadable` for a value that is not a presence.
    pub state: String,
    pub boot_id: Option<String>,
    /// The lease its node key is on, in hex as etcdctl shows it.
    pub lease: Option<String>,
    /// The TTL etcd granted, and what is left of it.
    pub lease_ttl_s: Option<i64>,
    pub lease_remaining_s: Option<i64>,
    /// Seconds since the lease was last renewed (granted − remaining).
    pub lease_age_s: Option<i64>,
    /// Its HA workloads, as it announced them.
    pub ha: Vec<String>,
    pub frozen: bool,
    /// Whether it has a `members/` key (it outlives the node).
    pub member: bool,
    pub last_state: Option<String>,
    /// The timeout of the hardware watchdog it declares, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watchdog_s: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OwnerRow {
    pub workload: String,
    /// None for a value that does not read as an owner.
    pub node: Option<String>,
    pub lease: String,
    pub stop_bound_s: Option<u64>,
    pub since: Option<String>,
    /// The wait is its owner's watchdog timeout and margin, not its
    /// unit's stop bound.
    pub watchdog_wait: bool,
}

/// One key as read: name under its directory, value, lease.
pub struct Read<'a> {
    pub key: &'a str,
    pub value: &'a [u8],
    pub lease: i64,
}

/// The view from one listing of the prefix and the leases' TTLs (lease →
/// granted, remaining). Pure.
pub fn assemble(
    keys: &Keys,
    node: &str,
    revision: i64,
    listing: &[Read],
    ttls: &BTreeMap<i64, (i64, i64)>,
    fence_deadline_in_ms: Option<i64>,
    as_of: String,
) -> ClusterView {
    let mut peers: BTreeMap<String, Peer> = BTreeMap::new();
    let blank = |n: &str| Peer {
        node: n.to_string(),
        state: "absent".into(),
        boot_id: None,
        lease: None,
        lease_ttl_s: None,
        lease_remaining_s: None,
        lease_age_s: None,
        ha: Vec::new(),
        frozen: false,
        member: false,
        last_state: None,
        watchdog_s: None,
    };
    let mut owners = Vec::new();
    let last_states = keys.last_state("");
    for r in listing {
        if let Some(n) = keys.name_in(&keys.nodes(), r.key) {
            let p = peers.entry(n.to_string()).or_insert_with(|| blank(n));
            let ttl = ttls.get(&r.lease).copied();
            p.lease = Some(format!("{:x}", r.lease));
            p.lease_ttl_s = ttl.map(|t| t.0);
            p.lease_remaining_s = ttl.map(|t| t.1);
            p.lease_age_s = ttl.map(|(granted, left)| (granted - left).max(0));
            match serde_json::from_slice::<Presence>(r.value) {
                Ok(presence) => {
                    p.state = presence.state.as_str().into();
                    p.boot_id = Some(presence.boot_id);
                    p.ha = presence.ha.into_keys().collect();
                    p.frozen = presence.frozen;
                    p.watchdog_s = presence.watchdog_s;
                }
                Err(_) => p.state = "unreadable".into(),
            }
        } else if let Some(n) = keys.name_in(&keys.members(), r.key) {
            peers.entry(n.to_string()).or_insert_with(|| blank(n)).member = true;
        } else if let Some(n) = keys.name_in(&last_states, r.key) {
            let state = serde_json::from_slice::<LastState>(r.value)
                .map_or_else(|_| "unreadable".to_string(), |l| l.state.as_str().to_string());
            peers.entry(n.to_string()).or_insert_with(|| blank(n)).last_state = Some(state);
        } else if let Some(w) = keys.name_in(&keys.owners(), r.key) {
            let owner = serde_json::from_slice::<Owner>(r.value).ok();
            owners.push(OwnerRow {
                workload: w.to_string(),
                node: owner.as_ref().map(|o| o.node.clone()),
                lease: format!("{:x}", r.lease),
                stop_bound_s: owner.as_ref().map(|o| o.stop_bound_s),
                since: owner.map(|o| o.since),
                watchdog_wait: false,
            });
        }
    }
    for o in &mut owners {
        let declared = o
            .node
            .as_ref()
            .and_then(|n| peers.get(n))
            .and_then(|p| p.watchdog_s);
        o.watchdog_wait = matches!((declared, o.stop_bound_s),
            (Some(t), Some(b)) if b <= super::watchdog::takeover_wait_s(u64::MAX, Some(t)));
    }
    ClusterView {
        node: node.to_string(),
        as_of,
        revision,
        fence_deadline_in_ms,
        listing_error: None,
        peers: peers.into_values().collect(),
        owners,
    }
}

/// This node's fence deadline from now, as the daemon last kept it.
pub fn fence_deadline_in_ms(runtime_dir: &std::path::Path) -> Option<i64> {
    let d = super::fence::read_deadline(runtime_dir)?;
    Some(d.as_millis() as i64 - boottime().as_millis() as i64)
}

/// Reads the view from etcd: a bounded listing of each of berth's
/// directories, then, with `lease_ttls`, the TTL of each node key's lease
/// (a few at once); within [`GATHER_TIMEOUT`].
pub async fn gather(
    client: &mut Client,
    settings: &ClusterSettings,
    node: &str,
    runtime_dir: &std::path::Path,
    lease_ttls: bool,
) -> Result<ClusterView, ClusterError> {
    let keys = Keys::new(&settings.prefix);
    let gathering = async {
        // Only berth's four directories, each bounded (keys only for the
        // members: their values say nothing shown here). One revision
        // for all: the first read's.
        let mut listings = Vec::new();
        let mut revision = 0;
        for (dir, keys_only) in [
            (keys.nodes(), false),
            (keys.members(), true),
            (keys.last_state(""), false),
            (keys.owners(), false),
        ] {
            let mut options = GetOptions::new().with_prefix().with_limit(MAX_KEYS);
            if keys_only {
                options = options.with_keys_only();
            }
            if revision > 0 {
                options = options.with_revision(revision);
            }
            let mut kv = client
                .kv_client()
                .max_decoding_message_size(super::session::REPLY_LIMIT);
            let got = kv.get(dir.as_str(), Some(options)).await?;
            if revision == 0 {
                revision = got.header().map_or(0, |h| h.revision());
            }
            listings.push(got);
        }
        let reads: Vec<Read> = listings
            .iter()
            .flat_map(|l| l.kvs())
            .filter_map(|kv| {
                Some(Read {
                    key: kv.key_str().ok()?,
                    value: kv.value(),
                    lease: kv.lease(),
                })
            })
            .collect();
        let leases: BTreeSet<i64> = reads
            .iter()
            .filter(|r| lease_ttls && keys.name_in(&keys.nodes(), r.key).is_some() && r.lease != 0)
            .map(|r| r.lease)
            .take(MAX_LEASES)
            .collect();
        let asked = leases.into_iter().map(|lease| {
            let mut c = client.clone();
            async move {
                let r = c.lease_time_to_live(lease, None).await.ok()?;
                Some((lease, (r.granted_ttl(), r.ttl())))
            }
        });
        let ttls: BTreeMap<i64, (i64, i64)> = futures_util::stream::iter(asked)
            .buffer_unordered(LEASES_IN_FLIGHT)
            .filter_map(|t| async move { t })
            .collect()
            .await;
        let mut view = assemble(
            &keys,
            node,
            revision,
            &reads,
            &ttls,
            fence_deadline_in_ms(runtime_dir),
            rfc3339(SystemTime::now()),
        );
        view.listing_error = crate::state::cluster::read_listing_error(runtime_dir);
        Ok::<_, ClusterError>(view)
    };
    tokio::time::timeout(GATHER_TIMEOUT, gathering)
        .await
        .map_err(|_| ClusterError::Etcd("etcd did not answer in time".into()))?
}

/// Connects and gathers, for a command run once.
pub async fn ask(
    settings: &ClusterSettings,
    runtime_dir: &std::path::Path,
    lease_ttls: bool,
) -> Result<ClusterView, String> {
    let node = super::node_name(settings)?;
    let mut client = tokio::time::timeout(GATHER_TIMEOUT, super::session::connect(settings))
        .await
        .map_err(|_| "etcd did not answer in time".to_string())?
        .map_err(|e| e.to_string())?;
    gather(&mut client, settings, &node, runtime_dir, lease_ttls)
        .await
        .map_err(|e| e.to_string())
}

/// The view as `berth status` prints it. Names and values came from
/// etcd: escaped.
pub fn text(v: &ClusterView) -> String {
    let e = |s: &str| s.escape_debug().to_string();
    let mut out = format!(
        "cluster: node {}, etcd revision {} at {}\n",
        e(&v.node),
        v.revision,
        v.as_of
    );
    out.push_str(&match v.fence_deadline_in_ms {
        Some(ms) if ms >= 0 => format!("  fence deadline: in {:.1} s\n", ms as f64 / 1000.0),
        Some(ms) => format!(
            "  fence deadline: passed {:.1} s ago (HA workloads are fenced)\n",
            -ms as f64 / 1000.0
        ),
        None => "  fence deadline: none seen in this boot\n".to_string(),
    });
    if let Some(why) = &v.listing_error {
        out.push_str(&format!(
            "  ownership: the daemon cannot list owners and presences ({}); nothing is taken here\n",
            e(why)
        ));
    }
    for p in &v.peers {
        out.push_str(&format!("  node {}: {}", e(&p.node), p.state));
        if let (Some(lease), Some(age), Some(left)) = (&p.lease, p.lease_age_s, p.lease_remaining_s) {
            out.push_str(&format!(
                ", lease {lease} renewed {age} s ago, expires in {left} s"
            ));
        } else if let Some(lease) = &p.lease {
            out.push_str(&format!(", lease {lease} (TTL unknown)"));
        }
        if p.frozen {
            out.push_str(", frozen");
        }
        if let Some(t) = p.watchdog_s {
            out.push_str(&format!(", watchdog {t} s"));
        }
        if !p.ha.is_empty() {
            let ha: Vec<String> = p.ha.iter().map(|h| e(h)).collect();
            out.push_str(&format!(", HA: {}", ha.join(" ")));
        }
        // Said only when it tells more than the state does.
        if let Some(last) = p.last_state.as_ref().filter(|l| **l != p.state) {
            out.push_str(&format!(" (last state {last})"));
        }
        out.push('\n');
    }
    for o in &v.owners {
        match (&o.node, o.stop_bound_s) {
            (Some(n), Some(b)) => out.push_str(&format!(
                "  owner of {}: {} (lease {}, {}, since {})\n",
                e(&o.workload),
                e(n),
                o.lease,
                if o.watchdog_wait {
                    format!(
                        "takeover wait {b} s: its watchdog's timeout + {} s",
                        super::watchdog::MARGIN.as_secs()
                    )
                } else {
                    format!("stop bound {b} s")
                },
                e(o.since.as_deref().unwrap_or("?"))
            )),
            _ => out.push_str(&format!(
                "  owner of {}: unreadable key (lease {})\n",
                e(&o.workload),
                o.lease
            )),
        }
    }
    out
}

/// Keeps the daemon's copy on a thread and a runtime of its own.
pub fn start_keeping(
    settings: ClusterSettings,
    node: String,
    runtime_dir: std::path::PathBuf,
    api: Arc<crate::api::Shared>,
) {
    let spawned = std::thread::Builder::new()
        .name("berth-cluster-view".into())
        .spawn(
            move || match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt.block_on(keep(settings, node, runtime_dir, api)),
                Err(e) => crate::events::Events::new("berth-daemon")
                    .warn(&format!("cluster: no view for /v1/cluster: {e}")),
            },
        );
    if let Err(e) = spawned {
        crate::events::Events::new("berth-daemon").warn(&format!("cluster: no view for /v1/cluster: {e}"));
    }
}

/// The daemon's copy for `/v1/cluster`: gathered once at the start, then
/// again, at most every [`REFRESH_EVERY`], only when it was read since.
async fn keep(
    settings: ClusterSettings,
    node: String,
    runtime_dir: std::path::PathBuf,
    api: Arc<crate::api::Shared>,
) {
    api.cluster_waiting();
    let mut client: Option<Client> = None;
    let mut first = true;
    loop {
        if first || api.cluster_asked() {
            if client.is_none() {
                client = tokio::time::timeout(GATHER_TIMEOUT, super::session::connect(&settings))
                    .await
                    .ok()
                    .and_then(Result::ok);
            }
            let gathered = match client.as_mut() {
                Some(c) => gather(c, &settings, &node, &runtime_dir, true).await,
                None => Err(ClusterError::Etcd("cannot connect".into())),
            };
            match gathered {
                Ok(view) => {
                    api.set_cluster(serde_json::to_value(&view).unwrap_or_default());
                    first = false;
                }
                Err(e) => {
                    api.cluster_unreachable(&e.to_string());
                    client = None;
                }
            }
            tokio::time::sleep(REFRESH_EVERY).await;
        } else {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys as etcd holds them → the view; hostile values are shown as
    /// unreadable, never trusted.
    #[test]
    fn the_view_from_one_listing() {
        let keys = Keys::new("/berth/");
        let up = br#"{"state":"up","boot_id":"b1","since":"T","ha":{"db":"h"},"frozen":false}"#;
        let maint = br#"{"state":"maintenance","boot_id":"b2","since":"T","ha":{},"frozen":true}"#;
        let owner = br#"{"node":"n1","stop_bound_s":38,"since":"T0"}"#;
        let drained = br#"{"state":"drained","boot_id":"b3","at":"T"}"#;
        let listing = [
            Read {
                key: "/berth/nodes/n1",
                value: up,
                lease: 0x10,
            },
            Read {
                key: "/berth/nodes/n2",
                value: maint,
                lease: 0x20,
            },
            Read {
                key: "/berth/nodes/ev\u{1b}il",
                value: b"\x1b[2J",
                lease: 0x30,
            },
            Read {
                key: "/berth/members/n1",
                value: b"{}",
                lease: 0,
            },
            Read {
                key: "/berth/members/n3",
                value: b"{}",
                lease: 0,
            },
            Read {
                key: "/berth/last-state/n1",
                value: br#"{"state":"up","boot_id":"b1","at":"T"}"#,
                lease: 0,
            },
            Read {
                key: "/berth/last-state/n3",
                value: drained,
                lease: 0,
            },
            Read {
                key: "/berth/owners/db",
                value: owner,
                lease: 0x10,
            },
            Read {
                key: "/berth/owners/web",
                value: b"nonsense",
                lease: 0x20,
            },
            Read {
                key: "/berth/owners/a/b",
                value: owner,
                lease: 0x10,
            },
        ];
        let ttls = BTreeMap::from([(0x10, (5, 4)), (0x20, (15, 9))]);
        let v = assemble(&keys, "n1", 42, &listing, &ttls, Some(-1500), "T1".into());
        let peers: Vec<_> = v
            .peers
            .iter()
            .map(|p| {
                (
                    p.node.as_str(),
                    p.state.as_str(),
                    p.lease_age_s,
                    p.member,
                    p.last_state.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            peers,
            [
                ("ev\u{1b}il", "unreadable", None, false, None),
                ("n1", "up", Some(1), true, Some("up")),
                ("n2", "maintenance", Some(6), false, None),
                ("n3", "absent", None, true, Some("drained")),
            ]
        );
        let owners: Vec<_> = v
            .owners
            .iter()
            .map(|o| {
                (
                    o.workload.as_str(),
                    o.node.as_deref(),
                    o.lease.as_str(),
                    o.stop_bound_s,
                )
            })
            .collect();
        assert_eq!(
            owners,
            [("db", Some("n1"), "10", Some(38)), ("web", None, "20", None)],
            "a key below a workload's is no workload's"
        );
        let text = text(&v);
        for line in [
            "cluster: node n1, etcd revision 42 at T1\n",
            "  fence deadline: passed 1.5 s ago (HA workloads are fenced)\n",
            "  node n1: up, lease 10 renewed 1 s ago, expires in 4 s, HA: db\n",
            "  node n2: maintenance, lease 20 renewed 6 s ago, expires in 9 s, frozen\n",
            "  node ev\\u{1b}il: unreadable, lease 30 (TTL unknown)\n",
            "  node n3: absent (last state drained)\n",
            "  owner of db: n1 (lease 10, stop bound 38 s, since T0)\n",
            "  owner of web: unreadable key (lease 20)\n",
        ] {
            assert!(text.contains(line), "{line:?} not in\n{text}");
        }
        assert!(!text.contains('\x1b'), "no terminal control from a value");
    }

    /// An owner whose node declares a watchdog: its key's wait is the
    /// watchdog's when it is no longer than the timeout and the margin.
    #[test]
    fn a_watchdog_wait_is_told_from_a_stop_bound() {
        let keys = Keys::new("/berth/");
        let up = br#"{"state":"up","boot_id":"b1","since":"T","ha":{"db":"h","q":"h"},"frozen":false,"watchdog_s":10}"#;
        let listing = [
            Read {
                key: "/berth/nodes/n1",
                value: up,
                lease: 0x10,
            },
            Read {
                key: "/berth/owners/db",
                value: br#"{"node":"n1","stop_bound_s":13,"since":"T0"}"#,
                lease: 0x10,
            },
            // Taken before the watchdog was configured.
            Read {
                key: "/berth/owners/q",
                value: br#"{"node":"n1","stop_bound_s":38,"since":"T0"}"#,
                lease: 0x10,
            },
        ];
        let v = assemble(&keys, "n1", 1, &listing, &BTreeMap::new(), None, "T1".into());
        assert_eq!(v.peers[0].watchdog_s, Some(10));
        let text = text(&v);
        for line in [
            "  node n1: up, lease 10 (TTL unknown), watchdog 10 s, HA: db q\n",
            "  owner of db: n1 (lease 10, takeover wait 13 s: its watchdog's timeout + 3 s, since T0)\n",
            "  owner of q: n1 (lease 10, stop bound 38 s, since T0)\n",
        ] {
            assert!(text.contains(line), "{line:?} not in\n{text}");
        }
    }
}
