//! A watchdog device, through the kernel's watchdog API
//! (Documentation/watchdog/watchdog-api.rst): opening it starts the
//! count, `WDIOC_KEEPALIVE` restarts it, and only writing the magic
//! character `V` before the close stops it. Any other close (a crash, a
//! SIGKILL, an exit) leaves it counting: the host resets unless a new
//! holder opens it in time.
//!
//! Nothing in the tests opens a real one: they share the host's kernel,
//! and a reset would take down the machine running them. They use
//! [`Fake`].

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the holder needs of a device.
pub trait Device {
    /// Restarts the count.
    fn pet(&mut self) -> io::Result<()>;
    /// The timeout the device counts now.
    fn timeout(&self) -> Duration;
    /// Stops the count and closes: no reset.
    fn close_disarmed(self) -> io::Result<()>;
    /// Starts the count again from its timeout, for hardware that may
    /// have forgotten it: a suspend to RAM powers the chipset down, and a
    /// driver without resume hooks (i6300esb) leaves it disabled after.
    fn rearm(&mut self) -> io::Result<()>;
}

/// `struct watchdog_info` of linux/watchdog.h.
#[repr(C)]
#[derive(Default)]
pub struct WatchdogInfo {
    options: u32,
    firmware_version: u32,
    identity: [u8; 32],
}

/// The device stops when closed with `V` written first.
const WDIOF_MAGICCLOSE: u32 = 0x0100;
/// It takes a timeout.
const WDIOF_SETTIMEOUT: u32 = 0x0080;

/// `WDIOC_SETOPTIONS` values.
const WDIOS_DISABLECARD: libc_int = 0x0001;
const WDIOS_ENABLECARD: libc_int = 0x0002;

nix::ioctl_read!(wdioc_getsupport, b'W', 0, WatchdogInfo);
nix::ioctl_read!(wdioc_setoptions, b'W', 4, libc_int);
nix::ioctl_read!(wdioc_keepalive, b'W', 5, libc_int);
nix::ioctl_readwrite!(wdioc_settimeout, b'W', 6, libc_int);
nix::ioctl_read!(wdioc_gettimeout, b'W', 7, libc_int);

#[allow(non_camel_case_types)]
type libc_int = nix::libc::c_int;

/// Why a device cannot be held.
#[derive(Debug)]
pub enum OpenError {
    Open(PathBuf, io::Error),
    /// It cannot be stopped by a magic close, so every close (a crash
    /// too) would stop it: it would not survive what it is for.
    NoMagicClose(PathBuf, String),
    NoTimeout(PathBuf, String),
    /// Its driver runs with nowayout: even a magic close leaves it
    /// counting, so a clean stop of its holder would reset the host.
    NoWayOut(PathBuf),
    /// It counts longer than configured: peers would start too soon.
    Longer {
        path: PathBuf,
        asked: u64,
        got: u64,
    },
    Ioctl(PathBuf, &'static str, nix::Error),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Open(p, e) => write!(f, "cannot open {}: {e}", p.display()),
            OpenError::NoMagicClose(p, id) => write!(
                f,
                "{} ({id}) stops whenever it is closed (no magic close), so a crash of its holder would disarm it",
                p.display()
            ),
            OpenError::NoTimeout(p, id) => write!(f, "{} ({id}) takes no timeout", p.display()),
            OpenError::NoWayOut(p) => write!(
                f,
                "{} has nowayout set (its driver's nowayout=1, or CONFIG_WATCHDOG_NOWAYOUT): no close can stop it, so a clean stop of berth-fence-watch would reset the host; load its driver with nowayout=0",
                p.display()
            ),
            OpenError::Longer { path, asked, got } => write!(
                f,
                "{} was asked for a timeout of {asked} s and counts {got} s: peers would take over too soon",
                path.display()
            ),
            OpenError::Ioctl(p, what, e) => write!(f, "{} on {}: {e}", what, p.display()),
        }
    }
}

/// A real device, held open.
#[derive(Debug)]
pub struct Hardware {
    file: File,
    path: PathBuf,
    timeout: Duration,
}

impl Hardware {
    /// Opens `path` (the count starts), and sets its timeout. A device
    /// that cannot be held safely is closed again at once, disarmed.
    ///
    /// `taking_over`: an earlier holder left it counting (a relaunch, a
    /// crash). Then nothing is set, and nothing stops it: setting the
    /// timeout would pet it, and that earlier holder may have stopped
    /// petting on purpose. Its timeout is read and kept.
    pub fn open(path: &Path, timeout_s: u64, taking_over: bool) -> Result<Hardware, OpenError> {
        // Asked before the open, which would start a count nothing could
        // stop again.
        if !taking_over && sysfs(path, "nowayout").is_some_and(|v| v.trim() == "1") {
            return Err(OpenError::NoWayOut(path.to_path_buf()));
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| OpenError::Open(path.to_path_buf(), e))?;
        let mut held = Hardware {
            file,
            path: path.to_path_buf(),
            timeout: Duration::from_secs(timeout_s),
        };
        if taking_over {
            let mut got: libc_int = 0;
            // SAFETY: an int the kernel writes.
            if unsafe { wdioc_gettimeout(held.file.as_raw_fd(), &mut got) }.is_ok() && got > 0 {
                held.timeout = Duration::from_secs(got as u64);
            }
            return Ok(held);
        }
        match held.configure(timeout_s) {
            Ok(()) => Ok(held),
            Err(e) => {
                // Disarmed when it can be; when it cannot (no magic
                // close), closing it stops it anyway.
                let _ = held.file.write_all(b"V");
                Err(e)
            }
        }
    }

    fn configure(&mut self, timeout_s: u64) -> Result<(), OpenError> {
        let fd = self.file.as_raw_fd();
        let path = || self.path.clone();
        let mut info = WatchdogInfo::default();
        // SAFETY: `info` is a live `struct watchdog_info` the kernel fills.
        unsafe { wdioc_getsupport(fd, &mut info) }
            .map_err(|e| OpenError::Ioctl(path(), "WDIOC_GETSUPPORT", e))?;
        let end = info.identity.iter().position(|b| *b == 0).unwrap_or(32);
        let identity = String::from_utf8_lossy(&info.identity[..end]).into_owned();
        if info.options & WDIOF_MAGICCLOSE == 0 {
            return Err(OpenError::NoMagicClose(path(), identity));
        }
        if info.options & WDIOF_SETTIMEOUT == 0 {
            return Err(OpenError::NoTimeout(path(), identity));
        }
        let mut t = timeout_s as libc_int;
        // SAFETY: an int the kernel reads and writes back.
        unsafe { wdioc_settimeout(fd, &mut t) }
            .map_err(|e| OpenError::Ioctl(path(), "WDIOC_SETTIMEOUT", e))?;
        let mut got: libc_int = 0;
        // SAFETY: an int the kernel writes.
        unsafe { wdioc_gettimeout(fd, &mut got) }
            .map_err(|e| OpenError::Ioctl(path(), "WDIOC_GETTIMEOUT", e))?;
        if got <= 0 || got as u64 > timeout_s {
            return Err(OpenError::Longer {
                path: path(),
                asked: timeout_s,
                got: got.max(0) as u64,
            });
        }
        self.timeout = Duration::from_secs(got as u64);
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Whether the kernel says the device counts now
/// (`/sys/class/watchdog/watchdogN/state`; `/dev/watchdog` is
/// watchdog0). False when it cannot tell.
pub fn counting(path: &Path) -> bool {
    sysfs(path, "state").is_some_and(|s| s.trim() == "active")
}

/// An attribute of the device in `/sys/class/watchdog` (`/dev/watchdog`
/// is watchdog0), short; `None` when it cannot be read.
fn sysfs(path: &Path, attribute: &str) -> Option<String> {
    let name = match path.file_name().and_then(|n| n.to_str()) {
        Some("watchdog") => "watchdog0",
        Some(n) => n,
        None => return None,
    };
    crate::state::cluster::read_at_most(&Path::new("/sys/class/watchdog").join(name).join(attribute), 64)
}

impl Device for Hardware {
    fn pet(&mut self) -> io::Result<()> {
        let mut dummy: libc_int = 0;
        // SAFETY: the kernel ignores the argument of WDIOC_KEEPALIVE.
        unsafe { wdioc_keepalive(self.file.as_raw_fd(), &mut dummy) }
            .map(|_| ())
            .map_err(io::Error::from)
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn close_disarmed(mut self) -> io::Result<()> {
        self.file.write_all(b"V")
    }

    fn rearm(&mut self) -> io::Result<()> {
        let fd = self.file.as_raw_fd();
        // Stopped and started again (the kernel calls the driver's stop
        // and start: the enable bit is written anew), then given its
        // timeout again, which a reset of the chipset dropped too.
        let set = |option: libc_int| {
            let mut o = option;
            // SAFETY: an int the kernel reads.
            unsafe { wdioc_setoptions(fd, &mut o) }.map(|_| ())
        };
        set(WDIOS_DISABLECARD).map_err(io::Error::from)?;
        // Stopped now: started again whatever it takes, or said plainly.
        let mut started = set(WDIOS_ENABLECARD);
        for _ in 0..3 {
            if started.is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
            started = set(WDIOS_ENABLECARD);
        }
        started.map_err(|e| io::Error::other(format!("{e}; it is stopped: nothing resets this host now")))?;
        let mut t = self.timeout.as_secs() as libc_int;
        // SAFETY: an int the kernel reads and writes back.
        unsafe { wdioc_settimeout(fd, &mut t) }.map_err(io::Error::from)?;
        if t <= 0 || t as u64 > self.timeout.as_secs() {
            return Err(io::Error::other(format!(
                "asked for a timeout of {} s, it counts {t} s",
                self.timeout.as_secs()
            )));
        }
        Ok(())
    }
}

/// What was done to a [`Fake`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Done {
    /// Petted at this time of the test's clock.
    Pet(Duration),
    ClosedDisarmed,
    Rearmed(Duration),
}

/// A device for tests: records what was done to it, stamped with the
/// test's clock.
pub struct Fake {
    pub timeout: Duration,
    pub log: std::sync::Arc<std::sync::Mutex<Vec<Done>>>,
    pub clock: Box<dyn Fn() -> Duration + Send>,
}

impl Fake {
    fn record(&self, done: Done) -> io::Result<()> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).push(done);
        Ok(())
    }
}

impl Device for Fake {
    fn pet(&mut self) -> io::Result<()> {
        self.record(Done::Pet((self.clock)()))
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn close_disarmed(self) -> io::Result<()> {
        self.record(Done::ClosedDisarmed)
    }

    fn rearm(&mut self) -> io::Result<()> {
        self.record(Done::Rearmed((self.clock)()))
    }
}
