//! The one way berth replaces a file: readers see the old or the new one,
//! never a torn one, also across a power failure.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

thread_local! {
    /// The files written inside each open [`Batch`] on this thread,
    /// innermost last.
    static BATCHES: RefCell<Vec<Vec<PathBuf>>> = const { RefCell::new(Vec::new()) };
}

/// Many replacements, their fsyncs later: while a batch is open on this
/// thread, [`replace`] skips its fsyncs and notes the file, and
/// [`Batch::commit`] makes the files written inside it durable, and then
/// each of their directories once. Only berth's own files: a `syncfs`
/// did it in one call, but paid for every other writer's dirty pages as
/// well (the journal of a boot's thousands of starts, or whatever the
/// host wrote lately), 0.5 s on the first drain after boot. Until the
/// commit, a crash may leave a new record empty; a record that does not
/// parse is set aside and rebuilt from systemd's live state. A batch
/// dropped uncommitted hands its files to the batch around it, if any;
/// the daemon's loop opens one around each record it writes and syncs
/// those files itself, off the loop.
#[must_use = "a batch dropped uncommitted leaves its files unsynced"]
pub struct Batch {
    committed: bool,
}

impl Batch {
    pub fn begin() -> Batch {
        BATCHES.with(|b| b.borrow_mut().push(Vec::new()));
        Batch { committed: false }
    }

    /// Syncs every file written inside the batch, then their directories;
    /// nothing when nothing was written.
    pub fn commit(self) -> io::Result<()> {
        let written = self.take();
        sync_files(&written)?;
        sync_dirs(&written)
    }

    /// Syncs every file written inside the batch and returns them: their
    /// directories are for the caller to sync, once for many batches
    /// ([`sync_dirs`]).
    pub fn commit_files(self) -> io::Result<Vec<PathBuf>> {
        let written = self.take();
        sync_files(&written)?;
        Ok(written)
    }

    fn take(mut self) -> Vec<PathBuf> {
        self.committed = true;
        BATCHES.with(|b| b.borrow_mut().pop()).unwrap_or_default()
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        BATCHES.with(|b| {
            let mut b = b.borrow_mut();
            let written = b.pop().unwrap_or_default();
            if let Some(outer) = b.last_mut() {
                outer.extend(written);
            }
        });
    }
}

/// fsync of each file; one already gone (swept, moved aside) has nothing
/// left to sync.
/// Many of them on several threads at once: one after the other, each
/// waits for its own journal commit (2 s for 2000 records), while
/// concurrent ones share them.
pub fn sync_files(paths: &[PathBuf]) -> io::Result<()> {
    let sync = |paths: &[PathBuf]| -> io::Result<()> {
        for path in paths {
            match File::open(path) {
                Ok(f) => f.sync_all()?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    };
    if paths.len() <= SYNCS_PER_THREAD {
        return sync(paths);
    }
    let per_thread = paths.len().div_ceil(SYNC_THREADS).max(SYNCS_PER_THREAD);
    std::thread::scope(|s| {
        let threads: Vec<_> = paths
            .chunks(per_thread)
            .map(|chunk| s.spawn(move || sync(chunk)))
            .collect();
        // Every thread is joined at the end of the scope, whatever fails.
        threads.into_iter().try_for_each(|t| {
            t.join()
                .unwrap_or_else(|_| Err(io::Error::other("a sync thread panicked")))
        })
    })
}

/// Threads [`sync_files`] uses at most, and files each takes at least.
const SYNC_THREADS: usize = 32;
const SYNCS_PER_THREAD: usize = 8;

/// fsync of each directory that holds one of `paths`, once: what makes
/// their renames durable.
pub fn sync_dirs(paths: &[PathBuf]) -> io::Result<()> {
    let dirs: BTreeSet<&Path> = paths.iter().filter_map(|p| p.parent()).collect();
    for dir in dirs {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Notes `path` in the innermost open batch; false when none is open.
fn batched(path: &Path) -> bool {
    BATCHES.with(|b| match b.borrow_mut().last_mut() {
        Some(written) => {
            written.push(path.to_path_buf());
            true
        }
        None => false,
    })
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
    let in_batch = batched(path);
    let written = match with {
        Replacement::File(bytes, mode) => (|| {
            let mut f = File::create(&tmp)?;
            f.write_all(bytes)?;
            f.set_permissions(fs::Permissions::from_mode(*mode))?;
            if !in_batch {
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
    if in_batch {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path) {
        write_json(path, b"{}").unwrap();
    }

    #[test]
    fn a_batch_syncs_only_the_files_written_inside_it() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("c"));
        write(&a);
        let outer = Batch::begin();
        write(&b);
        {
            // Dropped uncommitted: its files are the outer batch's.
            let _inner = Batch::begin();
            write(&c);
        }
        assert_eq!(outer.commit_files().unwrap(), [b.clone(), c.clone()]);
        let empty = Batch::begin();
        assert!(
            empty.commit_files().unwrap().is_empty(),
            "nothing written, nothing to sync"
        );
        let after = Batch::begin();
        write(&a);
        assert_eq!(after.commit_files().unwrap(), [a]);
        assert_eq!(std::fs::read(&b).unwrap(), b"{}\n");
    }

    #[test]
    fn many_files_are_synced_on_several_threads_and_a_gone_one_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let batch = Batch::begin();
        let paths: Vec<PathBuf> = (0..100).map(|i| dir.path().join(format!("r{i}"))).collect();
        paths.iter().for_each(|p| write(p));
        std::fs::remove_file(&paths[7]).unwrap();
        assert_eq!(batch.commit_files().unwrap().len(), 100);
        let swept = vec![dir.path().join("missing-dir/x")];
        assert!(sync_files(&swept).is_ok(), "gone: nothing to sync");
        assert!(
            sync_dirs(&[dir.path().join("nope/x")]).is_err(),
            "a directory that is gone is said"
        );
    }
}
