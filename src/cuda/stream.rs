//! Stream-ordered work on the caller's CUDA stream: copies, and the two memory operations
//! that let a host thread and a stream hand work to each other without a kernel spinning
//! (a stream writes a flag when it reaches a point; a stream waits until a flag is reached).

use cudarc::driver::sys;

use super::driver::check;
use crate::error::Result;

/// A CUDA stream as the user passed it (`cudaStream_t` and `CUstream` are the same handle;
/// NULL is the legacy default stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stream(pub usize);

impl Stream {
    pub fn from_raw(raw: *mut std::ffi::c_void) -> Stream {
        Stream(raw as usize)
    }

    fn raw(self) -> sys::CUstream {
        self.0 as sys::CUstream
    }

    /// The per-thread default stream's handle (`cudaStreamPerThread`): a different stream on
    /// every thread.
    pub const PER_THREAD: Stream = Stream(2);

    /// The context the stream belongs to (the current one for the legacy default stream's
    /// handles 0 and 1).
    pub fn context(self) -> Result<crate::cuda::driver::Context> {
        crate::cuda::driver::Context::of_stream(self)
    }

    /// Whether the stream is being captured into a CUDA graph.
    pub fn is_capturing(self) -> Result<bool> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the stream handle is the caller's (valid per the API contract); out-pointer
        // is a live local.
        check(unsafe { sys::cuStreamIsCapturing(self.raw(), &mut status) }, "cuStreamIsCapturing")?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Copies `bytes` from `src` to `dst` when the stream gets there (any direction: unified
    /// addressing tells host from device).
    ///
    /// # Safety
    /// Both ranges must stay valid until the copy has run on the stream.
    pub unsafe fn copy(self, dst: *mut u8, src: *const u8, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: the caller keeps both ranges valid until the stream has run the copy.
        check(
            unsafe { sys::cuMemcpyAsync(dst as sys::CUdeviceptr, src as sys::CUdeviceptr, bytes, self.raw()) },
            "cuMemcpyAsync",
        )
    }

    /// Writes `value` at `addr` (pinned host or device memory) when the stream gets there.
    pub fn write_flag(self, addr: sys::CUdeviceptr, value: u32) -> Result<()> {
        // SAFETY: addr is a device-visible address of memory ferroccl keeps alive for as long
        // as streams may use it (flags are never freed while a communicator lives).
        check(unsafe { sys::cuStreamWriteValue32_v2(self.raw(), addr, value, 0) }, "cuStreamWriteValue32")
    }

    /// Holds the stream until the 32-bit value at `addr` is at least `value` (wrapping
    /// comparison is the driver's: values are sequence numbers that never wrap in practice).
    pub fn wait_flag(self, addr: sys::CUdeviceptr, value: u32) -> Result<()> {
        let flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        // SAFETY: as for write_flag.
        check(unsafe { sys::cuStreamWaitValue32_v2(self.raw(), addr, value, flags) }, "cuStreamWaitValue32")
    }

    /// Holds the stream until the 32-bit value at `addr` equals `value` (flags that are set
    /// and reset: the same values every time, so that a captured graph can replay them).
    pub fn wait_flag_eq(self, addr: sys::CUdeviceptr, value: u32) -> Result<()> {
        let flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32;
        // SAFETY: as for write_flag.
        check(unsafe { sys::cuStreamWaitValue32_v2(self.raw(), addr, value, flags) }, "cuStreamWaitValue32")
    }

    /// Queues several flag operations in order with one driver call (one command batch for
    /// the GPU), or one call each under graph capture where batches cannot be captured.
    pub fn flag_ops(self, ops: &[FlagOp], capturing: bool) -> Result<()> {
        if capturing && !batch_capturable() {
            for op in ops {
                match *op {
                    FlagOp::WaitEq(addr, value) => self.wait_flag_eq(addr, value)?,
                    FlagOp::WaitGeq(addr, value) => self.wait_flag(addr, value)?,
                    FlagOp::Write(addr, value) => self.write_flag(addr, value)?,
                }
            }
            return Ok(());
        }
        let mut params: Vec<sys::CUstreamBatchMemOpParams> = ops
            .iter()
            .map(|op| {
                // SAFETY: a plain-data union for which all-zero bytes are a valid value; the
                // variant used is set in full below.
                let mut p: sys::CUstreamBatchMemOpParams = unsafe { std::mem::zeroed() };
                match *op {
                    FlagOp::WaitEq(address, value) | FlagOp::WaitGeq(address, value) => {
                        let test = if matches!(op, FlagOp::WaitEq(..)) {
                            sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ
                        } else {
                            sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ
                        };
                        p.waitValue = sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWaitValueParams_st {
                            operation: sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WAIT_VALUE_32,
                            address,
                            __bindgen_anon_1:
                                sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWaitValueParams_st__bindgen_ty_1 {
                                    value,
                                },
                            flags: test as u32,
                            alias: 0,
                        }
                    }
                    FlagOp::Write(address, value) => {
                        p.writeValue = sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st {
                            operation: sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_32,
                            address,
                            __bindgen_anon_1:
                                sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st__bindgen_ty_1 {
                                    value,
                                },
                            flags: 0,
                            alias: 0,
                        }
                    }
                }
                p
            })
            .collect();
        // The driver takes fewer than 256 operations per call.
        for chunk in params.chunks_mut(255) {
            // SAFETY: chunk is a live array of fully initialised operations on addresses ferroccl
            // keeps alive while streams use them (as for write_flag).
            let res = unsafe { sys::cuStreamBatchMemOp_v2(self.raw(), chunk.len() as u32, chunk.as_mut_ptr(), 0) };
            check(res, "cuStreamBatchMemOp")?;
        }
        Ok(())
    }

    /// Makes work queued on this stream from now on wait for `event`'s last record.
    pub fn wait_event(self, event: &Event) -> Result<()> {
        // SAFETY: the stream is the caller's, the event is live (owned by `event`).
        check(unsafe { sys::cuStreamWaitEvent(self.raw(), event.0, 0) }, "cuStreamWaitEvent")
    }

    /// A new stream of ferroccl's own in the current context, not synchronising with the
    /// legacy default stream. Never destroyed: one per worker thread, for the process's life.
    pub fn create() -> Result<Stream> {
        let mut s: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: a context is current (callers run in one); out-pointer is a live local.
        check(unsafe { sys::cuStreamCreate(&mut s, flags) }, "cuStreamCreate")?;
        Ok(Stream(s as usize))
    }

    /// Blocks until all work queued on the stream is done.
    pub fn synchronize(self) -> Result<()> {
        // SAFETY: the stream handle is the caller's.
        check(unsafe { sys::cuStreamSynchronize(self.raw()) }, "cuStreamSynchronize")
    }
}

/// [`private_stream`] from a thread that may have no current context (an abort from a
/// watchdog thread): device `dev`'s primary context is made current first when none is.
pub fn private_stream_on(dev: i32) -> Result<Stream> {
    if super::driver::current_context().is_none() {
        if let Some(ctx) = super::driver::primary_context(dev) {
            super::driver::make_current(ctx)?;
        }
    }
    private_stream()
}

/// ferroccl's own non-blocking stream of the current context (created once per context and
/// kept): for work that must not wait for, or be ordered after, the user's streams.
pub fn private_stream() -> Result<Stream> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static STREAMS: Mutex<Option<HashMap<usize, Stream>>> = Mutex::new(None);
    let ctx = super::driver::current_context()
        .ok_or_else(|| crate::error::Error::invalid_usage("no current CUDA context"))?;
    let mut streams = STREAMS.lock().unwrap_or_else(|p| p.into_inner());
    let map = streams.get_or_insert_with(HashMap::new);
    if let Some(s) = map.get(&ctx.key()) {
        return Ok(*s);
    }
    let s = Stream::create()?;
    map.insert(ctx.key(), s);
    Ok(s)
}

static BATCH_CAPTURABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Whether a command batch of stream memory operations can be captured into a CUDA graph, as
/// [`probe_batch_capture`] found (false before it ran: probing during a capture of the user's
/// would make CUDA calls that invalidate it).
pub fn batch_capturable() -> bool {
    BATCH_CAPTURABLE.get().copied().unwrap_or(false)
}

/// Finds out once, on a private stream, whether command batches can be captured. Call it with
/// the context current and outside any stream capture of this thread (communicator setup).
pub fn probe_batch_capture() {
    BATCH_CAPTURABLE.get_or_init(|| {
        let probe = || -> Result<bool> {
            let s = private_stream()?;
            let word = super::memory::Pinned::new(4)?;
            let addr = word.device_ptr()?;
            let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
            // SAFETY: s is ferroccl's stream, not capturing.
            check(unsafe { sys::cuStreamBeginCapture_v2(s.raw(), mode) }, "cuStreamBeginCapture")?;
            let batched = s.flag_ops(&[FlagOp::Write(addr, 0), FlagOp::Write(addr, 1)], false).is_ok();
            let mut graph: sys::CUgraph = std::ptr::null_mut();
            // SAFETY: capture began above; out-pointer is a live local.
            let ended = unsafe { sys::cuStreamEndCapture(s.raw(), &mut graph) };
            if !graph.is_null() {
                // SAFETY: the graph came from the capture and is not used again.
                unsafe { sys::cuGraphDestroy(graph) };
            }
            drop(word); // only after the capture ended: the graph never ran
            Ok(batched && ended == sys::CUresult::CUDA_SUCCESS)
        };
        let ok = probe().unwrap_or(false);
        log::info!(target: "INIT", "CUDA: stream memory operation batches {} be captured in graphs", if ok { "can" } else { "cannot" });
        ok
    });
}

impl Stream {
    /// Sets `count` 32-bit words at `addr` (device memory) to `value` when the stream gets there.
    pub fn fill32(self, addr: sys::CUdeviceptr, value: u32, count: usize) -> Result<()> {
        // SAFETY: addr is device memory of at least count words that ferroccl keeps alive.
        check(unsafe { sys::cuMemsetD32Async(addr, value, count, self.raw()) }, "cuMemsetD32Async")
    }
}

/// One stream memory operation on a 32-bit flag at a device-visible address.
#[derive(Clone, Copy, Debug)]
pub enum FlagOp {
    /// Hold the stream until the flag equals the value.
    WaitEq(sys::CUdeviceptr, u32),
    /// Hold the stream until the flag has reached the value in wrapping sequence order (the
    /// driver's cyclic `(int32)(flag - value) >= 0`).
    WaitGeq(sys::CUdeviceptr, u32),
    /// Write the value when the stream gets there.
    Write(sys::CUdeviceptr, u32),
}

/// A CUDA event of ferroccl's own (no timing), to order one stream after another.
pub struct Event(sys::CUevent);

// SAFETY: an event handle may be used from any thread of the process.
unsafe impl Send for Event {}
// SAFETY: as above; the driver synchronises concurrent use of a handle.
unsafe impl Sync for Event {}

impl Event {
    pub fn create() -> Result<Event> {
        let mut e: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: a context is current (callers run in one); out-pointer is a live local.
        check(unsafe { sys::cuEventCreate(&mut e, flags) }, "cuEventCreate")?;
        Ok(Event(e))
    }

    /// Whether the work it recorded has run (true also for an event never recorded).
    pub fn is_complete(&self) -> bool {
        // SAFETY: the event is live.
        unsafe { sys::cuEventQuery(self.0) == sys::CUresult::CUDA_SUCCESS }
    }

    /// Records the work queued on `stream` so far.
    pub fn record(&self, stream: Stream) -> Result<()> {
        // SAFETY: the event is live; the stream is the caller's.
        check(unsafe { sys::cuEventRecord(self.0, stream.raw()) }, "cuEventRecord")
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by cuEventCreate and destroyed once; the driver defers the release
        // until recorded work completes.
        let _ = unsafe { sys::cuEventDestroy_v2(self.0) };
    }
}
