//! Opt-in (`FERROCCL_SHARE_HEAP=1`): large malloc'd host buffers turned into shared memory in
//! place, so that peer processes on this host reach them like ncclMemAlloc memory.
//!
//! A process rank's ordinary buffer cannot be mapped by its peers, so node collectives copy it
//! through the slots or with process_vm_readv (a copy in and a copy out that ncclMemAlloc
//! buffers avoid). With the opt-in, the first time a one-host collective of processes uses a
//! buffer of at least `FERROCCL_SHARE_HEAP_MIN` bytes that is a glibc mmapped chunk, [`share`]
//! creates a memfd, copies the chunk's pages into it and maps it over exactly the same pages
//! (`MAP_SHARED | MAP_FIXED`): the user's pointer and contents do not change, and
//! [`peer_mem::locate`] finds the range, so peers map it through `/proc/<pid>/fd` and work on
//! it in place. Thread ranks never need this (they share the address space) and never do it.
//!
//! Safety rules (each one is tested below):
//! - Only glibc mmapped chunks are promoted, found by glibc's own headers and never by the
//!   bytes before the buffer (user data may look like a header; an interior pointer has
//!   none): the kernel mapping holding the buffer must be anonymous, private and read-write
//!   (not `[heap]`, not `[stack]`; checked with the kernel's `PROCMAP_QUERY` or, on older
//!   kernels, `/proc/self/maps`), and from its start, chunk after chunk (the kernel merges
//!   neighbouring anonymous mappings), each page-aligned piece must begin with an mmapped
//!   chunk's header, `(0, length | IS_MMAPPED)` with a whole number of pages, until the one
//!   that holds the whole buffer. (posix_memalign and aligned_alloc chunks keep that header at
//!   their mapping's start, glibc writing the aligned header further on.) Headers of
//!   neighbours are read with process_vm_readv, which fails instead of faulting when another
//!   thread frees one meanwhile, and the mapping is checked again before the promotion. Such a
//!   chunk owns all of its pages: glibc writes its header page only when this chunk is freed or
//!   reallocated, so no other allocation shares the promoted range. Anything else (brk heap and
//!   arena chunks, stacks, mappings glibc did not make, small buffers, buffers CUDA knows
//!   such as cudaHostRegister'd ones) keeps the slot or copy path.
//! - Realloc: glibc grows an mmapped chunk with `mremap(MREMAP_MAYMOVE)`, which extends the
//!   shared mapping further into the file. The memfd is therefore sized (sparse, nothing
//!   allocated) at [`FILE_BYTES`], the whole 47-bit user address space, so no growth can reach
//!   past its end (SIGBUS); promotion is skipped when `RLIMIT_FSIZE` forbids that size (the
//!   kernel would send SIGXFSZ). A grown or moved range no longer matches its record and is
//!   dropped (it stays shared memory for the process, but later collectives copy it again).
//!   Were the mremap to fail, glibc falls back to malloc, copy and free.
//! - Stale records: the user may free a promoted buffer (glibc munmaps it) and the address may
//!   be reused by any new mapping. Every [`locate`] therefore re-checks that the range is still
//!   exactly one kernel mapping of that memfd: by `PROCMAP_QUERY` (range, shared, offset 0,
//!   device and inode; Linux 6.11+, about 1 us), else by the range's `/proc/self/map_files`
//!   link, which exists only for exactly one mapping of exactly that range and names the memfd,
//!   whose name holds this pid and a serial (about 4 us), else by `/proc/self/maps` (tens of
//!   microseconds and more); a record that fails is dropped and its memfd closed. At most [`MAX_SHARED`] ranges are held; each
//!   promotion first drops stale records, then refuses when the table is still full.
//! - A refused buffer (address and length) is examined again only every [`RETRY_AFTER`] calls,
//!   so a large buffer that cannot be shared costs a hash lookup per call, not a mapping query
//!   (a shareable buffer later allocated at the same address and length waits that long).
//! - Promotion copies the chunk while holding this module's lock, so two communicators of one
//!   process cannot promote the same chunk twice. If the fixed mapping fails, the private
//!   pages are restored from the memfd copy (the process aborts only if even that fails: the
//!   buffer's contents would be lost).
//!
//! Side effects, documented in the README: a `fork()` child shares the promoted pages with its
//! parent instead of copying them on write; the memory counts as shared (`Shmem`, `RssShmem`)
//! rather than anonymous; promotion briefly holds two copies of the chunk; `MADV_DONTNEED` on a
//! promoted range no longer zeroes it; the memory of a freed promoted buffer is released at the
//! next promotion or lookup that finds its record stale (and by peers when they next map a
//! buffer of this process, see `PeerMaps`).
//!
//! Not detectable here, and so the user's to avoid (README):
//! - The promotion copies the whole chunk, then replaces its pages: a write made meanwhile by
//!   another thread to any part of that allocation is lost (not only to the buffer passed: the
//!   collective may get a piece of a larger array, whose other parts threads may be filling).
//!   The allocation must be left alone by other threads during the call that first shares it.
//! - Memory that another library has registered by address keeps pointing at the old pages
//!   after a promotion (ibv_reg_mr by an MPI or UCX registration cache, mlock). The fixed
//!   mapping is a raw system call, so interposed mmap hooks (UCX's, Open MPI's memory patcher)
//!   do not see it.
//! - Allocators other than glibc's malloc (jemalloc, tcmalloc, musl) do not write glibc's
//!   headers, so their buffers are refused, unless the start of one of their mappings happens to
//!   hold the bytes of such a header.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use rustix::fs::MemfdFlags;
use rustix::mm::{MapFlags, ProtFlags};

use super::peer_mem::{self, SharedRef};

/// glibc's chunk header on 64-bit targets: `prev_size`, then size and flags, before the buffer.
const HEADER_BYTES: usize = 16;
/// glibc's flag for a chunk that is its own mmap.
const IS_MMAPPED: usize = 0x2;
/// glibc's three flag bits in the size word.
const FLAG_BITS: usize = 0x7;
/// Size of each memfd (sparse): the 47-bit user address space, larger than any size a
/// realloc's mremap can grow the mapping to.
pub const FILE_BYTES: u64 = 1 << 47;
/// Most ranges held at once (each holds a descriptor).
pub const MAX_SHARED: usize = 64;
/// Calls with a refused address and length before it is examined again.
pub const RETRY_AFTER: u32 = 64;
/// Most chunks walked through in one kernel mapping to find a buffer's.
const MAX_WALK: usize = 4096;

/// Why a buffer was not promoted.
#[derive(Debug)]
pub enum Refused {
    /// Smaller than the threshold.
    Small,
    /// The header's mapping is not anonymous, private and read-write (or is the brk heap or a
    /// stack), or does not hold the whole chunk.
    Mapping,
    /// The header is not that of a glibc mmapped chunk covering the buffer.
    NotMmappedChunk,
    /// [`MAX_SHARED`] live ranges are held.
    Full,
    /// Refused at one of the last [`RETRY_AFTER`] calls with the same address and length.
    Recently,
    /// CUDA knows the buffer (pinned with cudaHostRegister): its registration would keep
    /// pointing at the old pages.
    CudaRegistered,
    /// `RLIMIT_FSIZE` is below [`FILE_BYTES`].
    FileSizeLimit,
    /// A system call failed (the buffer is unchanged).
    System(io::Error),
}

/// One promoted range: `len` bytes mapped from offset 0 of `fd`.
struct Promoted {
    len: usize,
    fd: OwnedFd,
    ino: u64,
    dev: (u32, u32),
    serial: u64,
    /// What `/proc/self/map_files/<range>` names while the range is still this memfd's mapping:
    /// the memfd's name holds this pid and the serial, so no other file shows the same.
    link: String,
}

#[derive(Default)]
struct Registry {
    ranges: BTreeMap<usize, Promoted>,
    /// `/proc/self/maps` opened by this pid, for PROCMAP_QUERY (reopened after a fork).
    maps: Option<(u32, OwnedFd)>,
    /// PROCMAP_QUERY unsupported by this kernel (before 6.11): check with map_files.
    no_query: bool,
    /// `/proc/self/map_files` links unreadable here too: parse `/proc/self/maps` (slow).
    no_map_files: bool,
    /// Recently refused (address, length): calls left before the next examination.
    refused: std::collections::HashMap<(usize, usize), u32>,
}

/// Number of held ranges, so that [`locate`] takes no lock while nothing is promoted.
static HELD: AtomicUsize = AtomicUsize::new(0);

fn registry() -> MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(Registry::default())).lock().unwrap_or_else(|e| e.into_inner())
}

/// The promotion threshold when `FERROCCL_SHARE_HEAP=1`, else `None` (read once).
pub fn min_bytes() -> Option<usize> {
    static MIN: OnceLock<Option<usize>> = OnceLock::new();
    *MIN.get_or_init(|| {
        crate::env::get_bool("FERROCCL_SHARE_HEAP")
            .then(|| crate::env::get_bytes("FERROCCL_SHARE_HEAP_MIN").max(1) as usize)
    })
}

/// The bounds of the mapping holding `addr` when it is private anonymous memory (malloc'd,
/// stack, `[heap]`: not shared, no file), else `None`; for [`super::huge_pages`], which must
/// not change how shared or file memory is backed.
pub fn private_anonymous_mapping(addr: usize) -> Option<(usize, usize)> {
    let vma = registry().vma_at(addr)?;
    (!vma.shared && vma.inode == 0 && vma.dev == (0, 0)).then_some((vma.start, vma.end))
}

/// The promoted range holding all of `addr..addr+len`, checked to be still mapped as promoted
/// (a stale record is dropped).
pub fn locate(addr: usize, len: usize) -> Option<SharedRef> {
    if HELD.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let end = addr.checked_add(len)?;
    let mut reg = registry();
    let (&start, p) = reg.ranges.range(..=addr).next_back()?;
    if end > start + p.len {
        return None;
    }
    let (fd, serial, size) = (p.fd.as_raw_fd(), p.serial, p.len);
    if !reg.still_promoted(start) {
        reg.drop_range(start);
        return None;
    }
    Some(SharedRef { fd, serial, size: size as u64, offset: (addr - start) as u64 })
}

/// Promotes the glibc mmapped chunk that starts right before `addr` (when it qualifies, see
/// the module rules) and returns where `addr..addr+len` lies in it. Already promoted ranges
/// are returned as they are.
pub fn share(addr: usize, len: usize, min: usize) -> std::result::Result<SharedRef, Refused> {
    if len < min || len == 0 {
        return Err(Refused::Small);
    }
    if let Some(r) = locate(addr, len) {
        return Ok(r);
    }
    let mut reg = registry();
    // A buffer that cannot be shared is usually passed again and again: look at it again only
    // every RETRY_AFTER calls (the examination costs a PROCMAP_QUERY, or a read of
    // /proc/self/maps on kernels before 6.11).
    if let Some(left) = reg.refused.get_mut(&(addr, len)) {
        if *left > 0 {
            *left -= 1;
            return Err(Refused::Recently);
        }
        reg.refused.remove(&(addr, len));
    }
    let out = examine_and_promote(&mut reg, addr, len);
    if let Err(Refused::Mapping | Refused::NotMmappedChunk | Refused::CudaRegistered) = out {
        if reg.refused.len() >= MAX_SHARED {
            reg.refused.clear();
        }
        reg.refused.insert((addr, len), RETRY_AFTER);
    }
    out
}

fn examine_and_promote(reg: &mut Registry, addr: usize, len: usize) -> std::result::Result<SharedRef, Refused> {
    let page = peer_mem::page_size();
    let vma = reg.vma_at(addr).ok_or(Refused::Mapping)?;
    let private_anonymous = |v: &Vma| {
        v.read && v.write && !v.shared && v.inode == 0 && (v.name.is_empty() || v.name == "[anon: glibc: malloc]")
    };
    if !private_anonymous(&vma) {
        return Err(Refused::Mapping);
    }
    // Find the chunk by glibc's own headers, from the start of the kernel mapping (which may
    // hold several chunks: the kernel merges neighbouring anonymous mappings) from one chunk
    // to the next, never by bytes that merely sit before the buffer (user data can look like a
    // header, an interior pointer has none).
    let mut base = vma.start;
    let mut steps = 0;
    let total = loop {
        let total = mapping_at(base, page).ok_or(Refused::NotMmappedChunk)?;
        let end = base.checked_add(total).ok_or(Refused::NotMmappedChunk)?;
        if end > vma.end {
            return Err(Refused::Mapping);
        }
        if addr < end {
            break total;
        }
        base = end;
        steps += 1;
        if steps > MAX_WALK {
            return Err(Refused::NotMmappedChunk);
        }
    };
    let end = base + total;
    if addr < base + HEADER_BYTES || end < addr.saturating_add(len) {
        return Err(Refused::NotMmappedChunk);
    }
    // Still one private anonymous mapping (a neighbour may have been freed meanwhile: that is
    // why headers are read with process_vm_readv, which fails instead of faulting).
    match reg.vma_at(base) {
        Some(v) if private_anonymous(&v) && v.start <= base && end <= v.end => {}
        _ => return Err(Refused::Mapping),
    }
    if crate::cuda::memory::known_to_cuda(addr as *const u8) {
        return Err(Refused::CudaRegistered);
    }
    reg.sweep();
    if reg.ranges.len() >= MAX_SHARED {
        return Err(Refused::Full);
    }
    if !file_size_allowed() {
        return Err(Refused::FileSizeLimit);
    }
    let p = promote(base, total).map_err(Refused::System)?;
    // A fresh range must pass its own check; if map_files cannot show it (kernels before
    // 4.3 without CONFIG_CHECKPOINT_RESTORE), that check is not used.
    if reg.no_query && !reg.no_map_files && !link_names(base, total, &p.link).unwrap_or(false) {
        reg.no_map_files = true;
    }
    let r = SharedRef { fd: p.fd.as_raw_fd(), serial: p.serial, size: total as u64, offset: (addr - base) as u64 };
    log::info!(target: "SHM", "SHM: shared {total} bytes of malloc'd memory at {base:#x} with peers (FERROCCL_SHARE_HEAP)");
    reg.ranges.insert(base, p);
    HELD.store(reg.ranges.len(), Ordering::Relaxed);
    Ok(r)
}

/// The length of the glibc mmapped chunk mapping that starts at page-aligned `base`: the pair
/// `(0, length | IS_MMAPPED)` there. That is the chunk's header for malloc; for posix_memalign
/// and aligned_alloc glibc leaves it in place and writes the aligned chunk's header further on.
/// Read with process_vm_readv: another thread may unmap a neighbour's chunk at any time.
fn mapping_at(base: usize, page: usize) -> Option<usize> {
    let mut pair = [0u8; 16];
    let remote = [nix::sys::uio::RemoteIoVec { base, len: 16 }];
    let me = nix::unistd::Pid::this();
    let n = nix::sys::uio::process_vm_readv(me, &mut [std::io::IoSliceMut::new(&mut pair)], &remote).ok()?;
    let word = |i: usize| usize::from_ne_bytes(pair[i * 8..i * 8 + 8].try_into().unwrap_or_default());
    let (w0, w1) = (word(0), word(1));
    let len = w1 & !FLAG_BITS;
    (n == 16 && w0 == 0 && w1 & FLAG_BITS == IS_MMAPPED && len >= page && len % page == 0).then_some(len)
}

/// Replaces the private pages of `chunk..chunk+len` by a memfd holding the same bytes.
fn promote(chunk: usize, len: usize) -> io::Result<Promoted> {
    let serial = peer_mem::next_serial();
    let name = format!("ferroccl-heap-{}-{serial}", std::process::id());
    let fd = rustix::fs::memfd_create(name.as_str(), MemfdFlags::CLOEXEC)?;
    rustix::fs::ftruncate(&fd, FILE_BYTES)?;
    // SAFETY: chunk..chunk+len is one readable mapping (checked by the caller), which only
    // this chunk's owner uses; it is read here, not kept.
    let current = unsafe { std::slice::from_raw_parts(chunk as *const u8, len) };
    let mut done = 0;
    while done < len {
        match rustix::io::pwrite(&fd, &current[done..], done as u64) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let st = rustix::fs::fstat(&fd)?;
    // SAFETY: chunk..chunk+len is exactly the chunk's own pages (module rules); the new shared
    // mapping holds the same bytes, so the user's pointer keeps its contents.
    let mapped = unsafe {
        rustix::mm::mmap(
            chunk as *mut std::ffi::c_void,
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED | MapFlags::FIXED,
            &fd,
            0,
        )
    };
    if let Err(e) = mapped {
        restore(chunk, len, &fd);
        return Err(e.into());
    }
    Ok(Promoted {
        len,
        fd,
        ino: st.st_ino,
        dev: (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev)),
        serial,
        link: format!("/memfd:{name} (deleted)"),
    })
}

/// Puts private pages holding the memfd's copy back at `chunk` after a failed fixed mapping
/// (which may have removed the old pages).
fn restore(chunk: usize, len: usize, fd: &OwnedFd) {
    // SAFETY: the range is the chunk's own pages, whose bytes are in `fd`; they are copied back
    // right after.
    let anon = unsafe {
        rustix::mm::mmap_anonymous(
            chunk as *mut std::ffi::c_void,
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE | MapFlags::FIXED,
        )
    };
    let back = anon.is_ok() && {
        // SAFETY: the range was just mapped read-write, and nothing else uses it yet.
        let dst = unsafe { std::slice::from_raw_parts_mut(chunk as *mut u8, len) };
        let mut done = 0;
        while done < len {
            match rustix::io::pread(fd, &mut dst[done..], done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => break,
            }
        }
        done == len
    };
    if !back {
        // The user's buffer is gone and cannot be put back: continuing would compute on
        // garbage.
        log::error!("FERROCCL_SHARE_HEAP: could not restore {len} bytes at {chunk:#x}; aborting");
        std::process::abort();
    }
}

/// Whether exactly one kernel mapping covers exactly `start..start+len` and maps the file
/// whose link text is `link`; `Err` when map_files links cannot be read here.
fn link_names(start: usize, len: usize, link: &str) -> io::Result<bool> {
    let path = format!("/proc/self/map_files/{start:x}-{:x}", start + len);
    match rustix::fs::readlink(path.as_str(), Vec::new()) {
        Ok(name) => Ok(name.as_bytes() == link.as_bytes()),
        Err(rustix::io::Errno::NOENT) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn file_size_allowed() -> bool {
    let lim = rustix::process::getrlimit(rustix::process::Resource::Fsize);
    lim.current.is_none_or(|c| c >= FILE_BYTES)
}

impl Registry {
    /// Whether the range at `start` is still exactly one shared mapping of its memfd.
    /// Checked on every use, so it must be cheap: PROCMAP_QUERY (one ioctl, about 1 us) where
    /// the kernel has it, else the range's `/proc/self/map_files` link (one readlink; it
    /// exists only for exactly one kernel mapping of exactly that range, and names the memfd),
    /// else the text of `/proc/self/maps` (tens to hundreds of microseconds).
    fn still_promoted(&mut self, start: usize) -> bool {
        let Some(p) = self.ranges.get(&start) else { return false };
        let (len, ino, dev) = (p.len, p.ino, p.dev);
        if !self.no_query {
            match self.query(start) {
                Ok(v) => return v.is_some_and(|v| v.is(start, len, ino, dev)),
                Err(_) => self.no_query = true,
            }
        }
        let Some(p) = self.ranges.get(&start) else { return false };
        if !self.no_map_files {
            match link_names(start, len, &p.link) {
                Ok(same) => return same,
                Err(_) => self.no_map_files = true,
            }
        }
        vma_from_maps(&std::fs::read_to_string("/proc/self/maps").unwrap_or_default(), start)
            .is_some_and(|v| v.is(start, len, ino, dev))
    }

    fn drop_range(&mut self, start: usize) {
        if self.ranges.remove(&start).is_some() {
            log::info!(target: "SHM", "SHM: shared malloc'd range at {start:#x} is gone (freed or reallocated)");
        }
        HELD.store(self.ranges.len(), Ordering::Relaxed);
    }

    /// Drops every stale record.
    fn sweep(&mut self) {
        let starts: Vec<usize> = self.ranges.keys().copied().collect();
        for s in starts {
            if !self.still_promoted(s) {
                self.drop_range(s);
            }
        }
    }

    /// The mapping that holds `addr`.
    fn vma_at(&mut self, addr: usize) -> Option<Vma> {
        if !self.no_query {
            match self.query(addr) {
                Ok(v) => return v,
                Err(_) => self.no_query = true,
            }
        }
        vma_from_maps(&std::fs::read_to_string("/proc/self/maps").ok()?, addr)
    }

    /// PROCMAP_QUERY (Linux 6.11+): `Ok(None)` when nothing is mapped at `addr`, `Err` when the
    /// kernel lacks the call.
    fn query(&mut self, addr: usize) -> io::Result<Option<Vma>> {
        let pid = std::process::id();
        if self.maps.as_ref().is_none_or(|(p, _)| *p != pid) {
            let fd = rustix::fs::open(
                "/proc/self/maps",
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )?;
            self.maps = Some((pid, fd));
        }
        let Some((_, fd)) = &self.maps else { return Err(io::ErrorKind::NotFound.into()) };
        let mut name = [0u8; 256];
        let mut q = ProcmapQuery {
            size: std::mem::size_of::<ProcmapQuery>() as u64,
            query_addr: addr as u64,
            vma_name_size: name.len() as u32,
            vma_name_addr: name.as_mut_ptr() as u64,
            ..ProcmapQuery::default()
        };
        // SAFETY: PROCMAP_QUERY reads and writes `q` (its size is in q.size) and writes at most
        // vma_name_size bytes to `name`, both live across the call.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), PROCMAP_QUERY, &mut q as *mut ProcmapQuery) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOENT) => Ok(None),
                // A name longer than the buffer: a file path, never an anonymous mapping.
                Some(libc::ENAMETOOLONG) => self.query_unnamed(addr),
                _ => Err(e),
            };
        }
        let n = (q.vma_name_size as usize).saturating_sub(1).min(name.len());
        Ok(Some(q.vma(String::from_utf8_lossy(&name[..n]).into_owned())))
    }

    fn query_unnamed(&mut self, addr: usize) -> io::Result<Option<Vma>> {
        let Some((_, fd)) = &self.maps else { return Err(io::ErrorKind::NotFound.into()) };
        let mut q = ProcmapQuery {
            size: std::mem::size_of::<ProcmapQuery>() as u64,
            query_addr: addr as u64,
            ..Default::default()
        };
        // SAFETY: as in `query`, without a name buffer.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), PROCMAP_QUERY, &mut q as *mut ProcmapQuery) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Some(q.vma("(long name)".into())))
    }
}

impl Vma {
    /// Whether this is exactly the shared mapping of `start..start+len` from offset 0 of the
    /// file (device, inode).
    fn is(&self, start: usize, len: usize, ino: u64, dev: (u32, u32)) -> bool {
        self.start == start
            && self.end == start + len
            && self.shared
            && self.offset == 0
            && self.inode == ino
            && self.dev == dev
    }
}

/// One mapping of this process, as `/proc/self/maps` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Vma {
    start: usize,
    end: usize,
    read: bool,
    write: bool,
    shared: bool,
    offset: u64,
    dev: (u32, u32),
    inode: u64,
    name: String,
}

/// `struct procmap_query` of linux/fs.h.
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

const _: () = assert!(std::mem::size_of::<ProcmapQuery>() == 104);
/// `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: libc::c_ulong = (3 << 30) | (104 << 16) | ((b'f' as libc::c_ulong) << 8) | 17;

impl ProcmapQuery {
    fn vma(&self, name: String) -> Vma {
        Vma {
            start: self.vma_start as usize,
            end: self.vma_end as usize,
            read: self.vma_flags & 1 != 0,
            write: self.vma_flags & 2 != 0,
            shared: self.vma_flags & 8 != 0,
            offset: self.vma_offset,
            dev: (self.dev_major, self.dev_minor),
            inode: self.inode,
            name,
        }
    }
}

/// The mapping holding `addr` in the text of `/proc/self/maps`.
fn vma_from_maps(text: &str, addr: usize) -> Option<Vma> {
    text.lines().find_map(|line| {
        let mut f = line.splitn(6, ' ');
        let (range, perms, offset, dev, inode) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        let (s, e) = range.split_once('-')?;
        let (start, end) = (usize::from_str_radix(s, 16).ok()?, usize::from_str_radix(e, 16).ok()?);
        if !(start..end).contains(&addr) {
            return None;
        }
        let (maj, min) = dev.split_once(':')?;
        let p = perms.as_bytes();
        Some(Vma {
            start,
            end,
            read: p.first() == Some(&b'r'),
            write: p.get(1) == Some(&b'w'),
            shared: p.get(3) == Some(&b's'),
            offset: u64::from_str_radix(offset, 16).ok()?,
            dev: (u32::from_str_radix(maj, 16).ok()?, u32::from_str_radix(min, 16).ok()?),
            inode: inode.parse().ok()?,
            name: f.next().unwrap_or("").trim().to_string(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::peer_mem::PeerMaps;

    /// Above glibc's largest dynamic mmap threshold (32 MiB), so malloc maps it whatever other
    /// tests of this process freed before.
    const BIG: usize = 40 << 20;
    const MIN: usize = 1 << 20;

    fn pattern(n: usize, seed: u64) -> Vec<u64> {
        (0..n as u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed).collect()
    }

    fn vma(addr: usize) -> Vma {
        registry().vma_at(addr).expect("mapped")
    }

    fn held(start: usize) -> bool {
        registry().ranges.contains_key(&start)
    }

    #[test]
    fn promotion_keeps_pointer_and_contents_and_peers_see_the_same_memory() {
        let mut v = pattern(BIG / 8, 1);
        let ptr = v.as_mut_ptr() as usize;
        assert!(!vma(ptr).shared, "malloc'd memory starts private");
        let r = share(ptr, BIG, MIN).expect("a glibc mmapped chunk");
        assert_eq!(r.offset, HEADER_BYTES as u64);
        assert!(r.size as usize >= BIG + HEADER_BYTES);
        assert_eq!(v.as_ptr() as usize, ptr, "the pointer is unchanged");
        assert!(v == pattern(BIG / 8, 1), "contents survive the promotion");
        assert!(vma(ptr).shared, "the pages are now a shared mapping");
        // Found again, also for a piece inside it, and promoted once only.
        let inner = locate(ptr + 4096, 8192).expect("located");
        assert_eq!((inner.serial, inner.offset), (r.serial, 4096 + HEADER_BYTES as u64));
        assert_eq!(share(ptr, BIG, MIN).unwrap().serial, r.serial);
        assert!(locate(ptr, r.size as usize).is_none(), "runs past the chunk");
        // A peer maps it as it maps ncclMemAlloc memory (this process stands in for the peer).
        let mut maps = PeerMaps::default();
        let q = maps.resolve(std::process::id(), &r).expect("mappable through /proc");
        // SAFETY: q is the buffer's start in a second mapping of the same pages, BIG bytes long.
        unsafe {
            assert_eq!(*(q as *const u64).add(7), v[7]);
            *(q as *mut u64).add(9) = 12345;
        }
        assert_eq!(v[9], 12345, "writes through the peer's mapping land in the user's buffer");
        v[10] = 777;
        // SAFETY: as above.
        assert_eq!(unsafe { *(q as *const u64).add(10) }, 777);
        drop(v);
    }

    #[test]
    fn aligned_allocations_side_by_side_are_promoted_whole() {
        // posix_memalign'd chunks (page-aligned buffers, as the benchmark's): the header sits
        // after a page of padding minus 16 bytes; two of them usually share one kernel mapping.
        let layout = std::alloc::Layout::from_size_align(BIG, 4096).unwrap();
        // SAFETY: non-zero size; freed below with the same layout.
        let (a, b) = unsafe { (std::alloc::alloc(layout) as usize, std::alloc::alloc(layout) as usize) };
        assert!(a != 0 && b != 0 && a % 4096 == 0);
        for (p, seed) in [(a, 11u8), (b, 12)] {
            // SAFETY: BIG bytes at p, ours.
            unsafe { std::ptr::write_bytes(p as *mut u8, seed, BIG) };
        }
        let (ra, rb) = (share(a, BIG, MIN).expect("a"), share(b, BIG, MIN).expect("b"));
        assert_eq!((ra.offset, rb.offset), (4096, 4096), "the padding page is promoted with it");
        for (p, seed) in [(a, 11u8), (b, 12)] {
            // SAFETY: as above.
            let v = unsafe { std::slice::from_raw_parts(p as *const u8, BIG) };
            assert!(v.iter().all(|&x| x == seed));
            assert!(vma(p).shared && vma(p - 4096).shared);
        }
        // SAFETY: allocated above with this layout.
        unsafe { (std::alloc::dealloc(a as *mut u8, layout), std::alloc::dealloc(b as *mut u8, layout)) };
        assert!(locate(a, 1).is_none() && locate(b, 1).is_none());
    }

    #[test]
    fn freed_range_reused_by_new_memory_is_never_reported_shared() {
        let v = pattern(BIG / 8, 2);
        let ptr = v.as_ptr() as usize;
        let first = share(ptr, BIG, MIN).expect("promoted");
        let start = ptr - HEADER_BYTES;
        drop(v); // glibc munmaps the chunk
                 // The same address as a new private mapping (when no other thread took it meanwhile).
        let again = pattern(BIG / 8, 3);
        let ptr2 = again.as_ptr() as usize;
        assert!(locate(ptr2, BIG).is_none(), "new private memory is not the old shared range");
        assert!(locate(ptr, 4096).is_none(), "a freed range is not reported");
        assert!(!held(start), "the stale record was dropped");
        assert!(!vma(ptr2).shared);
        // Promoting the new buffer gives a new allocation (peers must not reuse the old map).
        let second = share(ptr2, BIG, MIN).expect("promoted");
        assert_ne!(second.serial, first.serial);
        assert!(again == pattern(BIG / 8, 3));
    }

    #[test]
    fn every_validation_method_tells_live_from_stale() {
        let v = pattern(BIG / 8, 9);
        let ptr = v.as_ptr() as usize;
        share(ptr, BIG, MIN).expect("promoted");
        let start = ptr - HEADER_BYTES;
        let (len, ino, dev, link) = {
            let reg = registry();
            let p = &reg.ranges[&start];
            (p.len, p.ino, p.dev, p.link.clone())
        };
        let by_text = || {
            let text = std::fs::read_to_string("/proc/self/maps").unwrap();
            vma_from_maps(&text, start).is_some_and(|v| v.is(start, len, ino, dev))
        };
        let by_query = || registry().query(start).map(|v| v.is_some_and(|v| v.is(start, len, ino, dev)));
        assert!(link.starts_with("/memfd:ferroccl-heap-") && link.ends_with(" (deleted)"), "{link}");
        assert!(link_names(start, len, &link).expect("map_files readable"));
        assert!(!link_names(start, len - 4096, &link).unwrap(), "another range has no such link");
        assert!(by_text());
        let queried = by_query();
        assert!(queried.as_ref().map_or(true, |&ok| ok), "{queried:?}");
        drop(v);
        let again = pattern(BIG / 8, 10); // often at the same address
        assert!(!link_names(start, len, &link).unwrap());
        assert!(!by_text());
        assert!(by_query().map_or(true, |ok| !ok));
        drop(again);
    }

    #[test]
    fn realloc_growth_and_shrink_of_a_promoted_buffer() {
        let mut v = pattern(BIG / 8, 4);
        let ptr = v.as_ptr() as usize;
        share(ptr, BIG, MIN).expect("promoted");
        // glibc grows the mmapped chunk with mremap, extending the shared mapping into the
        // memfd: every new page must be backed (a short file would SIGBUS here).
        v.reserve_exact(2 * BIG / 8);
        let grown = v.as_ptr() as usize;
        v.extend((0..2 * BIG as u64 / 8).map(|i| !i));
        assert!(v[..BIG / 8] == pattern(BIG / 8, 4)[..], "old contents kept");
        assert!(v[BIG / 8..].iter().enumerate().all(|(i, &x)| x == !(i as u64)), "new pages usable");
        // The grown range is no longer the promoted one: not reported, not promoted again
        // (it is a shared mapping now, not anonymous private memory).
        assert!(locate(grown, v.len() * 8).is_none());
        assert!(matches!(share(grown, v.len() * 8, MIN), Err(Refused::Mapping)));
        v.truncate(BIG / 16);
        v.shrink_to_fit();
        assert!(v[..] == pattern(BIG / 8, 4)[..BIG / 16]);
        drop(v);
    }

    #[test]
    fn only_large_glibc_mmapped_chunks_are_promoted() {
        let small = vec![1u8; 4096];
        assert!(matches!(share(small.as_ptr() as usize, small.len(), MIN), Err(Refused::Small)));
        assert!(share(small.as_ptr() as usize, small.len(), 1).is_err(), "brk/arena chunk");
        let big = pattern(BIG / 8, 5);
        assert!(matches!(share(big.as_ptr() as usize, BIG, BIG + 1), Err(Refused::Small)));
        // A stack buffer.
        let stack = [7u8; 64 << 10];
        assert!(share(stack.as_ptr() as usize, stack.len(), 1).is_err());
        assert!(!vma(stack.as_ptr() as usize).shared);
        // Anonymous memory that glibc did not allocate (no chunk header).
        let len = 4 << 20;
        // SAFETY: a new private mapping, unmapped below.
        let anon = unsafe {
            rustix::mm::mmap_anonymous(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::PRIVATE)
        }
        .unwrap() as usize;
        assert!(matches!(share(anon + HEADER_BYTES, MIN, 1), Err(Refused::NotMmappedChunk)));
        // Bytes that look like an mmapped chunk's header in the middle of a buffer (page
        // aligned, a smaller chunk): never taken for one; the pointer is an interior pointer of
        // the real chunk, which is promoted whole.
        let mut fake = pattern(BIG / 8, 6);
        let at = (8192 - HEADER_BYTES) / 8; // two pages past the real chunk's start
        let inner = fake.as_ptr() as usize + at * 8 + HEADER_BYTES;
        fake[at] = 0;
        fake[at + 1] = (2 << 20) | IS_MMAPPED as u64;
        let r = share(inner, MIN, 1).expect("the real chunk");
        assert_eq!(r.offset as usize, inner - (fake.as_ptr() as usize - HEADER_BYTES));
        assert!(r.size as usize >= BIG + HEADER_BYTES, "the whole real chunk, not the fake one");
        assert_eq!(fake[at + 1], (2 << 20) | IS_MMAPPED as u64);
        // Shared memory of any kind (here an ncclMemAlloc allocation) is not anonymous.
        let p = peer_mem::alloc_shared(4 << 20).unwrap();
        assert!(share(p as usize + HEADER_BYTES, MIN, 1).is_err());
        assert!(peer_mem::free_shared(p));
        // SAFETY: the mapping made above.
        unsafe { rustix::mm::munmap(anon as *mut std::ffi::c_void, len) }.unwrap();
    }

    #[test]
    fn refused_buffers_are_examined_again_only_every_retry_after_calls() {
        let len = 4 << 20;
        // SAFETY: a new private mapping (no chunk header), unmapped below.
        let anon = unsafe {
            rustix::mm::mmap_anonymous(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::PRIVATE)
        }
        .unwrap() as usize;
        let (addr, n) = (anon + 4096, 3 << 20);
        assert!(matches!(share(addr, n, 1), Err(Refused::NotMmappedChunk)));
        for _ in 0..RETRY_AFTER {
            assert!(matches!(share(addr, n, 1), Err(Refused::Recently)));
        }
        assert!(matches!(share(addr, n, 1), Err(Refused::NotMmappedChunk)), "examined again");
        assert!(matches!(share(addr, n, 1), Err(Refused::Recently)));
        // SAFETY: the mapping made above.
        unsafe { rustix::mm::munmap(anon as *mut std::ffi::c_void, len) }.unwrap();
    }

    #[test]
    fn off_by_default_leaves_buffers_private() {
        let p = crate::env::param_info("FERROCCL_SHARE_HEAP").expect("registered");
        assert_eq!(p.default, "0");
        let unset = crate::env::Snapshot::from_lookup(|_| None, &[]);
        assert!(!unset.get_bool("FERROCCL_SHARE_HEAP"));
        let v = pattern(BIG / 8, 7);
        let d = crate::transport::node_area::BufDesc::of_sharing(v.as_ptr() as *const u8, BIG, None);
        assert!(d.shared.is_none());
        assert!(!vma(v.as_ptr() as usize).shared);
        let d = crate::transport::node_area::BufDesc::of_sharing(v.as_ptr() as *const u8, BIG, Some(MIN));
        assert!(d.shared.is_some(), "and on when asked");
    }

    #[test]
    fn procmap_query_and_maps_text_agree() {
        let v = pattern(BIG / 8, 8);
        let stack = 0u64;
        let code = pattern as *const () as usize;
        for addr in [v.as_ptr() as usize, &stack as *const u64 as usize, code] {
            // Tests on other threads map and unmap memory meanwhile, and the kernel merges a
            // neighbouring anonymous mapping into ours: a query and a text read taken apart may
            // see two layouts. Both are read again until one layout shows (a few tries).
            let mut seen = Vec::new();
            for _ in 0..5 {
                let mut reg = registry();
                let q = match reg.query(addr) {
                    Ok(q) => q.expect("mapped"),
                    Err(e) => {
                        println!("PROCMAP_QUERY unsupported here ({e}); only the text parser is used");
                        return;
                    }
                };
                let text = std::fs::read_to_string("/proc/self/maps").unwrap();
                let t = vma_from_maps(&text, addr).expect("listed");
                let (qk, tk) = (
                    (q.start, q.read, q.write, q.shared, q.inode, q.dev),
                    (t.start, t.read, t.write, t.shared, t.inode, t.dev),
                );
                if qk == tk && q.name.is_empty() == t.name.is_empty() {
                    seen.clear();
                    break;
                }
                seen.push(format!("{q:?} vs {t:?}"));
            }
            assert!(seen.is_empty(), "PROCMAP_QUERY and /proc/self/maps disagree in every try: {seen:?}");
        }
        assert!(vma_from_maps("10000-20000 rw-p 00000000 00:00 0 \n", 0x1_8000).is_some_and(|v| v.write && !v.shared));
        assert!(vma_from_maps("10000-20000 rw-s 00000000 00:01 42 /memfd:x (deleted)\n", 0x2_0000).is_none());
    }
}
