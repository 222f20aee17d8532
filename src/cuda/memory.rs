//! What kind of memory a pointer is, and the allocations ferroccl makes on the GPU's behalf.
//!
//! [`MemKind`] is the one description of a buffer's memory that the collective layer dispatches
//! on: host memory runs on the calling thread as before; device memory runs ordered on the
//! caller's CUDA stream.

use std::os::fd::FromRawFd;

use cudarc::driver::sys;

use super::driver::{self, check};
use crate::error::{Error, Result};

/// Where a buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    /// Memory the CPU can use directly: malloc'd, stack, ncclMemAlloc's shareable host memory,
    /// pinned host memory.
    Host,
    /// CUDA device memory (cudaMalloc, cuMem*, managed memory) of one device.
    Device { device: i32 },
}

impl MemKind {
    pub fn is_device(self) -> bool {
        matches!(self, MemKind::Device { .. })
    }
}

/// Asks the driver what `ptr` is. Pointers unknown to CUDA (and every pointer when CUDA is
/// unavailable or the thread has no context) are host memory.
pub fn classify(ptr: *const u8) -> MemKind {
    match driver::current_context() {
        Some(current) => classify_in_context(&current, ptr),
        None => MemKind::Host,
    }
}

/// [`classify`] for a caller that holds the thread's current context (so CUDA is available):
/// saves asking the driver again per buffer (a small host-buffer call classifies two, and each
/// driver call is a visible share of an 8-byte call's time on a GPU host).
pub fn classify_in_context(current: &driver::Context, ptr: *const u8) -> MemKind {
    let Some(mem_type) = memory_type_in_context(current, ptr) else {
        return MemKind::Host; // not CUDA memory: plain host memory
    };
    let mut managed: u32 = 0;
    // SAFETY: `current` shows CUDA available with a context current; IS_MANAGED writes a
    // 32-bit boolean into a live local.
    let managed_res = unsafe {
        sys::cuPointerGetAttribute(
            &mut managed as *mut u32 as *mut std::ffi::c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
            ptr as sys::CUdeviceptr,
        )
    };
    let is_managed = managed_res == sys::CUresult::CUDA_SUCCESS && managed != 0;
    if mem_type == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32 && !is_managed {
        return MemKind::Host; // pinned host memory: the CPU path serves it
    }
    let mut ordinal: i32 = -1;
    // SAFETY: as for IS_MANAGED; DEVICE_ORDINAL writes an int.
    let res = unsafe {
        sys::cuPointerGetAttribute(
            &mut ordinal as *mut i32 as *mut std::ffi::c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr as sys::CUdeviceptr,
        )
    };
    if res != sys::CUresult::CUDA_SUCCESS || ordinal < 0 {
        ordinal = driver::current_device().unwrap_or(0);
    }
    MemKind::Device { device: ordinal }
}

/// Whether CUDA knows `ptr` (device, managed or page-locked host memory, such as a buffer
/// registered with cudaHostRegister). False when no context is current in this thread.
pub fn known_to_cuda(ptr: *const u8) -> bool {
    memory_type(ptr).is_some()
}

/// The driver's memory type of `ptr` (`CUmemorytype`), or `None` when CUDA does not know it
/// (or no context is current in this thread).
fn memory_type(ptr: *const u8) -> Option<u32> {
    memory_type_in_context(&driver::current_context()?, ptr)
}

/// [`memory_type`] given the thread's current context (which proves CUDA available).
fn memory_type_in_context(_current: &driver::Context, ptr: *const u8) -> Option<u32> {
    if ptr.is_null() {
        return None;
    }
    let mut mem_type: u32 = 0;
    // SAFETY: `current` shows CUDA available with a context current; the out-pointer is a
    // live u32, the size this attribute writes.
    let res = unsafe {
        sys::cuPointerGetAttribute(
            &mut mem_type as *mut u32 as *mut std::ffi::c_void,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr as sys::CUdeviceptr,
        )
    };
    (res == sys::CUresult::CUDA_SUCCESS).then_some(mem_type)
}

/// Classic allocations ncclMemAlloc made where VMM could not be used (freed by ncclMemFree).
static CLASSIC: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

/// Device memory for ncclMemAlloc, on the calling thread's current device: exportable VMM
/// memory as NCCL makes it ([`super::vmm`]), or, where the device cannot (no VMM or no POSIX
/// descriptor handles), classic cuMemAlloc memory, which legacy CUDA IPC exports.
pub fn alloc_device(size: usize) -> Result<*mut u8> {
    let device = driver::current_device().unwrap_or(0);
    if super::vmm::supported(device) {
        match super::vmm::alloc(size, device) {
            Ok(p) => return Ok(p),
            Err(e) => log::info!(target: "ALLOC", "ncclMemAlloc: cuMem allocation failed ({e}); using cuMemAlloc"),
        }
    } else {
        log::info!(target: "ALLOC", "ncclMemAlloc: device {device} has no exportable cuMem allocations; using cuMemAlloc");
    }
    let mut dptr: sys::CUdeviceptr = 0;
    // SAFETY: callers check that a context is current; the out-pointer is a live local.
    check(unsafe { sys::cuMemAlloc_v2(&mut dptr, size.max(1)) }, "cuMemAlloc")?;
    CLASSIC.lock().unwrap_or_else(|p| p.into_inner()).push(dptr);
    Ok(dptr as *mut u8)
}

/// Frees memory from [`alloc_device`]; `Ok(false)` when `ptr` is not such memory (nothing is
/// freed then: device memory the user allocated is not ours to free).
pub fn free_device(ptr: *mut u8) -> Result<bool> {
    if super::vmm::free(ptr)? {
        return Ok(true);
    }
    let mut classic = CLASSIC.lock().unwrap_or_else(|p| p.into_inner());
    let Some(i) = classic.iter().position(|&p| p == ptr as u64) else { return Ok(false) };
    classic.swap_remove(i);
    drop(classic);
    // SAFETY: ptr came from cuMemAlloc in alloc_device and is freed once (removed above).
    check(unsafe { sys::cuMemFree_v2(ptr as sys::CUdeviceptr) }, "cuMemFree")?;
    Ok(true)
}

/// A small block of classic device memory (cuMemAlloc) for ferroccl's own use, exportable to
/// other processes with legacy CUDA IPC. Never freed: freeing device memory can wait for every
/// stream of the device, including ones that wait on the block.
pub fn alloc_internal_block(size: usize) -> Result<u64> {
    let mut dptr: sys::CUdeviceptr = 0;
    // SAFETY: callers run with a current context; the out-pointer is a live local.
    check(unsafe { sys::cuMemAlloc_v2(&mut dptr, size.max(1)) }, "cuMemAlloc")?;
    Ok(dptr)
}

/// A dma-buf file descriptor for the device range `addr..addr+len` (page-aligned), which an
/// RDMA device registers with `ibv_reg_dmabuf_mr` (GPUDirect RDMA without nvidia_peermem).
/// Fails where the driver or device cannot export dma-bufs (CUDA < 11.7, Linux < 5.12,
/// CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 0). Not run on a GPU with an HCA yet.
pub fn dmabuf_fd(addr: u64, len: usize) -> Result<std::os::fd::OwnedFd> {
    if driver::current_context().is_none() {
        return Err(Error::invalid_usage("dma-buf export of device memory needs a current CUDA context"));
    }
    let mut fd: std::ffi::c_int = -1;
    // SAFETY: a context is current; the out-pointer is a live int, the size this handle type
    // writes; the driver checks that the range is device memory it can export.
    let res = unsafe {
        sys::cuMemGetHandleForAddressRange(
            &mut fd as *mut std::ffi::c_int as *mut std::ffi::c_void,
            addr as sys::CUdeviceptr,
            len,
            sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    };
    check(res, "cuMemGetHandleForAddressRange")?;
    if fd < 0 {
        return Err(Error::internal("cuMemGetHandleForAddressRange returned no descriptor"));
    }
    // SAFETY: the driver just opened this descriptor for us; nobody else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Reads `out.len()` bytes of device memory now (synchronously, outside stream order).
pub fn read_device(src: *const u8, out: &mut [u8]) -> Result<()> {
    // SAFETY: src is device memory (the caller classified it) of at least out.len() bytes;
    // out is a live host slice.
    check(
        unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr() as *mut std::ffi::c_void, src as sys::CUdeviceptr, out.len()) },
        "cuMemcpyDtoH",
    )
}

/// Page-locked host memory that the GPU can reach (copies at full speed, and the target of
/// stream memory operations). Freed on drop.
pub struct Pinned {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: plain host memory owned by this value; no thread affinity.
unsafe impl Send for Pinned {}
// SAFETY: shared access only hands out the address; writers synchronise externally.
unsafe impl Sync for Pinned {}

impl Pinned {
    /// `len` bytes, zeroed.
    pub fn new(len: usize) -> Result<Pinned> {
        if !driver::available() {
            return Err(Error::invalid_usage("pinned host memory needs CUDA"));
        }
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // Allowed while a stream of this process is being captured (see Drop).
        let _relaxed = super::graph::RelaxedCapture::begin()?;
        // SAFETY: CUDA is available; out-pointer is a live local.
        check(unsafe { sys::cuMemHostAlloc(&mut p, len.max(1), flags) }, "cuMemHostAlloc")?;
        // SAFETY: the driver returned len bytes of writable host memory.
        unsafe { std::ptr::write_bytes(p as *mut u8, 0, len) };
        Ok(Pinned { ptr: p as *mut u8, len })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address the GPU uses for this memory (the same as the host's with unified
    /// addressing, which every supported GPU has).
    pub fn device_ptr(&self) -> Result<sys::CUdeviceptr> {
        let mut d: sys::CUdeviceptr = 0;
        // SAFETY: ptr came from cuMemHostAlloc with DEVICEMAP; out-pointer is a live local.
        let res = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, self.ptr as *mut std::ffi::c_void, 0) };
        check(res, "cuMemHostGetDevicePointer")?;
        Ok(d)
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // Pinned memory comes and goes while streams may be captured, on this thread (a staged
        // call under capture) or another (a staging pool's buffers freed with their thread):
        // in the default modes that call would invalidate the capture, so it is made in
        // relaxed mode, as NCCL does around its own allocations.
        let relaxed = super::graph::RelaxedCapture::begin();
        // SAFETY: ptr came from cuMemHostAlloc and is freed once.
        let res = unsafe { sys::cuMemFreeHost(self.ptr as *mut std::ffi::c_void) };
        match res {
            sys::CUresult::CUDA_SUCCESS => {}
            // At exit, after the application reset the device or the driver shut down: the
            // context's pinned memory went with it (nccl-tests printed one warning per
            // staging buffer here).
            sys::CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED | sys::CUresult::CUDA_ERROR_DEINITIALIZED => {
                log::debug!(target: "ALLOC", "cuMemFreeHost: {} (released with its context)", driver::describe(res))
            }
            _ => log::warn!(target: "ALLOC", "cuMemFreeHost failed: {}", driver::describe(res)),
        }
        drop(relaxed);
    }
}

/// Host memory this process mapped (for example shared with other processes) made reachable
/// by the GPU: stream memory operations and copies can target it. Unregistered on drop,
/// unless [`Registered::keep`] was called because streams may still use it.
pub struct Registered {
    ptr: *mut u8,
    dev: sys::CUdeviceptr,
    keep: bool,
}

// SAFETY: the registration is process-wide; the value only holds addresses.
unsafe impl Send for Registered {}
// SAFETY: as above.
unsafe impl Sync for Registered {}

impl Registered {
    /// Registers `len` bytes at `ptr` (page-aligned, mapped for as long as this value lives).
    ///
    /// # Safety
    /// The mapping must outlive the returned value.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Result<Registered> {
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: ptr..ptr+len is a live mapping (caller's contract).
        check(unsafe { sys::cuMemHostRegister_v2(ptr as *mut std::ffi::c_void, len, flags) }, "cuMemHostRegister")?;
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: ptr was just registered with DEVICEMAP; out-pointer is a live local.
        let res = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, ptr as *mut std::ffi::c_void, 0) };
        if let Err(e) = check(res, "cuMemHostGetDevicePointer") {
            // SAFETY: registered just above, unregistered once.
            unsafe { sys::cuMemHostUnregister(ptr as *mut std::ffi::c_void) };
            return Err(e);
        }
        Ok(Registered { ptr, dev, keep: false })
    }

    /// The GPU's address of the first byte.
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.dev
    }

    /// Never unregister (streams may still wait on this memory; unregistering could wait for
    /// them, or leave them reading unmapped pages).
    pub fn keep(&mut self) {
        self.keep = true;
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        // SAFETY: registered in new() and unregistered once.
        let res = unsafe { sys::cuMemHostUnregister(self.ptr as *mut std::ffi::c_void) };
        if res != sys::CUresult::CUDA_SUCCESS {
            log::warn!(target: "ALLOC", "cuMemHostUnregister failed: {}", driver::describe(res));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_pointers_are_host_memory() {
        let v = [1u8; 64];
        assert_eq!(classify(v.as_ptr()), MemKind::Host);
        assert_eq!(classify(std::ptr::null()), MemKind::Host);
        let x = 5u64;
        assert_eq!(classify(&x as *const u64 as *const u8), MemKind::Host);
    }
}
