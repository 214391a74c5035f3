//! `[daemon] metrics_textfile`: the metrics as `berth.prom` in a directory
//! node_exporter's textfile collector reads, for hosts scraped through
//! node_exporter alone. Replaced whole by a rename, so the collector never
//! reads half a file; written on a thread of its own, so a slow disk never
//! holds the daemon's loop (and its watchdog); removed when the daemon
//! stops cleanly, so that no one reads a stopped daemon's last word as
//! current (after a crash it stays: node_exporter's
//! `node_textfile_mtime_seconds` tells its age).

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::exposition::{Format, render};
use super::families;
use crate::api::Shared;

/// The file's name; node_exporter reads `*.prom`.
pub const FILE: &str = "berth.prom";
/// Written at most this often: node_exporter is scraped every 15 s or
/// more, and at 5000 workloads the file is megabytes.
pub const EVERY: Duration = Duration::from_secs(15);
/// The name it is written under first: not `*.prom`, so never read.
const TEMP: &str = ".berth.prom.tmp";

pub struct Textfile {
    dir: PathBuf,
    last: Option<Instant>,
    /// The last write failed: said once until one succeeds.
    failing: bool,
    /// A write is running on its thread; what the last one gave.
    writing: Arc<AtomicBool>,
    written: Arc<Mutex<Option<io::Result<()>>>>,
}

impl Textfile {
    pub fn new(dir: &Path) -> Textfile {
        Textfile {
            dir: dir.to_path_buf(),
            last: None,
            failing: false,
            writing: Arc::new(AtomicBool::new(false)),
            written: Arc::new(Mutex::new(None)),
        }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE)
    }

    /// Renders the metrics and hands them to a thread that writes the
    /// file, when [`EVERY`] has passed since the last try and no write is
    /// still running. What to say: the failure of a finished write, the
    /// first of a run of failures only.
    pub fn tick(&mut self, shared: &Shared, now: Instant) -> Option<String> {
        let said = self.outcome();
        if self.writing.load(Ordering::Acquire) || self.last.is_some_and(|t| now.duration_since(t) < EVERY) {
            return said;
        }
        self.last = Some(now);
        let text = render(&families(shared, SystemTime::now()), Format::Text);
        let (dir, writing, written) = (self.dir.clone(), self.writing.clone(), self.written.clone());
        writing.store(true, Ordering::Release);
        let job = move || {
            let result = write(&dir, &text);
            *written.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(result);
            writing.store(false, Ordering::Release);
        };
        if let Err(e) = std::thread::Builder::new()
            .name("berth-textfile".into())
            .spawn(job)
        {
            self.writing.store(false, Ordering::Release);
            return Some(format!(
                "metrics: cannot start a thread to write {}: {e}",
                self.path().display()
            ));
        }
        said
    }

    /// The finished write's failure, said once per run of failures.
    fn outcome(&mut self) -> Option<String> {
        let result = self
            .written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()?;
        match result {
            Ok(()) => {
                self.failing = false;
                None
            }
            Err(e) if !self.failing => {
                self.failing = true;
                Some(format!("metrics: cannot write {}: {e}", self.path().display()))
            }
            Err(_) => None,
        }
    }

    /// At a clean exit: the file goes (a symlink put in its place is
    /// removed, never followed).
    pub fn remove(&self) {
        let _ = std::fs::remove_file(self.path());
    }
}

/// `text` as DIR/berth.prom, mode 0644, by a rename. The temporary name
/// is created afresh (O_EXCL: a symlink planted there is not followed),
/// and the rename replaces whatever is at the final name without
/// following it.
pub fn write(dir: &Path, text: &str) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let temp = dir.join(TEMP);
    match std::fs::remove_file(&temp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&temp)?;
    if let Err(e) = file.write_all(text.as_bytes()) {
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    drop(file);
    std::fs::rename(&temp, dir.join(FILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_whole_and_a_planted_symlink_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join(TEMP)).unwrap();
        write(dir.path(), "berth_up 1\n").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(
            std::fs::read_to_string(dir.path().join(FILE)).unwrap(),
            "berth_up 1\n"
        );
        assert!(!dir.path().join(TEMP).exists());
        // A symlink at the final name is replaced, not written through.
        std::fs::remove_file(dir.path().join(FILE)).unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join(FILE)).unwrap();
        write(dir.path(), "berth_up 0\n").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(
            std::fs::read_to_string(dir.path().join(FILE)).unwrap(),
            "berth_up 0\n"
        );
    }

    /// Until the running write is done.
    fn settle(t: &Textfile) {
        let until = Instant::now() + Duration::from_secs(10);
        while t.writing.load(Ordering::Acquire) {
            assert!(Instant::now() < until, "the write never ended");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn at_most_every_interval_and_a_failure_said_once() {
        let dir = tempfile::tempdir().unwrap();
        let shared = Shared::new(Duration::from_secs(10));
        let missing = dir.path().join("missing");
        let mut t = Textfile::new(&missing);
        let now = Instant::now();
        assert_eq!(t.tick(&shared, now), None, "the write runs on its own thread");
        settle(&t);
        let said = t.tick(&shared, now + EVERY).unwrap();
        assert!(said.contains("missing/berth.prom"), "{said}");
        settle(&t);
        assert_eq!(t.tick(&shared, now + EVERY + EVERY), None, "said once");
        std::fs::create_dir(&missing).unwrap();
        settle(&t);
        assert_eq!(t.tick(&shared, now + EVERY * 3), None);
        settle(&t);
        let text = std::fs::read_to_string(missing.join(FILE)).unwrap();
        assert!(text.contains("\nberth_workloads 0\n"), "{text}");
        std::fs::remove_file(missing.join(FILE)).unwrap();
        assert_eq!(t.tick(&shared, now + EVERY * 3 + Duration::from_secs(1)), None);
        settle(&t);
        assert!(!missing.join(FILE).exists(), "not before the interval");
        assert_eq!(t.tick(&shared, now + EVERY * 4), None);
        settle(&t);
        assert!(missing.join(FILE).exists());
        t.remove();
        assert!(!missing.join(FILE).exists(), "removed at a clean exit");
    }
}
