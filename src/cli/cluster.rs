//! The cluster's unit-side helpers:
//! - `berth owner-check NAME`: ExecStartPre= of an HA workload's unit.
//!   Exit 0 when this node owns NAME on its live lease; 1 with the
//!   reason, and the start refused, otherwise: it fails closed.
//! - `berth fence-arm`: ExecStopPost= of berth-daemon in cluster mode:
//!   arms `berth-fence.timer` at the lease deadline the daemon last saw.
//! - `berth fence`: what that timer starts: stops the HA workloads.
//! - `berth fence-watch` (in fence_watch.rs): the fence's backstop, and
//!   the watchdog's holder.
//! - `berth cluster forget N`: N is gone for good; the rejoin grace stops
//!   waiting for it.

use super::lifecycle::helper_context;
use super::{block_on, fail, say, say_error, with_systemd};
use crate::cluster::fence::{self, Arming};
use crate::cluster::session::boottime;
use crate::config;
use crate::paths::Root;
use crate::systemd::Ops;

/// owner-check's refusal: as the unit's `ExecCondition=`, 255 fails the
/// start (1 to 254 would only skip it, and report it done).
pub const OWNER_CHECK_REFUSED: i32 = 255;

pub(super) fn owner_check(root: &Root, name: &str) -> i32 {
    let refuse = |why: &str| {
        say_error(&format!("berth owner-check: not starting {name}: {why}"));
        OWNER_CHECK_REFUSED
    };
    let loaded = config::load(root);
    let Some(settings) = loaded.host.cluster.clone() else {
        return refuse("there is no valid [cluster] section in berth.toml (see berth check)");
    };
    match loaded.workload(name) {
        Some(w) if w.ha.is_some() => {}
        Some(_) => return refuse("it is not an HA workload (ha = true)"),
        None => return refuse("no valid workload file (see berth check)"),
    }
    let node = match crate::cluster::node_name(&settings) {
        Ok(n) => n,
        Err(e) => return refuse(&e),
    };
    if fence::start_refused(fence::read_deadline(&root.runtime_dir()), boottime()) {
        return refuse("this node is past its fence deadline (its lease is not known to be alive)");
    }
    let armed = crate::state::cluster::read_armed(&root.runtime_dir());
    if let Some(why) = crate::cluster::watchdog::start_refusal(
        settings
            .watchdog
            .as_ref()
            .map(|w| (w.device.as_path(), w.timeout_s)),
        armed.as_ref().map(|(d, t)| (d.as_path(), *t)),
    ) {
        return refuse(&why);
    }
    let boot_id = match crate::state::runs::boot_id() {
        Ok(b) => b,
        Err(e) => return refuse(&format!("cannot read this boot's id: {e}")),
    };
    if crate::state::cluster::read_drained(&root.runtime_dir()).as_deref() == Some(boot_id.as_str()) {
        return refuse(
            "berth drain ran on this node in this boot; it starts no HA workload until berth-daemon joins the cluster again",
        );
    }
    let checked = block_on(crate::cluster::owner::confirm(
        &settings,
        &node,
        name,
        &root.state_dir(),
        &boot_id,
    ));
    if let Ok(Ok(token)) = &checked
        && let Some(why) =
            crate::cluster::watchdog::key_refusal(token.watchdog_s, armed.as_ref().map(|(_, t)| *t))
    {
        return refuse(&why);
    }
    match checked {
        Ok(Ok(token)) => match crate::cluster::owner::write_token(&root.runtime_dir(), name, &token) {
            Ok(()) => 0,
            Err(e) => refuse(&format!(
                "cannot write the fencing token {}: {e}",
                crate::cluster::owner::token_path(&root.runtime_dir(), name).display()
            )),
        },
        Ok(Err(why)) => refuse(&why.to_string()),
        Err(e) => refuse(&format!("{e:#}")),
    }
}

/// How often `fence-arm` tries, and the pause between: all within the
/// daemon unit's stop timeout.
const ARM_ATTEMPTS: u32 = 3;
const ARM_PAUSE: std::time::Duration = std::time::Duration::from_millis(500);

pub(super) fn fence_arm(root: &Root) -> i32 {
    let loaded = config::load(root);
    if loaded.host.cluster.is_none() {
        return 0;
    }
    let deadline = fence::read_deadline(&root.runtime_dir());
    if fence::arming(deadline, boottime(), None) == Arming::NothingToArm {
        say("berth fence-arm: no lease deadline was seen in this boot; nothing to arm\n");
        return 0;
    }
    let argv = match std::env::current_exe() {
        Ok(exe) => vec![exe.to_string_lossy().into_owned(), "fence".to_string()],
        Err(e) => {
            say_error(&format!(
                "berth fence-arm: cannot tell where the berth binary is: {e}"
            ));
            return 1;
        }
    };
    // Retried: this one call is all that fences a node whose daemon is
    // gone, and a busy manager may time it out.
    let mut armed = Err(anyhow::anyhow!("not tried"));
    for attempt in 1..=ARM_ATTEMPTS {
        let argv = argv.clone();
        armed = with_systemd(root, |sd| async move {
            let state = sd.system_state().await.ok();
            let arming = fence::arming(deadline, boottime(), state.as_deref());
            if let Arming::After(after) = arming {
                sd.arm_timer(
                    fence::TIMER,
                    "berth: fence this node's HA workloads at its lease deadline",
                    after,
                    &argv,
                )
                .await?;
            }
            Ok(arming)
        });
        match &armed {
            Err(e) if attempt < ARM_ATTEMPTS => {
                say_error(&format!(
                    "berth fence-arm: attempt {attempt} of {ARM_ATTEMPTS} failed ({e:#}); trying again"
                ));
                std::thread::sleep(ARM_PAUSE);
            }
            _ => break,
        }
    }
    match armed {
        Ok(Arming::After(after)) => {
            say(&format!(
                "berth fence-arm: {}.timer armed: the HA workloads stop in {} ms unless berth-daemon joins again first\n",
                fence::TIMER,
                after.as_millis()
            ));
            0
        }
        Ok(_) => {
            say("berth fence-arm: the host is shutting down; the drain releases the HA workloads\n");
            0
        }
        Err(e) => fail("fence-arm", &e),
    }
}

/// The HA workloads of `loaded`: what a fence stops.
pub(super) fn ha_workloads(loaded: &config::Loaded) -> Vec<config::Workload> {
    loaded
        .workloads
        .iter()
        .filter(|w| w.ha.is_some())
        .cloned()
        .collect()
}

pub(super) fn fence(root: &Root) -> i32 {
    let (loaded, events) = helper_context(root);
    let ha = ha_workloads(&loaded);
    let ran = with_systemd(root, |sd| async move {
        fence::fence_now(&sd, root, &ha, &events, false).await;
        Ok(())
    });
    match ran {
        Ok(()) => 0,
        Err(e) => fail("fence", &e),
    }
}

pub(super) fn forget(root: &Root, node: &str) -> i32 {
    if let Err(why) = config::cluster::check_node_name(node) {
        say_error(&format!(
            "berth cluster forget: {:?} {why}",
            node.escape_debug().to_string()
        ));
        return 2;
    }
    let loaded = config::load(root);
    let Some(settings) = loaded.host.cluster.clone() else {
        say_error(
            "berth cluster forget: there is no valid [cluster] section in berth.toml (see berth check)",
        );
        return 1;
    };
    use crate::cluster::admin::{Forgot, forget};
    match block_on(forget(&settings, node)) {
        Ok(Ok(Forgot::Done(true))) => {
            say(&format!(
                "forgot {node}: its member and last-state keys are deleted\n"
            ));
            0
        }
        Ok(Ok(Forgot::Done(false))) => {
            say(&format!("{node} is not a member: nothing to forget\n"));
            0
        }
        Ok(Ok(Forgot::Present)) => {
            say_error(&format!(
                "berth cluster forget: {node} is present (it has a node key: up or in maintenance); only a node gone for good is forgotten"
            ));
            1
        }
        Ok(Err(e)) => {
            say_error(&format!("berth cluster forget: {e}"));
            1
        }
        Err(e) => fail("cluster forget", &e),
    }
}
