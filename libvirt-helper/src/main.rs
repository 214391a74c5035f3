//! berth-libvirt: what berth's guest watcher (`berth guest`) and
//! `berth check --live` ask libvirt, through libvirt's own API rather than
//! virsh's text. A binary of its own, so that berth does not link
//! libvirt: a host without libvirt installs berth alone.
//!
//! `berth-libvirt follow DOMAIN` opens qemu:///system read-only, registers
//! for the domain's lifecycle events, then prints its state, and a line
//! per event, until the connection closes:
//!
//! ```text
//! state STATE REASON     virDomainState and its reason, numbers
//! event EVENT DETAIL     virDomainEventType and its detail, numbers
//! ```
//!
//! Registered before the state is read, so no event between the two is
//! lost. `state DOMAIN` prints the state line alone; `list` prints
//! `domain ACTIVE AUTOSTART MANAGEDSAVE NAME` (0 or 1 each) per domain,
//! persistent or running. The actions (`start`, `shutdown MODES`, `destroy`,
//! `managedsave`, `abortjob`, `resume`, `pmwakeup`) open it read-write and
//! make one call each.
//!
//! Exit status: 0 done (for `follow`, once the connection closed: the
//! daemon went away and the watcher runs it again); 1 an error, stderr
//! says which; 2 a usage error; 3 libvirt refused the action in the
//! domain's present state (a destroy of a guest that is not running).

mod ffi;

use std::ffi::{CStr, CString, c_int, c_uint, c_void};
use std::io::Write;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};

const URI: &str = "qemu:///system";
/// A ping every 5 s, 3 unanswered: a daemon that hangs closes the
/// connection after about 15 s, as one that exits does at once.
const KEEPALIVE_INTERVAL_S: c_int = 5;
const KEEPALIVE_COUNT: u32 = 3;

const EXIT_ERROR: i32 = 1;
const EXIT_USAGE: i32 = 2;
const EXIT_REFUSED: i32 = 3;

static CLOSED: AtomicBool = AtomicBool::new(false);

/// Why a call failed: what to say, and whether libvirt refused it for
/// the domain's state (the watcher tells that apart from a failure).
#[derive(Debug)]
struct Failure {
    message: String,
    refused: bool,
}

impl Failure {
    fn plain(message: String) -> Failure {
        Failure {
            message,
            refused: false,
        }
    }

    /// libvirt's last error, after `what`.
    fn libvirt(what: &str) -> Failure {
        // SAFETY: both read libvirt's thread-local last error; the message
        // is never NULL ("unknown error" when there is none) and is valid
        // until the next libvirt call, which comes after the copy.
        let (message, code) = unsafe {
            (
                CStr::from_ptr(ffi::virGetLastErrorMessage())
                    .to_string_lossy()
                    .into_owned(),
                ffi::virGetLastErrorCode(),
            )
        };
        Failure {
            message: format!("{what}: {message}"),
            refused: code == ffi::ERR_OPERATION_INVALID,
        }
    }

    fn exit_code(&self) -> i32 {
        if self.refused { EXIT_REFUSED } else { EXIT_ERROR }
    }
}

/// One line, flushed: the watcher acts on each as it comes. When the
/// watcher is gone there is nobody to tell: the loop ends.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
        CLOSED.store(true, Ordering::SeqCst);
    }
}

/// A connection to qemu:///system, closed when dropped.
struct Connection(*mut ffi::Connect);

impl Connection {
    /// Read-only for what only looks; read-write (root's, as the unit
    /// runs) for the actions.
    fn open(writable: bool) -> Result<Connection, Failure> {
        let uri = CString::new(URI).expect("no NUL in the URI");
        // SAFETY: a NUL-terminated string that outlives the call; the
        // result is NULL or a connection this value owns.
        let conn = unsafe {
            if writable {
                ffi::virConnectOpen(uri.as_ptr())
            } else {
                ffi::virConnectOpenReadOnly(uri.as_ptr())
            }
        };
        if conn.is_null() {
            return Err(Failure::libvirt(&format!("cannot connect to {URI}")));
        }
        Ok(Connection(conn))
    }

    fn domain(&self, name: &str) -> Result<Domain<'_>, Failure> {
        let c_name =
            CString::new(name).map_err(|_| Failure::plain("the domain name holds a NUL byte".into()))?;
        // SAFETY: an open connection and a NUL-terminated name; the
        // result is NULL or a reference this value owns.
        let dom = unsafe { ffi::virDomainLookupByName(self.0, c_name.as_ptr()) };
        if dom.is_null() {
            return Err(Failure::libvirt(&format!("no domain {name:?}")));
        }
        Ok(Domain(dom, PhantomData))
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // SAFETY: the connection is this value's, closed once; every
        // domain borrowed from it was freed first (their lifetimes).
        unsafe { ffi::virConnectClose(self.0) };
    }
}

/// A domain reference, freed when dropped, before its connection.
struct Domain<'c>(*mut ffi::Domain, PhantomData<&'c Connection>);

impl Drop for Domain<'_> {
    fn drop(&mut self) {
        // SAFETY: the reference is this value's, freed once.
        unsafe { ffi::virDomainFree(self.0) };
    }
}

impl Domain<'_> {
    fn state(&self) -> Result<(c_int, c_int), Failure> {
        let (mut state, mut reason) = (0, 0);
        // SAFETY: a live domain and two ints libvirt writes to.
        if unsafe { ffi::virDomainGetState(self.0, &mut state, &mut reason, 0) } < 0 {
            return Err(Failure::libvirt("cannot read its state"));
        }
        Ok((state, reason))
    }
}

/// What a request changes on a domain: one libvirt call each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Start,
    /// virDomainShutdownFlags' flags: with both, libvirt's QEMU driver
    /// tries the guest agent first and ACPI when the agent fails.
    Shutdown(c_uint),
    Destroy,
    ManagedSave,
    AbortJob,
    Resume,
    PmWakeup,
}

impl Action {
    fn call(self, dom: &Domain) -> Result<(), Failure> {
        // SAFETY: a live domain; flags libvirt documents for each call.
        let (done, what) = unsafe {
            match self {
                Action::Start => (ffi::virDomainCreate(dom.0), "start"),
                Action::Shutdown(flags) => (ffi::virDomainShutdownFlags(dom.0, flags), "shutdown"),
                Action::Destroy => (ffi::virDomainDestroy(dom.0), "destroy"),
                Action::ManagedSave => (ffi::virDomainManagedSave(dom.0, 0), "managed save"),
                Action::AbortJob => (ffi::virDomainAbortJob(dom.0), "abort of its job"),
                Action::Resume => (ffi::virDomainResume(dom.0), "resume"),
                Action::PmWakeup => (ffi::virDomainPMWakeup(dom.0, 0), "wakeup"),
            }
        };
        if done < 0 {
            return Err(Failure::libvirt(&format!("{what} failed")));
        }
        Ok(())
    }
}

/// `agent,acpi` (as `virsh shutdown --mode` and `berth guest
/// --shutdown-mode` take it) as virDomainShutdownFlags' flags.
fn shutdown_flags(modes: &str) -> Option<c_uint> {
    modes.split(',').try_fold(0, |flags, mode| match mode {
        "agent" => Some(flags | ffi::SHUTDOWN_GUEST_AGENT),
        "acpi" => Some(flags | ffi::SHUTDOWN_ACPI_POWER_BTN),
        _ => None,
    })
}

/// What the command line asks.
#[derive(Debug, PartialEq, Eq)]
enum Request<'a> {
    Follow(&'a str),
    State(&'a str),
    List,
    Act(Action, &'a str),
    Version,
}

fn request<'a>(args: &[&'a str]) -> Option<Request<'a>> {
    Some(match *args {
        ["follow", domain] => Request::Follow(domain),
        ["state", domain] => Request::State(domain),
        ["list"] => Request::List,
        ["start", domain] => Request::Act(Action::Start, domain),
        ["shutdown", domain, modes] => Request::Act(Action::Shutdown(shutdown_flags(modes)?), domain),
        ["destroy", domain] => Request::Act(Action::Destroy, domain),
        ["managedsave", domain] => Request::Act(Action::ManagedSave, domain),
        ["abortjob", domain] => Request::Act(Action::AbortJob, domain),
        ["resume", domain] => Request::Act(Action::Resume, domain),
        ["pmwakeup", domain] => Request::Act(Action::PmWakeup, domain),
        ["--version"] => Request::Version,
        _ => return None,
    })
}

unsafe extern "C" fn on_lifecycle(
    _conn: *mut ffi::Connect,
    _dom: *mut ffi::Domain,
    event: c_int,
    detail: c_int,
    _opaque: *mut c_void,
) -> c_int {
    say(&format!("event {event} {detail}"));
    0
}

unsafe extern "C" fn on_close(_conn: *mut ffi::Connect, _reason: c_int, _opaque: *mut c_void) {
    CLOSED.store(true, Ordering::SeqCst);
}

fn follow(name: &str) -> Result<(), Failure> {
    // SAFETY: libvirt's event loop is registered before the connection
    // opens, as libvirt requires.
    if unsafe { ffi::virEventRegisterDefaultImpl() } < 0 {
        return Err(Failure::libvirt("cannot start libvirt's event loop"));
    }
    let conn = Connection::open(false)?;
    // SAFETY: an open connection; the close callback is an `extern "C"`
    // function with libvirt's signature and no data.
    unsafe {
        if ffi::virConnectSetKeepAlive(conn.0, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT) < 0 {
            eprintln!(
                "berth-libvirt: {}",
                Failure::libvirt("no keepalive on the connection").message
            );
        }
        if ffi::virConnectRegisterCloseCallback(conn.0, on_close, std::ptr::null_mut(), None) < 0 {
            return Err(Failure::libvirt("cannot watch the connection"));
        }
    }
    let dom = conn.domain(name)?;
    let lifecycle: ffi::LifecycleCallback = on_lifecycle;
    // SAFETY: the lifecycle callback cast to the generic type, as
    // VIR_DOMAIN_EVENT_CALLBACK does; libvirt calls it with the lifecycle
    // signature for EVENT_ID_LIFECYCLE. It keeps no data.
    let registered = unsafe {
        let generic = std::mem::transmute::<ffi::LifecycleCallback, ffi::GenericCallback>(lifecycle);
        ffi::virConnectDomainEventRegisterAny(
            conn.0,
            dom.0,
            ffi::EVENT_ID_LIFECYCLE,
            generic,
            std::ptr::null_mut(),
            None,
        )
    };
    if registered < 0 {
        return Err(Failure::libvirt(&format!(
            "cannot register for {name:?}'s events"
        )));
    }
    let (state, reason) = dom.state()?;
    say(&format!("state {state} {reason}"));
    while !CLOSED.load(Ordering::SeqCst) {
        // SAFETY: the default event loop, registered above.
        if unsafe { ffi::virEventRunDefaultImpl() } < 0 {
            return Err(Failure::libvirt("libvirt's event loop failed"));
        }
    }
    Ok(())
}

fn state(name: &str) -> Result<(), Failure> {
    let conn = Connection::open(false)?;
    let (state, reason) = conn.domain(name)?.state()?;
    say(&format!("state {state} {reason}"));
    Ok(())
}

/// One line per domain, persistent or running; one whose flags cannot be read (it
/// was undefined in between) is said on stderr and left out.
fn list() -> Result<(), Failure> {
    let conn = Connection::open(false)?;
    let mut array: *mut *mut ffi::Domain = std::ptr::null_mut();
    // SAFETY: an open connection; libvirt allocates the array. No
    // flags: every domain.
    let count = unsafe { ffi::virConnectListAllDomains(conn.0, &mut array, 0) };
    if count < 0 {
        return Err(Failure::libvirt("cannot list the domains"));
    }
    // SAFETY: `count` domain references, each owned by its Domain from
    // here on; the array itself is freed with libc's free, as libvirt
    // documents.
    let domains: Vec<Domain> = unsafe {
        let owned = (0..count as usize)
            .map(|i| Domain(*array.add(i), PhantomData))
            .collect();
        ffi::free(array.cast());
        owned
    };
    for dom in &domains {
        // SAFETY: a live domain; the name is the domain's, valid while
        // it is, copied at once.
        let name = unsafe {
            let p = ffi::virDomainGetName(dom.0);
            if p.is_null() {
                continue;
            }
            CStr::from_ptr(p).to_string_lossy().into_owned()
        };
        if name.chars().any(char::is_control) {
            eprintln!("berth-libvirt: a domain name holds a control character: {name:?}; left out");
            continue;
        }
        let mut autostart: c_int = 0;
        // SAFETY: a live domain and an int libvirt writes to.
        let (active, autostart_read, saved) = unsafe {
            (
                ffi::virDomainIsActive(dom.0),
                ffi::virDomainGetAutostart(dom.0, &mut autostart),
                ffi::virDomainHasManagedSaveImage(dom.0, 0),
            )
        };
        if active < 0 || autostart_read < 0 || saved < 0 {
            eprintln!(
                "berth-libvirt: {}",
                Failure::libvirt(&format!("domain {name:?}")).message
            );
            continue;
        }
        say(&format!(
            "domain {} {} {} {name}",
            active,
            c_int::from(autostart != 0),
            c_int::from(saved > 0)
        ));
    }
    Ok(())
}

fn act(action: Action, name: &str) -> Result<(), Failure> {
    let conn = Connection::open(true)?;
    action.call(&conn.domain(name)?)
}

fn main() {
    // Not `args()`, which panics on an argument that is not UTF-8.
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let done = match request(&args) {
        Some(Request::Follow(domain)) => follow(domain),
        Some(Request::State(domain)) => state(domain),
        Some(Request::List) => list(),
        Some(Request::Act(action, domain)) => act(action, domain),
        Some(Request::Version) => {
            println!("berth-libvirt {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        None => {
            eprintln!(
                "usage: berth-libvirt follow|state|start|destroy|managedsave|abortjob|resume|pmwakeup DOMAIN\n       \
                 berth-libvirt shutdown DOMAIN agent,acpi\n       berth-libvirt list"
            );
            std::process::exit(EXIT_USAGE);
        }
    };
    std::process::exit(match done {
        Ok(()) => 0,
        Err(f) => {
            eprintln!("berth-libvirt: {}", f.message);
            f.exit_code()
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_as_the_watcher_makes_them() {
        use Action::*;
        for (args, want) in [
            (&["follow", "vm"][..], Some(Request::Follow("vm"))),
            (&["state", "vm"], Some(Request::State("vm"))),
            (&["list"], Some(Request::List)),
            (&["start", "vm"], Some(Request::Act(Start, "vm"))),
            (
                &["shutdown", "vm", "agent,acpi"],
                Some(Request::Act(Shutdown(3), "vm")),
            ),
            (&["shutdown", "vm", "acpi"], Some(Request::Act(Shutdown(1), "vm"))),
            (
                &["shutdown", "vm", "agent"],
                Some(Request::Act(Shutdown(2), "vm")),
            ),
            (&["destroy", "vm"], Some(Request::Act(Destroy, "vm"))),
            (&["managedsave", "vm"], Some(Request::Act(ManagedSave, "vm"))),
            (&["abortjob", "vm"], Some(Request::Act(AbortJob, "vm"))),
            (&["resume", "vm"], Some(Request::Act(Resume, "vm"))),
            (&["pmwakeup", "vm"], Some(Request::Act(PmWakeup, "vm"))),
            (&["--version"], Some(Request::Version)),
            // A mode libvirt has but berth does not ask for, or none.
            (&["shutdown", "vm", "initctl"], None),
            (&["shutdown", "vm", ""], None),
            (&["shutdown", "vm", "acpi,"], None),
            (&["shutdown", "vm"], None),
            (&["destroy"], None),
            (&["destroy", "vm", "extra"], None),
            (&["list", "vm"], None),
            (&["reboot", "vm"], None),
            (&[], None),
        ] {
            assert_eq!(request(args), want, "{args:?}");
        }
    }
}
