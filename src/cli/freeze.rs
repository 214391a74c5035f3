//! `berth freeze [NAME]` and `berth thaw [NAME]`: the node's or one
//! workload's freeze flag.

use super::{say, say_error};
use crate::config;
use crate::names::{is_valid_workload_name, unit_name};
use crate::paths::Root;
use crate::state::freeze;

pub(super) fn freeze(root: &Root, name: Option<&str>, reason: &str, force: bool) -> i32 {
    // A typo (`webb`) would freeze nothing and say nothing about it.
    if let Some(n) = name
        && !force
        && is_valid_workload_name(n)
        && crate::config::load(root).workload(n).is_none()
    {
        say_error(&format!(
            "berth freeze: no workload {n:?} is configured; --force freezes it anyway"
        ));
        return 1;
    }
    freeze_cmd(root, name, Some(reason))
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
            Ok(true) => {
                say(&format!("thawed: {what}\n"));
                0
            }
            Ok(false) => {
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
