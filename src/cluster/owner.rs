//! The unit's own guard against a double run: an HA workload's unit
//! starts only on the node that owns it (`ExecStartPre=+berth owner-check
//! NAME`), whoever asks for the start (`systemctl start` by hand, a
//! dependency, the autostart of an older berth). It fails closed: what
//! etcd cannot confirm in time is refused.

use std::path::Path;
use std::time::Duration;

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
    /// boot's, or its maintenance lease).
    OtherLease {
        key_lease: i64,
        live: i64,
    },
    LeaseGone(i64),
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
            NotOwner::LeaseGone(l) => write!(f, "this node's lease {l:x} has expired"),
            NotOwner::Unconfirmed(e) => write!(f, "etcd could not confirm the ownership ({e})"),
        }
    }
}

/// The judgement on what etcd said (pure): the owner key's value and
/// lease, this node's name and live lease, and that lease's remaining TTL.
pub fn judge(owner: Option<(&str, i64)>, node: &str, live_lease: i64, live_ttl: i64) -> Result<(), NotOwner> {
    let Some((value, key_lease)) = owner else {
        return Err(NotOwner::NoOwner);
    };
    let owner: Owner =
        serde_json::from_str(value).map_err(|e| NotOwner::Unconfirmed(format!("owner key: {e}")))?;
    if owner.node != node {
        return Err(NotOwner::OwnedBy(owner.node));
    }
    if key_lease != live_lease {
        return Err(NotOwner::OtherLease {
            key_lease,
            live: live_lease,
        });
    }
    if live_ttl <= 0 {
        return Err(NotOwner::LeaseGone(live_lease));
    }
    Ok(())
}

/// Asks etcd whether `node` owns `workload` on its live lease of this
/// boot (recorded under `state_dir`).
pub async fn confirm(
    settings: &ClusterSettings,
    node: &str,
    workload: &str,
    state_dir: &Path,
    boot_id: &str,
) -> Result<(), NotOwner> {
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
        let got = client.get(key, None).await.map_err(|e| e.to_string())?;
        let owner = got
            .kvs()
            .first()
            .map(|kv| (kv.value_str().unwrap_or("").to_string(), kv.lease()));
        let ttl = client
            .lease_time_to_live(record.lease_id, None)
            .await
            .map_err(|e| e.to_string())?
            .ttl();
        Ok::<_, String>((owner, ttl))
    };
    let (owner, ttl) = tokio::time::timeout(CHECK_LIMIT, asked)
        .await
        .map_err(|_| NotOwner::Unconfirmed(format!("no answer within {} s", CHECK_LIMIT.as_secs())))?
        .map_err(NotOwner::Unconfirmed)?;
    judge(
        owner.as_ref().map(|(v, l)| (v.as_str(), *l)),
        node,
        record.lease_id,
        ttl,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(node: &str) -> String {
        serde_json::to_string(&Owner {
            node: node.into(),
            stop_bound_s: 65,
            since: "T".into(),
        })
        .unwrap()
    }

    /// Each case: the owner key (value, lease), the live lease's TTL, and
    /// the verdict for node n1 on lease 7.
    #[test]
    fn only_the_owner_on_its_live_lease_may_start() {
        let mine = owner("n1");
        let theirs = owner("n2");
        type Case<'a> = (Option<(&'a str, i64)>, i64, Result<(), NotOwner>);
        let cases: Vec<Case> = vec![
            (Some((&mine, 7)), 5, Ok(())),
            (None, 5, Err(NotOwner::NoOwner)),
            (Some((&theirs, 9)), 5, Err(NotOwner::OwnedBy("n2".into()))),
            (
                Some((&mine, 3)),
                5,
                Err(NotOwner::OtherLease {
                    key_lease: 3,
                    live: 7,
                }),
            ),
            (Some((&mine, 7)), -1, Err(NotOwner::LeaseGone(7))),
        ];
        for (key, ttl, want) in cases {
            assert_eq!(judge(key, "n1", 7, ttl), want, "{key:?} ttl {ttl}");
        }
        assert!(matches!(
            judge(Some(("{not json", 7)), "n1", 7, 5),
            Err(NotOwner::Unconfirmed(_))
        ));
    }
}
