//! A communicator's shared control area, when all of its ranks live on this host.
//!
//! One memfd, created by rank 0 and opened by the others through `/proc/<pid>/fd/<fd>`
//! (the same access rule as cross-memory attach), so a crash leaves nothing in /dev/shm. It
//! holds, per rank, a few sequence counters on their own cache lines, a descriptor of the
//! rank's current buffers, and two data slots (one per operation parity) through which
//! small inputs, and the buffers of ranks that peers cannot map, travel. Node-level algorithms (`coll::node`)
//! synchronise through it instead of exchanging messages: one cache-line write tells every
//! rank at once.
//!
//! Waiting on a counter has no descriptor to sleep on, so the area watches the peer
//! processes themselves (pidfds): a rank that dies turns every wait on it into an error.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::event::{PollFd, PollFlags};
use rustix::fs::MemfdFlags;
use rustix::mm::{MapFlags, ProtFlags};

use super::exchange::Exchange;
use super::peer_mem::{self, PeerMaps, SharedRef};
use crate::error::{Error, Result};
use crate::wire::OpSig;

const AREA_MAGIC: u64 = 0x4665_7272_6f4e_6f64;
const HEADER_BYTES: usize = 4096;
/// Per-rank control block: two counters on their own cache lines, the descriptor's two
/// copies, then [`TINY_DEPTH`] tiny slots ([`TINY_LINES`] cache lines each).
const CTRL_BYTES: usize = TINY_OFFSET + TINY_DEPTH as usize * TINY_SLOT_BYTES;
/// Offset of the first tiny slot in a control block.
const TINY_OFFSET: usize = 512;
/// Cache lines of a tiny slot: the sequence word (offset 0), the call's signature
/// ([`TINY_SIG`]), then the input, contiguous to the slot's end. The sequence word is stored
/// last, with Release, so that the first line says the input is ready, brings its start and
/// says what call it belongs to. Two lines, not more: the second crosses with the first (the
/// pair fills a 128-byte block), a third costs a transfer of its own. Measured on the 2-core
/// VM (Intel), 2-rank broadcasts, us, three alternating runs: 64 B 0.13-0.15 in two lines
/// against 0.17-0.22 through a ring slot; 128 B in three lines 0.22-0.41 against 0.17-0.19
/// through a ring slot.
pub const TINY_LINES: usize = 2;
const TINY_SLOT_BYTES: usize = TINY_LINES * 64;
/// Offset of the input in a tiny slot.
const TINY_DATA: usize = 16;
/// Largest input a tiny slot holds (up to 48 B it stays in the first line).
pub const TINY_BYTES: usize = TINY_SLOT_BYTES - TINY_DATA;
/// Tiny slots per rank, used in turn: operation seq reuses the slot of seq - TINY_DEPTH. More
/// than two let a rank that only posts (a broadcast's root) run that many operations ahead,
/// so that ranks sharing a core wait for each other once per several operations instead of
/// every other one, and a root returns at once as Open MPI's does after queuing an eager
/// message. Measured on the 2-core VM, 4 ranks, broadcasts (us, min of 3 runs of 100 calls,
/// 8 against 64): 8 B 0.80 / 0.29, 128 B 0.74 / 0.23, 2 KiB 1.03 / 0.48 (Open MPI 0.27, 0.44,
/// 4.2); 2 ranks unchanged. 128 rather than 64 (16 KiB per rank): a burst of up to 128
/// broadcasts of at most [`TINY_BYTES`] never waits for receivers that are off their core
/// (unless a ring-slot operation among the last [`RING_DEPTH`] holds the root to that), just
/// as Open MPI's root, whose eager queue has no bound, never waits (4 ranks on 2 cores, 8 B,
/// 100 calls, three alternating launches: 0.29-0.39 us at 64, 0.10-0.11 at 128, Open MPI
/// 0.09-0.49; with 2000 calls all three 0.26-0.61; bench/results/burst-depth-2core-2026-12-06.md).
pub const TINY_DEPTH: u64 = 128;
/// Ring slots (and small ring slots) per rank, used in turn as tiny slots are: operation seq
/// reuses the ring slot of seq - RING_DEPTH. Fewer than tiny slots: each ring slot is a page,
/// and a rank's small ones fill about eight, all faulted in at attach.
pub const RING_DEPTH: u64 = 64;
/// Bytes of each ring slot: one-shot inputs larger than a small ring slot and up to this size
/// go round [`RING_DEPTH`] of them per rank, as tiny ones go round the tiny slots (the two data
/// slots would hold a broadcast's root to one operation ahead).
pub const RING_BYTES: usize = 4096;
/// Largest one-shot input a small ring slot takes (larger ones, up to [`RING_BYTES`], take a
/// ring slot). Small ring slots are laid out in granules of [`RING_GRANULE`] bytes: granule g
/// of every one of a rank's [`RING_DEPTH`] small ring slots side by side, then granule g + 1
/// of each, [`RING_STRIDE`] further on, so that a run of calls of up to 512 B touches eight
/// pages and neighbouring lines, where slots of a page each made every call take a new page (and
/// cold lines and a TLB miss on both sides after other work evicted them). Measured on the
/// 2-core VM, 2 ranks, out of place, the first 100 calls after a sweep to 128 MiB (us, four
/// alternating launches, bench/results/buffer-size-16core-2026-12-05.md): all-reduce 128 B
/// 0.63-0.68 in a page each against 0.36-0.38 interleaved, reduce-scatter 128 B 0.52-0.71
/// against 0.34-0.38, all-gather of 256 B inputs 0.56-0.65 against 0.39-0.43; even once warm.
/// Larger inputs lose by it (all 4 KiB slots interleaved: all-reduce 2 KiB 0.97-1.10 against
/// 1.55-1.71, in place too: the processor's prefetch runs from one slot's granule into the
/// next slot's, which its owner is about to write).
pub const SMALL_RING_BYTES: usize = 512;
/// Bytes of a small ring slot's granule: a pair of cache lines, which the processor moves
/// together.
pub const RING_GRANULE: usize = 128;
/// Bytes from one granule of a small ring slot to its next: a row of the [`RING_DEPTH`] slots'
/// granules and one granule more, so that a slot's granules lie at different offsets within
/// their pages (one granule further each), and so do different ranks' slots (each rank's
/// region is [`SMALL_RING_RANK_BYTES`], 512 B more than eight pages), instead of all in the
/// same two sets of a core's first-level cache. Measured on the 16-core host it changed
/// nothing (16 ranks' all-gather of 512 B blocks 2.13 us against 2.08 with rows of exactly
/// [`RING_DEPTH`] granules; bench/results/cache-sets-16core-2026-12-05.md); kept as it costs
/// nothing.
pub const RING_STRIDE: usize = (RING_DEPTH as usize + 1) * RING_GRANULE;
/// How much further on each rank's data slots start than whole slots would put them: the
/// same offset in every rank's slot (a reduce-scatter's block, an all-reduce's slice) then
/// falls in different sets of a core's caches (second level: 8 KiB apart within its 128 KiB
/// span; first level: a line apart) instead of all in the same ones. 16-core host, malloc'd
/// buffers, three alternating launches, min us without / with: reduce-scatter 16 ranks
/// 32 KiB 14.6 / 12.5, 128 KiB 43.0 / 37.5, 2 MiB 451 / 348; 8 ranks 512 KiB 57.3 / 47.2, 1 MiB
/// 112 / 92; all-reduce 8 ranks even, 16 ranks 32-128 KiB 3-8% slower, 256 KiB-2 MiB 2-7%
/// faster (bench/results/cache-sets-16core/r94).
pub const DATA_SLOT_SKEW: usize = 8 * 1024 + 64;
/// Bytes of one rank's small ring slots.
pub const SMALL_RING_RANK_BYTES: usize = SMALL_RING_BYTES / RING_GRANULE * RING_STRIDE;
/// Offset of the signature word in a tiny slot.
const TINY_SIG: usize = 8;
/// Offset, in the Arrived counter's line, of the two announcement words (by parity of the
/// operation): `(seq as u32) << 32 | signature`, written when a rank starts an operation, so
/// that peers can compare calls whatever algorithm each chose.
const ANNOUNCE_OFFSET: usize = 8;
/// Idle polls between comparisons of the peers' announced calls (and looks at the clock)
/// (catches ranks that chose different algorithms because their calls differ, which would
/// otherwise wait for ever).
const SIG_EVERY: u32 = 1024;
/// Largest input the one-shot algorithms put in a slot (their reads grow with the rank
/// count, so larger inputs go direct whatever the slot size).
pub const SMALL_BYTES: usize = 16 << 10;
/// Default bytes of each of a rank's two data slots. Buffers that peers cannot map (from
/// malloc, the stack, Fortran) travel through them in pieces of up to this size: big enough that
/// a piece's two synchronisations cost little next to its copies, small enough that a
/// piece, its reduction and its copy out stay in each core's cache.
pub const SLOT_BYTES: usize = 1 << 20;
/// Bounds on a configured slot size (FERROCCL_NODE_SLOT_SIZE).
pub const SLOT_BYTES_RANGE: std::ops::RangeInclusive<usize> = SMALL_BYTES..=(64 << 20);
/// Least time between liveness checks of the peers while waiting: a dead rank is noticed
/// within about this much waiting however slowly the waiting loop turns (it sleeps after
/// spinning a while, and load stretches the sleeps); the clock is read only every `SIG_EVERY`
/// idle polls.
const LIVENESS_PERIOD: std::time::Duration = std::time::Duration::from_millis(100);

/// A per-rank sequence counter. Each holds the number of the last node operation for which
/// the rank reached that point; operations are numbered from 1 in call order, which is the
/// same on every rank. Invariant the waits rely on: a rank marks Left for an operation (every
/// round of it) before it starts the next one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Input published (small slot filled, or descriptor written).
    Arrived = 0,
    /// Done with every peer's memory for that operation.
    Left = 1,
}

/// Words of the descriptor: send and receive buffer, each as address, then (fd, serial,
/// size, offset) of its ncclMemAlloc allocation (fd -1: none); then flags (bit 0: the rank
/// pre-scales its input; bits 1 and 2: its send and receive buffer travel through its slot;
/// bit 3: it offers its receive buffer for a relayed all-gather),
/// the scalar's bytes (PreMulSum scalars differ per rank), and the bytes of one rank's block.
pub const DESC_WORDS: usize = 13;
/// Offset of the descriptor's first copy in a control block, after the counters' lines; the
/// second follows it. Operations that publish one use the copies in turn, so that a rank
/// may publish its next operation while peers still read the one before
/// ([`NodeArea::descriptor_free`]).
const DESC_OFFSET: usize = 192;
const DESC_BYTES: usize = DESC_WORDS * 8;
/// Offset of the claim word ([`NodeArea::claim`]), on the line between the counters and the
/// descriptor: written only by operations that share out work.
const CLAIM_OFFSET: usize = 128;

const _: () = assert!(SMALL_RING_BYTES % RING_GRANULE == 0 && RING_STRIDE % 4096 != 0);
const _: () = assert!(CLAIM_OFFSET >= 128 && CLAIM_OFFSET + 8 <= DESC_OFFSET);
const _: () = assert!(DESC_OFFSET + 2 * DESC_BYTES <= TINY_OFFSET && TINY_SIG + 8 <= TINY_DATA);
const _: () = assert!(TINY_OFFSET % 64 == 0 && CTRL_BYTES % 64 == 0 && HEADER_BYTES % 64 == 0);
// A tiny slot's first line holds the sequence word, the signature and the input's start; its
// lines fill one aligned 128-byte block; the slots end with the control block.
const _: () = assert!(TINY_DATA <= 64 && TINY_OFFSET % 128 == 0 && TINY_SLOT_BYTES % 128 == 0 && CTRL_BYTES % 128 == 0);
const _: () = assert!(TINY_OFFSET + TINY_DEPTH as usize * TINY_SLOT_BYTES == CTRL_BYTES);

/// Where a rank's buffer is, as published for its peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufDesc {
    pub addr: u64,
    pub shared: Option<SharedRef>,
    /// Peers reach this buffer through its owner's slot, not at `addr`.
    pub staged: bool,
}

impl BufDesc {
    pub fn of(addr: *const u8, len: usize) -> BufDesc {
        BufDesc { addr: addr as u64, shared: peer_mem::locate(addr as usize, len), staged: false }
    }

    /// As [`BufDesc::of`], first sharing a large malloc'd buffer in place when `share_heap_min`
    /// is set (`FERROCCL_SHARE_HEAP`; only for peers in other processes).
    pub fn of_sharing(addr: *const u8, len: usize, share_heap_min: Option<usize>) -> BufDesc {
        let shared = peer_mem::locate(addr as usize, len).or_else(|| {
            let min = share_heap_min?;
            super::share_heap::share(addr as usize, len, min)
                .inspect_err(|e| log::trace!(target: "SHM", "SHM: {len} bytes at {addr:p} not shared: {e:?}"))
                .ok()
        });
        BufDesc { addr: addr as u64, shared, staged: false }
    }

    /// The shareable allocation this buffer lies in, when it holds `len` bytes from the
    /// buffer's start (a peer's record may claim anything: the range is checked here).
    pub fn shared_range(&self, len: usize) -> Option<SharedRef> {
        self.shared.filter(|r| r.offset.checked_add(len as u64).is_some_and(|end| end <= r.size))
    }
}

/// A rank's descriptor as written into its control block and decoded by its peers: words of
/// another process, so decoding takes any value and uses are checked
/// ([`BufDesc::shared_range`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub send: BufDesc,
    pub recv: BufDesc,
    /// The PreMulSum scalar this rank scales its input by.
    pub pre_scalar: Option<[u8; 8]>,
    /// Bytes of one rank's block in this rank's call: a peer that writes into this rank's
    /// buffers checks it (the calls' signatures carry only a digest of the count).
    pub block: u64,
    /// An all-gather: its right neighbour may read the blocks this rank has received from
    /// its receive buffer (the relay, `coll::node`), once every rank offers it.
    pub relay: bool,
}

impl Descriptor {
    pub fn encode(&self) -> [u64; DESC_WORDS] {
        let mut w = [0u64; DESC_WORDS];
        if let Some(s) = self.pre_scalar {
            w[10] = 1;
            w[11] = u64::from_ne_bytes(s);
        }
        w[10] |= (u64::from(self.send.staged) << 1) | (u64::from(self.recv.staged) << 2) | (u64::from(self.relay) << 3);
        w[12] = self.block;
        for (i, d) in [self.send, self.recv].iter().enumerate() {
            let o = i * 5;
            w[o] = d.addr;
            match d.shared {
                Some(s) => {
                    w[o + 1] = s.fd as u32 as u64;
                    w[o + 2] = s.serial;
                    w[o + 3] = s.size;
                    w[o + 4] = s.offset;
                }
                None => w[o + 1] = u64::MAX,
            }
        }
        w
    }

    pub fn decode(w: &[u64; DESC_WORDS]) -> Descriptor {
        let flags = w[10];
        let buf = |o: usize, staged: bool| BufDesc {
            addr: w[o],
            // fd -1 (all ones): not shareable memory.
            shared: (w[o + 1] != u64::MAX).then(|| SharedRef {
                fd: w[o + 1] as u32 as i32,
                serial: w[o + 2],
                size: w[o + 3],
                offset: w[o + 4],
            }),
            staged,
        };
        Descriptor {
            send: buf(0, flags >> 1 & 1 == 1),
            recv: buf(5, flags >> 2 & 1 == 1),
            pre_scalar: (flags & 1 == 1).then(|| w[11].to_ne_bytes()),
            block: w[12],
            relay: flags >> 3 & 1 == 1,
        }
    }
}

/// How this rank reaches a peer's buffer.
#[derive(Clone, Copy, Debug)]
pub enum PeerBuf {
    /// Addressable here: the same process, or an allocation mapped into this one.
    Direct(*mut u8),
    /// Only by a kernel copy from process `pid`.
    Remote { pid: u32, addr: u64 },
}

pub struct NodeArea {
    base: *mut u8,
    len: usize,
    _fd: OwnedFd,
    rank: usize,
    nranks: usize,
    pids: Vec<u32>,
    /// Per peer in another process, a pidfd that becomes readable when it exits.
    pidfds: Vec<Option<OwnedFd>>,
    maps: PeerMaps,
    /// Node operations started on this rank.
    started: u64,
    /// Descriptors this rank published; the latest is in copy `published % 2`, and every
    /// rank reads its peers' copy of that parity (all publish for the same operations).
    published: u64,
    /// Per descriptor copy, the first operation number of the operation that last wrote it.
    desc_first: [u64; 2],
    idle: u32,
    slot_bytes: usize,
    /// Every rank is a thread of this process (any buffer is in reach of every rank).
    one_process: bool,
    /// Per counter, a value every rank is known to have reached: waits up to it need not
    /// read the other ranks' counters (each read of a line a peer just wrote is a miss).
    floor: [u64; 2],
    /// The operation under way and its call's signature (see [`NodeArea::announce`]).
    current: (u64, OpSig),
    /// When the peers were last checked for life during the current wait.
    checked: Option<std::time::Instant>,
}

// SAFETY: the mapping is shared memory accessed only through atomics and the node
// algorithms' publication protocol; the owning communicator serialises its users.
unsafe impl Send for NodeArea {}

/// Areas for `nranks` ranks that all live in this process (threads), without a bootstrap:
/// for the node algorithms' unit tests.
#[cfg(test)]
pub(crate) fn areas_for_threads(nranks: usize) -> Vec<NodeArea> {
    areas_for_threads_with(nranks, SLOT_BYTES, false)
}

/// As [`areas_for_threads`], with slots of `slot_bytes`; `as_processes` makes the ranks
/// treat their private buffers as out of their peers' reach (as ranks in separate processes
/// do), so that they pass them through their slots.
#[cfg(test)]
pub(crate) fn areas_for_threads_with(nranks: usize, slot_bytes: usize, as_processes: bool) -> Vec<NodeArea> {
    let len = area_bytes(nranks, slot_bytes);
    let fd = create(len, 7, nranks).expect("memfd");
    let pids = vec![std::process::id(); nranks];
    (0..nranks)
        .map(|r| {
            let mut area =
                NodeArea::attach(fd.try_clone().expect("dup"), len, r, nranks, 7, &pids, slot_bytes).expect("attach");
            area.one_process = !as_processes;
            area
        })
        .collect()
}

/// As [`areas_for_threads_with`] with `as_processes`, and each rank watching the others
/// through a pidfd of this process: buffers that do not go through a slot are then
/// reached as [`PeerBuf::Remote`], by kernel copies (process_vm_readv/writev on this
/// process), as ranks in separate processes reach each other's malloc'd memory.
#[cfg(test)]
pub(crate) fn areas_for_threads_by_kernel_copies(nranks: usize, slot_bytes: usize) -> Vec<NodeArea> {
    let mut areas = areas_for_threads_with(nranks, slot_bytes, true);
    for area in &mut areas {
        for r in (0..nranks).filter(|&r| r != area.rank) {
            area.pidfds[r] = Some(pidfd_open(std::process::id()).expect("pidfd_open"));
        }
    }
    areas
}

fn area_bytes(nranks: usize, slot_bytes: usize) -> usize {
    data_offset(nranks) + nranks * (2 * slot_bytes + DATA_SLOT_SKEW)
}

/// Where the ring slots start: after the header and the control blocks.
fn ring_offset(nranks: usize) -> usize {
    HEADER_BYTES + (nranks * CTRL_BYTES).next_multiple_of(4096)
}

/// Where the small ring slots start: after the ring slots.
fn small_ring_offset(nranks: usize) -> usize {
    ring_offset(nranks) + nranks * RING_DEPTH as usize * RING_BYTES
}

/// Where the data slots start: after the small ring slots.
fn data_offset(nranks: usize) -> usize {
    small_ring_offset(nranks) + (nranks * SMALL_RING_RANK_BYTES).next_multiple_of(4096)
}

impl NodeArea {
    /// Sets the area up across all ranks of a communicator whose ranks are all on this host
    /// (every rank must call it, in the same bootstrap order). `wanted` is this rank's
    /// opinion (configuration); the area exists only when every rank wants and reaches it.
    /// Rank 0's `slot_bytes` (clamped to [`SLOT_BYTES_RANGE`], whole pages) sizes the slots.
    pub fn establish(
        bootstrap: &mut impl Exchange,
        magic: u64,
        pids: &[u32],
        wanted: bool,
        slot_bytes: usize,
    ) -> Result<Option<NodeArea>> {
        let (rank, nranks) = (bootstrap.rank(), bootstrap.nranks());
        let mine = slot_bytes.clamp(*SLOT_BYTES_RANGE.start(), *SLOT_BYTES_RANGE.end()).next_multiple_of(4096);
        let created = if rank == 0 && wanted { Some(create(area_bytes(nranks, mine), magic, nranks)) } else { None };
        let fd_word: i64 = match &created {
            Some(Ok(fd)) => fd.as_raw_fd() as i64,
            _ => -1,
        };
        let mut word = [0u8; 16];
        word[..8].copy_from_slice(&fd_word.to_le_bytes());
        word[8..].copy_from_slice(&(mine as u64).to_le_bytes());
        let words = bootstrap.all_gather(&word)?;
        let root = words.get(..16).ok_or_else(|| Error::internal("node area descriptor: short all-gather"))?;
        let root_fd = crate::wire::le_i64(&root[..8], "node area descriptor")?;
        let slot_bytes = crate::wire::le_i64(&root[8..], "node area slot size")? as usize;
        if !SLOT_BYTES_RANGE.contains(&slot_bytes) || slot_bytes % 4096 != 0 {
            return Err(Error::internal(format!("node area: rank 0 sent slot size {slot_bytes}")));
        }
        let len = area_bytes(nranks, slot_bytes);
        let attached: std::result::Result<NodeArea, String> = if !wanted {
            Err("disabled by FERROCCL_NODE_COLL".into())
        } else if root_fd < 0 {
            Err(match created {
                Some(Err(e)) => e.to_string(),
                _ => "rank 0 did not create it".into(),
            })
        } else {
            match created {
                Some(Ok(fd)) => Ok(fd),
                _ => peer_mem::open_peer_fd(pids[0], root_fd as i32, len as u64).map_err(|e| e.to_string()),
            }
            .and_then(|fd| NodeArea::attach(fd, len, rank, nranks, magic, pids, slot_bytes).map_err(|e| e.to_string()))
        };
        let ok = bootstrap.all_gather(&[attached.is_ok() as u8])?;
        match attached {
            Ok(area) if ok.iter().all(|&b| b == 1) => {
                log::info!(target: "SHM", "Node area: {nranks} ranks synchronise through shared memory ({len} bytes, slots of {slot_bytes})");
                Ok(Some(area))
            }
            Ok(_) => {
                let missing: Vec<usize> = ok.iter().enumerate().filter(|(_, &b)| b != 1).map(|(r, _)| r).collect();
                log::info!(target: "SHM", "Node area: not used, ranks {missing:?} could not attach");
                Ok(None)
            }
            Err(why) => {
                log::info!(target: "SHM", "Node area: not used on rank {rank}: {why}");
                Ok(None)
            }
        }
    }

    fn attach(
        fd: OwnedFd,
        len: usize,
        rank: usize,
        nranks: usize,
        magic: u64,
        pids: &[u32],
        slot_bytes: usize,
    ) -> io::Result<NodeArea> {
        // SAFETY: a new shared mapping (no address hint) of a file of at least `len` bytes
        // (created so, or checked by open_peer_fd); Drop unmaps it.
        let base = unsafe {
            rustix::mm::mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, &fd, 0)
        }?;
        let me = std::process::id();
        let mut pidfds = Vec::with_capacity(nranks);
        for &pid in pids {
            pidfds.push(if pid == me { None } else { Some(pidfd_open(pid)?) });
        }
        let area = NodeArea {
            base: base as *mut u8,
            len,
            _fd: fd,
            rank,
            nranks,
            pids: pids.to_vec(),
            pidfds,
            maps: PeerMaps::default(),
            started: 0,
            published: 0,
            desc_first: [0; 2],
            idle: 0,
            slot_bytes,
            one_process: pids.iter().all(|&p| p == me),
            floor: [0; 2],
            current: (0, OpSig::NONE),
            checked: None,
        };
        if area.header(0).load(Ordering::Acquire) != AREA_MAGIC
            || area.header(1).load(Ordering::Relaxed) != nranks as u64
            || area.header(2).load(Ordering::Relaxed) != magic
        {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "node area belongs to another communicator"));
        }
        area.prefault_small_slots();
        Ok(area)
    }

    /// Maps in every page of the control blocks and ring slots now: small operations go round
    /// [`RING_DEPTH`] ring slots (a page each; the small ones share eight pages per rank), and
    /// a first touch of each costs this process a page fault (measured: 128 B broadcasts at 2
    /// ranks took 0.6-1.2 us instead of 0.2 over the 100 calls of a benchmark size that first
    /// used them).
    fn prefault_small_slots(&self) {
        for off in (0..data_offset(self.nranks)).step_by(4096) {
            // SAFETY: inside the mapping (data_offset < len), 8-aligned, only accessed
            // atomically; a read changes nothing.
            unsafe { &*(self.base.add(off) as *const AtomicU64) }.load(Ordering::Relaxed);
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Numbers the next node operation (1, 2, ...: the same sequence on every rank).
    pub fn next_seq(&mut self) -> u64 {
        self.started += 1;
        self.started
    }

    fn header(&self, word: usize) -> &AtomicU64 {
        debug_assert!(word * 8 < HEADER_BYTES);
        // SAFETY: inside the header page, 8-aligned, only accessed atomically.
        unsafe { &*(self.base.add(word * 8) as *const AtomicU64) }
    }

    fn ctrl_word(&self, rank: usize, offset: usize) -> &AtomicU64 {
        debug_assert!(rank < self.nranks && offset + 8 <= CTRL_BYTES && offset % 8 == 0);
        // SAFETY: inside rank's control block (the mapping holds nranks of them), 8-aligned,
        // only accessed atomically.
        unsafe { &*(self.base.add(HEADER_BYTES + rank * CTRL_BYTES + offset) as *const AtomicU64) }
    }

    fn counter(&self, rank: usize, c: Counter) -> &AtomicU64 {
        self.ctrl_word(rank, c as usize * 64)
    }

    /// Records that this rank reached `c` in operation `seq` (after its writes before it).
    pub fn mark(&self, c: Counter, seq: u64) {
        self.counter(self.rank, c).store(seq, Ordering::Release);
    }

    /// Whether every rank reached `c` in operation `seq` or later (and its writes before
    /// that are visible). Checks now and then that the ranks still live.
    pub fn all_reached(&mut self, c: Counter, seq: u64) -> Result<bool> {
        if self.floor[c as usize] >= seq {
            return Ok(true);
        }
        let mut least = u64::MAX;
        for r in 0..self.nranks {
            let v = self.counter(r, c).load(Ordering::Acquire);
            if v < seq {
                self.note_idle()?;
                return Ok(false);
            }
            least = least.min(v);
        }
        self.floor[c as usize] = least;
        self.idle = 0;
        self.checked = None;
        Ok(true)
    }

    /// Whether `rank` reached `c` in operation `seq` or later (and its writes before that are
    /// visible).
    pub fn reached(&mut self, rank: usize, c: Counter, seq: u64) -> Result<bool> {
        if self.floor[c as usize] >= seq || self.counter(rank, c).load(Ordering::Acquire) >= seq {
            self.idle = 0;
            self.checked = None;
            return Ok(true);
        }
        self.note_idle()?;
        Ok(false)
    }

    /// Takes the next of `count` pieces of operation `seq` from `owner`'s claim word, which
    /// every rank working on those pieces shares: `None` once all are taken. The word holds
    /// `(seq as u32) << 32 | pieces taken`, so a word left by an earlier operation reads as
    /// none taken. Callers must not leave the operation (mark Left) before their last claim.
    pub fn claim(&self, owner: usize, seq: u64, count: usize) -> Option<usize> {
        let word = self.ctrl_word(owner, CLAIM_OFFSET);
        let tag = (seq as u32 as u64) << 32;
        let mut w = word.load(Ordering::Relaxed);
        loop {
            let taken = if w & !0xffff_ffff == tag { w as u32 as usize } else { 0 };
            if taken >= count {
                return None;
            }
            // Relaxed: the pieces' data is published through the counters, not this word.
            match word.compare_exchange_weak(w, tag | (taken as u64 + 1), Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(taken),
                Err(now) => w = now,
            }
        }
    }

    /// This rank's tiny slot for operation `seq` (one of [`TINY_DEPTH`]): where its input
    /// ([`TINY_BYTES`] at most) goes before [`NodeArea::post_tiny`].
    pub fn tiny_data(&self, rank: usize, seq: u64) -> *mut u8 {
        (self.tiny_seq(rank, seq).as_ptr() as *mut u8).wrapping_add(TINY_DATA)
    }

    /// The sequence word of `rank`'s tiny slot for operation `seq`, at the start of the slot.
    fn tiny_seq(&self, rank: usize, seq: u64) -> &AtomicU64 {
        self.ctrl_word(rank, TINY_OFFSET + (seq % TINY_DEPTH) as usize * TINY_SLOT_BYTES)
    }

    /// Announces that this rank's tiny slot holds its input for operation `seq` (with the
    /// signature given to [`NodeArea::begin_tiny`]).
    pub fn post_tiny(&self, seq: u64) {
        // Published by the Release store of the sequence word, in the same line.
        self.tiny_sig(self.rank, seq).store(u64::from(self.current.1 .0), Ordering::Relaxed);
        self.tiny_seq(self.rank, seq).store(seq, Ordering::Release);
    }

    /// Records that this rank starts operation `seq` for a call of signature `sig`, for
    /// one-shot through tiny slots, which carries the signature in the slot's first line
    /// ([`NodeArea::post_tiny`]) and leaves the Arrived line alone (peers read it only when
    /// they check while idle, but a store there would pull the line back every operation).
    pub fn begin_tiny(&mut self, seq: u64, sig: OpSig) {
        self.current = (seq, sig);
    }

    /// Records that this rank starts operation `seq` for a call of signature `sig`, where
    /// every peer can compare it (before anything else of the operation is published).
    pub fn announce(&mut self, seq: u64, sig: OpSig) {
        self.current = (seq, sig);
        let word = (seq as u32 as u64) << 32 | u64::from(sig.0);
        self.ctrl_word(self.rank, ANNOUNCE_OFFSET + (seq & 1) as usize * 8).store(word, Ordering::Relaxed);
    }

    /// Compares `rank`'s announced call with this rank's current one, if it announced the same
    /// operation (it may be one ahead, or not there yet): ncclInvalidUsage naming the
    /// difference when they differ.
    pub fn check_peer(&self, rank: usize) -> Result<()> {
        let (seq, sig) = self.current;
        let w = self.ctrl_word(rank, ANNOUNCE_OFFSET + (seq & 1) as usize * 8).load(Ordering::Relaxed);
        if (w >> 32) as u32 == seq as u32 {
            return sig.check(OpSig(w as u32), self.rank, rank);
        }
        // One-shot through tiny slots announces in the slot's first line instead.
        if self.tiny_seq(rank, seq).load(Ordering::Acquire) == seq {
            return sig.check(OpSig(self.tiny_sig(rank, seq).load(Ordering::Relaxed) as u32), self.rank, rank);
        }
        Ok(())
    }

    /// The signature word in `rank`'s tiny slot for operation `seq` (one of TINY_DEPTH).
    fn tiny_sig(&self, rank: usize, seq: u64) -> &AtomicU64 {
        let line = self.tiny_seq(rank, seq).as_ptr() as *const u8;
        // SAFETY: inside rank's tiny slot's first line (TINY_SIG + 8 <= TINY_DATA <= 64),
        // 8-aligned, only accessed atomically.
        unsafe { &*(line.add(TINY_SIG) as *const AtomicU64) }
    }

    /// [`NodeArea::check_peer`] for every other rank.
    pub fn check_peers(&self) -> Result<()> {
        (0..self.nranks).filter(|&r| r != self.rank).try_for_each(|r| self.check_peer(r))
    }

    /// Whether every rank's tiny slot holds its input for operation `seq` (and that input is
    /// visible). `ready` counts the ranks already seen, so each poll resumes after them.
    pub fn all_posted_tiny(&mut self, seq: u64, ready: &mut usize) -> Result<bool> {
        while *ready < self.nranks {
            let r = *ready;
            if self.tiny_seq(r, seq).load(Ordering::Acquire) < seq {
                self.note_idle()?;
                return Ok(false);
            }
            // Visible after the Acquire load above; not rewritten before this rank marks Left.
            let theirs = self.tiny_sig(r, seq).load(Ordering::Relaxed);
            self.current.1.check(OpSig(theirs as u32), self.rank, r)?;
            *ready += 1;
        }
        self.idle = 0;
        self.checked = None;
        Ok(true)
    }

    /// Records that every rank was seen (with Acquire) to have started operation `seq`, the
    /// first of its operation: a rank starts an operation only once it has marked Left for
    /// every earlier one, so every rank has left seq - 1, and the next slot wait need not
    /// read the Left lines (a miss per peer).
    pub fn all_started(&mut self, seq: u64) {
        let left = &mut self.floor[Counter::Left as usize];
        *left = (*left).max(seq.saturating_sub(1));
    }

    /// Whether `rank`'s tiny slot holds its input for operation `seq` (and that input is
    /// visible).
    pub fn posted_tiny(&mut self, rank: usize, seq: u64) -> Result<bool> {
        if self.tiny_seq(rank, seq).load(Ordering::Acquire) >= seq {
            self.idle = 0;
            return Ok(true);
        }
        self.note_idle()?;
        Ok(false)
    }

    /// The ranks that have not reached `c` in operation `seq` yet (for timeout messages).
    pub fn behind(&self, c: Counter, seq: u64) -> Vec<usize> {
        (0..self.nranks).filter(|&r| self.counter(r, c).load(Ordering::Acquire) < seq).collect()
    }

    /// The ranks whose tiny slot does not hold their input for operation `seq` yet.
    pub fn behind_tiny(&self, seq: u64) -> Vec<usize> {
        (0..self.nranks).filter(|&r| self.tiny_seq(r, seq).load(Ordering::Acquire) < seq).collect()
    }

    /// A number that changes whenever any rank advances a counter or posts a tiny slot: the
    /// no-progress watchdog's view of the area (read only while idle).
    pub fn progress_mark(&self) -> u64 {
        let mut sum = 0u64;
        for r in 0..self.nranks {
            for c in [Counter::Arrived, Counter::Left] {
                sum = sum.wrapping_add(self.counter(r, c).load(Ordering::Relaxed));
            }
            for slot in 0..TINY_DEPTH {
                sum = sum.wrapping_add(self.tiny_seq(r, slot).load(Ordering::Relaxed));
            }
        }
        sum
    }

    fn note_idle(&mut self) -> Result<()> {
        self.idle = self.idle.wrapping_add(1);
        if self.idle % SIG_EVERY == 0 {
            self.check_peers()?;
            let now = std::time::Instant::now();
            match self.checked {
                Some(t) if now.duration_since(t) < LIVENESS_PERIOD => {}
                Some(_) => {
                    self.checked = Some(now);
                    self.check_alive()?;
                }
                None => self.checked = Some(now),
            }
        }
        Ok(())
    }

    /// Fails when a peer process has exited.
    pub fn check_alive(&self) -> Result<()> {
        for (r, fd) in self.pidfds.iter().enumerate() {
            let Some(fd) = fd else { continue };
            let mut pfd = [PollFd::new(fd, PollFlags::IN)];
            if super::poll_ms(&mut pfd, 0) > 0 {
                return Err(Error::remote(format!("rank {r} (pid {}) exited during a node collective", self.pids[r])));
            }
        }
        Ok(())
    }

    /// Publishes this rank's buffers, input scalar and block size (before marking `Arrived`).
    pub fn publish(&mut self, send: BufDesc, recv: BufDesc, pre_scalar: Option<[u8; 8]>, block: usize, relay: bool) {
        self.published += 1;
        self.desc_first[self.desc_copy()] = self.started;
        let w = Descriptor { send, recv, pre_scalar, block: block as u64, relay }.encode();
        for (i, v) in w.iter().enumerate() {
            self.ctrl_word(self.rank, self.desc_at(i)).store(*v, Ordering::Relaxed);
        }
    }

    /// The descriptor copy of the current operation.
    fn desc_copy(&self) -> usize {
        (self.published & 1) as usize
    }

    /// The operation every rank must have left before this rank publishes its next descriptor
    /// (0: none): the next publication overwrites the copy of the operation before the latest
    /// one, whose peers read it until they leave it, and every operation up to the latest
    /// one's first precedes that first.
    pub fn descriptor_guard(&self) -> u64 {
        if self.published < 2 {
            return 0;
        }
        self.desc_first[self.desc_copy()].saturating_sub(1)
    }

    /// Whether this rank may publish its next descriptor now ([`NodeArea::descriptor_guard`]).
    /// After operations that waited for every rank to leave them it passes at once; after one
    /// that returned early (a staged all-gather or reduce-scatter, whose input peers read from
    /// its slot) it waits here for the stragglers.
    pub fn descriptor_free(&mut self) -> Result<bool> {
        let guard = self.descriptor_guard();
        self.all_reached(Counter::Left, guard)
    }

    /// How this rank reaches `rank`'s send (`which == 0`) or receive buffer, `len` bytes
    /// from its start, as published for the current operation.
    pub fn peer_buf(&mut self, rank: usize, which: usize, len: usize) -> PeerBuf {
        let desc = self.descriptor(rank);
        let buf = if which == 0 { desc.send } else { desc.recv };
        let pid = self.pids[rank];
        // No pidfd: the rank lives in this process (getpid is a system call; this is not).
        if self.pidfds[rank].is_none() {
            return PeerBuf::Direct(buf.addr as usize as *mut u8);
        }
        if let Some(p) = buf.shared_range(len).and_then(|r| self.maps.resolve(pid, &r)) {
            return PeerBuf::Direct(p);
        }
        PeerBuf::Remote { pid, addr: buf.addr }
    }

    /// `rank`'s descriptor as published for the current operation.
    pub fn descriptor(&self, rank: usize) -> Descriptor {
        let w: [u64; DESC_WORDS] =
            std::array::from_fn(|i| self.ctrl_word(rank, self.desc_at(i)).load(Ordering::Relaxed));
        Descriptor::decode(&w)
    }

    /// Whether `rank` works in place (its send and receive buffers are the same address).
    pub fn peer_in_place(&self, rank: usize) -> bool {
        self.ctrl_word(rank, self.desc_at(0)).load(Ordering::Relaxed)
            == self.ctrl_word(rank, self.desc_at(5)).load(Ordering::Relaxed)
    }

    /// Offset of word `i` of the current operation's descriptor copy.
    fn desc_at(&self, i: usize) -> usize {
        DESC_OFFSET + self.desc_copy() * DESC_BYTES + i * 8
    }

    /// The scalar `rank` multiplies its input by (PreMulSum), as published.
    pub fn peer_pre_scalar(&self, rank: usize) -> Option<[u8; 8]> {
        self.descriptor(rank).pre_scalar
    }

    /// Whether `rank`'s send (`which == 0`) or receive buffer travels through its slot, as
    /// published for the current operation.
    pub fn peer_staged(&self, rank: usize, which: usize) -> bool {
        let desc = self.descriptor(rank);
        if which == 0 {
            desc.send.staged
        } else {
            desc.recv.staged
        }
    }

    /// Whether every peer can map a buffer of this rank that is not shared memory: only when
    /// all ranks are threads of this process.
    pub fn peers_share_address_space(&self) -> bool {
        self.one_process
    }

    /// Bytes of each data slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// A rank's ring slot for operation `seq` ([`RING_BYTES`] long, one of [`RING_DEPTH`]).
    pub fn ring_slot(&self, rank: usize, seq: u64) -> *mut u8 {
        let off = ring_offset(self.nranks) + (rank * RING_DEPTH as usize + (seq % RING_DEPTH) as usize) * RING_BYTES;
        debug_assert!(off + RING_BYTES <= small_ring_offset(self.nranks));
        self.base.wrapping_add(off)
    }

    /// The first granule of a rank's small ring slot for operation `seq` (one of
    /// [`RING_DEPTH`], holding up to [`SMALL_RING_BYTES`]): granule g lies `g * RING_STRIDE`
    /// bytes further on.
    pub fn small_ring_slot(&self, rank: usize, seq: u64) -> *mut u8 {
        let off =
            small_ring_offset(self.nranks) + rank * SMALL_RING_RANK_BYTES + (seq % RING_DEPTH) as usize * RING_GRANULE;
        debug_assert!(
            off + (SMALL_RING_BYTES / RING_GRANULE - 1) * RING_STRIDE + RING_GRANULE <= data_offset(self.nranks)
        );
        self.base.wrapping_add(off)
    }

    /// A rank's data slot for operations of parity `parity` ([`NodeArea::slot_bytes`] long).
    pub fn slot(&self, rank: usize, parity: u64) -> *mut u8 {
        let data = data_offset(self.nranks);
        let off = data + (rank * 2 + (parity & 1) as usize) * self.slot_bytes + rank * DATA_SLOT_SKEW;
        debug_assert!(off + self.slot_bytes <= self.len);
        self.base.wrapping_add(off)
    }
}

impl Drop for NodeArea {
    fn drop(&mut self) {
        // SAFETY: base/len are the mapping made in attach, unmapped once.
        let _ = unsafe { rustix::mm::munmap(self.base as *mut std::ffi::c_void, self.len) };
    }
}

fn create(len: usize, magic: u64, nranks: usize) -> io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(c"ferroccl-node", MemfdFlags::CLOEXEC)?;
    rustix::fs::ftruncate(&fd, len as u64)?;
    // SAFETY: a new shared mapping (no address hint) of the first page of a file of `len`
    // bytes, to write the header; unmapped below.
    let p = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            HEADER_BYTES,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            &fd,
            0,
        )
    }?;
    // SAFETY: the header page just mapped; words written atomically, then unmapped once.
    unsafe {
        let w = |i: usize| &*((p as *mut u8).add(i * 8) as *const AtomicU64);
        w(1).store(nranks as u64, Ordering::Relaxed);
        w(2).store(magic, Ordering::Relaxed);
        w(0).store(AREA_MAGIC, Ordering::Release);
        let _ = rustix::mm::munmap(p, HEADER_BYTES);
    }
    Ok(fd)
}

fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // Pid 0 (and anything beyond pid_t) is no process: EINVAL, as the system call says.
    let pid = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw).ok_or(rustix::io::Errno::INVAL)?;
    Ok(rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rank's two data slots lie inside the area, after the small ring slots, apart from
    /// each other and from every other rank's; and the same offset in different ranks' slots
    /// falls at different places within the 128 KiB that a core's second-level cache sets span
    /// (the point of DATA_SLOT_SKEW).
    #[test]
    fn data_slots_are_disjoint_and_skewed_per_rank() {
        for n in [2, 3, 16] {
            let area = areas_for_threads(n).swap_remove(0);
            let base = area.base as usize;
            let bytes = area.slot_bytes();
            let mut spans: Vec<(usize, usize)> = Vec::new();
            for r in 0..n {
                for parity in 0..2 {
                    let at = area.slot(r, parity) as usize - base;
                    assert!(at >= data_offset(n) && at + bytes <= area.len, "n {n} rank {r} slot {parity}");
                    spans.push((at, at + bytes));
                }
            }
            spans.sort_unstable();
            assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "n {n}: data slots overlap");
            let mut offsets: Vec<usize> = (0..n).map(|r| (area.slot(r, 0) as usize - base) % (128 << 10)).collect();
            offsets.sort_unstable();
            offsets.dedup();
            assert_eq!(offsets.len(), n, "n {n}: ranks' slots at the same offset in the cache's span");
        }
    }

    /// A call's small ring slot, read from every rank at once, spreads over the cache: each
    /// granule of 16 ranks' slot k (for every k) at its own offset within its page, modulo
    /// the 4 KiB that a first-level cache's sets span, at most two granules per offset.
    #[test]
    fn small_ring_granules_of_one_call_lie_at_different_page_offsets() {
        let n = 16;
        let area = areas_for_threads(n).swap_remove(0);
        for seq in [0, 1, 31, 63, 64, 100] {
            let mut at_offset = std::collections::HashMap::<usize, usize>::new();
            for r in 0..n {
                let first = area.small_ring_slot(r, seq);
                for g in 0..SMALL_RING_BYTES / RING_GRANULE {
                    let a = first.wrapping_add(g * RING_STRIDE) as usize;
                    *at_offset.entry(a % 4096).or_default() += 1;
                }
            }
            let most = at_offset.values().max().copied().unwrap_or(0);
            assert!(most <= 2, "seq {seq}: {most} granules at one page offset");
        }
    }

    /// Each publication goes to the other descriptor copy, peers read the copy of the operation
    /// they are on, and a rank overwrites a copy only once every rank has left everything
    /// before the operation that published last (one-shot operations in between included).
    #[test]
    fn descriptor_copies_alternate_and_wait_for_their_readers() {
        let mut areas = areas_for_threads(2);
        let desc = |addr: u64| BufDesc { addr, shared: None, staged: true };
        let publish = |area: &mut NodeArea, addr: u64| {
            area.next_seq();
            assert!(area.descriptor_free().unwrap(), "rank {} had to wait", area.rank());
            area.publish(desc(addr), desc(addr + 1), None, 64, false);
        };
        // Operation 1 on both ranks; rank 0 leaves it, runs two one-shot operations (2, 3) and
        // publishes operation 4 while rank 1 is still on operation 1.
        publish(&mut areas[0], 0x1000);
        publish(&mut areas[1], 0x2000);
        areas[0].mark(Counter::Left, 1);
        for seq in 2..=3 {
            assert_eq!(areas[0].next_seq(), seq);
            areas[0].mark(Counter::Left, seq);
        }
        publish(&mut areas[0], 0x3000);
        assert_eq!(areas[1].descriptor(0).send.addr, 0x1000, "rank 1 must still see operation 1's");
        // Rank 0's next publication would overwrite operation 1's copy: it waits until every
        // rank has left operation 3.
        assert_eq!(areas[0].descriptor_guard(), 3);
        areas[0].next_seq();
        assert!(!areas[0].descriptor_free().unwrap());
        for seq in 1..=3 {
            areas[1].mark(Counter::Left, seq);
            assert_eq!(areas[0].descriptor_free().unwrap(), seq == 3, "rank 1 left operation {seq}");
        }
        // Rank 1 catches up to operation 4 and reads rank 0's second copy.
        areas[1].next_seq();
        areas[1].next_seq();
        publish(&mut areas[1], 0x4000);
        assert_eq!(areas[1].descriptor(0).send.addr, 0x3000);
        assert_eq!(areas[1].descriptor(1).send.addr, 0x4000);
    }

    #[test]
    fn descriptors_round_trip_and_claimed_ranges_are_checked() {
        let shared = SharedRef { fd: 7, serial: 3, size: 4096, offset: 1000 };
        let d = Descriptor {
            send: BufDesc { addr: 0x1000, shared: Some(shared), staged: false },
            recv: BufDesc { addr: 0x2000, shared: None, staged: true },
            pre_scalar: Some(2.5f64.to_ne_bytes()),
            block: 12345,
            relay: true,
        };
        assert_eq!(Descriptor::decode(&d.encode()), d);
        assert!(!Descriptor::decode(&Descriptor { relay: false, ..d }.encode()).relay);
        // Within the allocation, up to its end; not one byte past it, nor by overflow.
        assert_eq!(d.send.shared_range(3096), Some(shared));
        assert_eq!(d.send.shared_range(3097), None);
        let huge = BufDesc { shared: Some(SharedRef { offset: u64::MAX, ..shared }), ..d.send };
        assert_eq!(huge.shared_range(2), None);
        // Any words decode, and decode again to the same record.
        let junk = [u64::MAX; DESC_WORDS];
        let j = Descriptor::decode(&junk);
        assert_eq!(Descriptor::decode(&j.encode()), j);
        assert!(j.send.shared.is_none() && j.send.staged && j.recv.staged && j.pre_scalar.is_some() && j.relay);
    }

    /// Every input length a tiny slot takes, over both of its lines, reaches the peer whole,
    /// with the signature, and leaves the slot of the next operation unposted; every slot of
    /// both ranks filled at once keeps its own bytes and spills into nothing around it (the
    /// other rank's counters, the ring slots after the control blocks).
    #[test]
    fn tiny_slots_carry_every_length_with_their_signature() {
        let mut areas = areas_for_threads(2);
        let pattern = |rank: usize, seq: u64, i: usize| (i * 37 + seq as usize * 11 + rank * 101) as u8;
        let ring_start = areas[0].ring_slot(0, 0);
        // SAFETY: the first ring slot of rank 0 (RING_BYTES >= 64), unused in this test.
        unsafe { std::ptr::write_bytes(ring_start, 0x5A, 64) };
        let post = |area: &NodeArea, seq: u64, len: usize| {
            let input: Vec<u8> = (0..len).map(|i| pattern(area.rank(), seq, i)).collect();
            // SAFETY: this rank's own tiny slot holds TINY_BYTES >= len; nobody reads it yet.
            unsafe { std::ptr::copy_nonoverlapping(input.as_ptr(), area.tiny_data(area.rank(), seq), len) };
            area.post_tiny(seq);
        };
        let read = |area: &NodeArea, rank: usize, seq: u64, len: usize| {
            // SAFETY: posted (Acquire seen by the caller), and not rewritten during this read.
            let got = unsafe { std::slice::from_raw_parts(area.tiny_data(rank, seq), len) };
            assert!(
                got.iter().enumerate().all(|(i, &b)| b == pattern(rank, seq, i)),
                "rank {rank} seq {seq} len {len}"
            );
        };
        for len in 0..=TINY_BYTES {
            let seq = len as u64 + 1;
            let (poster, reader) = (len % 2, 1 - len % 2);
            let sig = OpSig::new(1, 7, 0, 0, len);
            areas[poster].begin_tiny(seq, sig);
            post(&areas[poster], seq, len);
            areas[reader].begin_tiny(seq, sig);
            assert!(areas[reader].posted_tiny(poster, seq).unwrap(), "length {len}");
            assert!(!areas[reader].posted_tiny(poster, seq + 1).unwrap());
            areas[reader].check_peer(poster).unwrap();
            read(&areas[reader], poster, seq, len);
        }
        // A different call is refused by the signature in the slot.
        let (last, last_poster) = (TINY_BYTES as u64 + 1, TINY_BYTES % 2);
        areas[1 - last_poster].begin_tiny(last, OpSig::new(2, 7, 0, 0, TINY_BYTES));
        assert!(areas[1 - last_poster].check_peer(last_poster).is_err());
        // Every slot of both ranks full at once.
        let seqs = last + 1..=last + TINY_DEPTH;
        for seq in seqs.clone() {
            for area in &mut areas {
                area.begin_tiny(seq, OpSig::NONE);
                let before = area.progress_mark();
                post(area, seq, TINY_BYTES);
                assert_ne!(area.progress_mark(), before, "a post to tiny slot {} is no progress", seq % TINY_DEPTH);
            }
        }
        for seq in seqs {
            for rank in 0..2 {
                assert!(areas[1 - rank].posted_tiny(rank, seq).unwrap());
                read(&areas[1 - rank], rank, seq, TINY_BYTES);
            }
        }
        for c in [Counter::Arrived, Counter::Left] {
            assert_eq!(areas[0].behind(c, 1), vec![0, 1], "{c:?} counters overwritten");
        }
        // SAFETY: as above.
        assert!(unsafe { std::slice::from_raw_parts(ring_start, 64) }.iter().all(|&b| b == 0x5A));
    }
}
