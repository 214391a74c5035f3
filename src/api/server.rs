//! Serving the API: the socket, hyper's HTTP/1.1 connection handling, the
//! Server-Sent Events stream, and the limits a client cannot get past.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::header::{ACCEPT, ALLOW, CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast, mpsc};

use super::metrics::exposition::{Format, render};
use super::metrics::families;
use super::routes::{Reply, route};
use super::{Event, Shared};
use crate::paths::share_with_berth_group;

/// A request head larger than this is refused (431); hyper's minimum.
const MAX_HEAD: usize = 8 * 1024;
/// A client must send a complete request head within this, also between
/// requests on a kept-alive connection.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection whose writes make no progress for this long is closed: a
/// client that sends requests (pipelined, or an event stream's) and never
/// reads the answers cannot hold its slot once the socket's buffer is
/// full. An event stream's feeder gives up on a queue full for as long.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// A comment line on an idle event stream, so that proxies and clients
/// see it alive and a vanished reader is noticed.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Events queued per stream between the feeder and hyper.
const STREAM_QUEUE: usize = 16;
/// After a failed accept (out of file descriptors), wait before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Connections served at once. Beyond it a connection gets a slot kept for
/// `/healthz` while one is free, else a 503 and is closed; the unit's
/// LimitNOFILE= leaves room for all of them and the daemon's own.
pub(super) const MAX_CONNECTIONS: usize = 128;
/// Slots kept for `/healthz` (other paths get 503 there) when every
/// connection slot is taken, so a monitor can still tell a busy daemon
/// from a dead one.
pub(super) const RESERVED_FOR_HEALTH: usize = 4;
/// The head deadline on a reserved slot.
const HEALTH_HEAD_TIMEOUT: Duration = Duration::from_secs(1);
/// Event streams at once, within [`MAX_CONNECTIONS`]; beyond it, 503.
pub(super) const MAX_STREAMS: usize = 64;
/// How long a refused connection may take to accept its 503.
const REFUSE_TIMEOUT: Duration = Duration::from_secs(1);

type ResponseBody = BoxBody<Bytes, Infallible>;

/// The socket this process bound. Only it is removed at the end: the path
/// is the admin's to choose, and whatever is there later (a file, another
/// program's socket, a new daemon's) is not berth's.
#[derive(Debug)]
pub struct Bound {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl Bound {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Binds the socket with mode 0660, group `berth` when it exists; serves
/// on a thread of its own. `[daemon] socket` is the admin's to choose, so
/// berth touches only what is its own: the directory only when it creates
/// it (0750, group `berth`), and only a dead socket at the path (a
/// connection refused: a daemon that was killed); a socket that answers
/// belongs to a live program (the single-instance lock rules out only
/// another berth daemon), and anything else there is an error, left as it
/// is.
pub fn start(path: &Path, shared: Arc<Shared>) -> io::Result<Bound> {
    if let Some(dir) = path.parent()
        && !dir.exists()
    {
        std::fs::create_dir_all(dir)?;
        share_with_berth_group(dir, 0o750)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => remove_if_dead(path)?,
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "something other than a socket is there; left in place",
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let std_listener = std::os::unix::net::UnixListener::bind(path)?;
    let meta = std::fs::symlink_metadata(path)?;
    let bound = Bound {
        path: path.to_path_buf(),
        dev: meta.dev(),
        ino: meta.ino(),
    };
    share_with_berth_group(path, 0o660)?;
    std_listener.set_nonblocking(true)?;
    let rt = crate::systemd::runtime()?;
    std::thread::Builder::new()
        .name("berth-api".into())
        .spawn(move || {
            rt.block_on(async move {
                if let Ok(listener) = UnixListener::from_std(std_listener) {
                    accept_loop(listener, shared).await;
                }
            });
        })?;
    Ok(bound)
}

/// A socket nobody listens on is removed; one that accepts a connection is
/// a live program's, and so is one that cannot be tried (no permission):
/// both are refused, left in place.
fn remove_if_dead(path: &Path) -> io::Result<()> {
    match std::os::unix::net::UnixStream::connect(path) {
        Err(e) if e.raw_os_error() == Some(nix::libc::ECONNREFUSED) => std::fs::remove_file(path),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            "a live socket of another program answers there; left in place",
        )),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("a socket is there and cannot be tried ({e}); left in place"),
        )),
    }
}

/// Removes the socket at a clean exit, if it is still the one this process
/// bound (same inode, still a socket).
pub fn stop(bound: &Bound) {
    match std::fs::symlink_metadata(&bound.path) {
        Ok(meta) if meta.file_type().is_socket() && meta.dev() == bound.dev && meta.ino() == bound.ino => {
            let _ = std::fs::remove_file(&bound.path);
        }
        _ => {}
    }
}

/// What a connection may do, by the slot it got.
#[derive(Clone, Copy, PartialEq)]
enum Slot {
    Full,
    /// Every full slot was taken: `/healthz` only, one request.
    HealthOnly,
}

/// The server's limits, shared by its connections.
struct Limits {
    connections: Arc<Semaphore>,
    reserved: Arc<Semaphore>,
    streams: Arc<Semaphore>,
}

/// hyper's connection settings, both listeners': a head within
/// [`HEAD_TIMEOUT`] of at most [`MAX_HEAD`], kept-alive connections.
fn http_builder() -> http1::Builder {
    let mut http = http1::Builder::new();
    // hyper needs a timer for its header-read timeout (it panics without).
    // The timeout is a deadline for the whole head, from the moment hyper
    // waits for it: a client trickling bytes, or idling between requests
    // on a kept-alive connection, is disconnected.
    http.timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .keep_alive(true)
        .max_buf_size(MAX_HEAD)
        // The header spelling clients saw before hyper.
        .title_case_headers(true);
    http
}

async fn accept_loop(listener: UnixListener, shared: Arc<Shared>) {
    let http = http_builder();
    // A reserved slot is held briefly: one request, a short deadline for
    // its head, so that clients holding it idle give it back quickly.
    let mut health_only = http.clone();
    health_only
        .keep_alive(false)
        .header_read_timeout(HEALTH_HEAD_TIMEOUT);
    let limits = Arc::new(Limits {
        connections: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        reserved: Arc::new(Semaphore::new(RESERVED_FOR_HEALTH)),
        streams: Arc::new(Semaphore::new(MAX_STREAMS)),
    });
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // Out of descriptors, most likely: retrying at once would spin.
            Err(_) => {
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        // The reserved slots are root's (a health check by systemd or a
        // monitoring agent): a group member flooding the socket with slow
        // clients held them all, and /healthz went unanswered.
        let privileged = || {
            stream
                .peer_cred()
                .is_ok_and(|c| c.uid() == 0 || c.uid() == nix::unistd::geteuid().as_raw())
        };
        let stats = &shared.stats;
        let (slot, permit) = match limits.connections.clone().try_acquire_owned() {
            Ok(permit) => {
                stats.connections.fetch_add(1, Ordering::Relaxed);
                (Slot::Full, permit)
            }
            Err(_) => match limits.reserved.clone().try_acquire_owned() {
                Ok(permit) if privileged() => {
                    stats.health_only.fetch_add(1, Ordering::Relaxed);
                    (Slot::HealthOnly, permit)
                }
                _ => {
                    stats.refused.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(refuse(stream));
                    continue;
                }
            },
        };
        let (shared, limits) = (shared.clone(), limits.clone());
        let builder = if slot == Slot::Full { &http } else { &health_only };
        let connection = builder.serve_connection(
            TokioIo::new(WriteDeadline::new(stream, WRITE_TIMEOUT)),
            service_fn(move |request| {
                let answer = answer(&request, &shared, &limits, slot);
                async move { Ok::<_, Infallible>(answer) }
            }),
        );
        tokio::spawn(async move {
            let _ = connection.await;
            drop(permit);
        });
    }
}

/// A stream whose writes fail with `TimedOut` once one has waited
/// `limit` without progress; reads pass through (hyper bounds them).
struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteDeadline<S> {
    fn new(inner: S, limit: Duration) -> WriteDeadline<S> {
        WriteDeadline {
            inner,
            limit,
            stalled: None,
        }
    }

    /// A write's answer: progress (or a real error) clears the deadline;
    /// a write that must wait starts it, and past it the write fails.
    fn deadline<T>(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let limit = self.limit;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client did not read its answers",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteDeadline<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.deadline(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.deadline(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.deadline(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Over every limit: a 503 without parsing the request, then close. What
/// the client sent is read and dropped first, within the same second: a
/// TCP socket closed with unread bytes sends a reset, which may reach the
/// client before the 503 does.
async fn refuse(mut stream: impl tokio::io::AsyncWrite + tokio::io::AsyncRead + Unpin) {
    use tokio::io::AsyncReadExt;
    const BODY: &str = r#"{"error":"too many connections"}"#;
    let text = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    let _ = tokio::time::timeout(REFUSE_TIMEOUT, async {
        stream.write_all(text.as_bytes()).await?;
        stream.shutdown().await?;
        // Until the client closes, or the second is up; at most 64 KiB.
        let mut sink = [0u8; 1024];
        for _ in 0..64 {
            if stream.read(&mut sink).await? == 0 {
                break;
            }
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
}

fn json(status: StatusCode, body: &serde_json::Value) -> Response<ResponseBody> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if status == StatusCode::METHOD_NOT_ALLOWED {
        headers.insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
    }
    response
}

fn answer(
    request: &Request<Incoming>,
    shared: &Arc<Shared>,
    limits: &Limits,
    slot: Slot,
) -> Response<ResponseBody> {
    let path = request.uri().path();
    if slot == Slot::HealthOnly && path != "/healthz" {
        return json(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({"error": "too many connections; only /healthz is answered"}),
        );
    }
    let now = SystemTime::now();
    match route(request.method(), path, shared, now) {
        Reply::Json(status, body) => json(status, &body),
        Reply::Metrics => metrics(request, shared, now),
        Reply::Events => {
            let body = if request.method() == Method::HEAD {
                Empty::new().boxed()
            } else {
                let Ok(permit) = limits.streams.clone().try_acquire_owned() else {
                    shared.stats.streams_refused.fetch_add(1, Ordering::Relaxed);
                    return json(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &serde_json::json!({"error": "too many event streams"}),
                    );
                };
                // Subscribe before the snapshot: nothing falls in between.
                let events = shared.subscribe();
                let (tx, rx) = mpsc::channel(STREAM_QUEUE);
                tokio::spawn(feed(shared.clone(), events, tx, permit));
                EventStream { rx }.boxed()
            };
            let mut response = Response::new(body);
            let headers = response.headers_mut();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
            headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            response
        }
    }
}

/// The metrics in the format the request's `Accept` asks for.
fn metrics(request: &Request<Incoming>, shared: &Shared, now: SystemTime) -> Response<ResponseBody> {
    if request.method() == Method::GET {
        shared.stats.scrapes.fetch_add(1, Ordering::Relaxed);
    }
    let accept = request.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
    let format = Format::negotiate(accept);
    let text = render(&families(shared, now), format);
    let mut response = Response::new(Full::new(Bytes::from(text)).boxed());
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(format.content_type()));
    response
}

/// The opt-in TCP listener (`[daemon] metrics_listen`): `/metrics` and
/// nothing else, GET and HEAD, with the Unix socket's head and write
/// deadlines and a connection limit of its own, so that scrapers and the
/// API's clients never take each other's slots. Serves on a thread of its
/// own; the address it bound.
pub fn start_metrics(addr: std::net::SocketAddr, shared: Arc<Shared>) -> io::Result<std::net::SocketAddr> {
    let std_listener = std::net::TcpListener::bind(addr)?;
    std_listener.set_nonblocking(true)?;
    let bound = std_listener.local_addr()?;
    let rt = crate::systemd::runtime()?;
    std::thread::Builder::new()
        .name("berth-metrics".into())
        .spawn(move || {
            rt.block_on(async move {
                if let Ok(listener) = tokio::net::TcpListener::from_std(std_listener) {
                    metrics_accept_loop(listener, shared).await;
                }
            });
        })?;
    Ok(bound)
}

async fn metrics_accept_loop(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    let http = http_builder();
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            shared.stats.tcp_refused.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(refuse(stream));
            continue;
        };
        shared.stats.tcp_connections.fetch_add(1, Ordering::Relaxed);
        let shared = shared.clone();
        let connection = http.serve_connection(
            TokioIo::new(WriteDeadline::new(stream, WRITE_TIMEOUT)),
            service_fn(move |request| {
                let answer = metrics_only(&request, &shared);
                async move { Ok::<_, Infallible>(answer) }
            }),
        );
        tokio::spawn(async move {
            let _ = connection.await;
            drop(permit);
        });
    }
}

fn metrics_only(request: &Request<Incoming>, shared: &Shared) -> Response<ResponseBody> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return json(
            StatusCode::METHOD_NOT_ALLOWED,
            &serde_json::json!({"error": "read-only: only GET"}),
        );
    }
    if request.uri().path() != "/metrics" {
        return json(
            StatusCode::NOT_FOUND,
            &serde_json::json!({"error": "only /metrics is served over TCP"}),
        );
    }
    metrics(request, shared, SystemTime::now())
}

/// The body of an event stream: what [`feed`] queues, as it comes.
struct EventStream {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for EventStream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(Frame::data(c))))
    }
}

/// Feeds one event stream: a `sync` snapshot, then each change, and a
/// comment when idle. Ends when the reader goes away or stops reading.
async fn feed(
    shared: Arc<Shared>,
    mut events: broadcast::Receiver<Event>,
    tx: mpsc::Sender<Bytes>,
    _stream_slot: OwnedSemaphorePermit,
) {
    if put(&tx, sync_frame(&shared)).await.is_err() {
        return;
    }
    let mut idle = tokio::time::interval_at(tokio::time::Instant::now() + KEEP_ALIVE, KEEP_ALIVE);
    loop {
        let frame = tokio::select! {
            _ = tx.closed() => return,
            _ = idle.tick() => Bytes::from_static(b": keep-alive\n\n"),
            event = events.recv() => match event {
                Ok(event) => event_frame(&event),
                // Fell behind: events were lost; a fresh snapshot resynchronizes.
                Err(broadcast::error::RecvError::Lagged(_)) => sync_frame(&shared),
                Err(broadcast::error::RecvError::Closed) => return,
            },
        };
        if put(&tx, frame).await.is_err() {
            return;
        }
    }
}

/// Queues a frame; a reader that has not taken the queued ones within
/// [`WRITE_TIMEOUT`] is given up on.
async fn put(tx: &mpsc::Sender<Bytes>, frame: Bytes) -> Result<(), ()> {
    match tokio::time::timeout(WRITE_TIMEOUT, tx.send(frame)).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(()),
    }
}

fn sync_frame(shared: &Shared) -> Bytes {
    let views = shared.snapshot();
    let views: Vec<&crate::api::WorkloadView> = views.iter().map(AsRef::as_ref).collect();
    let data = serde_json::to_string(&views).unwrap_or_else(|_| "[]".into());
    Bytes::from(format!("event: sync\ndata: {data}\n\n"))
}

fn event_frame(event: &Event) -> Bytes {
    Bytes::from(format!("event: {}\ndata: {}\n\n", event.name(), event.data()))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    use super::*;
    use crate::api::view;

    fn serve() -> (tempfile::TempDir, std::path::PathBuf, Arc<Shared>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api/sock");
        let shared = Shared::new(Duration::from_secs(10));
        let _bound = start(&path, shared.clone()).unwrap();
        (dir, path, shared)
    }

    /// A socket file with nobody behind it, as a killed daemon leaves it.
    fn dead_socket(path: &Path) {
        drop(std::os::unix::net::UnixListener::bind(path).unwrap());
        assert!(std::fs::symlink_metadata(path).unwrap().file_type().is_socket());
    }

    /// Sends `requests` on one connection and reads until the server
    /// closes it (the last request says `Connection: close`, or the
    /// server refuses it).
    fn exchange(path: &Path, requests: &str) -> String {
        let mut s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // A server that refuses a connection answers and closes without
        // reading: the write may then meet the closed end (EPIPE). Its
        // answer is still there to read.
        match s.write_all(requests.as_bytes()) {
            Err(e)
                if e.kind() != std::io::ErrorKind::BrokenPipe
                    && e.kind() != std::io::ErrorKind::ConnectionReset =>
            {
                panic!("{e}")
            }
            _ => {}
        }
        let mut out = String::new();
        // A server that refuses a request it did not read to the end
        // closes with bytes unread, which resets the connection after its
        // answer; what was read before stays in `out`.
        match s.read_to_string(&mut out) {
            Err(e) if e.kind() != std::io::ErrorKind::ConnectionReset => panic!("{e}: {out}"),
            _ => out,
        }
    }

    #[test]
    fn http_over_the_socket() {
        let (_dir, path, shared) = serve();
        shared.publish(view("a"));
        shared.passed(SystemTime::now(), crate::api::health::Health::default());

        // Keep-alive: two requests, two answers, one connection; the query
        // string is ignored.
        let out = exchange(
            &path,
            "GET /healthz?verbose=1 HTTP/1.1\r\nHost: b\r\n\r\n\
             GET /v1/workloads/a HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(out.matches("HTTP/1.1 200 OK\r\n").count(), 2, "{out}");
        assert!(out.contains(r#""status":"healthy""#), "{out}");
        assert!(out.contains("Content-Type: application/json\r\n"), "{out}");
        assert!(
            out.ends_with(r#""record":null}"#) || out.contains(r#""name":"a""#),
            "{out}"
        );

        // HEAD: the head of GET, no body.
        let out = exchange(
            &path,
            "HEAD /v1/workloads HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n",
        );
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        assert!(out.ends_with("\r\n\r\n"), "a body after HEAD: {out}");

        // Read-only, with the methods it allows.
        let out = exchange(
            &path,
            "POST /v1/workloads HTTP/1.1\r\nHost: b\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
        assert!(out.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"), "{out}");
        assert!(out.contains("Allow: GET, HEAD\r\n"), "{out}");

        let out = exchange(
            &path,
            "GET /nope HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n",
        );
        assert!(out.starts_with("HTTP/1.1 404 Not Found\r\n"), "{out}");

        // An oversized head is refused, not buffered without end.
        let big = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "y".repeat(2 * MAX_HEAD));
        let out = exchange(&path, &big);
        assert!(
            out.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "{out}"
        );
    }

    /// Issue 10, defect 4: `[daemon] socket` chmodded an existing 1777
    /// directory to 0750 and deleted a regular file at the socket path.
    #[test]
    fn only_berths_own_directory_and_a_stale_socket_are_touched() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let shared_dir = dir.path().join("tmp");
        std::fs::create_dir(&shared_dir).unwrap();
        std::fs::set_permissions(&shared_dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let file = shared_dir.join("precious");
        std::fs::write(&file, "data").unwrap();

        let e = start(&file, Shared::new(Duration::from_secs(10))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{e}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "data");

        let sock = shared_dir.join("api.sock");
        start(&sock, Shared::new(Duration::from_secs(10))).unwrap();
        assert_eq!(std::fs::metadata(&shared_dir).unwrap().mode() & 0o7777, 0o1777);
        // A stale socket (a daemon that was killed) is replaced.
        let stale = shared_dir.join("stale.sock");
        dead_socket(&stale);
        start(&stale, Shared::new(Duration::from_secs(10))).unwrap();

        let own = dir.path().join("berthd/api.sock");
        start(&own, Shared::new(Duration::from_secs(10))).unwrap();
        assert_eq!(
            std::fs::metadata(own.parent().unwrap()).unwrap().mode() & 0o7777,
            0o750
        );
    }

    /// Issue 31, item 2: any socket at the path was unlinked and bound
    /// again, so another program's clients got berth's answers.
    #[test]
    fn a_live_socket_of_another_program_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("theirs.sock");
        let theirs = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let before = std::fs::symlink_metadata(&path).unwrap().ino();
        let e = start(&path, Shared::new(Duration::from_secs(10))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
        assert!(e.to_string().contains("another program"), "{e}");
        assert_eq!(std::fs::symlink_metadata(&path).unwrap().ino(), before);
        let _client = UnixStream::connect(&path).unwrap();
        assert!(theirs.accept().is_ok(), "their clients still reach them");
    }

    /// Issue 31, item 1: stopping removed whatever the path named by then.
    #[test]
    fn stop_removes_only_the_socket_it_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api.sock");
        let bound = start(&path, Shared::new(Duration::from_secs(10))).unwrap();
        assert_eq!(bound.path(), path);
        // Replaced meanwhile by a file, then by another program's socket.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "notes").unwrap();
        stop(&bound);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "notes");
        std::fs::remove_file(&path).unwrap();
        let _theirs = std::os::unix::net::UnixListener::bind(&path).unwrap();
        stop(&bound);
        assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_socket());
        // Its own socket goes.
        std::fs::remove_file(&path).unwrap();
        let bound = start(&path, Shared::new(Duration::from_secs(10))).unwrap();
        stop(&bound);
        assert!(std::fs::symlink_metadata(&path).is_err(), "its own socket stays");
    }

    /// Issue 31, item 10: a client that pipelined requests and never read
    /// the answers held its connection slot for good once the socket's
    /// buffer was full.
    #[test]
    fn a_client_that_never_reads_is_cut_off_after_the_write_deadline() {
        let (_dir, path, shared) = serve();
        // Answers of ~300 kB each: two fill every buffer on the way.
        for i in 0..2000 {
            let mut v = view(&format!("workload-with-a-long-name-{i:05}"));
            v.unit = format!("{}-{}.service", "u".repeat(60), i);
            shared.publish(v);
        }
        let s = UnixStream::connect(&path).unwrap();
        let mut writer = s.try_clone().unwrap();
        const REQUESTS: usize = 100;
        std::thread::spawn(move || {
            for _ in 0..REQUESTS {
                if writer
                    .write_all(b"GET /v1/workloads HTTP/1.1\r\nHost: b\r\n\r\n")
                    .is_err()
                {
                    return;
                }
            }
        });
        std::thread::sleep(WRITE_TIMEOUT + Duration::from_secs(3));
        // Read what was sent before the server gave up: far fewer answers
        // than requests, then the end of the connection.
        let mut s = s;
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut out = Vec::new();
        match s.read_to_end(&mut out) {
            Ok(_) => {}
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}"),
        }
        let answers = String::from_utf8_lossy(&out)
            .matches("HTTP/1.1 200 OK\r\n")
            .count();
        assert!(
            answers < REQUESTS / 2,
            "{answers} answers: the connection was kept"
        );
    }

    /// Issue 10, defect 3: no cap on connections or streams.
    #[test]
    fn connections_are_capped_and_healthz_keeps_a_slot() {
        let (_dir, path, shared) = serve();
        shared.passed(SystemTime::now(), crate::api::health::Health::default());
        // Every full slot taken by a client that sends nothing.
        let idle: Vec<UnixStream> = (0..MAX_CONNECTIONS)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        let out = exchange(&path, "GET /healthz HTTP/1.1\r\nHost: b\r\n\r\n");
        assert!(
            out.starts_with("HTTP/1.1 200 OK\r\n"),
            "the reserved slot answers /healthz: {out}"
        );
        let out = exchange(&path, "GET /v1/workloads HTTP/1.1\r\nHost: b\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{out}");
        assert!(out.contains("only /healthz"), "{out}");
        let more: Vec<UnixStream> = (0..RESERVED_FOR_HEALTH)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        let out = exchange(&path, "GET /healthz HTTP/1.1\r\nHost: b\r\n\r\n");
        assert!(out.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{out}");
        assert!(out.contains("too many connections"), "{out}");
        drop(idle);
        drop(more);
    }

    #[test]
    fn event_streams_are_capped() {
        let (_dir, path, _shared) = serve();
        let mut streams = Vec::new();
        for _ in 0..MAX_STREAMS {
            let mut s = UnixStream::connect(&path).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(b"GET /v1/events HTTP/1.1\r\nHost: b\r\n\r\n")
                .unwrap();
            let mut buf = [0u8; 4096];
            let mut seen = String::new();
            while !seen.contains("event: sync") {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "{seen}");
                seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
            streams.push(s);
        }
        let out = exchange(
            &path,
            "GET /v1/events HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n",
        );
        assert!(out.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{out}");
        assert!(out.contains("too many event streams"), "{out}");
    }

    /// Issue 10, defect 3: the 5 s limit was per read, so one byte every
    /// 4 s kept a connection for as long as the client liked.
    #[test]
    fn a_trickled_request_head_is_cut_off_at_the_deadline() {
        let (_dir, path, _shared) = serve();
        let mut s = UnixStream::connect(&path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut writer = s.try_clone().unwrap();
        let began = std::time::Instant::now();
        std::thread::spawn(move || {
            let _ = writer.write_all(b"GET /healthz HTTP/1.1\r\n");
            for _ in 0..30 {
                std::thread::sleep(Duration::from_millis(500));
                if writer.write_all(b"X: y\r\n").is_err() {
                    return;
                }
            }
        });
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        let took = began.elapsed();
        assert!(
            took >= HEAD_TIMEOUT - Duration::from_millis(500) && took < HEAD_TIMEOUT + Duration::from_secs(2),
            "closed after {took:?}"
        );
    }

    #[test]
    fn event_stream_opens_with_sync_then_follows_changes() {
        let (_dir, path, shared) = serve();
        shared.publish(view("a"));
        let mut s = UnixStream::connect(&path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /v1/events HTTP/1.1\r\nHost: b\r\n\r\n")
            .unwrap();
        let mut seen = String::new();
        let mut read_until = |needle: &str, seen: &mut String| {
            let mut buf = [0u8; 4096];
            while !seen.contains(needle) {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "stream closed before {needle:?}: {seen}");
                seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        };
        read_until("event: sync\n", &mut seen);
        assert!(seen.starts_with("HTTP/1.1 200 OK\r\n"), "{seen}");
        assert!(seen.contains("Content-Type: text/event-stream\r\n"), "{seen}");
        assert!(seen.contains(r#""name":"a""#), "{seen}");
        shared.publish(view("b"));
        read_until("event: ADDED\ndata: {\"name\":\"b\"", &mut seen);
        shared.remove("a");
        read_until("event: DELETED\ndata: {\"name\":\"a\"", &mut seen);
        // Issue 13, point 7: ownership changes, on the same stream.
        shared.owner_changed(crate::api::OwnerChange {
            workload: "db".into(),
            owner: None,
            lease: None,
            stop_bound_s: None,
            revision: 9,
        });
        read_until(
            "event: OWNER\ndata: {\"workload\":\"db\",\"owner\":null,\"lease\":null,\"stop_bound_s\":null,\"revision\":9}\n\n",
            &mut seen,
        );
    }
}
