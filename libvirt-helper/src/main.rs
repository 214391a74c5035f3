//! berth-libvirt: what berth's guest watcher (`berth guest`) asks libvirt
//! through libvirt's own API rather than virsh's text. A binary of its
//! own, so that berth does not link libvirt: a host without libvirt
//! installs berth alone.
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
//! lost. `berth-libvirt state DOMAIN` prints the state line alone. Exit status: 0 once the connection closed (the daemon went
//! away: the watcher runs it again), 1 on an error (stderr says which),
//! 2 on a usage error.

mod ffi;

use std::ffi::{CStr, CString, c_int, c_void};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

const URI: &str = "qemu:///system";
/// A ping every 5 s, 3 unanswered: a daemon that hangs closes the
/// connection after about 15 s, as one that exits does at once.
const KEEPALIVE_INTERVAL_S: c_int = 5;
const KEEPALIVE_COUNT: u32 = 3;

static CLOSED: AtomicBool = AtomicBool::new(false);

fn last_error() -> String {
    // SAFETY: libvirt returns a thread-local string, never NULL ("unknown
    // error" when there is none), valid until the next libvirt call.
    unsafe { CStr::from_ptr(ffi::virGetLastErrorMessage()) }
        .to_string_lossy()
        .into_owned()
}

/// One line, flushed: the watcher acts on each as it comes. When the
/// watcher is gone there is nobody to tell: the loop ends.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
        CLOSED.store(true, Ordering::SeqCst);
    }
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

fn follow(domain: &str) -> Result<(), String> {
    let uri = CString::new(URI).expect("no NUL in the URI");
    let name = CString::new(domain).map_err(|_| "the domain name holds a NUL byte".to_string())?;
    // SAFETY: each call is libvirt's documented use: the event loop is
    // registered before the connection opens; every pointer passed is
    // either libvirt's own or a NUL-terminated string that outlives the
    // call; the callbacks are `extern "C"` functions with libvirt's
    // signatures (the lifecycle one cast to the generic type, as
    // VIR_DOMAIN_EVENT_CALLBACK does).
    unsafe {
        if ffi::virEventRegisterDefaultImpl() < 0 {
            return Err(format!("cannot start libvirt's event loop: {}", last_error()));
        }
        let conn = ffi::virConnectOpenReadOnly(uri.as_ptr());
        if conn.is_null() {
            return Err(format!("cannot connect to {URI}: {}", last_error()));
        }
        if ffi::virConnectSetKeepAlive(conn, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT) < 0 {
            eprintln!("berth-libvirt: no keepalive on the connection: {}", last_error());
        }
        if ffi::virConnectRegisterCloseCallback(conn, on_close, std::ptr::null_mut(), None) < 0 {
            ffi::virConnectClose(conn);
            return Err(format!("cannot watch the connection: {}", last_error()));
        }
        let dom = ffi::virDomainLookupByName(conn, name.as_ptr());
        if dom.is_null() {
            let e = last_error();
            ffi::virConnectClose(conn);
            return Err(format!("no domain {domain:?}: {e}"));
        }
        let lifecycle: ffi::LifecycleCallback = on_lifecycle;
        let generic: ffi::GenericCallback =
            std::mem::transmute::<ffi::LifecycleCallback, ffi::GenericCallback>(lifecycle);
        if ffi::virConnectDomainEventRegisterAny(
            conn,
            dom,
            ffi::EVENT_ID_LIFECYCLE,
            generic,
            std::ptr::null_mut(),
            None,
        ) < 0
        {
            let e = last_error();
            ffi::virDomainFree(dom);
            ffi::virConnectClose(conn);
            return Err(format!("cannot register for {domain:?}'s events: {e}"));
        }
        let (mut state, mut reason) = (0, 0);
        if ffi::virDomainGetState(dom, &mut state, &mut reason, 0) < 0 {
            let e = last_error();
            ffi::virDomainFree(dom);
            ffi::virConnectClose(conn);
            return Err(format!("cannot read {domain:?}'s state: {e}"));
        }
        say(&format!("state {state} {reason}"));
        while !CLOSED.load(Ordering::SeqCst) {
            if ffi::virEventRunDefaultImpl() < 0 {
                let e = last_error();
                ffi::virDomainFree(dom);
                ffi::virConnectClose(conn);
                return Err(format!("libvirt's event loop failed: {e}"));
            }
        }
        ffi::virDomainFree(dom);
        ffi::virConnectClose(conn);
    }
    Ok(())
}

/// The domain's state, once: `state STATE REASON`.
fn state(domain: &str) -> Result<(), String> {
    let uri = CString::new(URI).expect("no NUL in the URI");
    let name = CString::new(domain).map_err(|_| "the domain name holds a NUL byte".to_string())?;
    let (mut state, mut reason) = (0, 0);
    // SAFETY: as in `follow`, without the event loop: a connection, a
    // lookup by name, one read, each freed once.
    unsafe {
        let conn = ffi::virConnectOpenReadOnly(uri.as_ptr());
        if conn.is_null() {
            return Err(format!("cannot connect to {URI}: {}", last_error()));
        }
        let dom = ffi::virDomainLookupByName(conn, name.as_ptr());
        if dom.is_null() {
            let e = last_error();
            ffi::virConnectClose(conn);
            return Err(format!("no domain {domain:?}: {e}"));
        }
        let read = ffi::virDomainGetState(dom, &mut state, &mut reason, 0);
        let e = last_error();
        ffi::virDomainFree(dom);
        ffi::virConnectClose(conn);
        if read < 0 {
            return Err(format!("cannot read {domain:?}'s state: {e}"));
        }
    }
    say(&format!("state {state} {reason}"));
    Ok(())
}

fn main() {
    // Not `args()`, which panics on an argument that is not UTF-8.
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let code = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["follow", domain] => match follow(domain) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("berth-libvirt: {e}");
                1
            }
        },
        ["state", domain] => match state(domain) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("berth-libvirt: {e}");
                1
            }
        },
        ["--version"] => {
            println!("berth-libvirt {}", env!("CARGO_PKG_VERSION"));
            0
        }
        _ => {
            eprintln!("usage: berth-libvirt follow DOMAIN | state DOMAIN");
            2
        }
    };
    std::process::exit(code);
}
