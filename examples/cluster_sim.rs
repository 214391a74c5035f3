//! One simulated node of the cluster scale benchmark
//! (bench/cluster-scale.sh): berth's own configuration, join, keep-alive
//! and ownership loop against a real etcd, with a service manager that
//! only records starts. It takes part as a daemon would; SIGTERM is its
//! power-off: it releases what it owns (the stop bound put to zero, then
//! the key deleted, as the drain does), revokes its lease and exits.
//!
//!     cluster_sim DIR NODE NODES WORKLOADS ENDPOINT TTL
//!
//! DIR: a directory of its own (configuration and state); NODE: its name,
//! one of n1..nNODES; every node has the HA workloads w1..wWORKLOADS, w_k's
//! candidates being every node, in order from n_(1 + (k-1)*NODES/WORKLOADS)
//! on. On standard output, one line per start: `start WORKLOAD UNIX_TIME`
//! (seconds, wall clock), and `joined LEASE` once joined.

use std::io::Write;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use berth::cluster::join;
use berth::cluster::keys::{Keys, Owner};
use berth::cluster::node::Node;
use berth::cluster::ownership::Local;
use berth::cluster::reconcile::{Pending, Seen, Units};
use berth::cluster::session;
use berth::cluster::take::{self, Announced};
use berth::config::{self, Workload};
use berth::events::Events;
use berth::paths::Root;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};

/// Every start is as quick as a unit's start job, and one line; what
/// was started runs until fenced. With `SIM_FAIL_FIRST_START_UNTIL`
/// (a Unix time) in the environment, each workload's first start on this
/// node before then fails instead (`start-failed WORKLOAD UNIX_TIME`), as
/// a unit whose start job failed.
#[derive(Default)]
struct Recorder {
    running: std::cell::RefCell<std::collections::BTreeSet<String>>,
    fail_until: f64,
    failed: std::cell::RefCell<std::collections::BTreeSet<String>>,
}

impl Units for Recorder {
    fn start(&self, workload: &Workload) -> Pending<bool> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let fails =
            now.as_secs_f64() < self.fail_until && self.failed.borrow_mut().insert(workload.name.clone());
        let mut out = std::io::stdout().lock();
        let what = if fails { "start-failed" } else { "start" };
        let _ = writeln!(out, "{what} {} {:.6}", workload.name, now.as_secs_f64());
        let _ = out.flush();
        if !fails {
            self.running.borrow_mut().insert(workload.name.clone());
        }
        Box::pin(std::future::ready(!fails))
    }

    fn seen(&self, workload: &Workload) -> Pending<Option<Seen>> {
        let running = self.running.borrow().contains(&workload.name);
        Box::pin(std::future::ready(Some(if running {
            Seen::Running
        } else {
            Seen::Down
        })))
    }

    fn fence(&self, workload: &Workload) -> Pending<bool> {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "fence {}", workload.name);
        let _ = out.flush();
        self.running.borrow_mut().remove(&workload.name);
        Box::pin(std::future::ready(true))
    }
}

/// The stop bound each simulated node writes into its keys (s): what a
/// peer waits after a key it did not see released with a bound of zero.
const STOP_BOUND_S: u64 = 2;

fn usage() -> ! {
    eprintln!("usage: cluster_sim DIR NODE NODES WORKLOADS ENDPOINT TTL");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, node, nodes, workloads, endpoint, ttl] = args.as_slice() else {
        usage()
    };
    let (Ok(nodes), Ok(workloads), Ok(ttl)) = (
        nodes.parse::<usize>(),
        workloads.parse::<usize>(),
        ttl.parse::<u64>(),
    ) else {
        usage()
    };
    if nodes == 0 || workloads == 0 {
        usage()
    }
    let dir = PathBuf::from(dir);
    if let Err(e) = write_config(&dir, node, nodes, workloads, endpoint, ttl) {
        eprintln!(
            "cluster_sim {node}: cannot write its configuration under {}: {e}",
            dir.display()
        );
        std::process::exit(1)
    }
    let root = Root::new(&dir);
    let loaded = config::load(&root);
    if !loaded.errors.is_empty() {
        for e in &loaded.errors {
            eprintln!("cluster_sim {node}: {e}");
        }
        std::process::exit(1)
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    // A LocalSet, as the daemon's agent thread: the ownership loop spawns
    // its starts and fences there.
    let local = tokio::task::LocalSet::new();
    std::process::exit(local.block_on(&runtime, run(root, loaded, node.clone())))
}

fn write_config(
    dir: &std::path::Path,
    node: &str,
    nodes: usize,
    workloads: usize,
    endpoint: &str,
    ttl: u64,
) -> std::io::Result<()> {
    let etc = dir.join("etc/berth");
    std::fs::create_dir_all(etc.join("workloads"))?;
    std::fs::write(
        etc.join("berth.toml"),
        format!("[cluster]\nnode = \"{node}\"\nendpoints = [\"{endpoint}\"]\nlease_ttl_s = {ttl}\n"),
    )?;
    for k in 1..=workloads {
        let first = (k - 1) * nodes / workloads;
        let order: Vec<String> = (0..nodes)
            .map(|i| format!("\"n{}\"", (first + i) % nodes + 1))
            .collect();
        std::fs::write(
            etc.join(format!("workloads/w{k}.toml")),
            format!(
                "exec = [\"/bin/true\"]\nha = true\nnodes = [{}]\n",
                order.join(", ")
            ),
        )?;
    }
    Ok(())
}

async fn run(root: Root, loaded: config::Loaded, node: String) -> i32 {
    let Some(settings) = loaded.host.cluster.clone() else {
        eprintln!("cluster_sim {node}: no [cluster] section");
        return 1;
    };
    let boot_id = format!("sim-{node}-{}", std::process::id());
    let sim = Node::new(
        settings.clone(),
        node.clone(),
        boot_id,
        root.clone(),
        &loaded.workloads,
        Events::new("berth-sim"),
    );
    let (mut client, joined) = loop {
        let attempt = async {
            let mut client = session::connect(&settings).await?;
            let joined = join::join(&mut client, &sim).await?;
            Ok::<_, session::ClusterError>((client, joined))
        };
        match attempt.await {
            Ok(done) => break done,
            Err(e) => {
                eprintln!("cluster_sim {node}: cannot join yet: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    let lease = joined.lease_id;
    println!("joined {lease:x}");
    let state = sim.lease.clone();
    state.lease.store(lease, std::sync::atomic::Ordering::Relaxed);
    state.set_deadline(joined.deadline);
    let locals = sim
        .workloads
        .iter()
        .filter_map(|w| {
            Some(Local {
                name: w.name.clone(),
                policy: w.ha.clone()?,
                stop_bound_s: STOP_BOUND_S,
            })
        })
        .collect();
    let announced = Announced::at_join(&sim, false);
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
        eprintln!("cluster_sim {node}: cannot catch SIGTERM");
        return 1;
    };
    tokio::select! {
        lost = session::keep_alive(client.clone(), settings.clone(), lease, state) => {
            eprintln!("cluster_sim {node}: lease lost ({lost:?})");
            1
        }
        _ = take::run_with(client.clone(), &sim, lease, announced, locals, Rc::new(Recorder {
            fail_until: std::env::var("SIM_FAIL_FIRST_START_UNTIL")
                .ok()
                .and_then(|t| t.parse().ok())
                .unwrap_or(0.0),
            ..Recorder::default()
        })) => 1,
        _ = term.recv() => {
            match release(&mut client, &settings.prefix, &node, lease).await {
                Ok(n) => {
                    eprintln!("cluster_sim {node}: released {n} workloads");
                    0
                }
                Err(e) => {
                    eprintln!("cluster_sim {node}: release failed: {e}");
                    1
                }
            }
        }
    }
}

/// As the drain: each key this node owns gets a stop bound of zero, then
/// goes; then the lease.
async fn release(
    client: &mut etcd_client::Client,
    prefix: &str,
    node: &str,
    lease: i64,
) -> Result<usize, etcd_client::Error> {
    let keys = Keys::new(prefix);
    let owners = client
        .get(keys.owners(), Some(GetOptions::new().with_prefix()))
        .await?;
    let mut released = 0;
    for kv in owners.kvs() {
        let Ok(mut owner) = serde_json::from_slice::<Owner>(kv.value()) else {
            continue;
        };
        if owner.node != node || kv.lease() != lease {
            continue;
        }
        owner.stop_bound_s = 0;
        let key = kv.key().to_vec();
        let mine = Compare::lease(key.clone(), CompareOp::Equal, lease);
        let value = serde_json::to_vec(&owner).unwrap_or_default();
        client
            .txn(Txn::new().when(vec![mine.clone()]).and_then(vec![TxnOp::put(
                key.clone(),
                value,
                Some(PutOptions::new().with_lease(lease)),
            )]))
            .await?;
        client
            .txn(
                Txn::new()
                    .when(vec![mine])
                    .and_then(vec![TxnOp::delete(key, None)]),
            )
            .await?;
        released += 1;
    }
    client.lease_revoke(lease).await?;
    Ok(released)
}
