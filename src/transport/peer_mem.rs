//! Reaching another rank's memory on this host without a message.
//!
//! - [`alloc_shared`] backs ncclMemAlloc: each allocation is its own memfd mapped shared, so a
//!   peer process can map the same pages and read or write the buffer in place (the host
//!   analogue of CUDA IPC handles). [`locate`] finds the allocation behind a user pointer.
//! - [`PeerMaps`] maps such allocations of peer processes, found by the descriptor the owner
//!   publishes ([`SharedRef`]), through `/proc/<pid>/fd/<fd>`.
//! - [`read_remote`] is the fallback for any other memory: one kernel copy
//!   (`process_vm_readv`, Linux cross-memory attach).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{self, IoSliceMut};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use nix::sys::uio::RemoteIoVec;
use rustix::fs::{MemfdFlags, Mode, OFlags};
use rustix::mm::{MapFlags, ProtFlags};

use crate::error::{Error, Result};

/// One ncclMemAlloc allocation.
struct SharedAlloc {
    fd: OwnedFd,
    size: usize,
    /// Unique in this process: descriptor numbers are reused after a free, serials are not.
    serial: u64,
}

fn allocations() -> MutexGuard<'static, BTreeMap<usize, SharedAlloc>> {
    static A: OnceLock<Mutex<BTreeMap<usize, SharedAlloc>>> = OnceLock::new();
    A.get_or_init(|| Mutex::new(BTreeMap::new())).lock().unwrap_or_else(|e| e.into_inner())
}

/// Allocates `size` bytes (at least one page) of page-aligned memory that peer processes on
/// this host can map.
pub fn alloc_shared(size: usize) -> Result<*mut u8> {
    let len = size.max(1).next_multiple_of(page_size());
    let fd = rustix::fs::memfd_create(c"ferroccl-mem", MemfdFlags::CLOEXEC)
        .map_err(|e| Error::system("memfd_create for ncclMemAlloc", e.into()))?;
    rustix::fs::ftruncate(&fd, len as u64)
        .map_err(|e| Error::system(format!("ncclMemAlloc of {size} bytes"), e.into()))?;
    let base = map_fd(&fd, len).map_err(|e| Error::system(format!("ncclMemAlloc of {size} bytes"), e))?;
    let serial = next_serial();
    allocations().insert(base as usize, SharedAlloc { fd, size: len, serial });
    Ok(base)
}

/// A number no other shareable allocation of this process has had (ncclMemAlloc or promoted
/// heap memory): peers key their mappings by it.
pub(super) fn next_serial() -> u64 {
    static SERIAL: AtomicU64 = AtomicU64::new(1);
    SERIAL.fetch_add(1, Ordering::Relaxed)
}

/// Frees an allocation from [`alloc_shared`]; `false` when `ptr` is not one.
pub fn free_shared(ptr: *mut u8) -> bool {
    let Some(a) = allocations().remove(&(ptr as usize)) else { return false };
    // SAFETY: ptr/size are exactly the mapping made in alloc_shared, removed from the table
    // above, so it is unmapped once.
    let _ = unsafe { rustix::mm::munmap(ptr as *mut std::ffi::c_void, a.size) };
    true
}

/// Where a buffer lies inside an ncclMemAlloc allocation, as a peer needs to map it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedRef {
    pub fd: i32,
    pub serial: u64,
    pub size: u64,
    pub offset: u64,
}

/// The allocation holding all of `addr..addr+len`, if any: an ncclMemAlloc one, or heap
/// memory shared by [`super::share_heap`].
pub fn locate(addr: usize, len: usize) -> Option<SharedRef> {
    locate_allocation(addr, len).or_else(|| super::share_heap::locate(addr, len))
}

fn locate_allocation(addr: usize, len: usize) -> Option<SharedRef> {
    let allocs = allocations();
    let (&base, a) = allocs.range(..=addr).next_back()?;
    let end = addr.checked_add(len)?;
    (end <= base + a.size).then(|| SharedRef {
        fd: a.fd.as_raw_fd(),
        serial: a.serial,
        size: a.size as u64,
        offset: (addr - base) as u64,
    })
}

pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

fn map_fd(fd: &OwnedFd, len: usize) -> io::Result<*mut u8> {
    // SAFETY: a new shared read-write mapping (no address hint) of a file we hold, of `len`
    // bytes (the file is at least that long: created so, or checked with fstat by the caller).
    let p = unsafe {
        rustix::mm::mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, fd, 0)
    }?;
    Ok(p as *mut u8)
}

/// Opens a descriptor of another process (same user, ptrace read access), checking that
/// the file it names has at least `min_size` bytes.
pub fn open_peer_fd(pid: u32, fd: i32, min_size: u64) -> io::Result<OwnedFd> {
    let owned = rustix::fs::open(format!("/proc/{pid}/fd/{fd}"), OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())?;
    let st = rustix::fs::fstat(&owned)?;
    if (st.st_size as u64) < min_size {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/{pid}/fd/{fd} is smaller than announced"),
        ));
    }
    Ok(owned)
}

/// A peer's allocation mapped here.
struct Mapping {
    base: *mut u8,
    size: usize,
    /// The owner's descriptor number and the file's inode, to notice when the owner let go.
    fd: i32,
    ino: u64,
}

impl Mapping {
    /// Whether process `pid` still holds this file open under the same descriptor (it closes
    /// it when the memory is freed: ncclMemFree, or a shared heap buffer found freed).
    fn owner_holds(&self, pid: u32) -> bool {
        rustix::fs::stat(format!("/proc/{pid}/fd/{}", self.fd)).is_ok_and(|st| st.st_ino == self.ino)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: base/size are a mapping made by map_fd, owned by this value only.
        let _ = unsafe { rustix::mm::munmap(self.base as *mut std::ffi::c_void, self.size) };
    }
}

/// Mappings of peer processes' ncclMemAlloc allocations, made on first use. Bounded: a peer
/// that allocates and frees buffers in a loop would otherwise keep its freed memory alive here.
#[derive(Default)]
pub struct PeerMaps {
    maps: HashMap<(u32, u64), Mapping>,
    order: VecDeque<(u32, u64)>,
    /// Allocations that could not be mapped (fall back to copies; asked again never).
    refused: HashMap<(u32, u64), ()>,
}

// SAFETY: the mappings are plain shared memory; the owning communicator serialises access.
unsafe impl Send for PeerMaps {}

/// Mappings kept per communicator before the oldest is unmapped.
const MAX_PEER_MAPS: usize = 64;

impl PeerMaps {
    /// The address of `r` in process `pid`, mapped into this process, or `None` when it cannot
    /// be mapped (the caller copies through [`read_remote`] instead).
    pub fn resolve(&mut self, pid: u32, r: &SharedRef) -> Option<*mut u8> {
        let key = (pid, r.serial);
        if let Some(m) = self.maps.get(&key) {
            return (r.offset < m.size as u64).then(|| m.base.wrapping_add(r.offset as usize));
        }
        if self.refused.contains_key(&key) {
            return None;
        }
        let mapped = open_peer_fd(pid, r.fd, r.size)
            .and_then(|fd| Ok((rustix::fs::fstat(&fd)?.st_ino, map_fd(&fd, r.size as usize)?)));
        match mapped {
            Ok((ino, base)) => {
                // A new allocation of this peer: drop mappings of memory it has freed since (a
                // program that allocates and frees large buffers in a loop would otherwise keep
                // up to MAX_PEER_MAPS of them alive here).
                let maps = &mut self.maps;
                maps.retain(|k, m| k.0 != pid || m.owner_holds(pid));
                self.order.retain(|k| maps.contains_key(k));
                if self.order.len() >= MAX_PEER_MAPS {
                    if let Some(old) = self.order.pop_front() {
                        self.maps.remove(&old);
                    }
                }
                log::info!(target: "SHM", "SHM: mapped {} bytes of pid {pid}'s shareable memory (ncclMemAlloc or FERROCCL_SHARE_HEAP)", r.size);
                self.maps.insert(key, Mapping { base, size: r.size as usize, fd: r.fd, ino });
                self.order.push_back(key);
                Some(base.wrapping_add(r.offset as usize))
            }
            Err(e) => {
                log::info!(target: "SHM", "cannot map pid {pid}'s shareable memory ({e}); copying instead");
                self.refused.insert(key, ());
                None
            }
        }
    }
}

/// Bytes a staging buffer needs beyond the data it stages for [`page_matched`].
pub const PAGE_MATCH_SLACK: usize = PAGE_BYTES;
const PAGE_BYTES: usize = 4096;

/// The `len` bytes of `room` that lie at the same offset within a 4 KiB page as `addr`, the
/// other end of a kernel copy to or from them. The kernel copies user memory with `rep movsb`,
/// which AMD Zen cores run at a fifth of their speed when the destination lies 1-31 bytes past
/// the source modulo 4 KiB (256 KiB `process_vm_readv` pieces on an EPYC: 2.6 against 13.5
/// GB/s; bench/results/page-offset-2026-12-06.md). malloc puts large blocks 16 bytes into a
/// page, so a staging buffer from the heap met a page-aligned peer buffer exactly there; at the
/// source's own page offset no copy meets that window, on any CPU. `room` must hold at least
/// `len + PAGE_MATCH_SLACK - 1` bytes.
pub fn page_matched(room: &mut [u8], addr: u64, len: usize) -> &mut [u8] {
    let skip = (addr as usize).wrapping_sub(room.as_ptr() as usize) % PAGE_BYTES;
    debug_assert!(skip + len <= room.len(), "staging room of {} bytes for {len} at a page offset", room.len());
    &mut room[skip..skip + len]
}

/// Reads `out.len()` bytes at `addr` in process `pid`.
pub fn read_remote(pid: u32, addr: u64, out: &mut [u8]) -> Result<()> {
    let target = nix::unistd::Pid::from_raw(pid as i32);
    let mut done = 0;
    while done < out.len() {
        let remote = [RemoteIoVec { base: addr as usize + done, len: out.len() - done }];
        // The kernel checks the remote range; `out` is our own writable buffer.
        let n = match nix::sys::uio::process_vm_readv(target, &mut [IoSliceMut::new(&mut out[done..])], &remote) {
            Ok(0) => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            Ok(n) => Ok(n),
            Err(e) => Err(io::Error::from(e)),
        }
        .map_err(|e| Error::remote(format!("process_vm_readv from pid {pid}: {e}")))?;
        done += n;
    }
    Ok(())
}

/// How many times a memcpy's time a kernel copy of memory on 4 KiB pages may take before
/// [`small_page_kernel_copies_slow`] calls it slow: two, what passing the bytes through a slot
/// costs (a copy in and a copy out, in cache) against one kernel copy plus its work per page.
/// Measured by this function when both ranks of a 2-rank job take it at once
/// (bench/results/app-arrays-2026-12-07.md, 256 KiB): the AMD 2-core VM 2.4-4.0x (26.4-54.5
/// against 7.2-18.2 us, six processes; 4.3x in a program of its own), the 16-core Intel host
/// 1.78-1.84x (11.2-11.6 against 6.3 us, sixteen times). There slots won 2-rank all-reduces of
/// 4 KiB-page arrays at 256 KiB-2 MiB on the VM, and kernel copies did as well or better on the
/// host.
const SLOW_KERNEL_COPY_RATIO: f64 = 2.0;
/// Bytes each trial of the measurement copies (a piece of a kernel-copy all-reduce).
const PROBE_BYTES: usize = 256 << 10;
/// Trials of each copy; the fastest counts.
const PROBE_TRIALS: usize = 5;

/// Whether, on this machine, a kernel copy (process_vm_readv) of memory on 4 KiB pages takes
/// more than [`SLOW_KERNEL_COPY_RATIO`] times a memcpy of it: the kernel then spends longer
/// looking up and pinning each page than a second copy through shared memory would take.
/// Measured once per process, on first use (about a millisecond), on private memory of this
/// process (a kernel copy from a peer's costs the same); a copy that fails counts as slow.
pub fn small_page_kernel_copies_slow() -> bool {
    static SLOW: OnceLock<bool> = OnceLock::new();
    *SLOW.get_or_init(|| match measure_small_page_copies() {
        Ok((kernel, memcpy)) => {
            let slow = kernel.as_secs_f64() > SLOW_KERNEL_COPY_RATIO * memcpy.as_secs_f64();
            log::info!(
                target: "SHM",
                "SHM: a kernel copy of {} KiB on 4 KiB pages takes {:.1} us, a memcpy {:.1} us: kernel copies of such pages are {}",
                PROBE_BYTES >> 10,
                kernel.as_secs_f64() * 1e6,
                memcpy.as_secs_f64() * 1e6,
                if slow { "slow here (2-rank reductions stage them)" } else { "fast enough here" }
            );
            slow
        }
        Err(e) => {
            log::info!(target: "SHM", "SHM: kernel copies of 4 KiB pages not measured ({e}): taken as slow");
            true
        }
    })
}

/// The fastest of [`PROBE_TRIALS`] kernel copies and of as many memcpys of [`PROBE_BYTES`],
/// between two private mappings of this process held on 4 KiB pages.
fn measure_small_page_copies() -> io::Result<(std::time::Duration, std::time::Duration)> {
    struct Mapping(*mut u8, usize);
    impl Drop for Mapping {
        fn drop(&mut self) {
            // SAFETY: exactly the mapping made below, not used after this.
            let _ = unsafe { rustix::mm::munmap(self.0.cast(), self.1) };
        }
    }
    let map = || -> io::Result<Mapping> {
        // SAFETY: a new private anonymous mapping (no address hint) of PROBE_BYTES.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                PROBE_BYTES,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }?;
        let m = Mapping(p.cast(), PROBE_BYTES);
        // SAFETY: our own mapping; 4 KiB pages, as an application's array of this size has.
        unsafe { rustix::mm::madvise(p, PROBE_BYTES, rustix::mm::Advice::LinuxNoHugepage) }?;
        // SAFETY: PROBE_BYTES writable bytes of our own mapping: every page faulted in.
        unsafe { std::ptr::write_bytes(m.0, 1, PROBE_BYTES) };
        Ok(m)
    };
    let (src, dst) = (map()?, map()?);
    // SAFETY: the two mappings above, PROBE_BYTES each, alive until the end of this function.
    let (from, to) =
        unsafe { (std::slice::from_raw_parts(src.0, PROBE_BYTES), std::slice::from_raw_parts_mut(dst.0, PROBE_BYTES)) };
    let fastest = |f: &mut dyn FnMut() -> io::Result<()>| -> io::Result<std::time::Duration> {
        let mut best = std::time::Duration::MAX;
        for _ in 0..PROBE_TRIALS {
            let t = std::time::Instant::now();
            f()?;
            best = best.min(t.elapsed());
        }
        Ok(best)
    };
    // The library's own kernel-copy read, from this process.
    let kernel = fastest(&mut || {
        read_remote(std::process::id(), src.0 as u64, to).map_err(|e| io::Error::other(e.to_string()))
    })?;
    let memcpy = fastest(&mut || {
        to.copy_from_slice(std::hint::black_box(from));
        std::hint::black_box(&to[..]);
        Ok(())
    })?;
    Ok((kernel, memcpy))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The measurement behind [`small_page_kernel_copies_slow`] copies between two mappings of
    /// this process by both means and times each.
    #[test]
    fn small_page_copies_are_measured_both_ways() {
        let (kernel, memcpy) = measure_small_page_copies().expect("a kernel copy from this process");
        assert!(kernel > std::time::Duration::ZERO && memcpy > std::time::Duration::ZERO);
        assert!(kernel < std::time::Duration::from_secs(1) && memcpy < std::time::Duration::from_secs(1));
    }

    #[test]
    fn page_matched_staging_shares_the_other_end_s_page_offset() {
        let len = 10_000;
        let mut room = vec![0u8; len + PAGE_MATCH_SLACK - 1];
        let start = room.as_ptr() as usize;
        for addr in [0u64, 8, 16, 31, 32, 4080, 4095, 4096, 0x7f00_0000_1010, u64::MAX - 4095] {
            let got = page_matched(&mut room, addr, len);
            assert_eq!(got.len(), len);
            let at = got.as_ptr() as usize;
            assert_eq!(at % PAGE_BYTES, addr as usize % PAGE_BYTES, "addr {addr:#x}");
            assert!(at >= start && at + len <= start + room.len(), "addr {addr:#x} outside the room");
        }
        // A read into the matched slice lands there, whatever the room's own offset.
        let src: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let dst = page_matched(&mut room[5..], src.as_ptr() as u64, len - 5);
        read_remote(std::process::id(), src.as_ptr() as u64, dst).unwrap();
        assert_eq!(dst, &src[..len - 5]);
        assert_eq!(dst.as_ptr() as usize % PAGE_BYTES, src.as_ptr() as usize % PAGE_BYTES);
    }

    #[test]
    fn shared_allocation_is_located_mapped_again_and_freed() {
        let p = alloc_shared(10_000).unwrap();
        // SAFETY: p is a fresh allocation of at least 10 000 bytes.
        unsafe { std::ptr::write_bytes(p, 0x5a, 10_000) };
        let r = locate(p as usize + 100, 200).expect("inside the allocation");
        assert_eq!(r.offset, 100);
        assert!(locate(p as usize + 100, 1 << 20).is_none(), "runs past the end");
        // This process can map its own allocation through /proc like a peer would.
        let mut maps = PeerMaps::default();
        let q = maps.resolve(std::process::id(), &r).expect("mappable");
        // SAFETY: q points 100 bytes into a second mapping of the same pages.
        unsafe {
            assert_eq!(*q, 0x5a);
            *q = 7;
            assert_eq!(*p.add(100), 7, "both mappings show the same memory");
        }
        assert!(free_shared(p));
        assert!(!free_shared(p), "a second free is refused");
        assert!(locate(p as usize, 1).is_none());
    }

    #[test]
    fn mappings_of_freed_memory_are_dropped_when_the_owner_maps_a_new_one() {
        let mut maps = PeerMaps::default();
        let me = std::process::id();
        let a = alloc_shared(1 << 16).unwrap();
        let b = alloc_shared(1 << 16).unwrap();
        let (ra, rb) = (locate(a as usize, 1).unwrap(), locate(b as usize, 1).unwrap());
        assert!(maps.resolve(me, &ra).is_some() && maps.resolve(me, &rb).is_some());
        assert_eq!(maps.maps.len(), 2);
        assert!(free_shared(a)); // closes a's descriptor
        let c = alloc_shared(1 << 16).unwrap();
        let rc = locate(c as usize, 1).unwrap();
        assert!(maps.resolve(me, &rc).is_some());
        assert!(!maps.maps.contains_key(&(me, ra.serial)), "a is gone: its mapping too");
        assert!(maps.maps.contains_key(&(me, rb.serial)), "b is still held");
        assert_eq!(maps.order.len(), maps.maps.len());
        assert!(free_shared(b) && free_shared(c));
    }

    #[test]
    fn unknown_descriptor_is_refused_not_mapped() {
        let mut maps = PeerMaps::default();
        let bogus = SharedRef { fd: 1_000_000, serial: 9, size: 4096, offset: 0 };
        assert!(maps.resolve(std::process::id(), &bogus).is_none());
    }
}
