//! ncclMemAlloc / ncclMemFree: page-aligned host memory (device memory once CUDA lands).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use super::{boundary, non_null};
use crate::error::Error;
use crate::types::ncclResult_t;

fn allocations() -> &'static Mutex<HashMap<usize, usize>> {
    static A: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();
    A.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Allocates `size` bytes suitable for communication buffers.
#[unsafe(no_mangle)]
pub extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
    boundary("ncclMemAlloc", || {
        non_null(ptr, "ncclMemAlloc", "ptr")?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: posix_memalign writes an aligned allocation (or nothing) into p.
        let rc = unsafe { libc::posix_memalign(&mut p, 4096, size.max(1)) };
        if rc != 0 {
            return Err(Error::system(format!("ncclMemAlloc of {size} bytes"), std::io::Error::from_raw_os_error(rc)));
        }
        allocations().lock().unwrap_or_else(|e| e.into_inner()).insert(p as usize, size);
        log::info!(target: "ALLOC", "ncclMemAlloc {size} bytes at {p:p}");
        // SAFETY: checked non-null.
        unsafe { ptr.write(p) };
        Ok(())
    })
}

/// Frees memory from ncclMemAlloc; other pointers are rejected.
#[unsafe(no_mangle)]
pub extern "C" fn ncclMemFree(ptr: *mut c_void) -> ncclResult_t {
    boundary("ncclMemFree", || {
        non_null(ptr, "ncclMemFree", "ptr")?;
        if allocations().lock().unwrap_or_else(|e| e.into_inner()).remove(&(ptr as usize)).is_none() {
            return Err(Error::invalid_argument(format!("ncclMemFree: {ptr:p} was not allocated by ncclMemAlloc")));
        }
        // SAFETY: ptr came from posix_memalign in ncclMemAlloc and is freed once.
        unsafe { libc::free(ptr) };
        Ok(())
    })
}
