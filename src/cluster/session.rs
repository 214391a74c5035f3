//! A node's session with etcd, which every cluster primitive hangs off:
//! the connection, the error type, one call timeout, and the one
//! keep-alive loop, which feeds a [`DeadlineSink`] — the daemon's
//! [`LeaseState`], or the drain's capped deadline.
//!
//! Deadlines, never errors, drive fencing: a partition hangs calls rather
//! than failing them. The deadline is `t_send + TTL − margin`, `t_send`
//! being when the oldest keep-alive the acknowledgement answered was sent,
//! on CLOCK_BOOTTIME (a suspended host's lease runs on at etcd).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use etcd_client::{
    Client, ConnectOptions, GetOptions, GetResponse, Txn, TxnResponse, WatchOptions, WatchStream,
};
use serde::Serialize;

use crate::config::ClusterSettings;

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
    /// etcd said nothing within this long: a partition hangs calls
    /// rather than failing them.
    Unanswered(Duration),
    /// A directory holds more keys than a listing reads.
    TooMany { dir: String, limit: i64 },
}

impl std::fmt::Display for ClusterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClusterError::Etcd(e) => write!(f, "etcd: {e}"),
            ClusterError::Local(p, e) => write!(f, "{}: {e}", p.display()),
            ClusterError::Unanswered(d) => write!(f, "etcd did not answer within {} ms", d.as_millis()),
            ClusterError::TooMany { dir, limit } => {
                write!(f, "{} holds more than {limit} keys; not read", dir.escape_debug())
            }
        }
    }
}

impl std::error::Error for ClusterError {}

impl ClusterError {
    /// Its kind, as the metrics label it.
    pub fn kind(&self) -> &'static str {
        match self {
            ClusterError::Etcd(_) => "error",
            ClusterError::Local(..) => "local",
            ClusterError::Unanswered(_) => "timeout",
            ClusterError::TooMany { .. } => "too-many",
        }
    }
}

impl From<etcd_client::Error> for ClusterError {
    fn from(e: etcd_client::Error) -> Self {
        ClusterError::Etcd(e.to_string())
    }
}

/// How long one etcd call may take: a partition hangs calls, and the
/// deadline, not the call, decides.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// `call`, given at most `limit`: every etcd call the agent and the
/// drain make goes through here or through a caller's own bound.
pub async fn within<T, E: Into<ClusterError>>(
    limit: Duration,
    call: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, ClusterError> {
    let result = match tokio::time::timeout(limit, call).await {
        Ok(r) => r.map_err(Into::into),
        Err(_) => Err(ClusterError::Unanswered(limit)),
    };
    if let Err(e) = &result {
        crate::api::metrics::ETCD_FAILURES.count(e.kind());
    }
    result
}

/// `key`'s value (or, with `options`, the keys under it), bounded.
pub async fn get(
    client: &mut Client,
    key: &str,
    options: Option<GetOptions>,
) -> Result<GetResponse, ClusterError> {
    within(CALL_TIMEOUT, client.get(key, options)).await
}

/// The most keys one listing of a directory reads: more is refused, not
/// half read.
pub const LIST_LIMIT: i64 = 20_000;

/// The largest reply a listing or a watch accepts. The client's default
/// (4 MiB) is less than a few values etcd accepts (1.5 MiB each by
/// default) and refuses the whole reply.
pub const REPLY_LIMIT: usize = 256 << 20;

/// Every key under the directory `dir` (one of berth's own: `nodes/`,
/// `owners/`, `freeze/`…), at most [`LIST_LIMIT`] of them, in a reply of
/// at most [`REPLY_LIMIT`], bounded in time.
pub async fn list_dir(client: &Client, dir: &str) -> Result<GetResponse, ClusterError> {
    list_dir_at(client, dir, 0).await
}

/// The same at `revision` (0: the latest).
pub async fn list_dir_at(client: &Client, dir: &str, revision: i64) -> Result<GetResponse, ClusterError> {
    let mut kv = client.kv_client().max_decoding_message_size(REPLY_LIMIT);
    let options = GetOptions::new()
        .with_prefix()
        .with_limit(LIST_LIMIT)
        .with_revision(revision);
    let got = within(CALL_TIMEOUT, kv.get(dir, Some(options))).await?;
    if got.more() {
        return Err(ClusterError::TooMany {
            dir: dir.to_string(),
            limit: LIST_LIMIT,
        });
    }
    Ok(got)
}

/// A transaction, bounded by `limit`: an answer that never came may still
/// have been applied, so callers compare before they act again.
pub async fn txn(client: &mut Client, txn: Txn, limit: Duration) -> Result<TxnResponse, ClusterError> {
    within(limit, client.txn(txn)).await
}

/// A watch of every key under `prefix` from `revision` on (with each
/// deleted key's last value when `prev_kv`), opened within the bound.
pub async fn watch(
    client: &mut Client,
    prefix: &str,
    revision: i64,
    prev_kv: bool,
) -> Result<WatchStream, ClusterError> {
    let mut options = WatchOptions::new().with_prefix().with_start_revision(revision);
    if prev_kv {
        options = options.with_prev_key();
    }
    within(CALL_TIMEOUT, client.watch(prefix, Some(options))).await
}

/// One watch stream over each of `dirs` from `revision` on, with each
/// deleted key's last value, replies up to [`REPLY_LIMIT`]; opened within
/// the bound.
pub async fn watch_dirs(
    client: &Client,
    dirs: &[String],
    revision: i64,
) -> Result<WatchStream, ClusterError> {
    let options = || {
        WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision)
            .with_prev_key()
    };
    let mut watches = client.watch_client().max_decoding_message_size(REPLY_LIMIT);
    let opened = async {
        let Some((first, rest)) = dirs.split_first() else {
            return Err(ClusterError::Etcd("no directory to watch".into()));
        };
        let mut stream = watches.watch(first.as_str(), Some(options())).await?;
        for dir in rest {
            stream.watch(dir.as_str(), Some(options())).await?;
        }
        Ok(stream)
    };
    within(CALL_TIMEOUT, opened).await
}

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

/// A value as stored in etcd: JSON (berth's own types always serialize).
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

impl crate::api::metrics::LeaseProbe for LeaseState {
    fn fence_deadline_in_s(&self) -> Option<f64> {
        self.deadline()
            .map(|d| d.as_secs_f64() - boottime().as_secs_f64())
    }

    fn joined(&self) -> bool {
        self.lease_id() != 0 && self.ahead()
    }
}

/// Where the keep-alive puts what it learns.
pub trait DeadlineSink: Send + Sync {
    /// The loop ran at `now` (CLOCK_BOOTTIME).
    fn progress(&self, _now: Duration) {}
    /// An acknowledgement moved the fence deadline to `deadline`.
    fn renewed(&self, deadline: Duration);
    /// etcd answered at `now` that the lease is gone: whatever deadline
    /// an earlier answer gave, the fence is due now. (A host that was
    /// paused wakes with its clocks, and so that deadline, behind.)
    fn expired(&self, now: Duration);
}

impl DeadlineSink for LeaseState {
    fn progress(&self, now: Duration) {
        self.progress_ms.store(now.as_millis() as u64, Ordering::Relaxed);
    }

    fn renewed(&self, deadline: Duration) {
        self.set_deadline(deadline);
    }

    fn expired(&self, now: Duration) {
        if self.deadline().is_none_or(|d| d > now) {
            self.set_deadline(now);
        }
    }
}

/// The drain's deadline (CLOCK_BOOTTIME ms): it only moves on, and never
/// past `cap` (in maintenance, the daemon's last deadline: some keys may
/// still be on the live lease).
pub struct CappedDeadline {
    pub deadline: Arc<AtomicU64>,
    pub cap: Option<Duration>,
    /// The runtime directory whose deadline file follows it: the drain
    /// keeps the lease alive once the daemon is gone, and the watchdog's
    /// holder reads the lease's life there.
    pub runtime_dir: Option<std::path::PathBuf>,
}

impl CappedDeadline {
    fn written(&self) {
        let ms = self.deadline.load(Ordering::Relaxed);
        if let Some(dir) = &self.runtime_dir
            && ms > 0
        {
            crate::state::cluster::write_fence_deadline(dir, Duration::from_millis(ms));
        }
    }
}

impl DeadlineSink for CappedDeadline {
    fn renewed(&self, deadline: Duration) {
        let d = self.cap.map_or(deadline, |c| deadline.min(c));
        let before = self.deadline.fetch_max(d.as_millis() as u64, Ordering::Relaxed);
        if before < d.as_millis() as u64 {
            self.written();
        }
    }

    fn expired(&self, now: Duration) {
        self.deadline.fetch_min(now.as_millis() as u64, Ordering::Relaxed);
        self.written();
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

/// Keeps `lease_id` alive every keep-alive interval, telling `sink` of
/// each acknowledgement's deadline, until etcd says the lease is gone or
/// says nothing for a whole TTL. A partition may leave a connection that
/// neither answers nor fails, so silence, not an error, ends it. A broken
/// stream is opened again; nothing here waits on anything but etcd. Any
/// client may keep a lease, by id: the daemon's, and the drain's.
pub async fn keep_alive<S: DeadlineSink>(
    mut client: Client,
    settings: ClusterSettings,
    lease_id: i64,
    sink: Arc<S>,
) -> LeaseLost {
    let interval = settings.keep_alive_interval();
    let margin = settings.fence_margin();
    let ttl = Duration::from_secs(settings.lease_ttl_s);
    let mut answered = boottime();
    loop {
        sink.progress(boottime());
        if boottime().saturating_sub(answered) > ttl {
            return LeaseLost::Silent;
        }
        let opened = tokio::time::timeout(CALL_TIMEOUT, client.lease_keep_alive(lease_id)).await;
        let (mut keeper, mut stream) = match opened {
            Ok(Ok(opened)) => opened,
            // The client's way of saying the first answer had TTL 0.
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => {
                sink.expired(boottime());
                return LeaseLost::Expired;
            }
            _ => {
                tokio::time::sleep(interval).await;
                continue;
            }
        };
        // A new stream answers only what is sent on it.
        let mut clock = LeaseClock::default();
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let now = boottime();
                    sink.progress(now);
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
                    Ok(Some(r)) if r.ttl() <= 0 => {
                        sink.expired(boottime());
                        return LeaseLost::Expired;
                    }
                    Ok(Some(r)) => {
                        answered = boottime();
                        if let Some(deadline) = clock.acknowledged(r.ttl(), margin) {
                            sink.renewed(deadline);
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

    /// Every failed call through `within` is counted by its kind, for
    /// the metrics; a call that succeeds is not.
    #[tokio::test]
    async fn failed_calls_are_counted_by_kind() {
        let count = |kind: &str| crate::api::metrics::ETCD_FAILURES.get(kind);
        let (timeouts, errors) = (count("timeout"), count("error"));
        let hung = within(
            Duration::from_millis(10),
            std::future::pending::<Result<(), ClusterError>>(),
        )
        .await;
        assert!(matches!(hung, Err(ClusterError::Unanswered(_))));
        let refused = within(S, async { Err::<(), _>(ClusterError::Etcd("refused".into())) }).await;
        assert!(refused.is_err());
        within(S, async { Ok::<_, ClusterError>(()) }).await.unwrap();
        // Other tests may count too, in parallel: at least these.
        assert!(count("timeout") > timeouts);
        assert!(count("error") > errors);
        for (e, kind) in [
            (ClusterError::Etcd("x".into()), "error"),
            (
                ClusterError::Local("/k".into(), std::io::Error::other("x")),
                "local",
            ),
            (ClusterError::Unanswered(S), "timeout"),
            (
                ClusterError::TooMany {
                    dir: "owners/".into(),
                    limit: 1,
                },
                "too-many",
            ),
        ] {
            assert_eq!(e.kind(), kind);
            assert!(crate::api::metrics::FailureCounts::KINDS.contains(&kind));
        }
    }

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

    #[test]
    fn the_drains_deadline_only_moves_on_and_never_past_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        let file = || crate::state::cluster::read_fence_deadline(dir.path());
        let capped = CappedDeadline {
            deadline: Arc::new(AtomicU64::new(50_000)),
            cap: Some(80 * S),
            runtime_dir: Some(dir.path().to_path_buf()),
        };
        capped.renewed(40 * S);
        assert_eq!(capped.deadline.load(Ordering::Relaxed), 50_000, "never back");
        assert_eq!(file(), None, "nothing moved, nothing written");
        capped.renewed(60 * S);
        assert_eq!(capped.deadline.load(Ordering::Relaxed), 60_000);
        assert_eq!(
            file(),
            Some(60 * S),
            "the file follows: the watchdog's holder reads it"
        );
        capped.renewed(90 * S);
        assert_eq!(capped.deadline.load(Ordering::Relaxed), 80_000, "capped");
        assert_eq!(file(), Some(80 * S));
        capped.expired(70 * S);
        assert_eq!(file(), Some(70 * S), "a lease gone is due now");
    }
}
