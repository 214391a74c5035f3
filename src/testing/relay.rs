//! A TCP relay between a node and etcd for the cluster tests, as
//! `tests/harness/bin/relay` is for the container scenarios: it can hold
//! what etcd sends back (the node's requests still reach etcd and are
//! applied), so that an answer comes late or a call times out after it
//! took effect.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub(crate) struct Relay {
    /// What the node is given as its endpoint.
    pub url: String,
    held: Arc<watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// A relay to `target` (`http://127.0.0.1:PORT`) on a free port.
    pub async fn start(target: &str) -> Relay {
        let upstream = target.trim_start_matches("http://").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let held = Arc::new(watch::channel(false).0);
        let gate = held.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (mut client_read, client_write) = client.into_split();
                let (server_read, mut server_write) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                });
                tokio::spawn(replies(server_read, client_write, gate.subscribe()));
            }
        });
        Relay { url, held, task }
    }

    /// Holds etcd's replies (true) or lets them through again, in order.
    pub fn hold_replies(&self, hold: bool) {
        self.held.send_replace(hold);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// etcd → node: each chunk waits while the gate is held.
async fn replies(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut gate: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if gate.wait_for(|held| !*held).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
