//! `berth freeze [NAME]` and `berth thaw [NAME]`: the node's or one
//! workload's freeze flag. With `--cluster`: the cluster's or the object's
//! freeze key in etcd, which every node's daemon adopts as its own node or
//! instance freeze (and drops when the key goes).

use super::{say, say_error};
use crate::config;
use crate::names::{is_valid_workload_name, unit_name};
use crate::paths::Root;
use crate::state::freeze;

/// The longest `--reason` taken (bytes): it is shown by every `berth
/// status`, and a cluster freeze puts it in etcd for every node to copy.
pub const MAX_REASON_BYTES: usize = 1024;

/// A reason too long for that (exit 2), said.
fn refuse_long_reason(reason: &str) -> Option<i32> {
    (reason.len() > MAX_REASON_BYTES).then(|| {
        say_error(&format!(
            "berth freeze: --reason is {} bytes; at most {MAX_REASON_BYTES}",
            reason.len()
        ));
        2
    })
}

pub(super) fn freeze(root: &Root, name: Option<&str>, reason: &str, force: bool) -> i32 {
    if let Some(code) = refuse_long_reason(reason).or_else(|| refuse_typo(root, name, force)) {
        return code;
    }
    freeze_cmd(root, name, Some(reason))
}

/// A typo (`webb`) would freeze nothing and say nothing about it.
fn refuse_typo(root: &Root, name: Option<&str>, force: bool) -> Option<i32> {
    let n = name?;
    if !is_valid_workload_name(n) {
        say_error(&format!("berth: {n:?} is not a valid workload name"));
        return Some(2);
    }
    if !force && crate::config::load(root).workload(n).is_none() {
        say_error(&format!(
            "berth freeze: no workload {n:?} is configured; --force freezes it anyway"
        ));
        return Some(1);
    }
    None
}

/// The cluster's settings and this node's name, or the reason there are
/// none (exit 1).
#[cfg(feature = "cluster")]
fn cluster_of(root: &Root, verb: &str) -> Result<(crate::config::ClusterSettings, String), i32> {
    let loaded = config::load(root);
    let Some(settings) = loaded.host.cluster.clone() else {
        say_error(&format!(
            "berth {verb} --cluster: there is no valid [cluster] section in berth.toml (see berth check)"
        ));
        return Err(1);
    };
    match crate::cluster::node_name(&settings) {
        Ok(node) => Ok((settings, node)),
        Err(e) => {
            say_error(&format!("berth {verb} --cluster: {e}"));
            Err(1)
        }
    }
}

/// `berth freeze [NAME] --cluster`.
#[cfg(feature = "cluster")]
pub(super) fn freeze_cluster(root: &Root, name: Option<&str>, reason: &str, force: bool) -> i32 {
    if let Some(code) = refuse_long_reason(reason).or_else(|| refuse_typo(root, name, force)) {
        return code;
    }
    let (settings, node) = match cluster_of(root, "freeze") {
        Ok(c) => c,
        Err(code) => return code,
    };
    let key = crate::cluster::admin::freeze_key(&settings, name);
    match super::block_on(crate::cluster::admin::freeze(&settings, &node, name, reason)) {
        Ok(Ok((value, revision))) => {
            let what = match name {
                None => "the cluster: every node's daemon freezes its node".to_string(),
                Some(n) => format!("{n} on every node that has it"),
            };
            say(&format!(
                "frozen: {what} (key {key}, revision {revision}, taken by {node}, since {})\n",
                value.frozen_at
            ));
            0
        }
        Ok(Err(e)) => {
            say_error(&format!("berth freeze --cluster: cannot put {key}: {e}"));
            1
        }
        Err(e) => super::fail("freeze", &e),
    }
}

/// `berth thaw [NAME] --cluster`.
#[cfg(feature = "cluster")]
pub(super) fn thaw_cluster(root: &Root, name: Option<&str>) -> i32 {
    if let Some(n) = name
        && !is_valid_workload_name(n)
    {
        say_error(&format!("berth: {n:?} is not a valid workload name"));
        return 2;
    }
    let (settings, _) = match cluster_of(root, "thaw") {
        Ok(c) => c,
        Err(code) => return code,
    };
    let key = crate::cluster::admin::freeze_key(&settings, name);
    match super::block_on(crate::cluster::admin::thaw(&settings, name)) {
        Ok(Ok(true)) => {
            say(&format!(
                "thawed: {key} deleted; each node's daemon drops the freeze it adopted from it\n"
            ));
            0
        }
        Ok(Ok(false)) => {
            say(&format!("{key} was not there: nothing to thaw\n"));
            0
        }
        Ok(Err(e)) => {
            say_error(&format!("berth thaw --cluster: cannot delete {key}: {e}"));
            1
        }
        Err(e) => super::fail("thaw", &e),
    }
}

pub(super) fn thaw(root: &Root, name: Option<&str>) -> i32 {
    freeze_cmd(root, name, None)
}

/// `berth freeze [NAME]` (reason given) and `berth thaw [NAME]` (none).
fn freeze_cmd(root: &Root, name: Option<&str>, reason: Option<&str>) -> i32 {
    if let Some(n) = name
        && !is_valid_workload_name(n)
    {
        say_error(&format!("berth: {n:?} is not a valid workload name"));
        return 2;
    }
    let what = name
        .map(|n| config::load_workload(root, n).map_or_else(|| unit_name(n), |w| w.unit_name()))
        .unwrap_or_else(|| "the node".into());
    match reason {
        Some(reason) => match freeze::freeze(root, name, reason) {
            Ok(f) => {
                say(&format!("frozen: {what} since {}\n", f.frozen_at));
                0
            }
            Err(e) => {
                say_error(&format!("berth freeze: cannot write the flag for {what}: {e}"));
                1
            }
        },
        None => match freeze::thaw(root, name) {
            Ok(freeze::Thawed::Thawed) => {
                say(&format!("thawed: {what}\n"));
                0
            }
            // Its own freeze went; the adopted one it covered holds.
            Ok(freeze::Thawed::Uncovered(f)) => {
                say(&format!(
                    "thawed: {what}'s own freeze; the {} freeze taken by {} still holds (berth thaw{} --cluster lifts it)\n",
                    f.scope.as_str(),
                    f.adopted
                        .as_ref()
                        .map_or_else(|| "?".to_string(), |a| a.taken_by.escape_debug().to_string()),
                    name.map(|n| format!(" {n}")).unwrap_or_default()
                ));
                0
            }
            Ok(freeze::Thawed::NotFrozen) => {
                say(&format!("{what} was not frozen\n"));
                0
            }
            Err(e) => {
                say_error(&format!("berth thaw: cannot remove the flag for {what}: {e}"));
                1
            }
        },
    }
}
