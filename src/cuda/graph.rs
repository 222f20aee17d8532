//! What ferroccl needs of CUDA graphs while a caller's stream is being captured: the graph
//! being built, host nodes that call back into the library when a replay reaches them, objects
//! the graph owns (freed when the graph is destroyed), and allocations allowed mid-capture.

use std::ffi::c_void;

use cudarc::driver::sys;

use super::driver::check;
use super::stream::Stream;
use crate::error::{Error, Result};

/// A function the GPU's host node calls (on a CUDA thread: it must not call CUDA) with the
/// data pointer given when it was captured.
pub type HostFn = unsafe extern "C" fn(*mut c_void);

impl Stream {
    /// The capture under way on this stream: its sequence's unique id and the graph it is
    /// building. Fails when the stream is not capturing.
    pub fn capture_info(self) -> Result<(u64, sys::CUgraph)> {
        // cuStreamGetCaptureInfo_v3 came with CUDA 12.3; cudarc would panic on an older driver.
        let driver = super::driver::driver_version();
        if driver < 12030 {
            return Err(Error::invalid_usage(format!(
                "CUDA graph capture of staged operations needs a CUDA 12.3 driver or newer (this one is {}.{})",
                driver / 1000,
                (driver % 1000) / 10
            )));
        }
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut id: sys::cuuint64_t = 0;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: the stream handle is the caller's (valid per the API contract); the
        // out-pointers are live locals, and the dependency outputs are optional (null).
        let res = unsafe {
            sys::cuStreamGetCaptureInfo_v3(
                self.0 as sys::CUstream,
                &mut status,
                &mut id,
                &mut graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        check(res, "cuStreamGetCaptureInfo")?;
        match status {
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE if !graph.is_null() => {}
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED => {
                return Err(Error::invalid_usage(
                    "the stream's capture was invalidated before this call (by an earlier call that capture forbids)",
                ))
            }
            other => {
                return Err(Error::invalid_usage(format!(
                    "the stream is not being captured (capture status {other:?}, graph {graph:?})"
                )))
            }
        }
        Ok((id, graph))
    }

    /// Queues a call of `f(data)` when the stream gets there (captured: a host node that runs
    /// at every replay).
    ///
    /// # Safety
    /// `f` must be sound to call with `data` on a CUDA thread for as long as the stream or the
    /// graph may run it.
    pub unsafe fn launch_host_fn(self, f: HostFn, data: *mut c_void) -> Result<()> {
        // SAFETY: f may be called with data while the stream or graph runs (caller's contract).
        check(unsafe { sys::cuLaunchHostFunc(self.0 as sys::CUstream, Some(f), data) }, "cuLaunchHostFunc")
    }
}

/// Hands `graph` one reference to a new user object carrying `data`: when the graph (and
/// every executable made from it) is destroyed and its launched work is done, CUDA calls
/// `destroy(data)` on one of its threads. On failure the caller must keep `data` valid for
/// ever: a user object created before the failure is leaked, and CUDA does not say whether it
/// ever calls a leaked object's destructor.
///
/// # Safety
/// `graph` must be the graph of a capture under way on the calling thread's stream, and
/// `destroy(data)` sound to call once, on a CUDA thread, whenever CUDA chooses.
pub unsafe fn give_to_graph(graph: sys::CUgraph, data: *mut c_void, destroy: HostFn) -> Result<()> {
    let mut object: sys::CUuserObject = std::ptr::null_mut();
    let flags = sys::CUuserObject_flags_enum::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC as u32;
    // SAFETY: out-pointer is a live local; destroy may be called with data (caller's contract).
    check(unsafe { sys::cuUserObjectCreate(&mut object, data, Some(destroy), 1, flags) }, "cuUserObjectCreate")?;
    let moved = sys::CUuserObjectRetain_flags_enum::CU_GRAPH_USER_OBJECT_MOVE as u32;
    // SAFETY: graph is a capture's graph (caller's contract); the object's one reference
    // moves to the graph. On failure the reference stays ours and is leaked (a few bytes).
    let res = unsafe { sys::cuGraphRetainUserObject(graph, object, 1, moved) };
    check(res, "cuGraphRetainUserObject")
}

/// While alive, this thread may make calls that a capture in global or thread-local mode
/// forbids (allocating pinned memory), as NCCL does around its own allocations mid-capture.
pub struct RelaxedCapture {
    previous: sys::CUstreamCaptureMode,
}

impl RelaxedCapture {
    pub fn begin() -> Result<RelaxedCapture> {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: in/out pointer to a live local.
        check(unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }, "cuThreadExchangeStreamCaptureMode")?;
        Ok(RelaxedCapture { previous: mode })
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        let mut mode = self.previous;
        // SAFETY: as above; restores the thread's mode from before begin().
        let res = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        match res {
            sys::CUresult::CUDA_SUCCESS => {}
            // At exit, after the driver shut down (pinned buffers freed then come here).
            sys::CUresult::CUDA_ERROR_DEINITIALIZED | sys::CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED => {
                log::debug!(target: "COLL", "restoring the thread's capture mode: {}", super::driver::describe(res))
            }
            _ => log::warn!(target: "COLL", "restoring the thread's capture mode: {}", super::driver::describe(res)),
        }
    }
}
