//! The C boundary: every `extern "C"` function of nccl.h lives in this module's files.
//!
//! Each export wraps its body in `boundary`, which clears the thread's last error, catches
//! panics (a panic must never unwind into C), turns `Err` into NCCL's result codes and keeps the
//! message for `ncclGetLastError`. Bodies check pointers and enum values first, then make one
//! safe call into the library; out-parameters are written only on success.
#![allow(non_snake_case)]
// C entry points take raw pointers by design; each checks them before use.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::error::{Error, Result};
use crate::group::Progress;
use crate::types::ncclResult_t;

pub mod coll;
pub mod coverage;
pub mod encryption;
pub mod group;
pub mod init;
pub mod mem;
pub mod profiling;
pub mod query;

thread_local! {
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Runs an export's body: panics become `ncclInternalError`, errors are logged as NCCL WARN
/// lines and kept for `ncclGetLastError`.
pub(crate) fn boundary(function: &'static str, body: impl FnOnce() -> Result<()>) -> ncclResult_t {
    boundary_progress(function, || body().map(|()| Progress::Complete))
}

/// [`boundary`] for calls that may leave work running: [`Progress::InProgress`] returns
/// `ncclInProgress`, which is not an error (nothing is logged or kept).
pub(crate) fn boundary_progress(function: &'static str, body: impl FnOnce() -> Result<Progress>) -> ncclResult_t {
    crate::debug::init();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(Progress::Complete)) => ncclResult_t::ncclSuccess,
        Ok(Ok(Progress::InProgress)) => ncclResult_t::ncclInProgress,
        Ok(Err(e)) => {
            let code = e.code();
            record_error(function, &e.to_string());
            code
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            record_error(function, &format!("internal panic: {what}"));
            ncclResult_t::ncclInternalError
        }
    }
}

fn record_error(function: &str, message: &str) {
    let text = if message.starts_with(function) { message.to_string() } else { format!("{function}: {message}") };
    log::warn!(target: "INIT", "{text}");
    let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|slot| *slot.borrow_mut() = Some(c));
}

/// The calling thread's last error message, else the process's last WARN line.
pub(crate) fn last_error() -> *const std::ffi::c_char {
    thread_local! {
        static RETURNED: RefCell<CString> = RefCell::new(CString::default());
    }
    let text = LAST_ERROR
        .with(|slot| slot.borrow().clone())
        .or_else(|| crate::debug::last_warning().and_then(|w| CString::new(w).ok()))
        .unwrap_or_default();
    RETURNED.with(|slot| {
        *slot.borrow_mut() = text;
        slot.borrow().as_ptr()
    })
}

/// A required pointer argument: NULL is `ncclInvalidArgument` naming the parameter.
pub(crate) fn non_null<T>(ptr: *const T, function: &str, name: &str) -> Result<()> {
    if ptr.is_null() {
        Err(Error::invalid_argument(format!("{function}: {name} is NULL")))
    } else {
        Ok(())
    }
}

/// A C string argument that may be NULL.
///
/// # Safety
/// `ptr` must be NULL or point to a NUL-terminated string that outlives the call.
pub(crate) unsafe fn opt_cstr<'a>(ptr: *const std::ffi::c_char) -> Option<&'a CStr> {
    if ptr.is_null() {
        None
    } else {
        // SAFETY: caller guarantees a valid NUL-terminated string.
        Some(unsafe { CStr::from_ptr(ptr) })
    }
}
