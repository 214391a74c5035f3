//! `berth owner-check NAME`: ExecStartPre= of an HA workload's unit. Exit
//! 0 when this node owns NAME on its live lease; 1 with the reason, and
//! the start refused, otherwise: it fails closed.

use super::{block_on, say_error};
use crate::config;
use crate::paths::Root;

pub(super) fn owner_check(root: &Root, name: &str) -> i32 {
    let refuse = |why: &str| {
        say_error(&format!("berth owner-check: not starting {name}: {why}"));
        1
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
    let boot_id = match crate::state::runs::boot_id() {
        Ok(b) => b,
        Err(e) => return refuse(&format!("cannot read this boot's id: {e}")),
    };
    let checked = block_on(crate::cluster::owner::confirm(
        &settings,
        &node,
        name,
        &root.state_dir(),
        &boot_id,
    ));
    match checked {
        Ok(Ok(())) => 0,
        Ok(Err(why)) => refuse(&why.to_string()),
        Err(e) => refuse(&format!("{e:#}")),
    }
}
