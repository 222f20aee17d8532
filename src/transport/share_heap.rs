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
//! - Only glibc mmapped chunks are promoted: the 16-byte chunk header sits right before the
//!   buffer, page aligned, its `prev_size` word is 0 and its size word has exactly the
//!   `IS_MMAPPED` flag; the chunk (page-sized) covers the buffer; and the whole chunk lies in
//!   one anonymous, private, read-write mapping (not `[heap]`, not `[stack]`), checked with
//!   the kernel's `PROCMAP_QUERY` or, on older kernels, `/proc/self/maps`, before the header
//!   is read. Such a chunk owns all of its pages: glibc writes its header page only when this
//!   chunk is freed or reallocated, so no other allocation shares the promoted range. Anything
//!   else (brk heap and arena chunks, stacks, other mappings, small buffers) keeps the slot or
//!   copy path.
//! - Realloc: glibc grows an mmapped chunk with `mremap(MREMAP_MAYMOVE)`, which extends the
//!   shared mapping further into the file. The memfd is therefore sized (sparse, nothing
//!   allocated) at [`FILE_BYTES`], the whole 47-bit user address space, so no growth can reach
//!   past its end (SIGBUS); promotion is skipped when `RLIMIT_FSIZE` forbids that size (the
//!   kernel would send SIGXFSZ). A grown or moved range no longer matches its record and is
//!   dropped (it stays shared memory for the process, but later collectives copy it again).
//!   Were the mremap to fail, glibc falls back to malloc, copy and free.
//! - Stale records: the user may free a promoted buffer (glibc munmaps it) and the address may
//!   be reused by any new mapping. Every [`locate`] therefore re-checks that the range is still
//!   exactly one shared mapping of offset 0 of that memfd (device and inode); a record that
//!   fails is dropped and its memfd closed. At most [`MAX_SHARED`] ranges are held; each
//!   promotion first drops stale records, then refuses when the table is still full.
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

/// Why a buffer was not promoted.
#[derive(Debug)]
pub enum Refused {
    /// Smaller than the threshold.
    Small,
    /// No page-aligned chunk header right before the buffer.
    Unaligned,
    /// The header's mapping is not anonymous, private and read-write (or is the brk heap or a
    /// stack), or does not hold the whole chunk.
    Mapping,
    /// The header is not that of a glibc mmapped chunk covering the buffer.
    NotMmappedChunk,
    /// [`MAX_SHARED`] live ranges are held.
    Full,
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
}

#[derive(Default)]
struct Registry {
    ranges: BTreeMap<usize, Promoted>,
    /// `/proc/self/maps` opened by this pid, for PROCMAP_QUERY (reopened after a fork).
    maps: Option<(u32, OwnedFd)>,
    /// PROCMAP_QUERY unsupported by this kernel: parse the text instead.
    no_query: bool,
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
    let page = page_size();
    let chunk = addr.checked_sub(HEADER_BYTES).ok_or(Refused::Unaligned)?;
    if chunk % page != 0 {
        return Err(Refused::Unaligned);
    }
    let mut reg = registry();
    let vma = reg.vma_at(chunk).ok_or(Refused::Mapping)?;
    let anonymous = vma.inode == 0 && (vma.name.is_empty() || vma.name == "[anon: glibc: malloc]");
    if !(vma.read && vma.write && !vma.shared && anonymous) {
        return Err(Refused::Mapping);
    }
    // SAFETY: chunk..chunk+16 lies in a readable mapping (checked just above; the mapping
    // starts at or before the page-aligned chunk and ends at a page boundary after it).
    let (prev_size, size_word) = unsafe {
        (std::ptr::read_volatile(chunk as *const usize), std::ptr::read_volatile((chunk + 8) as *const usize))
    };
    let chunk_len = size_word & !FLAG_BITS;
    let chunk_end = chunk.checked_add(chunk_len).ok_or(Refused::NotMmappedChunk)?;
    if prev_size != 0 || size_word & FLAG_BITS != IS_MMAPPED || chunk_len % page != 0 || chunk_end < addr.saturating_add(len) {
        return Err(Refused::NotMmappedChunk);
    }
    if chunk_end > vma.end {
        return Err(Refused::Mapping);
    }
    reg.sweep();
    if reg.ranges.len() >= MAX_SHARED {
        return Err(Refused::Full);
    }
    if !file_size_allowed() {
        return Err(Refused::FileSizeLimit);
    }
    let p = promote(chunk, chunk_len).map_err(Refused::System)?;
    let r = SharedRef { fd: p.fd.as_raw_fd(), serial: p.serial, size: chunk_len as u64, offset: HEADER_BYTES as u64 };
    log::info!(target: "SHM", "SHM: shared {chunk_len} bytes of malloc'd memory at {chunk:#x} with peers (FERROCCL_SHARE_HEAP)");
    reg.ranges.insert(chunk, p);
    HELD.store(reg.ranges.len(), Ordering::Relaxed);
    Ok(r)
}

/// Replaces the private pages of `chunk..chunk+len` by a memfd holding the same bytes.
fn promote(chunk: usize, len: usize) -> io::Result<Promoted> {
    let fd = rustix::fs::memfd_create(c"ferroccl-heap", MemfdFlags::CLOEXEC)?;
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
        serial: peer_mem::next_serial(),
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

fn file_size_allowed() -> bool {
    let lim = rustix::process::getrlimit(rustix::process::Resource::Fsize);
    lim.current.is_none_or(|c| c >= FILE_BYTES)
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

impl Registry {
    /// Whether the range at `start` is still exactly one shared mapping of its memfd.
    fn still_promoted(&mut self, start: usize) -> bool {
        let Some(p) = self.ranges.get(&start) else { return false };
        let (len, ino, dev) = (p.len, p.ino, p.dev);
        self.vma_at(start).is_some_and(|v| {
            v.start == start && v.end == start + len && v.shared && v.offset == 0 && v.inode == ino && v.dev == dev
        })
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
        let mut q = ProcmapQuery { size: std::mem::size_of::<ProcmapQuery>() as u64, query_addr: addr as u64, ..Default::default() };
        // SAFETY: as in `query`, without a name buffer.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), PROCMAP_QUERY, &mut q as *mut ProcmapQuery) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Some(q.vma("(long name)".into())))
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
