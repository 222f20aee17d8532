//! Device memory through CUDA's virtual memory management (cuMem*), as NCCL's ncclMemAlloc
//! makes it: physical memory created exportable as a POSIX file descriptor, mapped at a reserved
//! address. Other processes on the host import it from that descriptor (legacy CUDA IPC cannot
//! export such memory), which they get with `pidfd_getfd`: a duplicate of the owner's open
//! descriptor, which re-opening `/proc/<pid>/fd/<n>` would not give for a device file.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use cudarc::driver::sys;

use super::driver::{self, check};
use crate::error::{Error, Result};

/// One allocation of this process.
struct Allocation {
    size: usize,
    handle: sys::CUmemGenericAllocationHandle,
    /// Exported on first use and kept open while the allocation lives: peers duplicate it.
    fd: Option<OwnedFd>,
    /// Unique in this process (addresses are reused after a free, serials are not).
    serial: u64,
}

fn allocations() -> MutexGuard<'static, BTreeMap<u64, Allocation>> {
    static A: OnceLock<Mutex<BTreeMap<u64, Allocation>>> = OnceLock::new();
    A.get_or_init(|| Mutex::new(BTreeMap::new())).lock().unwrap_or_else(|p| p.into_inner())
}

fn prop(device: i32) -> sys::CUmemAllocationProp {
    // SAFETY: a plain-data struct for which all-zero bytes are valid (null metadata, no flags).
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p.location = sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device };
    p
}

fn attribute(device: i32, a: sys::CUdevice_attribute) -> i32 {
    let mut v = 0;
    // SAFETY: CUDA is available (callers checked); out-pointer is a live local.
    let res = unsafe { sys::cuDeviceGetAttribute(&mut v, a, device) };
    if res == sys::CUresult::CUDA_SUCCESS {
        v
    } else {
        0
    }
}

/// Whether `device` can make exportable VMM allocations.
pub fn supported(device: i32) -> bool {
    use sys::CUdevice_attribute::*;
    attribute(device, CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED) != 0
        && attribute(device, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) != 0
}

/// Rounds `size` up to a multiple of `granularity` (at least one granule).
pub fn round_up(size: usize, granularity: usize) -> usize {
    size.max(1).div_ceil(granularity) * granularity
}

/// Maps `handle` (`size` bytes) at a fresh address readable and writable by `device` and by
/// every device of this process that reaches it by peer access (as NCCL's `ncclMemAlloc`
/// does): ranks of one process on several GPUs use each other's buffers directly, and peer
/// access enabled on contexts does not cover this memory.
fn map(handle: sys::CUmemGenericAllocationHandle, size: usize, granularity: usize, device: i32) -> Result<u64> {
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: out-pointer is a live local; size and alignment are multiples of the granularity.
    check(unsafe { sys::cuMemAddressReserve(&mut ptr, size, granularity, 0, 0) }, "cuMemAddressReserve")?;
    // SAFETY: ptr..ptr+size was just reserved; handle is a live allocation of `size` bytes.
    if let Err(e) = check(unsafe { sys::cuMemMap(ptr, size, 0, handle, 0) }, "cuMemMap") {
        // SAFETY: reserved above, freed once.
        unsafe { sys::cuMemAddressFree(ptr, size) };
        return Err(e);
    }
    let desc = |id: i32| sys::CUmemAccessDesc {
        location: sys::CUmemLocation { type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id },
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    let mut access = vec![desc(device)];
    access.extend(
        (0..super::driver::device_count())
            .filter(|&other| other != device && super::driver::can_access_peer(other, device))
            .map(desc),
    );
    // SAFETY: ptr..ptr+size is mapped above; access is a live array of that many descriptors.
    if let Err(e) = check(unsafe { sys::cuMemSetAccess(ptr, size, access.as_ptr(), access.len()) }, "cuMemSetAccess") {
        // SAFETY: mapped and reserved above, undone once.
        unsafe {
            sys::cuMemUnmap(ptr, size);
            sys::cuMemAddressFree(ptr, size);
        }
        return Err(e);
    }
    Ok(ptr)
}

fn granularity(device: i32) -> Result<usize> {
    let p = prop(device);
    let mut g = 0usize;
    let flag = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED;
    // SAFETY: p is a live property struct; out-pointer is a live local.
    check(unsafe { sys::cuMemGetAllocationGranularity(&mut g, &p, flag) }, "cuMemGetAllocationGranularity")?;
    Ok(g.max(1))
}

/// `size` bytes (rounded up to the allocation granularity) of exportable device memory on
/// `device`, readable and writable there.
pub fn alloc(size: usize, device: i32) -> Result<*mut u8> {
    static SERIAL: AtomicU64 = AtomicU64::new(1);
    let g = granularity(device)?;
    let size = round_up(size, g);
    let p = prop(device);
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: p is a live property struct; out-pointer is a live local.
    check(unsafe { sys::cuMemCreate(&mut handle, size, &p, 0) }, "cuMemCreate")?;
    let ptr = match map(handle, size, g, device) {
        Ok(ptr) => ptr,
        Err(e) => {
            // SAFETY: created above, released once.
            unsafe { sys::cuMemRelease(handle) };
            return Err(e);
        }
    };
    let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
    allocations().insert(ptr, Allocation { size, handle, fd: None, serial });
    Ok(ptr as *mut u8)
}

/// Frees an allocation of [`alloc`]; `Ok(false)` when `ptr` is not one.
pub fn free(ptr: *mut u8) -> Result<bool> {
    let Some(a) = allocations().remove(&(ptr as u64)) else { return Ok(false) };
    // SAFETY: ptr/size/handle are exactly what alloc() mapped, removed from the table above, so
    // they are undone once. Peers that imported the memory keep their own references.
    unsafe {
        check(sys::cuMemUnmap(ptr as u64, a.size), "cuMemUnmap")?;
        check(sys::cuMemAddressFree(ptr as u64, a.size), "cuMemAddressFree")?;
        check(sys::cuMemRelease(a.handle), "cuMemRelease")?;
    }
    Ok(true)
}

/// How a peer finds a buffer in one of this process's allocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shareable {
    /// The owner's descriptor number (the peer duplicates it with pidfd_getfd).
    pub fd: i32,
    pub serial: u64,
    pub size: u64,
    pub offset: u64,
}

/// The allocation of [`alloc`] holding `ptr`, exported for peers (once per allocation).
pub fn shareable(ptr: *const u8) -> Result<Option<Shareable>> {
    let mut allocs = allocations();
    let Some((&base, a)) = allocs.range_mut(..=(ptr as u64)).next_back() else { return Ok(None) };
    let offset = ptr as u64 - base;
    if offset >= a.size as u64 {
        return Ok(None);
    }
    if a.fd.is_none() {
        let mut fd: i32 = -1;
        let kind = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // SAFETY: handle is a live allocation created exportable as a POSIX descriptor; the
        // driver writes an int descriptor to the out-pointer.
        let res = unsafe {
            sys::cuMemExportToShareableHandle(&mut fd as *mut i32 as *mut std::ffi::c_void, a.handle, kind, 0)
        };
        check(res, "cuMemExportToShareableHandle")?;
        // SAFETY: a fresh descriptor the driver handed to us.
        a.fd = Some(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    let fd = a.fd.as_ref().map_or(-1, |f| f.as_raw_fd());
    Ok(Some(Shareable { fd, serial: a.serial, size: a.size as u64, offset }))
}

/// Peers' allocations imported here: base address by (pid, serial).
static IMPORTED: Mutex<Option<HashMap<(u32, u64), u64>>> = Mutex::new(None);

/// The address of a peer's buffer in this process, importing its allocation once.
pub fn import(pid: u32, s: &Shareable) -> Result<*mut u8> {
    let mut imported = IMPORTED.lock().unwrap_or_else(|p| p.into_inner());
    let map = imported.get_or_insert_with(HashMap::new);
    if let Some(&base) = map.get(&(pid, s.serial)) {
        return Ok((base + s.offset) as *mut u8);
    }
    let fd = duplicate_peer_fd(pid, s.fd).map_err(|e| {
        Error::invalid_usage(format!(
            "cannot take pid {pid}'s CUDA memory descriptor ({e}); processes must belong to the same user and \
             allow ptrace access (kernel.yama.ptrace_scope)"
        ))
    })?;
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    let kind = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    // SAFETY: fd is a live descriptor of a CUDA allocation (the driver validates it); the
    // descriptor is passed by value in the pointer argument, as the API defines for POSIX fds.
    let res = unsafe {
        sys::cuMemImportFromShareableHandle(&mut handle, fd.as_raw_fd() as usize as *mut std::ffi::c_void, kind)
    };
    check(res, "cuMemImportFromShareableHandle")?;
    drop(fd); // the imported handle holds the memory now
    let device = driver::current_device().unwrap_or(0);
    let base = match map_imported(handle, s.size as usize, device) {
        Ok(b) => b,
        Err(e) => {
            // SAFETY: imported above, released once.
            unsafe { sys::cuMemRelease(handle) };
            return Err(e);
        }
    };
    log::info!(target: "P2P", "P2P/IPC: imported {} bytes of pid {pid}'s ncclMemAlloc memory", s.size);
    map.insert((pid, s.serial), base);
    Ok((base + s.offset) as *mut u8)
}

fn map_imported(handle: sys::CUmemGenericAllocationHandle, size: usize, device: i32) -> Result<u64> {
    map(handle, size, granularity(device)?, device)
}

/// A duplicate of descriptor `fd` of process `pid` (pidfd_open + pidfd_getfd).
fn duplicate_peer_fd(pid: u32, fd: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags; the result is checked.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if pidfd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that we own from here on.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    // SAFETY: pidfd_getfd takes a pidfd, a descriptor number of that process and flags; the
    // result is checked.
    let dup = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if dup < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that we own from here on.
    Ok(unsafe { OwnedFd::from_raw_fd(dup as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_up_to_whole_granules() {
        assert_eq!(round_up(0, 2 << 20), 2 << 20);
        assert_eq!(round_up(1, 2 << 20), 2 << 20);
        assert_eq!(round_up(2 << 20, 2 << 20), 2 << 20);
        assert_eq!(round_up((2 << 20) + 1, 2 << 20), 4 << 20);
    }

    #[test]
    fn unknown_pointers_are_not_vmm_allocations() {
        let x = 0u64;
        assert_eq!(shareable(&x as *const u64 as *const u8).unwrap(), None);
        assert!(!free(&x as *const u64 as *mut u8).unwrap());
    }

    #[test]
    fn a_missing_peer_descriptor_is_an_error_not_a_crash() {
        // Our own pid, a descriptor number that is not open.
        assert!(duplicate_peer_fd(std::process::id(), 1 << 20).is_err());
    }
}
