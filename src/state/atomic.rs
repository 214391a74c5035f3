//! The one way berth replaces a file: readers see the old or the new one,
//! never a torn one, also across a power failure.

use std::cell::Cell;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

thread_local! {
    /// Open [`Batch`]es on this thread.
    static BATCHES: Cell<u32> = const { Cell::new(0) };
}

/// Many replacements, one sync: while a batch is open on this thread,
/// [`replace`] skips its fsyncs, and [`Batch::commit`] makes everything
/// durable with one `syncfs`. For the daemon's first pass, which may write
/// a record for each of a thousand workloads before READY: one fsync pair
/// each made that take seconds. Until the commit, a crash may leave a new
/// record empty; a record that does not parse is set aside and rebuilt
/// from systemd's live state. The daemon's loop also opens one around each
/// record it writes and drops it uncommitted: it syncs those files itself,
/// off the loop.
pub struct Batch {
    dir: PathBuf,
}

impl Batch {
    /// Opens a batch; `dir` is on the file system to sync at the end.
    pub fn begin(dir: &Path) -> Batch {
        BATCHES.with(|b| b.set(b.get() + 1));
        Batch {
            dir: dir.to_path_buf(),
        }
    }

    /// Syncs the file system that holds the batch's directory.
    pub fn commit(self) -> io::Result<()> {
        sync_file_system(&self.dir)
    }
}

/// Makes durable what unsynced writes (a [`Batch`] dropped uncommitted,
/// on other threads) put in `dir`: one `syncfs` of its file system.
pub fn sync_file_system(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    nix::unistd::syncfs(File::open(dir)?).map_err(io::Error::from)
}

impl Drop for Batch {
    fn drop(&mut self) {
        BATCHES.with(|b| b.set(b.get().saturating_sub(1)));
    }
}

fn batched() -> bool {
    BATCHES.with(|b| b.get() > 0)
}

/// What [`replace`] puts at a path.
pub enum Replacement<'a> {
    /// Contents and permission bits.
    File(&'a [u8], u32),
    /// A symbolic link to this target.
    Symlink(&'a str),
}

/// Replaces `path`: a temporary file in the same directory, fsync, rename,
/// fsync of the directory.
pub fn replace(path: &Path, with: &Replacement) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a path without a directory"))?;
    fs::create_dir_all(dir)?;
    // Per process, so that two writers never share a temporary file.
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("record"),
        std::process::id()
    ));
    let _ = fs::remove_file(&tmp);
    let written = match with {
        Replacement::File(bytes, mode) => (|| {
            let mut f = File::create(&tmp)?;
            f.write_all(bytes)?;
            f.set_permissions(fs::Permissions::from_mode(*mode))?;
            if !batched() {
                f.sync_all()?;
            }
            Ok(())
        })(),
        Replacement::Symlink(target) => std::os::unix::fs::symlink(target, &tmp),
    };
    // A full disk must not leave the temporary file behind.
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    if batched() {
        return Ok(());
    }
    File::open(dir)?.sync_all()
}

/// Writes a JSON document (`bytes` and a newline) to `path` atomically.
pub fn write_json(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut line = Vec::with_capacity(bytes.len() + 1);
    line.extend_from_slice(bytes);
    line.push(b'\n');
    replace(path, &Replacement::File(&line, 0o644))
}
