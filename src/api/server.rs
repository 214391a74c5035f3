//! Serving the API: the socket, hyper's HTTP/1.1 connection handling, the
//! Server-Sent Events stream, and the limits a client cannot get past.

use std::convert::Infallible;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::header::{ALLOW, CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::UnixListener;
use tokio::sync::{broadcast, mpsc};

use super::routes::{Reply, route};
use super::{Event, Shared};

/// A request head larger than this is refused (431); hyper's minimum.
const MAX_HEAD: usize = 8 * 1024;
/// A client must send a complete request head within this, also between
/// requests on a kept-alive connection.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// An event stream whose reader takes longer than this to accept the next
/// event is closed: a stuck reader cannot hold anything for long.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// A comment line on an idle event stream, so that proxies and clients
/// see it alive and a vanished reader is noticed.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Events queued per stream between the feeder and hyper.
const STREAM_QUEUE: usize = 16;
/// After a failed accept (out of file descriptors), wait before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

type ResponseBody = BoxBody<Bytes, Infallible>;

/// Binds the socket (replacing a stale one) with mode 0660, group `berth`
/// when it exists, in a 0750 directory; serves on a thread of its own.
pub fn start(path: &Path, shared: Arc<Shared>) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750))?;
    }
    if std::fs::symlink_metadata(path).is_ok() {
        std::fs::remove_file(path)?;
    }
    let std_listener = std::os::unix::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    if let Ok(Some(group)) = nix::unistd::Group::from_name("berth") {
        let _ = nix::unistd::chown(path, None, Some(group.gid));
        if let Some(dir) = path.parent() {
            let _ = nix::unistd::chown(dir, None, Some(group.gid));
        }
    }
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
    Ok(())
}

/// Removes the socket on a clean exit.
pub fn stop(path: &Path) {
    let _ = std::fs::remove_file(path);
}

async fn accept_loop(listener: UnixListener, shared: Arc<Shared>) {
    let mut http = http1::Builder::new();
    // hyper needs a timer for its header-read timeout (it panics without).
    http.timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .keep_alive(true)
        .max_buf_size(MAX_HEAD)
        // The header spelling clients saw before hyper.
        .title_case_headers(true);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let shared = shared.clone();
        let connection = http.serve_connection(
            TokioIo::new(stream),
            service_fn(move |request| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(answer(&request, shared)) }
            }),
        );
        tokio::spawn(connection);
    }
}

fn answer(request: &Request<Incoming>, shared: Arc<Shared>) -> Response<ResponseBody> {
    let head = request.method() == Method::HEAD;
    match route(request.method(), request.uri().path(), &shared, SystemTime::now()) {
        Reply::Json(status, body) => {
            let text = body.to_string();
            let mut response = Response::new(Full::new(Bytes::from(text)).boxed());
            *response.status_mut() = status;
            let headers = response.headers_mut();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            if status == StatusCode::METHOD_NOT_ALLOWED {
                headers.insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            }
            response
        }
        Reply::Events => {
            let body = if head {
                Empty::new().boxed()
            } else {
                // Subscribe before the snapshot: nothing falls in between.
                let events = shared.subscribe();
                let (tx, rx) = mpsc::channel(STREAM_QUEUE);
                tokio::spawn(feed(shared, events, tx));
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
async fn feed(shared: Arc<Shared>, mut events: broadcast::Receiver<Event>, tx: mpsc::Sender<Bytes>) {
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
    let data = serde_json::to_string(&shared.snapshot()).unwrap_or_else(|_| "[]".into());
    Bytes::from(format!("event: sync\ndata: {data}\n\n"))
}

fn event_frame(event: &Event) -> Bytes {
    let data = serde_json::to_string(&event.workload).unwrap_or_else(|_| "{}".into());
    Bytes::from(format!("event: {}\ndata: {data}\n\n", event.kind.as_str()))
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
        start(&path, shared.clone()).unwrap();
        (dir, path, shared)
    }

    /// Sends `requests` on one connection and reads until the server
    /// closes it (the last request says `Connection: close`, or the
    /// server refuses it).
    fn exchange(path: &Path, requests: &str) -> String {
        let mut s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(requests.as_bytes()).unwrap();
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
        shared.passed(SystemTime::now(), crate::daemon::health::Health::default());

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
    }
}
