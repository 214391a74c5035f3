//! `berth install`, `berth uninstall` and `berth reload`: each step done on
//! stdout, warnings and the failed step on stderr.

use std::path::PathBuf;

use super::{block_on, fail, say, say_error};
use crate::install::{self, Error, Report};
use crate::paths::Root;

pub(super) fn install(root: &Root, bindir: Option<PathBuf>, force: bool) -> i32 {
    report("install", block_on(install::install(root, bindir, force)))
}

pub(super) fn uninstall(root: &Root, purge: bool) -> i32 {
    report("uninstall", block_on(install::uninstall(root, purge)))
}

pub(super) fn reload(root: &Root) -> i32 {
    report("reload", block_on(install::reload(root)))
}

fn report(verb: &str, outcome: anyhow::Result<Result<Report, Error>>) -> i32 {
    match outcome {
        Err(e) => fail(verb, &e),
        Ok(Err(e)) => {
            say_error(&format!("berth {verb}: {e}"));
            1
        }
        Ok(Ok(report)) => {
            for warning in &report.warnings {
                say_error(&format!("berth {verb}: {warning}"));
            }
            for line in &report.lines {
                say(&format!("{line}\n"));
            }
            0
        }
    }
}
