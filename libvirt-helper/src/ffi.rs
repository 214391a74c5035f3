//! The libvirt functions berth-libvirt calls, as libvirt.h declares them
//! (libvirt 9.0 and 11.3 alike: all stable since 4.5 at the latest).

use std::ffi::{c_char, c_int, c_uint, c_void};

#[repr(C)]
pub struct Connect {
    _private: [u8; 0],
}
#[repr(C)]
pub struct Domain {
    _private: [u8; 0],
}

pub type LifecycleCallback = unsafe extern "C" fn(
    conn: *mut Connect,
    dom: *mut Domain,
    event: c_int,
    detail: c_int,
    opaque: *mut c_void,
) -> c_int;
pub type GenericCallback = unsafe extern "C" fn(conn: *mut Connect, dom: *mut Domain, opaque: *mut c_void);
pub type CloseCallback = unsafe extern "C" fn(conn: *mut Connect, reason: c_int, opaque: *mut c_void);
pub type FreeCallback = unsafe extern "C" fn(opaque: *mut c_void);

/// virDomainEventID: VIR_DOMAIN_EVENT_ID_LIFECYCLE.
pub const EVENT_ID_LIFECYCLE: c_int = 0;

/// virDomainShutdownFlagValues.
pub const SHUTDOWN_ACPI_POWER_BTN: c_uint = 1 << 0;
pub const SHUTDOWN_GUEST_AGENT: c_uint = 1 << 1;

/// virErrorNumber: "Requested operation is not valid", libvirt's answer
/// to an action the domain's state does not allow (destroy of a guest
/// that is not running, start of one that is).
pub const ERR_OPERATION_INVALID: c_int = 55;

unsafe extern "C" {
    pub fn virEventRegisterDefaultImpl() -> c_int;
    pub fn virEventRunDefaultImpl() -> c_int;
    pub fn virConnectOpen(name: *const c_char) -> *mut Connect;
    pub fn virConnectOpenReadOnly(name: *const c_char) -> *mut Connect;
    pub fn virConnectClose(conn: *mut Connect) -> c_int;
    pub fn virConnectSetKeepAlive(conn: *mut Connect, interval: c_int, count: c_uint) -> c_int;
    pub fn virConnectRegisterCloseCallback(
        conn: *mut Connect,
        cb: CloseCallback,
        opaque: *mut c_void,
        freecb: Option<FreeCallback>,
    ) -> c_int;
    pub fn virConnectDomainEventRegisterAny(
        conn: *mut Connect,
        dom: *mut Domain,
        event_id: c_int,
        cb: GenericCallback,
        opaque: *mut c_void,
        freecb: Option<FreeCallback>,
    ) -> c_int;
    pub fn virConnectListAllDomains(
        conn: *mut Connect,
        domains: *mut *mut *mut Domain,
        flags: c_uint,
    ) -> c_int;
    pub fn virDomainLookupByName(conn: *mut Connect, name: *const c_char) -> *mut Domain;
    pub fn virDomainGetName(dom: *mut Domain) -> *const c_char;
    pub fn virDomainGetState(dom: *mut Domain, state: *mut c_int, reason: *mut c_int, flags: c_uint)
    -> c_int;
    pub fn virDomainIsActive(dom: *mut Domain) -> c_int;
    pub fn virDomainGetAutostart(dom: *mut Domain, autostart: *mut c_int) -> c_int;
    pub fn virDomainHasManagedSaveImage(dom: *mut Domain, flags: c_uint) -> c_int;
    pub fn virDomainCreate(dom: *mut Domain) -> c_int;
    pub fn virDomainShutdownFlags(dom: *mut Domain, flags: c_uint) -> c_int;
    pub fn virDomainDestroy(dom: *mut Domain) -> c_int;
    pub fn virDomainManagedSave(dom: *mut Domain, flags: c_uint) -> c_int;
    pub fn virDomainAbortJob(dom: *mut Domain) -> c_int;
    pub fn virDomainResume(dom: *mut Domain) -> c_int;
    pub fn virDomainPMWakeup(dom: *mut Domain, flags: c_uint) -> c_int;
    pub fn virDomainFree(dom: *mut Domain) -> c_int;
    pub fn virGetLastErrorMessage() -> *const c_char;
    pub fn virGetLastErrorCode() -> c_int;
    /// libc's: virConnectListAllDomains' array is the caller's to free.
    pub fn free(ptr: *mut c_void);
}
