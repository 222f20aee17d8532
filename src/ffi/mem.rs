//! ncclMemAlloc / ncclMemFree. In a thread with a current CUDA context (a CUDA program), device
//! memory of that context's device, as NCCL gives. Elsewhere (host-only programs, machines
//! without a GPU), page-aligned host memory that peer processes on this host can map, so
//! node-level collectives read and write it in place.

use std::ffi::c_void;

use super::{boundary, non_null};
use crate::cuda::memory;
use crate::error::Error;
use crate::transport::peer_mem;
use crate::types::ncclResult_t;

/// Allocates `size` bytes suitable for communication buffers.
#[unsafe(no_mangle)]
pub extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
    boundary("ncclMemAlloc", || {
        non_null(ptr, "ncclMemAlloc", "ptr")?;
        let p = if crate::cuda::driver::current_context().is_some() {
            let p = memory::alloc_device(size)? as *mut c_void;
            log::info!(target: "ALLOC", "ncclMemAlloc {size} bytes of device memory at {p:p}");
            p
        } else {
            let p = peer_mem::alloc_shared(size)? as *mut c_void;
            log::info!(target: "ALLOC", "ncclMemAlloc {size} bytes at {p:p}");
            p
        };
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
        if peer_mem::free_shared(ptr as *mut u8) {
            return Ok(());
        }
        if crate::cuda::driver::available() && memory::free_device(ptr as *mut u8)? {
            return Ok(());
        }
        Err(Error::invalid_argument(format!("ncclMemFree: {ptr:p} was not allocated by ncclMemAlloc")))
    })
}
