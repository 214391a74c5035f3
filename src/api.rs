//! The supervisor's read-only API: HTTP/1.1 and JSON on a Unix socket,
//! never TCP.
//!
//! - `GET /healthz`: 200 while the loop runs and its last pass is recent;
//!   503 when systemd could not be scanned at all or the loop stalled.
//! - `GET /v1/workloads`, `GET /v1/workloads/NAME`: record and live state.
//! - `GET /v1/events`: Server-Sent Events; a `sync` snapshot, then
//!   `MODIFIED` / `ADDED` / `DELETED`. The subscription is taken before the
//!   snapshot; nothing is replayed; a reader that falls behind loses events
//!   (told by a fresh `sync`) and never slows the others or the loop.
//!
//! Only GET; request heads are bounded; idle and slow clients time out.
//!
//! It runs on its own thread and runtime, so a stalled supervisor loop
//! cannot stall it, and `/healthz` can say so.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::broadcast;

use crate::records::Record;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WorkloadView {
    pub name: String,
    pub unit: String,
    pub active_state: String,
    pub main_pid: u32,
    pub invocation_id: String,
    pub record: Option<Record>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Event {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub workload: WorkloadView,
}

/// What the supervisor shares with the API.
pub struct Shared {
    pub workloads: Mutex<BTreeMap<String, WorkloadView>>,
    pub heartbeat: Mutex<Option<SystemTime>>,
    pub systemd_ok: Mutex<bool>,
    pub events: broadcast::Sender<Event>,
    /// The supervisor's health aggregate: status, failed, not converged.
    pub health: Mutex<(&'static str, Vec<String>, Vec<String>)>,
    /// A pass older than this is a stalled loop.
    pub stale_after: Duration,
}

impl Shared {
    pub fn new(stale_after: Duration) -> Arc<Shared> {
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        Arc::new(Shared {
            workloads: Mutex::new(BTreeMap::new()),
            heartbeat: Mutex::new(None),
            systemd_ok: Mutex::new(false),
            events,
            health: Mutex::new(("healthy", Vec::new(), Vec::new())),
            stale_after,
        })
    }

    /// Every workload's view, in name order.
    pub fn snapshot(&self) -> Vec<WorkloadView> {
        self.workloads
            .lock()
            .expect("api state")
            .values()
            .cloned()
            .collect()
    }

    /// Stores a workload's view; publishes it when it changed.
    pub fn publish(&self, view: WorkloadView) {
        let mut all = self.workloads.lock().expect("api state");
        let kind = match all.get(&view.name) {
            Some(old) if *old == view => return,
            Some(_) => "MODIFIED",
            None => "ADDED",
        };
        all.insert(view.name.clone(), view.clone());
        drop(all);
        let _ = self.events.send(Event { kind, workload: view });
    }

    pub fn remove(&self, name: &str) {
        if let Some(view) = self.workloads.lock().expect("api state").remove(name) {
            let _ = self.events.send(Event {
                kind: "DELETED",
                workload: view,
            });
        }
    }

    fn health(&self) -> (u16, serde_json::Value) {
        let heartbeat = *self.heartbeat.lock().expect("api state");
        let systemd_ok = *self.systemd_ok.lock().expect("api state");
        let age = heartbeat.and_then(|h| SystemTime::now().duration_since(h).ok());
        let fresh = age.is_some_and(|a| a <= self.stale_after);
        // The same aggregate as the journal event and the status file;
        // only a stalled loop or an unlistable systemd makes it a 503.
        let (aggregate, failed, unconverged) = self.health.lock().expect("api state").clone();
        let status = if !fresh || !systemd_ok {
            "unhealthy"
        } else {
            aggregate
        };
        let code = if status == "unhealthy" { 503 } else { 200 };
        (
            code,
            serde_json::json!({
                "status": status,
                "loop_fresh": fresh,
                "systemd_scanned": systemd_ok,
                "last_pass_age_ms": age.map(|a| a.as_millis() as u64),
                "degraded": failed.len() + unconverged.len(),
                "failed_workloads": failed,
                "unconverged_workloads": unconverged,
            }),
        )
    }
}

const EVENT_BUFFER: usize = 256;
const MAX_HEAD: usize = 8 * 1024;
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds the socket (replacing a stale one) with mode 0660, group `berth`
/// when it exists, in a 0750 directory; serves on a thread of its own.
pub fn start(path: &Path, shared: Arc<Shared>) -> std::io::Result<()> {
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
    std::thread::Builder::new()
        .name("berth-api".into())
        .spawn(move || {
            let Ok(rt) = crate::systemd::runtime() else { return };
            rt.block_on(async move {
                let Ok(listener) = UnixListener::from_std(std_listener) else {
                    return;
                };
                loop {
                    if let Ok((stream, _)) = listener.accept().await {
                        tokio::spawn(serve(stream, shared.clone()));
                    }
                }
            });
        })?;
    Ok(())
}

/// Removes the socket on a clean exit.
pub fn stop(path: &PathBuf) {
    let _ = std::fs::remove_file(path);
}

async fn read_head(stream: &mut UnixStream) -> Option<String> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_HEAD {
            return None;
        }
        let n = tokio::time::timeout(HEAD_TIMEOUT, stream.read(&mut buf))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

async fn respond(stream: &mut UnixStream, code: u16, body: &serde_json::Value) {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let body = serde_json::to_string(body).expect("serializes");
    let allow = if code == 405 { "Allow: GET\r\n" } else { "" };
    let text = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(text.as_bytes())).await;
}

async fn serve(mut stream: UnixStream, shared: Arc<Shared>) {
    let Some(head) = read_head(&mut stream).await else {
        respond(
            &mut stream,
            431,
            &serde_json::json!({"error": "request head too large, incomplete or too slow"}),
        )
        .await;
        return;
    };
    let mut parts = head.lines().next().unwrap_or("").split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" {
        respond(
            &mut stream,
            405,
            &serde_json::json!({"error": "read-only API: only GET"}),
        )
        .await;
        return;
    }
    match target {
        "/healthz" => {
            let (code, body) = shared.health();
            respond(&mut stream, code, &body).await;
        }
        "/v1/workloads" => {
            let all = shared.snapshot();
            respond(&mut stream, 200, &serde_json::to_value(all).expect("serializes")).await;
        }
        "/v1/events" => events(stream, shared).await,
        t => match t.strip_prefix("/v1/workloads/") {
            Some(name) => {
                let view = shared.workloads.lock().expect("api state").get(name).cloned();
                match view {
                    Some(v) => respond(&mut stream, 200, &serde_json::to_value(v).expect("serializes")).await,
                    None => {
                        respond(
                            &mut stream,
                            404,
                            &serde_json::json!({"error": format!("no workload {name:?}")}),
                        )
                        .await
                    }
                }
            }
            None => respond(&mut stream, 404, &serde_json::json!({"error": "not found"})).await,
        },
    }
}

/// Server-Sent Events: subscribe first, then the snapshot, then changes.
async fn events(mut stream: UnixStream, shared: Arc<Shared>) {
    let mut rx = shared.events.subscribe();
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n";
    if send(&mut stream, head).await.is_err() || send_sync(&mut stream, &shared).await.is_err() {
        return;
    }
    loop {
        match rx.recv().await {
            Ok(event) => {
                let data = serde_json::to_string(&event.workload).expect("serializes");
                if send(&mut stream, &format!("event: {}\ndata: {data}\n\n", event.kind))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            // Fell behind: events were lost; a fresh snapshot resynchronizes.
            Err(broadcast::error::RecvError::Lagged(_)) => {
                if send_sync(&mut stream, &shared).await.is_err() {
                    return;
                }
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

async fn send_sync(stream: &mut UnixStream, shared: &Shared) -> Result<(), ()> {
    let all = shared.snapshot();
    let data = serde_json::to_string(&all).expect("serializes");
    send(stream, &format!("event: sync\ndata: {data}\n\n")).await
}

/// A write that a stuck reader cannot hold forever.
async fn send(stream: &mut UnixStream, text: &str) -> Result<(), ()> {
    match tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(text.as_bytes())).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(()),
    }
}
