//! The daemon's cluster agent: the [`phases`](super::phases) on a thread
//! and a runtime of their own, so that keep-alives never wait behind the
//! supervisor's D-Bus calls or disk writes. The daemon keeps an [`Agent`]:
//! the lease state it shares (the fence deadline, and the thread's pulse,
//! which the watchdog depends on) and the way to ask it to leave.

use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::node::{Node, node_name};
use super::phases;
use super::session::{LeaseState, boottime};
use crate::config::Loaded;
use crate::events::Events;
use crate::paths::Root;
use crate::systemd::Systemd;

/// The daemon's handle on its agent.
pub struct Agent {
    /// The lease deadline and the thread's pulse (the watchdog's gate).
    pub state: Arc<LeaseState>,
    leave: tokio::sync::mpsc::UnboundedSender<std::sync::mpsc::Sender<String>>,
}

impl Agent {
    /// Whether the agent's thread made progress within `within`.
    pub fn alive(&self, within: Duration) -> bool {
        self.state.alive(within)
    }

    /// The daemon is leaving (a stop, a restart, a relaunch): the agent
    /// stops keeping the live lease and hands the node's keys to a
    /// maintenance lease, unless the host is shutting down. Waits at most
    /// `limit`; what happened, for the journal.
    pub fn hand_over(&self, limit: Duration) -> String {
        let (tell, told) = std::sync::mpsc::channel();
        if self.leave.send(tell).is_err() {
            return "the agent's thread is gone; nothing handed over".into();
        }
        told.recv_timeout(limit).unwrap_or_else(|_| {
            format!(
                "no maintenance hand-over within {} s: the fence keeps the live lease's deadline",
                limit.as_secs()
            )
        })
    }
}

/// Starts the agent when berth.toml has a `[cluster]` section.
pub fn start_agent(
    root: &Root,
    loaded: &Loaded,
    boot_id: String,
    api: Option<Arc<crate::api::Shared>>,
) -> Option<Agent> {
    let settings = loaded.host.cluster.clone()?;
    // The first daemon of a boot rejoins (a restart within the boot finds
    // the rejoin done).
    if super::rejoin::pending(&root.runtime_dir(), &boot_id) {
        freeze_for_the_command_line(root);
    }
    let name = node_name(&settings);
    let mut node = Node::new(
        settings,
        name.clone().unwrap_or_default(),
        boot_id,
        root.clone(),
        &loaded.workloads,
        Events::new("berth-daemon"),
    );
    let state = node.lease.clone();
    if let Some(api) = &api {
        let _ = api.agent.lease.set(state.clone());
    }
    node.api = api;
    // A deadline a previous daemon of this boot saw holds until this one
    // joins: the fence keeps it.
    if let Some(d) = super::fence::read_deadline(&root.runtime_dir()) {
        state.set_deadline(d);
    }
    state
        .progress_ms
        .store(boottime().as_millis() as u64, Ordering::Relaxed);
    let (leave, leaving) = tokio::sync::mpsc::unbounded_channel();
    let spawned = std::thread::Builder::new()
        .name("berth-cluster".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(r) => r,
                Err(e) => {
                    return node
                        .events
                        .warn(&format!("cluster: cannot start the agent's runtime: {e}"));
                }
            };
            let local = tokio::task::LocalSet::new();
            local.block_on(&runtime, async move {
                phases::pulse(node.lease.clone());
                let ops = Rc::new(systemd(&node).await);
                let node = Rc::new(node);
                match name {
                    Ok(_) => phases::live(node, ops, leaving).await,
                    Err(why) => phases::outside(node, ops, leaving, why).await,
                }
            });
        });
    match spawned {
        Ok(_) => Some(Agent { state, leave }),
        Err(e) => {
            Events::new("berth-daemon").warn(&format!("cluster: cannot start the agent's thread: {e}"));
            None
        }
    }
}

/// A boot with berth.freeze on the command line: the node's own freeze,
/// kept past this boot (peers must not see it thaw by a mere reboot);
/// written once per boot, so that `berth thaw` lifts it for the next.
fn freeze_for_the_command_line(root: &Root) {
    use crate::state::freeze;
    if !freeze::cmdline_freeze(&freeze::kernel_command_line()) {
        return;
    }
    let events = Events::new("berth-daemon");
    match freeze::freeze_unless_own(root, None, freeze::KERNEL_CMDLINE) {
        Ok(Some(_)) => events.info(
            "cluster: berth.freeze is on the kernel command line: local node has been frozen (reason kernel-cmdline)",
        ),
        Ok(None) => {}
        Err(e) => events.warn(&format!(
            "cluster: cannot write the node freeze for berth.freeze: {e}"
        )),
    }
}

/// The agent's systemd connection, tried again every second until it
/// comes (said each time: the agent is idle meanwhile).
async fn systemd(node: &Node) -> Systemd {
    loop {
        match Systemd::connect(node.root.manager()).await {
            Ok(sd) => return sd,
            Err(e) => {
                node.events.warn(&format!(
                    "cluster: the agent cannot reach systemd ({e}); trying again"
                ));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
