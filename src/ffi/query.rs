//! Queries: version, errors, communicator attributes, operators, registration.

use std::ffi::{c_char, c_int, c_void};

use super::{boundary, non_null};
use crate::comm::{self, Scalar};
use crate::error::{error_string, Error};
use crate::types::{
    ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclScalarResidence_t, ncclWindow_t, DataType,
};

/// The NCCL version code this library implements (same as the header's NCCL_VERSION_CODE).
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetVersion(version: *mut c_int) -> ncclResult_t {
    boundary("ncclGetVersion", || {
        non_null(version, "ncclGetVersion", "version")?;
        // SAFETY: checked non-null.
        unsafe { version.write(crate::version::NCCL_VERSION_CODE) };
        Ok(())
    })
}

/// NCCL's text for a result code.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetErrorString(result: ncclResult_t) -> *const c_char {
    error_string(result).as_ptr()
}

/// The last error message of the calling thread (or the process's last warning); never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetLastError(comm: ncclComm_t) -> *const c_char {
    let _ = comm;
    super::last_error()
}

/// Re-reads logging settings (deprecated in NCCL; ferroccl reads them once, so a no-op).
#[unsafe(no_mangle)]
pub extern "C" fn ncclResetDebugInit() {}

/// The communicator's asynchronous error state (ncclSuccess while healthy): ncclInProgress
/// while a non-blocking init, split or shrink is still running, then its outcome.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommGetAsyncError(comm: ncclComm_t, asyncError: *mut ncclResult_t) -> ncclResult_t {
    boundary("ncclCommGetAsyncError", || {
        let entry = comm::entry(comm, "ncclCommGetAsyncError")?;
        non_null(asyncError, "ncclCommGetAsyncError", "asyncError")?;
        let state = match entry {
            comm::Entry::Ready(c) => {
                crate::coll::one_gpu::poll_async_error(&c);
                c.async_error()
            }
            comm::Entry::Creating(creation) => creation.status(),
        };
        // SAFETY: checked non-null.
        unsafe { asyncError.write(state) };
        Ok(())
    })
}

fn query_int(
    function: &'static str,
    comm: ncclComm_t,
    out: *mut c_int,
    get: impl FnOnce(&comm::Comm) -> c_int,
) -> ncclResult_t {
    boundary(function, || {
        let c = comm::lookup(comm, function)?;
        non_null(out, function, "output")?;
        // SAFETY: checked non-null.
        unsafe { out.write(get(&c)) };
        Ok(())
    })
}

/// Number of ranks.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
    query_int("ncclCommCount", comm, count, |c| c.nranks as c_int)
}

/// The CUDA device the communicator was created on.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
    query_int("ncclCommCuDevice", comm, device, |c| c.cuda_dev)
}

/// This rank.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
    query_int("ncclCommUserRank", comm, rank, |c| c.rank as c_int)
}

/// Creates a PreMulSum operator: inputs are multiplied by `scalar` before summing.
#[unsafe(no_mangle)]
pub extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut ncclRedOp_t,
    scalar: *mut c_void,
    datatype: ncclDataType_t,
    residence: ncclScalarResidence_t,
    comm: ncclComm_t,
) -> ncclResult_t {
    boundary("ncclRedOpCreatePreMulSum", || {
        let c = comm::lookup(comm, "ncclRedOpCreatePreMulSum")?;
        non_null(op, "ncclRedOpCreatePreMulSum", "op")?;
        non_null(scalar, "ncclRedOpCreatePreMulSum", "scalar")?;
        let dtype = DataType::try_from(datatype).map_err(|e| e.context("ncclRedOpCreatePreMulSum"))?;
        let scalar = match residence.0 {
            // Read now: the caller may reuse the memory as soon as this call returns.
            1 => {
                let mut bytes = [0u8; 8];
                // SAFETY: scalar points to one element of `dtype` (at most 8 bytes).
                unsafe { std::ptr::copy_nonoverlapping(scalar as *const u8, bytes.as_mut_ptr(), dtype.size()) };
                Scalar::Immediate(bytes)
            }
            // Read each time a collective uses the operator (ncclScalarDevice semantics).
            0 => Scalar::Pointer(scalar as usize),
            other => {
                return Err(Error::invalid_argument(format!("ncclRedOpCreatePreMulSum: invalid residence {other}")))
            }
        };
        let handle = c.create_premul_sum(dtype, scalar)?;
        // SAFETY: checked non-null.
        unsafe { op.write(ncclRedOp_t(handle)) };
        Ok(())
    })
}

/// Destroys a PreMulSum operator.
#[unsafe(no_mangle)]
pub extern "C" fn ncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
    boundary("ncclRedOpDestroy", || comm::lookup(comm, "ncclRedOpDestroy")?.destroy_redop(op.0))
}

/// Registers a buffer with the communicator (host memory: bookkeeping only).
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> ncclResult_t {
    boundary("ncclCommRegister", || {
        let c = comm::lookup(comm, "ncclCommRegister")?;
        non_null(buff, "ncclCommRegister", "buff")?;
        non_null(handle, "ncclCommRegister", "handle")?;
        let h = c.register(buff as usize, size, None);
        // SAFETY: checked non-null.
        unsafe { handle.write(h as *mut c_void) };
        Ok(())
    })
}

/// Releases a registration.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
    boundary("ncclCommDeregister", || comm::lookup(comm, "ncclCommDeregister")?.deregister(handle as usize, false))
}

/// Window flags this library knows (NCCL_WIN_COLL_SYMMETRIC, NCCL_WIN_STRICT_ORDERING).
const KNOWN_WIN_FLAGS: c_int = 0x01 | 0x02;

/// Registers a buffer as a window of the communicator (bookkeeping: collectives on a window's
/// memory take the same paths as on any other buffer; there are no symmetric kernels).
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommWindowRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    win: *mut ncclWindow_t,
    winFlags: c_int,
) -> ncclResult_t {
    boundary("ncclCommWindowRegister", || {
        let c = comm::lookup(comm, "ncclCommWindowRegister")?;
        non_null(buff, "ncclCommWindowRegister", "buff")?;
        non_null(win, "ncclCommWindowRegister", "win")?;
        if size == 0 {
            return Err(Error::invalid_argument("ncclCommWindowRegister: size is 0"));
        }
        if winFlags & !KNOWN_WIN_FLAGS != 0 {
            return Err(Error::invalid_argument(format!(
                "ncclCommWindowRegister: unknown winFlags {winFlags:#x} (known: NCCL_WIN_COLL_SYMMETRIC 0x1, \
                 NCCL_WIN_STRICT_ORDERING 0x2)"
            )));
        }
        let h = c.register(buff as usize, size, Some(winFlags));
        log::info!(target: "REG", "ncclCommWindowRegister: {size} bytes at {buff:p}, flags {winFlags:#x} (collectives on it take the usual paths)");
        // SAFETY: checked non-null; the handle is opaque to the caller (never dereferenced).
        unsafe { win.write(h as ncclWindow_t) };
        Ok(())
    })
}

/// Releases a window (a null window is accepted and does nothing, as with NCCL).
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
    boundary("ncclCommWindowDeregister", || {
        let c = comm::lookup(comm, "ncclCommWindowDeregister")?;
        if win.is_null() {
            return Ok(());
        }
        c.deregister(win as usize, true)
    })
}
