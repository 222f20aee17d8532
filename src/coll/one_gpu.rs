//! Device-buffer collectives of ranks that all use this host's one GPU.
//!
//! One rank (rank 0) runs each collective's kernels and copies for every rank, reading and
//! writing the others' buffers through CUDA IPC. Nobody else launches anything: processes that
//! share a GPU without MPS take turns on it, so a kernel per rank would cost a time slice each,
//! and a kernel spinning on another process's flag can stall for a whole slice. Streams are
//! ordered across processes with stream memory operations on set/reset flags in a small device
//! block of rank 0's that the others map through CUDA IPC; what hosts read (a rank's failure,
//! how far its stream got) and device-resident scalars go through a host page that all ranks map
//! and register with CUDA:
//!
//! ```text
//! rank r > 0 stream:  [scalar -> page]  ready_seq[r] = k   wait done_seq[r] >= k
//! rank 0 stream:      wait ready_seq[r] >= k (each r)   kernels   done_seq[r] = k (each r)
//! ```
//!
//! where k is the operation's sequence number (the same on every rank: operations are
//! collective). Nothing is reset, so each rank's stream does two flag operations and rank 0's
//! one wait per rank plus one write per rank. A CUDA graph replays the values it captured, so a
//! captured operation uses a second pair of flags that are set and reset, which only ever take
//! the values 0 and 1:
//!
//! ```text
//! rank r > 0 stream:  [scalar -> page]  ready[r] = 1   wait done[r] == 1   done[r] = 0
//! rank 0 stream:      wait ready[r] == 1, ready[r] = 0 (each r)   kernels   done[r] = 1 (each r)
//! ```
//!
//! Each pair is used only by its own kind of operation, and every rank queues the same
//! operations in the same order, so the two interleave safely. On the host, each call sends rank 0 where this rank's buffers
//! are (a gather over the communicator): the only host-side wait is that of the other ranks for
//! rank 0 to reach the same call, never for the GPU.
//!
//! Ranks that are threads of one process share its CUDA context and so its hardware queues:
//! they submit their flag operations in turn (`local_order`), rank 0's waits only after its
//! process mates' flag writes, and a mate's wait only after every mate's write (and rank 0's
//! kernels, when rank 0 is a mate). Graph captures cannot be ordered this way: each rank
//! replays its graph whenever its thread launches it, and a replayed wait that lands on a
//! hardware queue before the mate's write it needs stops both for good (the GPU tests with
//! rank threads stopped now and then in graph replays, rounds 19, 20 and 76). So a capture is
//! refused, on every rank alike, when any process holds two ranks of the communicator on one GPU.
//!
//! A rank that fails (a buffer it cannot export, a launch that fails) still writes and waits
//! on its flags, so no stream waits forever; rank 0 marks the failure in the page and the
//! others see it in `ncclCommGetAsyncError`. `ncclCommAbort` releases the stream waits of its
//! rank from the host.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::local_order::{LocalOrder, Path};
use super::reduce::Pre;
use super::{buffer_lengths, CollOp, OpRequest};
use crate::comm::Comm;
use crate::cuda::batch::Launches;
use crate::cuda::ipc;
use crate::cuda::kernels::{self, PreScalar};
use crate::cuda::memory::{MemKind, Registered};
use crate::cuda::stream::{Event, FlagOp, Stream};
use crate::error::{Error, Result};
use crate::transport::peer_mem::{self, PeerMaps, SharedRef};

/// Ranks one page serves (and one fold kernel reads at most).
const MAX_RANKS: usize = kernels::MAX_INPUTS;
/// Bytes of a rank's flag line: ready, done, error, finished (u32 each), alone on a cache line.
const LINE_BYTES: usize = 64;
/// Device-resident PreMulSum scalars one rank can pass in one group.
const SCALARS_PER_RANK: usize = 504;
/// Bytes of the page: the flag lines, then each rank's scalar slots.
const PAGE_BYTES: usize = MAX_RANKS * LINE_BYTES + MAX_RANKS * SCALARS_PER_RANK * 8;
const _: () = assert!(PAGE_BYTES <= 64 << 10);
/// Bytes of the device flag block: one line per rank (Ready, Done, ReadySeq and DoneSeq used).
const FLAG_BLOCK_BYTES: usize = MAX_RANKS * LINE_BYTES;

/// A rank's flags. Ready and Done, which the GPU polls, live in device memory (a block rank 0
/// allocates and the others map through CUDA IPC: a wait there is served from the GPU's own
/// memory, not across PCIe); Error, which hosts read, lives in the host page.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Word {
    Ready = 0,
    Done = 1,
    Error = 2,
    /// The sequence number of the last operation this rank's stream is ready for (plain
    /// launches; device block).
    ReadySeq = 4,
    /// The sequence number of the last operation rank 0's stream finished for this rank
    /// (plain launches; device block).
    DoneSeq = 5,
    /// The sequence number of the last operation whose own share this rank's stream finished
    /// (peer GPUs, [`Share`]; host page).
    FoldedSeq = 6,
}

/// Which part of a group's work a rank's stream does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Share {
    /// Rank 0 does everything for every rank.
    All,
    /// Ranks on peer GPUs, a group with a reduce-scatter: every rank folds its own block of
    /// each reduce-scatter on its own GPU, reading the others' inputs across the link (each
    /// block crosses once, as in a ring), and rank 0 does the rest. `lead` is rank 0's part.
    OwnBlocks { lead: bool },
}

impl Share {
    fn does(self, op: CollOp) -> bool {
        match self {
            Share::All | Share::OwnBlocks { lead: true } => true,
            Share::OwnBlocks { lead: false } => op == CollOp::ReduceScatter,
        }
    }

    fn own_blocks(self) -> bool {
        matches!(self, Share::OwnBlocks { .. })
    }
}

/// The page's place in this process: rank 0's own allocation or a mapping of it.
enum PageMemory {
    Owned(*mut u8),
    Mapped(#[allow(dead_code)] PeerMaps),
}

impl Drop for PageMemory {
    fn drop(&mut self) {
        if let PageMemory::Owned(p) = *self {
            peer_mem::free_shared(p);
        }
    }
}

/// One communicator's state for this path, in this process.
pub struct CommGpu {
    base: *mut u8,
    /// The page's address for the GPU.
    dev: u64,
    /// The device flag block's address in this process (unused when `peer_gpus`).
    flags: u64,
    /// Ranks on different GPUs (`Placement::PeerGpus`): every flag lives in the host page, and
    /// each rank other than 0 copies its own all-gather block on its own GPU.
    peer_gpus: bool,
    /// Taken (unregistered) before `memory` is unmapped; see Drop.
    registration: Mutex<Option<Registered>>,
    memory: ManuallyDrop<PageMemory>,
    /// Operations queued on this rank: the last one's sequence number.
    submitted: AtomicU32,
    /// A graph was captured, or the communicator aborted: the last event no longer tells
    /// whether streams are through with the page (a replay may still come).
    unsure: AtomicBool,
    /// The stream of the last operation and an event recorded after it: orders a different
    /// next stream after it, and tells at destroy whether streams are through with the page.
    last: Mutex<Option<(Stream, Event)>>,
    /// Ranks of this communicator that are threads of this process submit in turn
    /// (`local_order`); `None` when this is the only one.
    order: Option<LocalOrder>,
}

// SAFETY: the page is shared memory accessed through atomics (host) and stream memory
// operations (GPU); the rest is owned.
unsafe impl Send for CommGpu {}
// SAFETY: as above.
unsafe impl Sync for CommGpu {}

impl CommGpu {
    /// Whether flag `w` lives in the host page (the host can write it directly).
    fn in_page(&self, w: Word) -> bool {
        w == Word::Error || self.peer_gpus
    }

    /// A flag of the host page, for the host ([`CommGpu::in_page`]).
    fn word(&self, rank: usize, w: Word) -> &AtomicU32 {
        debug_assert!(rank < MAX_RANKS && self.in_page(w));
        // SAFETY: the page holds MAX_RANKS aligned lines of LINE_BYTES (every Word's u32 lies
        // inside) and lives as long as self; the GPU writes them with 32-bit stores, so atomic
        // host access is sound.
        unsafe { &*(self.base.add(rank * LINE_BYTES + 4 * w as usize) as *const AtomicU32) }
    }

    fn flag_addr(&self, rank: usize, w: Word) -> u64 {
        let base = if self.in_page(w) { self.dev } else { self.flags };
        base + (rank * LINE_BYTES + 4 * w as usize) as u64
    }

    fn scalar_offset(rank: usize, slot: usize) -> usize {
        MAX_RANKS * LINE_BYTES + (rank * SCALARS_PER_RANK + slot) * 8
    }
}

impl Drop for CommGpu {
    fn drop(&mut self) {
        let through = !self.unsure.load(Ordering::Acquire)
            && self.last.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_none_or(|(_, e)| e.is_complete());
        let mut reg = self.registration.lock().unwrap_or_else(|p| p.into_inner());
        if !through {
            // A stream may still wait on the page: keep it (a few KiB) rather than pull it away.
            if let Some(r) = reg.as_mut() {
                r.keep();
            }
            return;
        }
        drop(reg.take()); // unregister, then unmap
        drop(reg);
        // SAFETY: dropped once, here; never used again.
        unsafe { ManuallyDrop::drop(&mut self.memory) };
    }
}

/// Where a communicator's GPUs are, as far as this path is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    /// Every rank on one GPU.
    OneGpu,
    /// Ranks on several GPUs of this host that rank 0's GPU reaches directly (peer access over
    /// NVLink or PCIe), in processes of their own or as threads of one process (rank 0's context
    /// then enables peer access to the mates' devices): rank 0's kernels read and write the others' buffers
    /// across the link, and the flags that order the streams live in the host page (a stream
    /// waits on memory its own GPU can poll, without peer mappings of rank 0's flag block).
    PeerGpus,
    /// Neither: the staged path.
    Elsewhere,
}

/// The placement of ranks on GPUs `gpus` (by rank; PCI locations, 0 for none), where
/// `lead_reach` lists the GPUs rank 0's GPU maps by peer access (as rank 0's process found
/// them). Every rank decides from the same values (what rank 0 published), so all decide alike
/// even where their processes see different devices. `peer_path_on_one_gpu` sends ranks that
/// share a GPU down the peer-GPU path (testing it on one GPU).
fn placement(gpus: &[u64], lead_reach: &[u64], peer_path_on_one_gpu: bool) -> Placement {
    let Some(&lead) = gpus.first() else { return Placement::Elsewhere };
    if lead == 0 {
        return Placement::Elsewhere;
    }
    // Ranks that are threads of one process (on one device or several) order their flag
    // operations among themselves (local_order), and rank 0 reaches a mate's buffers on another
    // device once peer access is enabled from its context.
    if gpus.iter().all(|&g| g == lead) {
        return if peer_path_on_one_gpu && gpus.len() > 1 { Placement::PeerGpus } else { Placement::OneGpu };
    }
    if !gpus.iter().all(|g| lead_reach.contains(g)) {
        return Placement::Elsewhere;
    }
    Placement::PeerGpus
}

fn placement_of(comm: &Comm) -> Placement {
    let peer_path_on_one_gpu = crate::env::get_bool("FERROCCL_PEER_PATH_ON_ONE_GPU");
    // Every device call asks: the common case without allocating.
    let lead = &comm.peers[0].gpu;
    if !peer_path_on_one_gpu && lead.bus != 0 && comm.peers.iter().all(|p| p.gpu.bus == lead.bus) {
        return Placement::OneGpu;
    }
    let gpus: Vec<u64> = comm.peers.iter().map(|p| p.gpu.bus).collect();
    placement(&gpus, &lead.reach, peer_path_on_one_gpu)
}

/// Whether every rank is a process of its own (folding own blocks waits across every pair of
/// ranks' streams, which rank threads sharing a context's queues must not).
fn processes_apart(comm: &Comm) -> bool {
    let mut pids: Vec<(u64, u32)> = comm.peers.iter().map(|p| (p.host_hash, p.pid)).collect();
    pids.sort_unstable();
    pids.dedup();
    pids.len() == comm.peers.len()
}

/// Whether some process holds two ranks on one GPU (threads sharing a CUDA context and so its
/// hardware queues). Ranks with no GPU known (bus 0) count as sharing: refusing a capture is
/// the safe mistake.
fn threads_share_a_gpu(peers: &[crate::wire::peer_info::PeerInfo]) -> bool {
    let mut places: Vec<(u64, u32, u64)> = peers.iter().map(|p| (p.host_hash, p.pid, p.gpu.bus)).collect();
    places.sort_unstable();
    places.windows(2).any(|w| w[0] == w[1])
}

/// Whether every rank's GPU reaches every other's (each folding its own blocks reads all
/// ranks' inputs, [`Share`]), from what each rank published at init.
fn all_reach_all(comm: &Comm) -> bool {
    comm.peers.iter().all(|a| comm.peers.iter().all(|b| a.gpu.reach.contains(&b.gpu.bus)))
}

/// Whether a job can run here: one communicator whose ranks all use this host's same GPU, or
/// GPUs that rank 0's reaches directly, device buffers only, collectives
/// only (point-to-point keeps the staged path), one stream, and NCCL_P2P_DISABLE unset. Every
/// rank decides alike from what all ranks agree on: the GPUs' PCI locations and what rank 0's
/// GPU reaches, exchanged at init.
pub fn applies(ops: &[(Arc<Comm>, OpRequest)]) -> bool {
    let Some((first, first_req)) = ops.first() else { return false };
    if crate::env::get_bool("NCCL_P2P_DISABLE") || !first.node_area || first.nranks > MAX_RANKS {
        return false;
    }
    ops.iter().all(|(c, r)| {
        Arc::ptr_eq(c, first)
            && r.mem.is_device()
            && r.stream == first_req.stream
            && !matches!(r.op, CollOp::Send { .. } | CollOp::Recv { .. })
    }) && placement_of(first) != Placement::Elsewhere
}

/// Whether a group of several communicators (one thread driving several ranks, as after
/// `ncclCommInitAll`) can run here communicator by communicator: each one's operations as
/// [`applies`] requires. Returns them grouped, communicators in order of first appearance.
pub fn applies_per_communicator(ops: &[(Arc<Comm>, OpRequest)]) -> Option<Vec<(Arc<Comm>, Vec<OpRequest>)>> {
    // Every staged device call asks: one communicator (the common case) without allocating.
    let (first, _) = ops.first()?;
    if ops.iter().all(|(c, _)| Arc::ptr_eq(c, first)) {
        return None;
    }
    let per_comm = super::by_communicator(ops.to_vec());
    (per_comm.len() > 1
        && per_comm.iter().all(|(c, reqs)| {
            let mine: Vec<(Arc<Comm>, OpRequest)> = reqs.iter().map(|r| (c.clone(), *r)).collect();
            applies(&mine)
        }))
    .then_some(per_comm)
}

/// Queues each communicator's operations of a group ([`applies_per_communicator`]), each on a
/// thread of its own ([`on_own_threads`]). Ranks that are threads of one process order their
/// streams' flag operations among themselves (`local_order`), as rank threads do.
pub fn submit_each(per_comm: Vec<(Arc<Comm>, Vec<OpRequest>)>) -> Result<()> {
    on_own_threads(per_comm, submit).into_iter().collect()
}

/// Runs `f` for each communicator's operations of a group, each on a scoped thread of its own
/// with the context of its operations' stream current: a communicator's call waits on the host
/// for its other ranks to reach it, and those may be the very communicators this thread would
/// submit next (one thread driving several ranks, as after `ncclCommInitAll`). Operations on
/// `cudaStreamPerThread` cannot move to another thread (the handle names that thread's own
/// stream) and fail with the reason.
pub(super) fn on_own_threads<T: Send>(
    per_comm: Vec<(Arc<Comm>, Vec<OpRequest>)>,
    f: impl Fn(&Arc<Comm>, &[OpRequest]) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = per_comm
            .into_iter()
            .map(|(comm, reqs)| {
                scope.spawn(move || {
                    if reqs.iter().any(|r| r.stream == Stream::PER_THREAD) {
                        return Err(Error::invalid_usage(
                            "a group over several communicators cannot use cudaStreamPerThread: pass each \
                             communicator's own stream",
                        ));
                    }
                    let ctx = match reqs.first().map(|r| r.stream) {
                        Some(s) if s.0 > 2 => s.context()?,
                        _ => crate::cuda::driver::primary_context(comm.cuda_dev)
                            .ok_or_else(|| Error::internal(format!("no CUDA context for device {}", comm.cuda_dev)))?,
                    };
                    crate::cuda::driver::make_current(ctx)?;
                    f(&comm, &reqs)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(Error::internal("a group submission thread panicked"))))
            .collect()
    })
}

/// The communicator's page, set up on first use (a collective step: every rank calls this at
/// the same operation).
fn comm_gpu(comm: &Arc<Comm>, capturing: bool) -> Result<Arc<CommGpu>> {
    if let Some(g) = comm.with_layer_state(|s: &mut super::LayerState| s.gpu.clone()) {
        return Ok(g);
    }
    if capturing {
        // Setting up allocates and registers memory, which would invalidate the capture. Every
        // rank captures alike, so every rank fails here alike.
        return Err(Error::invalid_usage(
            "the first device-buffer operation of a communicator cannot be captured into a CUDA graph: \
             run one outside stream capture first (as a warm-up does)",
        ));
    }
    crate::cuda::stream::probe_batch_capture();
    let g = Arc::new(set_up_page(comm)?);
    comm.with_layer_state(|s: &mut super::LayerState| s.gpu = Some(g.clone()));
    Ok(g)
}

fn set_up_page(comm: &Arc<Comm>) -> Result<CommGpu> {
    // Rank 0 allocates the host page and the device flag block; the others learn where they
    // are by a host broadcast (pid, page fd, serial, size, ok, block export) and map them: the
    // page through /proc/<pid>/fd (the node area's access rule), the block through CUDA IPC.
    // A failure on rank 0 is said in the broadcast so that all fail alike.
    const HEAD: usize = 32;
    let mut msg = vec![0u8; HEAD + ipc::EXPORT_BYTES];
    let mut owned = None;
    if comm.rank == 0 {
        let made = (|| -> Result<(*mut u8, SharedRef, ipc::Export)> {
            let block = crate::cuda::memory::alloc_internal_block(FLAG_BLOCK_BYTES)?;
            let zero = crate::cuda::stream::private_stream()?;
            zero.fill32(block, 0, FLAG_BLOCK_BYTES / 4)?;
            zero.synchronize()?;
            let export = ipc::export(block as *const u8)?;
            let p = peer_mem::alloc_shared(PAGE_BYTES)?;
            let r = peer_mem::locate(p as usize, PAGE_BYTES).ok_or_else(|| Error::internal("page not located"))?;
            Ok((p, r, export))
        })();
        match made {
            Ok((p, r, export)) => {
                msg[0..4].copy_from_slice(&std::process::id().to_le_bytes());
                msg[4..8].copy_from_slice(&r.fd.to_le_bytes());
                msg[8..16].copy_from_slice(&r.serial.to_le_bytes());
                msg[16..24].copy_from_slice(&r.size.to_le_bytes());
                msg[24] = 1;
                export.encode(&mut msg[HEAD..]);
                owned = Some(p);
            }
            Err(e) => log::warn!(target: "INIT", "device path: {e}"),
        }
    }
    host_broadcast(comm, &mut msg)?;
    if msg[24] != 1 {
        return Err(Error::remote("rank 0 could not set up the flags for device operations (see its log)"));
    }
    let word = |a: usize, b: usize| -> u64 {
        let mut w = [0u8; 8];
        w[..b - a].copy_from_slice(&msg[a..b]);
        u64::from_le_bytes(w)
    };
    let pid = word(0, 4) as u32;
    let export = ipc::Export::decode(&msg[HEAD..]).ok_or_else(|| Error::internal("bad flag block export"))?;
    let peer_gpus = placement_of(comm) == Placement::PeerGpus;
    let flags = if pid == std::process::id() || peer_gpus { export.addr } else { ipc::open(pid, &export)? as u64 };
    let (base, memory) = match owned {
        Some(p) => (p, PageMemory::Owned(p)),
        None => {
            let mut maps = PeerMaps::default();
            let r = SharedRef { fd: word(4, 8) as i32, serial: word(8, 16), size: word(16, 24), offset: 0 };
            let p = maps.resolve(pid, &r).ok_or_else(|| {
                Error::invalid_usage("cannot map rank 0's flag page for device operations (see the SHM log line)")
            })?;
            (p, PageMemory::Mapped(maps))
        }
    };
    // SAFETY: base..base+PAGE_BYTES is mapped for as long as the CommGpu (which owns the
    // mapping) lives, and the registration is dropped first (CommGpu::drop).
    let registration = unsafe { Registered::new(base, PAGE_BYTES)? };
    Ok(CommGpu {
        base,
        dev: registration.device_ptr(),
        flags,
        peer_gpus,
        registration: Mutex::new(Some(registration)),
        memory: ManuallyDrop::new(memory),
        submitted: AtomicU32::new(0),
        unsure: AtomicBool::new(false),
        last: Mutex::new(None),
        order: LocalOrder::new(comm, Path::OneGpu),
    })
}

/// Bytes each rank sends rank 0 per operation: its send and receive buffers (IPC exports) and
/// its PreMulSum scalar (each rank's own: 8 bytes of value, then 1 when it is device-resident
/// and comes through the rank's page slot instead).
const OP_DESC_BYTES: usize = 2 * ipc::EXPORT_BYTES + 16;
const PRE_AT: usize = 2 * ipc::EXPORT_BYTES;
/// The header: process id (4 bytes), status (1: this rank's buffers could not be exported).
const DESC_HEADER_BYTES: usize = 8;

/// Queues one group's (or call's) operations, all on one communicator and one stream.
pub fn submit(comm: &Arc<Comm>, reqs: &[OpRequest]) -> Result<()> {
    let stream = reqs[0].stream;
    let capturing = stream.is_capturing()?;
    if capturing && threads_share_a_gpu(&comm.peers) {
        // Before any exchange: every rank knows the same peers, so every rank returns here.
        return Err(Error::invalid_usage(
            "CUDA graph capture of device-buffer collectives is not supported when rank threads of one \
             process share a GPU (ncclCommInitAll, nccl-tests -t on one GPU): their streams share the \
             context's hardware queues, and graph replays launched in any order could wait on each other \
             for ever. Run one process per rank, or these collectives outside stream capture",
        ));
    }
    let n = comm.nranks;
    let desc_len = DESC_HEADER_BYTES + reqs.len() * OP_DESC_BYTES;
    // Graph captures keep rank 0 doing all: their set/reset flags pair one rank with rank 0.
    // Every rank decides alike (the same operations, the same placement, captured alike).
    let share = if !capturing
        && n > 1
        && reqs.iter().any(|q| q.op == CollOp::ReduceScatter)
        && placement_of(comm) == Placement::PeerGpus
        && all_reach_all(comm)
        && processes_apart(comm)
    {
        Share::OwnBlocks { lead: comm.rank == 0 }
    } else {
        Share::All
    };
    let mut mine = vec![0u8; desc_len];
    mine[..4].copy_from_slice(&std::process::id().to_le_bytes());
    let described =
        if comm.rank == 0 && !share.own_blocks() { Ok(()) } else { describe_buffers(comm, reqs, &mut mine) };
    if let Err(e) = &described {
        log::warn!(target: "COLL", "device operation: {e}");
        mine[4] = 1;
    }
    let mut all = vec![0u8; if comm.rank == 0 || share.own_blocks() { desc_len * n } else { 0 }];
    // First, so that a rank that passed host buffers to this call (and so runs a host
    // collective) is told so here, by the node area's comparison of calls, on both sides.
    if share.own_blocks() {
        host_all_gather(comm, &mine, &mut all)?;
    } else {
        host_gather(comm, &mine, &mut all)?;
    }
    let g = comm_gpu(comm, capturing)?;
    log_path_once(comm);
    if capturing {
        g.unsure.store(true, Ordering::Release);
    } else {
        order_after_last_stream(&g, stream)?;
    }
    let seq = g.submitted.load(Ordering::Relaxed).wrapping_add(1);
    // Process mates: rank 0 waits on its stream for their flags only once they are submitted
    // (local_order); a failure before that still publishes, so that nobody waits for ever.
    let order = g.order.as_ref().filter(|_| !capturing).map(|o| (o, o.next_op()));
    let result = if comm.rank == 0 {
        let mates: Vec<usize> =
            order.map_or_else(Vec::new, |(o, _)| o.local_ranks().iter().copied().filter(|&r| r != 0).collect());
        order
            .map_or(Ok(()), |(o, k)| o.wait_seq(comm, &mates, k))
            .and_then(|()| lead(comm, &g, reqs, &all, desc_len, stream, capturing, seq, share))
    } else {
        let own_blocks = share.own_blocks().then_some((all.as_slice(), desc_len));
        follow(comm, &g, reqs, stream, capturing, order, seq, own_blocks)
    };
    if let Some((o, k)) = order {
        o.publish_seq(k);
    }
    g.submitted.store(seq, Ordering::Release);
    if !capturing {
        record_last_stream(&g, stream)?;
    }
    described?;
    result
}

/// A different stream than the last operation's waits for that one (the flags assume one
/// operation at a time per rank and communicator, as call order gives on one stream).
fn order_after_last_stream(g: &CommGpu, stream: Stream) -> Result<()> {
    let last = g.last.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((s, e)) = last.as_ref() {
        if *s != stream {
            stream.wait_event(e)?;
        }
    }
    Ok(())
}

fn record_last_stream(g: &CommGpu, stream: Stream) -> Result<()> {
    let mut last = g.last.lock().unwrap_or_else(|p| p.into_inner());
    if last.is_none() {
        *last = Some((stream, Event::create()?));
    }
    let (s, e) = last.as_mut().expect("set above");
    *s = stream;
    e.record(stream)
}

/// Rank `r`'s device-resident PreMulSum scalars into its page slots, for the rank that reads
/// them (rank 0; with [`Share::OwnBlocks`], every rank).
fn stage_scalars(g: &CommGpu, reqs: &[OpRequest], r: usize, stream: Stream) -> Result<()> {
    let mut slot = 0;
    for req in reqs {
        if let Some(at) = req.pre_device {
            if slot == SCALARS_PER_RANK {
                return Err(Error::invalid_usage(format!(
                    "more than {SCALARS_PER_RANK} operations with device-resident scalars in one group"
                )));
            }
            let dst = g.dev + CommGpu::scalar_offset(r, slot) as u64;
            // SAFETY: dst is this rank's scalar slot in the registered page (kept while
            // streams use it); the source is the user's scalar (valid per ncclScalarDevice's
            // contract).
            unsafe { stream.copy(dst as *mut u8, at as *const u8, req.dtype.size())? };
            slot += 1;
        }
    }
    Ok(())
}

/// A rank other than 0: its device scalars into the page, then the flag handshake.
/// `order`: this process's mates and the operation's number among them (`None` for graph
/// captures and ranks alone in their process). `own_blocks`: every rank's buffer descriptions
/// (and their length) when this rank folds its own reduce-scatter blocks ([`Share`]).
#[allow(clippy::too_many_arguments)]
fn follow(
    comm: &Comm,
    g: &CommGpu,
    reqs: &[OpRequest],
    stream: Stream,
    capturing: bool,
    order: Option<(&LocalOrder, u64)>,
    seq: u32,
    own_blocks: Option<(&[u8], usize)>,
) -> Result<()> {
    let r = comm.rank;
    // A failure here still goes through the flags below (rank 0's stream, and with
    // [`Share::OwnBlocks`] everyone's, waits on this rank's), then is returned.
    let mut prepared = stage_scalars(g, reqs, r, stream);
    if g.peer_gpus {
        // Ranks on their own GPUs: an all-gather's own block goes into its own output here, on
        // this GPU, before the ready flag (launch_for_all reads it from there).
        for req in reqs.iter().filter(|q| q.op == CollOp::AllGather) {
            let block = req.count * req.dtype.size();
            let own = req.recv.wrapping_add(r * block);
            if block > 0 && !std::ptr::eq(own as *const u8, req.send) {
                // SAFETY: the caller's device buffers for this operation: the send buffer holds
                // `block` bytes and the receive buffer `n * block` (NCCL's size rules); an
                // all-gather's send buffer is either this very block (in place, skipped) or
                // apart from the receive buffer (NCCL's rule for its buffers).
                let copied = unsafe { stream.copy(own, req.send, block) };
                if prepared.is_ok() {
                    prepared = copied;
                }
            }
        }
    }
    if capturing {
        stream.flag_ops(
            &[
                FlagOp::Write(g.flag_addr(r, Word::Ready), 1),
                FlagOp::WaitEq(g.flag_addr(r, Word::Done), 1),
                FlagOp::Write(g.flag_addr(r, Word::Done), 0),
            ],
            true,
        )?;
        return prepared;
    }
    let ready = FlagOp::Write(g.flag_addr(r, Word::ReadySeq), seq);
    let wait = FlagOp::WaitGeq(g.flag_addr(r, Word::DoneSeq), seq);
    if let Some((all, desc_len)) = own_blocks {
        // Ranks on their own GPUs (so alone in their processes: no `order`). Every input must be
        // ready before this rank reads it; rank 0 releases everyone once every rank has folded,
        // so nobody's input changes while another rank still reads it.
        let n = comm.nranks;
        let mut ops = vec![ready];
        ops.extend((0..n).filter(|&q| q != r).map(|q| FlagOp::WaitGeq(g.flag_addr(q, Word::ReadySeq), seq)));
        stream.flag_ops(&ops, false)?;
        let everyone_described = (0..n).all(|q| all[q * desc_len + 4] == 0);
        let folded = prepared.and_then(|()| {
            if everyone_described {
                launch_for_all(comm, reqs, all, desc_len, stream, g.dev, g.peer_gpus, Share::OwnBlocks { lead: false })
            } else {
                Err(Error::remote("a rank could not export its device buffers through CUDA IPC (see its log)"))
            }
        });
        if let Err(e) = &folded {
            log::warn!(target: "COLL", "device operation on rank {r}: {e}");
            comm.set_async_error(e);
        }
        stream.flag_ops(&[FlagOp::Write(g.flag_addr(r, Word::FoldedSeq), seq), wait], false)?;
        return folded;
    }
    let Some((order, k)) = order else { return stream.flag_ops(&[ready, wait], false).and(prepared) };
    // Process mates (local_order): the wait goes in once every mate has submitted its flag
    // write, and rank 0, when it is a mate, its kernels and done flags.
    stream.flag_ops(&[ready], false)?;
    order.publish_seq(k);
    let others: Vec<usize> = order.local_ranks().iter().copied().filter(|&m| m != r).collect();
    order.wait_seq(comm, &others, k)?;
    stream.flag_ops(&[wait], false)?;
    prepared
}

/// Rank 0: wait for every rank's stream, run everything, release every rank.
#[allow(clippy::too_many_arguments)]
fn lead(
    comm: &Comm,
    g: &CommGpu,
    reqs: &[OpRequest],
    all: &[u8],
    desc_len: usize,
    stream: Stream,
    capturing: bool,
    seq: u32,
    share: Share,
) -> Result<()> {
    let n = comm.nranks;
    let mut waits: Vec<FlagOp> = if capturing {
        (1..n)
            .flat_map(|r| {
                [FlagOp::WaitEq(g.flag_addr(r, Word::Ready), 1), FlagOp::Write(g.flag_addr(r, Word::Ready), 0)]
            })
            .collect()
    } else {
        (1..n).map(|r| FlagOp::WaitGeq(g.flag_addr(r, Word::ReadySeq), seq)).collect()
    };
    // The others read rank 0's inputs and scalars too ([`Share`]); a failure here still goes
    // through the flags below, so that nobody waits for ever.
    let staged = if share.own_blocks() { stage_scalars(g, reqs, 0, stream) } else { Ok(()) };
    if share.own_blocks() {
        waits.insert(0, FlagOp::Write(g.flag_addr(0, Word::ReadySeq), seq));
    }
    stream.flag_ops(&waits, capturing)?;
    let everyone_described = (1..n).all(|r| all[r * desc_len + 4] == 0);
    let launched = staged.and_then(|()| {
        if everyone_described {
            launch_for_all(comm, reqs, all, desc_len, stream, g.dev, g.peer_gpus, share)
        } else {
            Err(Error::remote("a rank could not export its device buffers through CUDA IPC (see its log)"))
        }
    });
    let mut releases = Vec::with_capacity(3 * n);
    if share.own_blocks() {
        releases.extend((1..n).map(|r| FlagOp::WaitGeq(g.flag_addr(r, Word::FoldedSeq), seq)));
    }
    if let Err(e) = &launched {
        log::warn!(target: "COLL", "device operation on rank 0: {e}");
        comm.set_async_error(e);
        releases.extend((1..n).map(|r| FlagOp::Write(g.flag_addr(r, Word::Error), 1)));
    }
    if capturing {
        releases.extend((1..n).map(|r| FlagOp::Write(g.flag_addr(r, Word::Done), 1)));
    } else {
        releases.extend((1..n).map(|r| FlagOp::Write(g.flag_addr(r, Word::DoneSeq), seq)));
    }
    stream.flag_ops(&releases, capturing)?;
    launched
}

/// Fills this rank's part of the gather: IPC exports of its buffers.
fn describe_buffers(comm: &Comm, reqs: &[OpRequest], mine: &mut [u8]) -> Result<()> {
    for (i, req) in reqs.iter().enumerate() {
        let d = &mut mine[DESC_HEADER_BYTES + i * OP_DESC_BYTES..][..OP_DESC_BYTES];
        let (send_len, recv_len) = buffer_lengths(req, comm.rank, comm.nranks)?;
        if send_len > 0 {
            ipc::export(req.send)?.encode(&mut d[..ipc::EXPORT_BYTES]);
        }
        if recv_len > 0 {
            ipc::export(req.recv)?.encode(&mut d[ipc::EXPORT_BYTES..2 * ipc::EXPORT_BYTES]);
        }
        if let Some(Pre::Mul(bits)) = req.reduction.map(|r| r.pre) {
            d[PRE_AT..PRE_AT + 8].copy_from_slice(&bits);
            d[PRE_AT + 8] = u8::from(req.pre_device.is_some());
        }
    }
    Ok(())
}

/// Where the failure of another rank shows (`ncclCommGetAsyncError`): rank 0 marks it in the
/// page; found there, it is recorded on the communicator.
pub fn poll_async_error(comm: &Comm) {
    let Some(g) = comm.with_layer_state(|s: &mut super::LayerState| s.gpu.clone()) else { return };
    if g.word(comm.rank, Word::Error).load(Ordering::Acquire) != 0 {
        comm.set_async_error(&Error::remote("rank 0 failed to run a device operation (see its log)"));
    }
}

/// ncclCommAbort: releases this rank's streams from waits on the page (their operations are
/// abandoned; the page is then kept until the process ends).
pub fn release_streams(comm: &Comm) {
    let Some(g) = comm.with_layer_state(|s: &mut super::LayerState| s.gpu.clone()) else { return };
    g.unsure.store(true, Ordering::Release); // never unregister: streams may still run
    g.word(comm.rank, Word::Error).store(1, Ordering::Release);
    // Sequence flags jump far ahead of every operation this rank queued (a wait is a cyclic
    // comparison, so half the number space ahead passes them all).
    let ahead = g.submitted.load(Ordering::Acquire).wrapping_add(1 << 30);
    let mut flags = vec![(comm.rank, Word::Done, 1), (comm.rank, Word::DoneSeq, ahead)];
    if comm.rank == 0 {
        flags.extend((1..comm.nranks).flat_map(|r| [(r, Word::Ready, 1), (r, Word::ReadySeq, ahead)]));
    }
    if g.peer_gpus {
        // Each rank folding its own blocks ([`Share`]) also waits for every rank's ready flag,
        // and rank 0 for every rank's fold.
        for r in (0..comm.nranks).filter(|&r| r != comm.rank) {
            flags.push((r, Word::ReadySeq, ahead));
            if comm.rank == 0 {
                flags.push((r, Word::FoldedSeq, ahead));
            }
        }
    }
    // Flags in the host page are written from the host: a stream could be held up behind the
    // very waits it should release, on a hardware queue it shares with them. Those in device
    // memory (the one-GPU block) go through ferroccl's own stream, which no user stream orders;
    // there the same hazard remains when rank threads share the GPU's queues and a user stream
    // waiting on a flag sits before it in one (processes have queues of their own).
    let (host, device): (Vec<_>, Vec<_>) = flags.into_iter().partition(|&(_, w, _)| g.in_page(w));
    for (r, w, v) in host {
        g.word(r, w).store(v, Ordering::Release);
    }
    if device.is_empty() {
        return;
    }
    let released = crate::cuda::stream::private_stream_on(comm.cuda_dev)
        .and_then(|s| device.iter().try_for_each(|&(r, w, v)| s.fill32(g.flag_addr(r, w), v, 1)));
    if let Err(e) = released {
        log::warn!(target: "COLL", "abort: could not release the streams waiting on device operations: {e}");
    }
}

/// NCCL's channel lines for this path, once per communicator, and a hint when processes
/// share the GPU.
fn log_path_once(comm: &Arc<Comm>) {
    let first = comm.with_layer_state(|s: &mut super::LayerState| !std::mem::replace(&mut s.gpu_logged, true));
    if !first {
        return;
    }
    let (rank, n, dev) = (comm.rank, comm.nranks, comm.cuda_dev);
    let dev_of = |r: usize| comm.peers.iter().find(|p| p.rank == r).map_or(dev, |p| p.cuda_dev);
    for peer in (1..n).map(|d| (rank + d) % n) {
        log::info!(target: "P2P", "Channel 00/0 : {rank}[{dev}] -> {peer}[{}] via P2P/IPC", dev_of(peer));
    }
    if placement_of(comm) == Placement::PeerGpus && rank == 0 {
        log::info!(
            target: "INIT",
            "ranks on {} GPUs with peer access: rank 0's GPU (device {dev}) runs each collective's kernels, reading and \
             writing the other GPUs' buffers over the link",
            {
                let mut gpus: Vec<u64> = comm.peers.iter().map(|p| p.gpu.bus).collect();
                gpus.sort_unstable();
                gpus.dedup();
                gpus.len()
            }
        );
        return;
    }
    let processes = {
        let mut pids: Vec<u32> = comm.peers.iter().map(|p| p.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        pids.len()
    };
    if processes > 1 && rank == 0 {
        log::info!(
            target: "INIT",
            "{processes} processes share CUDA device {dev}: rank 0 runs each collective's kernels for all of them; \
             with the MPS daemon (nvidia-cuda-mps-control -d) their own work would not take turns on the GPU"
        );
    }
}

/// Gathers `mine` (the same length on every rank) to rank 0's `all`.
fn host_gather(comm: &Arc<Comm>, mine: &[u8], all: &mut [u8]) -> Result<()> {
    if comm.nranks == 1 {
        all.copy_from_slice(mine);
        return Ok(());
    }
    let req = host_request(CollOp::Gather { root: 0 }, mine.as_ptr(), all.as_mut_ptr(), mine.len());
    super::run_one(comm, &req)
}

/// Gathers `mine` (the same length on every rank) to every rank's `all`.
fn host_all_gather(comm: &Arc<Comm>, mine: &[u8], all: &mut [u8]) -> Result<()> {
    if comm.nranks == 1 {
        all.copy_from_slice(mine);
        return Ok(());
    }
    let req = host_request(CollOp::AllGather, mine.as_ptr(), all.as_mut_ptr(), mine.len());
    super::run_one(comm, &req)
}

fn host_broadcast(comm: &Arc<Comm>, buf: &mut [u8]) -> Result<()> {
    let req = host_request(CollOp::Broadcast { root: 0 }, buf.as_ptr(), buf.as_mut_ptr(), buf.len());
    super::run_one(comm, &req)
}

/// A host-buffer exchange that belongs to a device call (`device_call` set).
pub(super) fn host_request(op: CollOp, send: *const u8, recv: *mut u8, count: usize) -> OpRequest {
    OpRequest {
        op,
        send,
        recv,
        count,
        dtype: crate::types::DataType::Uint8,
        reduction: None,
        mem: MemKind::Host,
        stream: Stream(0),
        pre_device: None,
        // These exchanges belong to a device call: a rank that passed host buffers to the same
        // call is told so instead of being matched against them.
        device_call: true,
    }
}

/// This rank's part (`share`): every rank's buffers resolved in this process, then one kernel
/// per output set (one pass over the data where the operation allows), or copies.
// Loops run over rank numbers, which index several per-rank tables at once.
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
fn launch_for_all(
    comm: &Comm,
    reqs: &[OpRequest],
    all: &[u8],
    desc_len: usize,
    stream: Stream,
    dev: u64,
    peer_gpus: bool,
    share: Share,
) -> Result<()> {
    let n = comm.nranks;
    let my_rank = comm.rank;
    let me = std::process::id();
    let mut scalar_slot = vec![0usize; n];
    // The group's folds go out in as few launches as their buffers allow (cuda::batch).
    let launches = std::cell::RefCell::new(Launches::new(stream));
    for (i, req) in reqs.iter().enumerate() {
        let es = req.dtype.size();
        let block = req.count * es;
        let mut send = Vec::with_capacity(n);
        let mut recv = Vec::with_capacity(n);
        let mut pre = Vec::with_capacity(n);
        let own_pre = req.reduction.as_ref().map_or(PreScalar::None, |r| kernels::from_reduction(r).1);
        // Device-resident scalars sit in page slots numbered by operation: count every
        // operation's, including those this rank leaves to others.
        let acting = share.does(req.op);
        for r in 0..n {
            if r == my_rank {
                send.push(req.send);
                recv.push(req.recv);
                pre.push(match req.pre_device {
                    Some(at) => PreScalar::Device(at as *const u8),
                    None => own_pre,
                });
                continue;
            }
            let desc = &all[r * desc_len..][..desc_len];
            let pid = u32::from_le_bytes(desc[..4].try_into().map_err(|_| Error::internal("short descriptor"))?);
            let d = &desc[DESC_HEADER_BYTES + i * OP_DESC_BYTES..][..OP_DESC_BYTES];
            let (send_len, recv_len) = buffer_lengths(req, r, n)?;
            let resolve = |bytes: &[u8], len: usize| -> Result<*mut u8> {
                if len == 0 || !acting {
                    return Ok(std::ptr::null_mut());
                }
                let e = ipc::Export::decode(bytes).ok_or_else(|| Error::internal("bad buffer export"))?;
                if pid == me {
                    // A process mate's buffer on another device: this context must reach it.
                    let dev = comm.peers[r].cuda_dev;
                    if peer_gpus && dev != comm.cuda_dev {
                        crate::cuda::driver::enable_peer_access(dev)?;
                    }
                    Ok(e.addr as *mut u8)
                } else {
                    ipc::open(pid, &e)
                }
            };
            // Each rank folding its own reduce-scatter block writes only its own output.
            let recv_len = if share.own_blocks() && req.op == CollOp::ReduceScatter { 0 } else { recv_len };
            let their_recv = resolve(&d[ipc::EXPORT_BYTES..2 * ipc::EXPORT_BYTES], recv_len)?;
            if peer_gpus && req.op == CollOp::AllGather {
                // The rank copied its block into its own output on its own GPU (follow): read it
                // there, and the grouped copy skips the store onto its own source, so the block
                // crosses the link once, to the other outputs.
                send.push(their_recv.wrapping_add(r * block) as *const u8);
            } else {
                send.push(resolve(&d[..ipc::EXPORT_BYTES], send_len)? as *const u8);
            }
            recv.push(their_recv);
            // Every rank passes the same operator, but a PreMulSum scalar is each rank's own:
            // sent above, or, when device-resident, copied into the rank's page slot by its
            // stream just before its ready flag.
            pre.push(match req.reduction.map(|red| red.pre) {
                Some(Pre::Mul(_)) if d[PRE_AT + 8] == 1 => {
                    if scalar_slot[r] == SCALARS_PER_RANK {
                        return Err(Error::invalid_usage(format!(
                            "rank {r} passed more than {SCALARS_PER_RANK} operations with device-resident scalars in one group"
                        )));
                    }
                    let at = dev + CommGpu::scalar_offset(r, scalar_slot[r]) as u64;
                    scalar_slot[r] += 1;
                    PreScalar::Device(at as *const u8)
                }
                Some(Pre::Mul(_)) => {
                    let mut bits = [0u8; 8];
                    bits.copy_from_slice(&d[PRE_AT..PRE_AT + 8]);
                    PreScalar::Bits(bits)
                }
                _ => own_pre,
            });
        }
        if !acting {
            continue;
        }
        let copy_to_all = |outs: &[*mut u8], src: *const u8| -> Result<()> {
            let outs: Vec<*mut u8> = outs.iter().copied().filter(|&o| !std::ptr::eq(o, src)).collect();
            if outs.is_empty() || block == 0 {
                return Ok(());
            }
            if outs.len() == 1 {
                // SAFETY: both are live device buffers of the ranks (exported by them for
                // this operation, which they keep alive until it completes) of at least
                // `block` bytes at these offsets, by NCCL's buffer-size rules.
                return unsafe { launches.borrow_mut().copy(outs[0], src, block) };
            }
            // One read of the source for all outputs: a one-input fold (a copy) with more
            // outputs; needs the copy kernels of a byte type, loaded at init.
            need_kernels(crate::types::DataType::Uint8)?;
            let f = kernels::Fold {
                dtype: crate::types::DataType::Uint8,
                kind: crate::reduce::ReduceKind::Sum,
                out: outs[0],
                inputs: &[src],
                pre: &[],
                post_div: None,
                count: block,
                more_outs: &outs[1..],
            };
            // SAFETY: as for the copy above.
            unsafe { launches.borrow_mut().fold(&f) }
        };
        // Rank g's `send`-side block to every output at offset g * block, as one kernel.
        let grouped_copy = |sources: &[*const u8], outs: &[*mut u8]| -> Result<bool> {
            if block == 0 {
                return Ok(true);
            }
            need_kernels(crate::types::DataType::Uint8)?;
            let f = kernels::FanOut { sources, outs, bytes: block };
            // SAFETY: sources and outputs are the ranks' live device buffers (exported for
            // this operation and kept until it completes) of at least `block` bytes per source
            // and `n * block` per output, by NCCL's buffer-size rules.
            unsafe { launches.borrow_mut().fan_out(&f) }
        };
        let fold = |out: *mut u8, more_outs: &[*mut u8], inputs: &[*const u8]| -> Result<()> {
            let f = fold_of(req, &pre, out, more_outs, inputs)?;
            // SAFETY: out and inputs are live device buffers of `count` elements (as above).
            unsafe { launches.borrow_mut().fold(&f) }
        };
        // Rank k's block of every input folded into rank k's output, for every k, as one kernel.
        let grouped_fold = |outs: &[*mut u8], inputs: &[*const u8]| -> Result<bool> {
            let f = fold_of(req, &pre, outs[0], &[], inputs)?;
            // SAFETY: the inputs are live device buffers of `n * block` bytes and the outputs
            // of `count` elements (exported for this operation and kept until it completes).
            unsafe { launches.borrow_mut().fold_groups(&f, outs, block) }
        };
        // SAFETY (offsets below): NCCL's size rules give every buffer used here room for
        // `n * block` bytes where a block index is added.
        let at = |p: *const u8, k: usize| p.wrapping_add(k * block);
        match req.op {
            // One pass: every input read once, every rank's output written once.
            CollOp::AllReduce => fold(recv[0], &recv[1..], &send)?,
            CollOp::Reduce { root } => fold(recv[root], &[], &send)?,
            // This rank's own block only, on its own GPU ([`Share`]).
            CollOp::ReduceScatter if share.own_blocks() => {
                let inputs: Vec<*const u8> = send.iter().map(|&s| at(s, my_rank)).collect();
                fold(recv[my_rank], &[], &inputs)?;
            }
            CollOp::ReduceScatter if grouped_fold(&recv, &send)? => {}
            CollOp::ReduceScatter => {
                for k in 0..n {
                    let inputs: Vec<*const u8> = send.iter().map(|&s| at(s, k)).collect();
                    fold(recv[k], &[], &inputs)?;
                }
            }
            // One launch when the buffers allow it (kernels::fan_out_params), else one per
            // source.
            CollOp::AllGather if grouped_copy(&send, &recv)? => {}
            CollOp::AllGather => {
                for j in 0..n {
                    let outs: Vec<*mut u8> = recv.iter().map(|&r| at(r, j) as *mut u8).collect();
                    copy_to_all(&outs, send[j])?;
                }
            }
            CollOp::Broadcast { root } => copy_to_all(&recv, send[root])?,
            CollOp::AlltoAll => {
                for k in 0..n {
                    let sources: Vec<*const u8> = send.iter().map(|&s| at(s, k)).collect();
                    if grouped_copy(&sources, &recv[k..=k])? {
                        continue;
                    }
                    for j in 0..n {
                        copy_to_all(&[at(recv[k], j) as *mut u8], at(send[j], k))?;
                    }
                }
            }
            CollOp::Gather { root } if grouped_copy(&send, &recv[root..=root])? => {}
            CollOp::Gather { root } => {
                for j in 0..n {
                    copy_to_all(&[at(recv[root], j) as *mut u8], send[j])?;
                }
            }
            CollOp::Scatter { root } => {
                for k in 0..n {
                    copy_to_all(&[recv[k]], at(send[root], k))?;
                }
            }
            CollOp::Send { .. } | CollOp::Recv { .. } => {
                return Err(Error::internal("point-to-point operation on the one-GPU path"))
            }
        }
    }
    launches.into_inner().flush()
}

/// The request's reduction as a fold of `inputs` into `out` (and `more_outs`), with the ranks'
/// pre scalars; its kernels must be loaded.
fn fold_of<'a>(
    req: &OpRequest,
    pre: &'a [PreScalar],
    out: *mut u8,
    more_outs: &'a [*mut u8],
    inputs: &'a [*const u8],
) -> Result<kernels::Fold<'a>> {
    let red = req.reduction.ok_or_else(|| Error::internal("reduction without an operator"))?;
    need_kernels(req.dtype)?;
    let (kind, _, post_div) = kernels::from_reduction(&red);
    Ok(kernels::Fold {
        dtype: req.dtype,
        kind,
        out,
        inputs,
        pre: if red.has_pre() { pre } else { &[] },
        post_div,
        count: req.count,
        more_outs,
    })
}

fn need_kernels(dtype: crate::types::DataType) -> Result<()> {
    if kernels::loaded(dtype) {
        return Ok(());
    }
    // Building them now could wait for streams that wait on this very operation.
    Err(Error::invalid_usage(
        "the CUDA reduction kernels were not built for this context: create communicators with the CUDA \
         device current (cudaSetDevice before ncclCommInitRank), as NCCL requires",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_layout_keeps_flags_and_scalars_apart() {
        let last_flag_end = MAX_RANKS * LINE_BYTES;
        assert!(CommGpu::scalar_offset(0, 0) >= last_flag_end);
        assert_eq!(CommGpu::scalar_offset(MAX_RANKS - 1, SCALARS_PER_RANK - 1) + 8, PAGE_BYTES);
        assert!(4 * (Word::DoneSeq as usize) + 4 <= LINE_BYTES);
    }

    #[test]
    fn placement_takes_peer_gpus_only_when_rank_0_reaches_all() {
        let (a, b, c) = (1 << 48 | 0x19 << 8, 1 << 48 | 0x3b << 8, 1 << 48 | 0x4c << 8);
        let nvlink = [a, b, c];
        assert_eq!(placement(&[a, a, a], &[a], false), Placement::OneGpu);
        assert_eq!(placement(&[a, b], &nvlink, false), Placement::PeerGpus);
        assert_eq!(placement(&[a, b, a, b], &[a, b], false), Placement::PeerGpus);
        // Rank 0's GPU must reach each rank's; what the others reach does not matter here.
        assert_eq!(placement(&[b, a], &[b], false), Placement::Elsewhere);
        assert_eq!(placement(&[a, c], &[a, b], false), Placement::Elsewhere, "no peer access to c");
        assert_eq!(placement(&[0, 0], &[], false), Placement::Elsewhere, "no GPU");
        assert_eq!(placement(&[a, 0], &[a], false), Placement::Elsewhere, "a rank without a GPU");
        assert_eq!(placement(&[], &nvlink, false), Placement::Elsewhere);
        // The test switch: several ranks on one GPU take the peer path.
        assert_eq!(placement(&[a, a], &[a], true), Placement::PeerGpus);
        assert_eq!(placement(&[a], &[a], true), Placement::OneGpu);
    }

    #[test]
    fn captures_are_refused_only_where_threads_share_a_gpu() {
        use crate::cuda::driver::GpuIdentity;
        use crate::wire::peer_info::PeerInfo;
        let peer = |rank: usize, host: u64, pid: u32, bus: u64| PeerInfo {
            rank,
            host_hash: host,
            pid,
            cuda_dev: 0,
            net_handle: Vec::new(),
            shm: true,
            gpu: GpuIdentity { bus, reach: vec![bus] },
        };
        let (a, b) = (0x19 << 8, 0x3b << 8);
        // A process per rank (mpirun), even on one GPU: separate contexts, separate queues.
        assert!(!threads_share_a_gpu(&[peer(0, 1, 10, a), peer(1, 1, 11, a), peer(2, 1, 12, a)]));
        // Threads of one process on GPUs of their own (a context each).
        assert!(!threads_share_a_gpu(&[peer(0, 1, 10, a), peer(1, 1, 10, b)]));
        // The same pid on another host is another process.
        assert!(!threads_share_a_gpu(&[peer(0, 1, 10, a), peer(1, 2, 10, a)]));
        // Two threads of one process on one GPU, wherever they are in the rank order.
        assert!(threads_share_a_gpu(&[peer(0, 1, 10, a), peer(1, 1, 10, a)]));
        assert!(threads_share_a_gpu(&[peer(0, 1, 11, b), peer(1, 1, 10, a), peer(2, 1, 12, b), peer(3, 1, 10, a)]));
        assert!(threads_share_a_gpu(&[peer(0, 1, 10, 0), peer(1, 1, 10, 0)]), "GPUs unknown");
        assert!(!threads_share_a_gpu(&[peer(0, 1, 10, a)]));
    }
}
