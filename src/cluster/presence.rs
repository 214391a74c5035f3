//! A node's presence in the cluster: its lease, kept alive on a thread of
//! its own, and the keys bound to it; and the fence deadline each
//! acknowledged keep-alive moves.
//!
//! Deadlines, never errors, drive fencing (issue 13): a partition hangs
//! calls rather than failing them. The deadline is `t_send + TTL − margin`,
//! `t_send` being when the oldest keep-alive the acknowledgement answered
//! was sent, on CLOCK_BOOTTIME (a suspended host's lease runs on at etcd).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, PutOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use super::keys::{Keys, LastState, Member, NodeState, Presence};
use crate::config::ClusterSettings;
use crate::time::rfc3339;

/// CLOCK_BOOTTIME now: counts a suspend, as etcd's clock does.
pub fn boottime() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map(Duration::from)
        .unwrap_or_default()
}

/// The send times of keep-alives not yet answered, and what an answer
/// makes of them. Pure: the caller reads the clock.
#[derive(Debug, Default)]
pub struct LeaseClock {
    unanswered: VecDeque<Duration>,
}

impl LeaseClock {
    pub fn sent(&mut self, at: Duration) {
        // Bounded: a stream that stopped answering must not grow it.
        if self.unanswered.len() >= 64 {
            self.unanswered.pop_front();
        }
        self.unanswered.push_back(at);
    }

    /// An acknowledgement that renewed the lease to `ttl_s`: etcd answers
    /// in order, so it answers the oldest keep-alive still unanswered. The
    /// fence deadline it gives; None for an answer nothing asked for, or
    /// a lease that is gone (TTL ≤ 0).
    pub fn acknowledged(&mut self, ttl_s: i64, margin: Duration) -> Option<Duration> {
        let sent = self.unanswered.pop_front()?;
        (ttl_s > 0).then(|| (sent + Duration::from_secs(ttl_s as u64)).saturating_sub(margin))
    }
}

/// Why the cluster cannot be joined.
#[derive(Debug)]
pub enum ClusterError {
    /// etcd did not answer, or refused.
    Etcd(String),
    /// A local file (the lease record, a TLS file).
    Local(PathBuf, std::io::Error),
}

impl std::fmt::Display for ClusterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClusterError::Etcd(e) => write!(f, "etcd: {e}"),
            ClusterError::Local(p, e) => write!(f, "{}: {e}", p.display()),
        }
    }
}

impl std::error::Error for ClusterError {}

impl From<etcd_client::Error> for ClusterError {
    fn from(e: etcd_client::Error) -> Self {
        ClusterError::Etcd(e.to_string())
    }
}

/// How long one etcd call may take: a partition hangs calls, and the
/// deadline, not the call, decides.
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects to the cluster's endpoints, with TLS when configured.
pub async fn connect(settings: &ClusterSettings) -> Result<Client, ClusterError> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(CALL_TIMEOUT)
        .with_timeout(CALL_TIMEOUT)
        .with_keep_alive(Duration::from_secs(2), CALL_TIMEOUT);
    if let Some(tls) = &settings.tls {
        let read = |p: &Path| std::fs::read(p).map_err(|e| ClusterError::Local(p.to_path_buf(), e));
        let mut t =
            etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(read(&tls.ca)?));
        if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
            t = t.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
        }
        options = options.with_tls(t);
    }
    Ok(Client::connect(&settings.endpoints, Some(options)).await?)
}

/// The lease a daemon holds, kept under its state directory with the boot
/// it was granted in: a restart in the same boot resumes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    pub lease_id: i64,
    pub boot_id: String,
}

pub fn lease_record_path(state_dir: &Path) -> PathBuf {
    state_dir.join("cluster-lease.json")
}

/// The lease this node recorded, as it is on disk.
pub fn read_lease_record(state_dir: &Path) -> Result<LeaseRecord, ClusterError> {
    let path = lease_record_path(state_dir);
    let bytes = std::fs::read(&path).map_err(|e| ClusterError::Local(path.clone(), e))?;
    serde_json::from_slice(&bytes).map_err(|e| ClusterError::Local(path, e.into()))
}

fn write_lease_record(state_dir: &Path, r: &LeaseRecord) -> Result<(), ClusterError> {
    let path = lease_record_path(state_dir);
    let bytes = serde_json::to_vec(r).map_err(|e| ClusterError::Local(path.clone(), e.into()))?;
    crate::state::atomic::write_json(&path, &bytes).map_err(|e| ClusterError::Local(path, e))
}

/// What a node joined with.
#[derive(Debug, Clone)]
pub struct Joined {
    pub lease_id: i64,
    /// The lease of this boot was still alive: a restart, not a new boot.
    pub resumed: bool,
    pub granted_ttl_s: i64,
    /// Owner keys moved back from the maintenance lease.
    pub taken_back: usize,
    /// The fence deadline the grant (or the renewal of a resumed lease)
    /// gives, counted from before the request was sent.
    pub deadline: Duration,
    /// The frozen flag of the presence put.
    pub frozen: bool,
}

/// The lease a join is made on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub id: i64,
    /// The lease of this boot was still alive: a restart, not a new boot.
    pub resumed: bool,
    pub granted_ttl_s: i64,
    /// The fence deadline the grant (or the renewal of a resumed lease)
    /// gives, counted from before the request was sent.
    pub deadline: Duration,
}

/// Takes the node's lease: the one of this boot when etcd still has it,
/// renewed at once (a daemon that restarted within its lease moves its
/// fence deadline before the join's writes, which wait on etcd's disk);
/// otherwise a new one, the lease of an earlier boot revoked.
pub async fn take_lease(
    client: &mut Client,
    settings: &ClusterSettings,
    boot_id: &str,
    state_dir: &Path,
) -> Result<Lease, ClusterError> {
    let margin = settings.fence_margin();
    let deadline =
        |sent: Duration, ttl: i64| (sent + Duration::from_secs(ttl.max(0) as u64)).saturating_sub(margin);
    if let Ok(old) = read_lease_record(state_dir) {
        if old.boot_id == boot_id {
            let granted = client.lease_time_to_live(old.lease_id, None).await?;
            // etcd rounds the remaining TTL down to whole seconds: a lease
            // in its last second says 0. A lease it does not have says
            // granted 0; the keep-alive decides for any other.
            if granted.granted_ttl() > 0 {
                // Reading the TTL renews nothing: a keep-alive does, to the
                // granted TTL, from no earlier than `sent`.
                let sent = boottime();
                let renewed = tokio::time::timeout(CALL_TIMEOUT, client.lease_keep_alive(old.lease_id))
                    .await
                    .map_err(|_| {
                        ClusterError::Etcd(format!("no answer to a keep-alive within {CALL_TIMEOUT:?}"))
                    })?;
                match renewed {
                    Ok(_) => {
                        return Ok(Lease {
                            id: old.lease_id,
                            resumed: true,
                            granted_ttl_s: granted.granted_ttl(),
                            deadline: deadline(sent, granted.granted_ttl()),
                        });
                    }
                    // It expired between the two calls.
                    Err(etcd_client::Error::LeaseKeepAliveError(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        } else {
            // A lease of an earlier boot: nothing of that boot runs any
            // more; its keys go now rather than at its expiry.
            let _ = client.lease_revoke(old.lease_id).await;
        }
    }
    let sent = boottime();
    let g = client.lease_grant(settings.lease_ttl_s as i64, None).await?;
    Ok(Lease {
        id: g.id(),
        resumed: false,
        granted_ttl_s: g.ttl(),
        deadline: deadline(sent, g.ttl()),
    })
}

/// Takes the node's lease ([`take_lease`]) and joins on it ([`join_on`]).
pub async fn join(
    client: &mut Client,
    settings: &ClusterSettings,
    node: &str,
    boot_id: &str,
    state_dir: &Path,
    ha: BTreeMap<String, String>,
    frozen: bool,
) -> Result<Joined, ClusterError> {
    let lease = take_lease(client, settings, boot_id, state_dir).await?;
    join_on(client, settings, node, boot_id, state_dir, ha, frozen, lease).await
}

/// Records `lease` as the node's, and puts its presence, its last state
/// and, the first time, its member key.
#[allow(clippy::too_many_arguments)]
pub async fn join_on(
    client: &mut Client,
    settings: &ClusterSettings,
    node: &str,
    boot_id: &str,
    state_dir: &Path,
    ha: BTreeMap<String, String>,
    frozen: bool,
    lease: Lease,
) -> Result<Joined, ClusterError> {
    let keys = Keys::new(&settings.prefix);
    let lease_id = lease.id;
    write_lease_record(
        state_dir,
        &LeaseRecord {
            lease_id,
            boot_id: boot_id.to_string(),
        },
    )?;
    // Back from maintenance: the keys it left on its maintenance lease
    // come back onto the live one, and the grace ends now.
    let taken_back =
        super::maintenance::take_back(client, settings, node, boot_id, state_dir, lease_id).await?;
    // Until its first listing says otherwise, the node waits for every
    // HA workload it has (it did not see any owner key go): a peer that
    // did see one go takes it first (placement).
    let mut joining = presence(NodeState::Up, boot_id, ha, frozen);
    joining.waiting = joining.ha.keys().cloned().collect();
    announce(client, &keys, node, lease_id, joining).await?;
    let member = Member {
        joined_at: rfc3339(std::time::SystemTime::now()),
    };
    // The member key is written once: its creation is the join.
    client
        .txn(
            Txn::new()
                .when(vec![Compare::create_revision(
                    keys.member(node),
                    CompareOp::Equal,
                    0,
                )])
                .and_then(vec![TxnOp::put(keys.member(node), json(&member), None)]),
        )
        .await?;
    Ok(Joined {
        lease_id,
        resumed: lease.resumed,
        granted_ttl_s: lease.granted_ttl_s,
        taken_back,
        deadline: lease.deadline,
        frozen,
    })
}

/// A presence in `state` from now on.
pub fn presence(state: NodeState, boot_id: &str, ha: BTreeMap<String, String>, frozen: bool) -> Presence {
    Presence {
        state,
        boot_id: boot_id.to_string(),
        since: rfc3339(std::time::SystemTime::now()),
        ha,
        version: env!("CARGO_PKG_VERSION").to_string(),
        frozen,
        waiting: BTreeSet::new(),
    }
}

/// Puts the node's presence on its lease and its last state (which
/// outlives the lease), in one transaction.
pub async fn announce(
    client: &mut Client,
    keys: &Keys,
    node: &str,
    lease_id: i64,
    presence: Presence,
) -> Result<(), ClusterError> {
    client
        .txn(Txn::new().and_then(announcing(keys, node, lease_id, &presence)))
        .await?;
    Ok(())
}

/// As [`announce`], only while the presence key is still at
/// `mod_revision`; whether it was put.
pub async fn announce_if_unchanged(
    client: &mut Client,
    keys: &Keys,
    node: &str,
    lease_id: i64,
    presence: Presence,
    mod_revision: i64,
) -> Result<bool, ClusterError> {
    let unchanged = Compare::mod_revision(keys.node(node), CompareOp::Equal, mod_revision);
    let r = client
        .txn(
            Txn::new()
                .when(vec![unchanged])
                .and_then(announcing(keys, node, lease_id, &presence)),
        )
        .await?;
    Ok(r.succeeded())
}

/// The presence on the lease and the last state beside it.
fn announcing(keys: &Keys, node: &str, lease_id: i64, presence: &Presence) -> Vec<TxnOp> {
    let last = LastState {
        state: presence.state,
        boot_id: presence.boot_id.clone(),
        at: presence.since.clone(),
    };
    vec![
        TxnOp::put(
            keys.node(node),
            json(presence),
            Some(PutOptions::new().with_lease(lease_id)),
        ),
        TxnOp::put(keys.last_state(node), json(&last), None),
    ]
}

pub(super) fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// What the keep-alive thread shares: the fence deadline (CLOCK_BOOTTIME,
/// ms; 0 before the first acknowledgement) and when it last made progress
/// (ms), which gates the daemon's watchdog in cluster mode.
#[derive(Debug, Default)]
pub struct LeaseState {
    pub fence_deadline_ms: AtomicU64,
    pub progress_ms: AtomicU64,
    /// The live lease (0 before the first join).
    pub lease: AtomicI64,
}

impl LeaseState {
    pub fn lease_id(&self) -> i64 {
        self.lease.load(Ordering::Relaxed)
    }

    pub fn set_deadline(&self, d: Duration) {
        self.fence_deadline_ms
            .store(d.as_millis().max(1) as u64, Ordering::Relaxed);
    }

    /// Whether the deadline is known and still ahead: the node may take.
    pub fn ahead(&self) -> bool {
        self.deadline().is_some_and(|d| boottime() < d)
    }

    pub fn deadline(&self) -> Option<Duration> {
        match self.fence_deadline_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// Whether the keep-alive task made progress within `within`.
    pub fn alive(&self, within: Duration) -> bool {
        let last = Duration::from_millis(self.progress_ms.load(Ordering::Relaxed));
        boottime().saturating_sub(last) <= within
    }
}

/// Why [`keep_alive`] stopped keeping a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseLost {
    /// etcd answered that the lease is gone (it expired).
    Expired,
    /// No answer for a whole TTL: the deadline has passed (the fence
    /// runs), and whatever the connection is, it is not to be trusted.
    Silent,
}

/// Keeps `lease_id` alive every keep-alive interval, moving the fence
/// deadline on each acknowledgement, until etcd says the lease is gone or
/// says nothing for a whole TTL: the node then joins again, on a new
/// connection, resuming the lease if etcd still has it. A partition may
/// leave a connection that neither answers nor fails, so silence, not an
/// error, ends it. A broken stream is opened again; nothing here waits on
/// anything but etcd.
pub async fn keep_alive(
    mut client: Client,
    settings: ClusterSettings,
    lease_id: i64,
    state: Arc<LeaseState>,
) -> LeaseLost {
    let interval = settings.keep_alive_interval();
    let margin = settings.fence_margin();
    let ttl = Duration::from_secs(settings.lease_ttl_s);
    let mut answered = boottime();
    loop {
        state
            .progress_ms
            .store(boottime().as_millis() as u64, Ordering::Relaxed);
        if boottime().saturating_sub(answered) > ttl {
            return LeaseLost::Silent;
        }
        let opened = tokio::time::timeout(CALL_TIMEOUT, client.lease_keep_alive(lease_id)).await;
        let (mut keeper, mut stream) = match opened {
            Ok(Ok(opened)) => opened,
            // The client's way of saying the first answer had TTL 0.
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => return LeaseLost::Expired,
            _ => {
                tokio::time::sleep(interval).await;
                continue;
            }
        };
        let mut clock = LeaseClock::default();
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let now = boottime();
                    state.progress_ms.store(now.as_millis() as u64, Ordering::Relaxed);
                    if now.saturating_sub(answered) > ttl {
                        return LeaseLost::Silent;
                    }
                    clock.sent(now);
                    // Never waits long: a stream that stopped taking
                    // keep-alives counts as broken.
                    match tokio::time::timeout(interval, keeper.keep_alive()).await {
                        Ok(Ok(())) => {}
                        _ => break,
                    }
                }
                answer = stream.message() => match answer {
                    Ok(Some(r)) if r.ttl() <= 0 => return LeaseLost::Expired,
                    Ok(Some(r)) => {
                        answered = boottime();
                        if let Some(deadline) = clock.acknowledged(r.ttl(), margin) {
                            state.set_deadline(deadline);
                        }
                    }
                    _ => break,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// Issue 13, point 3: the deadline anchors on the send time of the
    /// keep-alive the answer is for, never on the answer's arrival.
    #[test]
    fn the_deadline_counts_from_the_oldest_unanswered_send() {
        let mut c = LeaseClock::default();
        let margin = 4 * S;
        assert_eq!(c.acknowledged(10, margin), None, "an answer nothing asked for");
        c.sent(100 * S);
        c.sent(102 * S);
        assert_eq!(c.acknowledged(10, margin), Some(106 * S), "100 + 10 - 4");
        assert_eq!(c.acknowledged(10, margin), Some(108 * S));
        c.sent(104 * S);
        assert_eq!(c.acknowledged(0, margin), None, "a lease etcd no longer has");
        for i in 0..100 {
            c.sent(i * S);
        }
        assert_eq!(c.unanswered.len(), 64, "bounded while etcd does not answer");
    }

    #[test]
    fn boottime_moves() {
        let a = boottime();
        std::thread::sleep(Duration::from_millis(5));
        assert!(boottime() > a && a > Duration::ZERO);
    }
}
