//! The libvirt functions berth-libvirt calls, as libvirt.h declares them
//! (libvirt 9.0 and 11.3 alike: all stable since 0.10 at the latest).

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

unsafe extern "C" {
    pub fn virEventRegisterDefaultImpl() -> c_int;
    pub fn virEventRunDefaultImpl() -> c_int;
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
    pub fn virDomainLookupByName(conn: *mut Connect, name: *const c_char) -> *mut Domain;
    pub fn virDomainGetState(dom: *mut Domain, state: *mut c_int, reason: *mut c_int, flags: c_uint)
    -> c_int;
    pub fn virDomainFree(dom: *mut Domain) -> c_int;
    pub fn virGetLastErrorMessage() -> *const c_char;
}
