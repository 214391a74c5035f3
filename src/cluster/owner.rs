//! The unit's own guard against a double run: an HA workload's unit
//! starts only on the node that owns it (`ExecStartPre=+berth owner-check
//! NAME`), whoever asks for the start (`systemctl start` by hand, a
//! dependency, the autostart of an older berth). It fails closed: what
//! etcd cannot confirm in time is refused.

use std::path::{Path, PathBuf};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};

use super::keys::{Keys, Owner};
use super::presence;
use crate::config::ClusterSettings;

/// How long the check may take in all: a partition hangs calls.
pub const CHECK_LIMIT: Duration = Duration::from_secs(10);

/// Why this node may not start the workload.
#[derive(Debug, PartialEq, Eq)]
pub enum NotOwner {
    /// This node holds no lease of this boot (its daemon has not joined).
    NoLease(String),
    NoOwner,
    OwnedBy(String),
    /// The key names this node but sits on another lease (an earlier
    /// boot's, a maintenance lease, or an expired live lease's successor).
    OtherLease {
        key_lease: i64,
        live: i64,
    },
    Unconfirmed(String),
}

impl std::fmt::Display for NotOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotOwner::NoLease(why) => write!(f, "this node holds no cluster lease of this boot ({why})"),
            NotOwner::NoOwner => write!(f, "no node owns it"),
            NotOwner::OwnedBy(n) => write!(f, "node {} owns it", n.escape_debug()),
            NotOwner::OtherLease { key_lease, live } => write!(
                f,
                "its owner key is on lease {key_lease:x}, not on this node's live lease {live:x}"
            ),
            NotOwner::Unconfirmed(e) => write!(f, "etcd could not confirm the ownership ({e})"),
        }
    }
}

/// The owner key as one transaction read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub value: String,
    pub lease: i64,
    /// The revision that created it: the ownership's fencing token.
    pub revision: i64,
}

/// What a workload started under a confirmed ownership is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub node: String,
    pub lease: i64,
    pub revision: i64,
    /// The watchdog timeout the key counts on, if any.
    pub watchdog_s: Option<u64>,
}

/// The judgement on what etcd said (pure): the owner key as read, this
/// node's name and live lease. A key exists on a lease only while the
/// lease does: on the live lease, the lease is alive.
pub fn judge(owner: Option<&Read>, node: &str, live_lease: i64) -> Result<Token, NotOwner> {
    let Some(read) = owner else {
        return Err(NotOwner::NoOwner);
    };
    let owner: Owner =
        serde_json::from_str(&read.value).map_err(|e| NotOwner::Unconfirmed(format!("owner key: {e}")))?;
    if owner.node != node {
        return Err(NotOwner::OwnedBy(owner.node));
    }
    if read.lease != live_lease {
        return Err(NotOwner::OtherLease {
            key_lease: read.lease,
            live: live_lease,
        });
    }
    Ok(Token {
        node: owner.node,
        lease: read.lease,
        revision: read.revision,
        watchdog_s: owner.watchdog_s,
    })
}

/// Asks etcd, in one transaction, whether `node` owns `workload` on its
/// live lease of this boot (recorded under `state_dir`).
pub async fn confirm(
    settings: &ClusterSettings,
    node: &str,
    workload: &str,
    state_dir: &Path,
    boot_id: &str,
) -> Result<Token, NotOwner> {
    let record = presence::read_lease_record(state_dir).map_err(|e| NotOwner::NoLease(e.to_string()))?;
    if record.boot_id != boot_id {
        return Err(NotOwner::NoLease(format!(
            "{} is of an earlier boot",
            crate::state::cluster::lease_path(state_dir).display()
        )));
    }
    let asked = async {
        let mut client = super::session::connect(settings)
            .await
            .map_err(|e| e.to_string())?;
        let key = Keys::new(&settings.prefix).owner(workload);
        // The key and its lease at one revision: no window between a
        // read of the key and a read of the lease.
        let txn = Txn::new()
            .when(vec![Compare::lease(
                key.as_str(),
                CompareOp::Equal,
                record.lease_id,
            )])
            .and_then(vec![TxnOp::get(key.as_str(), None)])
            .or_else(vec![TxnOp::get(key.as_str(), None)]);
        let answer = client.txn(txn).await.map_err(|e| e.to_string())?;
        let read = answer.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(got) => Some(got.kvs().first().map(|kv| Read {
                value: kv.value_str().unwrap_or("").to_string(),
                lease: kv.lease(),
                revision: kv.create_revision(),
            })),
            _ => None,
        });
        read.ok_or_else(|| "the transaction answered no read".to_string())
    };
    let read = tokio::time::timeout(CHECK_LIMIT, asked)
        .await
        .map_err(|_| NotOwner::Unconfirmed(format!("no answer within {} s", CHECK_LIMIT.as_secs())))?
        .map_err(NotOwner::Unconfirmed)?;
    judge(read.as_ref(), node, record.lease_id)
}

/// Where `owner-check` leaves the token for the workload's unit
/// (`EnvironmentFile=-`, read before each command it runs).
pub fn token_path(runtime_dir: &Path, workload: &str) -> PathBuf {
    runtime_dir.join("owner").join(format!("{workload}.env"))
}

/// The token as environment assignments: plain digits and a name the
/// configuration checked, nothing to quote.
pub fn token_env(t: &Token) -> String {
    format!(
        "BERTH_OWNER_NODE={}\nBERTH_OWNER_LEASE={:x}\nBERTH_OWNER_REVISION={}\n",
        t.node, t.lease, t.revision
    )
}

/// Writes it for the start about to happen; a stale one is removed first,
/// so that a failed write never hands the workload an older token.
pub fn write_token(runtime_dir: &Path, workload: &str, t: &Token) -> std::io::Result<()> {
    let path = token_path(runtime_dir, workload);
    let _ = std::fs::remove_file(&path);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    crate::state::atomic::write_json(&path, token_env(t).trim_end().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(node: &str, lease: i64) -> Read {
        Read {
            value: serde_json::to_string(&Owner {
                node: node.into(),
                stop_bound_s: 65,
                since: "T".into(),
                boot_id: String::new(),
                watchdog_s: None,
            })
            .unwrap(),
            lease,
            revision: 40,
        }
    }

    /// Each case: the owner key as read, and the verdict for node n1 on
    /// lease 7.
    #[test]
    fn only_the_owner_on_its_live_lease_may_start() {
        let token = Token {
            node: "n1".into(),
            lease: 7,
            revision: 40,
            watchdog_s: None,
        };
        let cases: Vec<(Option<Read>, Result<Token, NotOwner>)> = vec![
            (Some(owner("n1", 7)), Ok(token.clone())),
            (None, Err(NotOwner::NoOwner)),
            (Some(owner("n2", 9)), Err(NotOwner::OwnedBy("n2".into()))),
            (
                Some(owner("n1", 3)),
                Err(NotOwner::OtherLease {
                    key_lease: 3,
                    live: 7,
                }),
            ),
        ];
        for (key, want) in cases {
            assert_eq!(judge(key.as_ref(), "n1", 7), want, "{key:?}");
        }
        let junk = Read {
            value: "{not json".into(),
            ..owner("n1", 7)
        };
        assert!(matches!(
            judge(Some(&junk), "n1", 7),
            Err(NotOwner::Unconfirmed(_))
        ));
        assert_eq!(
            token_env(&token),
            "BERTH_OWNER_NODE=n1\nBERTH_OWNER_LEASE=7\nBERTH_OWNER_REVISION=40\n"
        );
    }

    #[test]
    fn the_token_file_replaces_the_last_one() {
        let dir = tempfile::tempdir().unwrap();
        let t = |revision| Token {
            node: "n1".into(),
            lease: 0x2a,
            revision,
            watchdog_s: None,
        };
        write_token(dir.path(), "db", &t(5)).unwrap();
        write_token(dir.path(), "db", &t(9)).unwrap();
        let text = std::fs::read_to_string(token_path(dir.path(), "db")).unwrap();
        assert_eq!(
            text,
            "BERTH_OWNER_NODE=n1\nBERTH_OWNER_LEASE=2a\nBERTH_OWNER_REVISION=9\n"
        );
    }
}
