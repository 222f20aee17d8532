//! Staged operations captured into a CUDA graph.
//!
//! Ranks that stage device buffers through host memory (GPUs without peer access, other
//! hosts, `NCCL_P2P_DISABLE=1`) run each operation on their thread's stream worker
//! ([`super::stream`]). Its flags count operations, which a graph replaying the same nodes
//! cannot, and its staging comes from a pool it recycles. A captured operation (or group) gets
//! staging and a flag of its own instead, and a host node tells the worker when a replay has
//! copied its inputs (or, piece by piece, is about to):
//!
//! ```text
//! graph:   copy inputs to its staging -> host node: hand the replay to the worker -> wait done == 1 -> done = 0 -> copy outputs back
//! worker:  run the host engine on the staging -> done = 1
//! ```
//!
//! A single operation of two pieces or more (as the uncaptured path cuts them,
//! [`super::progressive`]) is replayed piece by piece, so that the copies overlap the
//! transfers: the host node comes first, the graph then copies each input piece and sets its
//! landed flag, waits for each output piece's released flag and copies it back, and at the end
//! sets every flag back to 0 for the next replay. A large all-reduce, broadcast or reduce is
//! first cut into separate operations as the uncaptured path cuts it (so every rank runs the
//! same operations, whether it captured them or not), each captured as above.
//!
//! The staging and the flag are buffers of the worker's pool (`staging_pool`), held for as
//! long as the graph lives: the graph owns the operation (a CUDA user object), and when the
//! graph and its executables are destroyed it goes back to the worker, which returns its
//! buffers to the pool. Nothing is freed: freeing pinned memory waits for every stream of the
//! context, one waiting on the worker included.
//!
//! Each replay is one more operation on its communicators, in the order replays reach the
//! worker, as if the calls were made again. The library does not see graph launches: a replay
//! is ordered with this thread's other staged calls only by stream order (and events). Every
//! rank must reach its operations in the same order, so a graph launched on a stream that no
//! event ties to another stream with staged calls of the same communicator can deadlock the
//! ranks, and a host-buffer call after a launch must wait for the launch's stream first. A
//! graph must not run concurrently with itself (two executables of it, or copies of it as
//! child graphs, on unordered streams): they share one set of staging and one flag block.
//!
//! Operations captured one after another on one stream run one after another at every replay
//! (each waits for the worker before the next copies in), so they share staging: a graph of
//! many calls (nccl-tests `-G` captures `-n` of them, a model's step one per layer) holds
//! buffers for its largest call, not for each.

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc};

use super::local_order::LocalOrder;
use super::progressive::{self, Pieces, StageProgress};
use super::stream::{queue_input_pieces, queue_output_pieces, stage_request, ToWorker};
use super::{buffer_lengths, OpRequest};
use crate::comm::Comm;
use crate::cuda::graph;
use crate::cuda::memory::Pinned;
use crate::cuda::stream::{FlagOp, Stream};
use crate::error::{Error, Result};

/// One captured operation or group, owned by its graph.
pub struct Captured {
    /// Per communicator, its operations in call order, on the staging below.
    by_comm: Vec<(Arc<Comm>, Vec<OpRequest>)>,
    /// Inputs, outputs and device scalars, as the requests above point at them (shared with
    /// the operations captured before and after it on the stream: [`SharedStaging`]), and the
    /// flag: pool indices and buffers.
    staging: Vec<(usize, Arc<Pinned>)>,
    /// The flag block: a word at 0 that is 1 when the worker has run a replay, and for an
    /// operation staged piece by piece its pieces' flags from [`PIECE_FLAGS_AT`]; the graph sets
    /// them back to 0 at the end of each replay.
    done: Arc<Pinned>,
    /// An operation staged piece by piece: its input's and output's pieces.
    pieces: Option<(Pieces, Pieces)>,
    to_worker: mpsc::Sender<ToWorker>,
}

/// Where an operation staged piece by piece has its pieces' flags in the flag block (a cache
/// line away from the done word, which the stream polls).
const PIECE_FLAGS_AT: usize = 64;

/// The sequence number of every replay: the graph sets each flag to it, or waits for it, and
/// sets them all back to one less (0) before the replay ends.
const REPLAY_SEQ: u32 = 1;

// SAFETY: the requests point into the staging this value owns (never at the caller's memory:
// device addresses are replaced at capture); the worker is their only user while it runs a
// replay, and the graph's copies touch the staging only while the worker does not, or (piece
// by piece) only input pieces not yet flagged landed, which no step reads before, and output
// pieces released, which no step writes after.
unsafe impl Send for Captured {}
// SAFETY: as above; through shared references the requests and buffer list are only read
// (never changed after capture), the channel is Sync and the flag block's words are atomic.
unsafe impl Sync for Captured {}

impl Captured {
    fn done_word(&self) -> &AtomicU32 {
        // SAFETY: the flag block is at least 4 bytes of page-aligned pinned memory that lives
        // as long as self; the GPU reads and writes it with 32-bit memory operations.
        unsafe { &*(self.done.as_ptr() as *const AtomicU32) }
    }

    /// The requests of one replay (each replay reads its device scalars afresh).
    pub(super) fn ops(&self) -> Vec<(Arc<Comm>, Vec<OpRequest>)> {
        self.by_comm.clone()
    }

    /// An operation staged piece by piece: the flags its replays exchange with the graph.
    pub(super) fn progress(&self) -> Option<StageProgress> {
        let (input, output) = self.pieces?;
        // SAFETY: the flag block holds PIECE_FLAGS_AT + FLAG_BYTES bytes of page-aligned pinned
        // memory (see capture) that live as long as self; the graph and the worker access them
        // only as 32-bit words.
        Some(unsafe { StageProgress::new(self.done.as_ptr().add(PIECE_FLAGS_AT), REPLAY_SEQ, input, output) })
    }

    /// Releases the graph's stream for this replay: every output piece, then the done word
    /// (after the run, or when it failed or could not start).
    pub(super) fn release(&self) {
        if let Some(progress) = self.progress() {
            progress.release_all();
        }
        self.done_word().store(1, Ordering::Release);
    }

    /// The pool buffers it holds (the flag's included), to give back when its graph is gone.
    pub(super) fn pool_indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.staging.iter().map(|&(i, _)| i)
    }
}

/// Where captured operations take their buffers: the stream worker's pool.
pub(super) trait GraphStaging {
    /// A buffer of at least `len` bytes no one else uses, held for a graph: (pool index, buffer).
    fn hold_new(&self, len: usize) -> Result<(usize, Arc<Pinned>)>;
    /// Buffer `index`, already held for this graph, held once more (for another operation).
    fn hold_again(&self, index: usize) -> Arc<Pinned>;
    /// One hold of buffer `index` ends.
    fn release(&self, index: usize);
}

/// Buffers held for an operation being captured, released unless the graph takes them.
struct Held<'a> {
    pool: &'a dyn GraphStaging,
    list: Vec<(usize, Arc<Pinned>)>,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        for (index, _) in self.list.drain(..) {
            self.pool.release(index);
        }
    }
}

/// Records `ops`, staged device-buffer operations of one group (or one call), into the graph
/// their stream is capturing. Nothing runs now; each replay of the graph runs them once.
pub(super) fn capture(
    ops: Vec<(Arc<Comm>, OpRequest)>,
    to_worker: mpsc::Sender<ToWorker>,
    pool: &dyn GraphStaging,
) -> Result<()> {
    let stream = ops[0].1.stream;
    if ops.iter().any(|(_, r)| !r.mem.is_device()) {
        return Err(Error::invalid_usage(
            "CUDA graph capture of a group that mixes host buffers (which run at the call) with device buffers",
        ));
    }
    if ops.iter().any(|(_, r)| r.stream != stream) {
        return Err(Error::invalid_usage(
            "CUDA graph capture of staged operations (ranks on other GPUs or hosts, or NCCL_P2P_DISABLE=1) on more \
             than one stream in one group: capture each stream's operations in a group of their own",
        ));
    }
    if ops.iter().any(|(c, _)| LocalOrder::staged(c).is_some()) {
        return Err(Error::invalid_usage(
            "CUDA graph capture of staged operations by ranks that are threads of one process: their replays could \
             wait on each other in the context's shared hardware queues; run them outside stream capture",
        ));
    }
    if let [(comm, req)] = ops.as_slice() {
        if let Some(ranges) = super::stream::separate_ranges(req) {
            // Cut as an uncaptured call is (every rank runs the same operations, whichever
            // captured them): separate operations, one after another, each replayed piece by
            // piece.
            let es = req.dtype.size();
            for (a, b) in ranges {
                let mut part = *req;
                part.count = b - a;
                // Offsets only into buffers the operation has (a non-root's may be null).
                if !req.send.is_null() {
                    part.send = req.send.wrapping_add(a * es);
                }
                if !req.recv.is_null() {
                    part.recv = req.recv.wrapping_add(a * es);
                }
                capture_one(vec![(comm.clone(), part)], to_worker.clone(), pool)?;
            }
            return Ok(());
        }
    }
    capture_one(ops, to_worker, pool)
}

/// [`capture`] for one operation or group as the worker will run it.
fn capture_one(
    ops: Vec<(Arc<Comm>, OpRequest)>,
    to_worker: mpsc::Sender<ToWorker>,
    pool: &dyn GraphStaging,
) -> Result<()> {
    let stream = ops[0].1.stream;
    let (capture_id, graph) = stream.capture_info()?;
    let pieces = match ops.as_slice() {
        [(comm, req)] => {
            let (send_len, recv_len) = buffer_lengths(req, comm.rank, comm.nranks)?;
            let piece = super::stream::piece_bytes();
            super::stream::worth_pieces((send_len, recv_len), piece).then(|| {
                let es = req.dtype.size();
                (Pieces::new(send_len, piece, es), Pieces::new(recv_len, piece, es))
            })
        }
        _ => None,
    };
    let mut shared = SharedStaging::of(capture_id, stream);
    let mut held = Held { pool, list: Vec::new() };
    let mut staged = Vec::with_capacity(ops.len());
    let mut requests = Vec::with_capacity(ops.len());
    for (comm, req) in ops {
        let s = stage_request(&comm, req, |len| {
            let taken = shared.take(pool, len)?;
            let at = taken.1.as_ptr();
            held.list.push(taken);
            Ok(at)
        })?;
        staged.push((comm.clone(), s.host));
        requests.push((comm, s));
    }
    // A flag block of its own (never shared: each operation's replay sets and resets it).
    let flag_bytes = if pieces.is_some() { PIECE_FLAGS_AT + progressive::FLAG_BYTES } else { 4 };
    let (flag_index, done) = pool.hold_new(flag_bytes)?;
    held.list.push((flag_index, done.clone()));
    let done_dev = done.device_ptr()?;
    let staging = std::mem::take(&mut held.list);
    let captured = Arc::new(Captured { by_comm: super::by_communicator(staged), staging, done, pieces, to_worker });
    // A pool buffer may hold anything; no stream or worker uses it now.
    captured.done_word().store(0, Ordering::Relaxed);
    let progress = captured.progress();
    if let Some(progress) = &progress {
        progress.reset();
    }
    // The graph holds a reference from here on; the host node below borrows it.
    let owned = Arc::into_raw(captured.clone()) as *mut c_void;
    // SAFETY: the graph is this stream's capture, under way on this thread; graph_destroyed
    // takes back exactly this reference, once.
    let given = unsafe { graph::give_to_graph(graph, owned, graph_destroyed) };
    // On failure the reference stays out, and the buffers held: a user object made before the
    // failure may still call graph_destroyed with it (a rare leak, never a dangling pointer
    // or a buffer taken twice).
    given?;
    shared.keep();
    // Failures below invalidate the capture (the caller gets the error and must not launch
    // what it captured); the graph it made, if any, gives the staging back when destroyed.
    // The copies below: one side is staging the graph owns, the other the caller's device
    // buffer or scalar, valid whenever the graph runs (API contract, as for any captured call);
    // piece ranges lie within both (Pieces cover exactly the buffer's length).
    match (progress, requests.as_slice()) {
        (Some(progress), [(comm, s)]) => {
            // The worker reads the scalar when the replay starts; the input as it lands.
            if let Some((dst, src, len)) = s.scalar_in {
                // SAFETY: see above.
                unsafe { stream.copy(dst, src, len)? };
            }
            // SAFETY: replay_reached only borrows the value, which the graph keeps alive for
            // as long as the node can run.
            unsafe { stream.launch_host_fn(replay_reached, Arc::as_ptr(&captured) as *mut c_void)? };
            let flags_dev = done_dev + PIECE_FLAGS_AT as u64;
            let (input_order, output_order) = super::staged_orders(comm, &s.host, progress.input, progress.output);
            if let Some((dst, src, _)) = s.input_in {
                // SAFETY: see above.
                unsafe { queue_input_pieces(stream, (dst, src), progress.input, &input_order, flags_dev, REPLAY_SEQ)? };
            }
            if let Some((dst, src, _)) = s.copy_out {
                // SAFETY: see above.
                unsafe {
                    queue_output_pieces(stream, (dst, src), progress.output, &output_order, flags_dev, REPLAY_SEQ)?
                };
            }
            // The staging is the worker's until the replay is done (a send may still read it).
            stream.wait_flag_eq(done_dev, 1)?;
            let reset = REPLAY_SEQ - 1;
            let mut resets = vec![FlagOp::Write(done_dev, reset)];
            resets.extend(
                (0..progress.input.count())
                    .map(|k| FlagOp::Write(flags_dev + StageProgress::landed_offset(k) as u64, reset)),
            );
            resets.extend(
                (0..progress.output.count())
                    .map(|k| FlagOp::Write(flags_dev + StageProgress::released_offset(k) as u64, reset)),
            );
            stream.flag_ops(&resets, true)?;
        }
        _ => {
            for (dst, src, len) in requests.iter().flat_map(|(_, s)| s.copies_in()) {
                // SAFETY: see above.
                unsafe { stream.copy(dst, src, len)? };
            }
            // SAFETY: as above.
            unsafe { stream.launch_host_fn(replay_reached, Arc::as_ptr(&captured) as *mut c_void)? };
            stream.wait_flag_eq(done_dev, 1)?;
            stream.write_flag(done_dev, 0)?;
            for (dst, src, len) in requests.iter().filter_map(|(_, s)| s.copy_out) {
                // SAFETY: see above.
                unsafe { stream.copy(dst, src, len)? };
            }
        }
    }
    log::debug!(target: "COLL", "captured {} staged operation(s) into a CUDA graph (capture {capture_id}): each replay \
        copies their inputs to pinned staging{}, runs them on the host engine and copies the outputs back",
        captured.by_comm.iter().map(|(_, r)| r.len()).sum::<usize>(),
        if captured.pieces.is_some() { " piece by piece as the engine goes" } else { "" });
    Ok(())
}

/// The host node of a replay: its inputs are in the staging; the worker runs it.
unsafe extern "C" fn replay_reached(data: *mut c_void) {
    let ptr = data as *const Captured;
    // SAFETY: the graph holds a reference to this value (give_to_graph) for as long as its
    // nodes can run, so taking one more is sound.
    let captured = unsafe {
        Arc::increment_strong_count(ptr);
        Arc::from_raw(ptr)
    };
    let sender = captured.to_worker.clone();
    if let Err(mpsc::SendError(ToWorker::Replay(c))) = sender.send(ToWorker::Replay(captured)) {
        // No worker (the process is ending): release the stream rather than hold it for ever.
        c.release();
    }
}

/// The graph's user object was destroyed: the graph and its executables are gone and their
/// launched work is done. The worker gives its buffers back (this is CUDA's thread, which may
/// not call CUDA).
unsafe extern "C" fn graph_destroyed(data: *mut c_void) {
    // SAFETY: this is the reference give_to_graph handed the graph, returned once.
    let captured = unsafe { Arc::from_raw(data as *const Captured) };
    let sender = captured.to_worker.clone();
    if let Err(mpsc::SendError(msg)) = sender.send(ToWorker::Release(captured)) {
        // No worker to give it to: leak it rather than let anything be freed from here.
        std::mem::forget(msg);
    }
}

/// The staging of the operations captured last on each capturing stream of this thread: the
/// next operation captured after them in the same capture holds the same buffers once more
/// (the graph being captured holds them all).
struct SharedStaging {
    capture: u64,
    stream: Stream,
    /// (pool index, bytes) by the order operations take them.
    buffers: Vec<(usize, usize)>,
    /// Buffers taken by the operation being captured (the next one takes index `taken`).
    taken: usize,
}

thread_local! {
    static LAST_CAPTURED: RefCell<Vec<SharedStaging>> = const { RefCell::new(Vec::new()) };
}

/// Streams of a thread remembered at most (captures rarely run on more at once).
const REMEMBERED_STREAMS: usize = 16;

impl SharedStaging {
    /// What the last operation captured on `stream` in capture `capture` left, or nothing.
    fn of(capture: u64, stream: Stream) -> SharedStaging {
        let found = LAST_CAPTURED.with(|l| {
            let mut l = l.borrow_mut();
            let at = l.iter().position(|s| s.stream == stream)?;
            let s = l.remove(at);
            (s.capture == capture).then_some(s)
        });
        found.unwrap_or(SharedStaging { capture, stream, buffers: Vec::new(), taken: 0 })
    }

    /// A buffer of at least `len` bytes that no other operation of this group uses: the one
    /// the operation before took at this index, if large enough.
    fn take(&mut self, pool: &dyn GraphStaging, len: usize) -> Result<(usize, Arc<Pinned>)> {
        let at = self.taken;
        self.taken += 1;
        if let Some(&(index, have)) = self.buffers.get(at) {
            if have >= len {
                return Ok((index, pool.hold_again(index)));
            }
        }
        let (index, b) = pool.hold_new(len)?;
        match self.buffers.get_mut(at) {
            Some(slot) => *slot = (index, b.len()),
            None => self.buffers.push((index, b.len())),
        }
        Ok((index, b))
    }

    /// Remembered for the next operation captured on the stream.
    fn keep(mut self) {
        self.taken = 0;
        LAST_CAPTURED.with(|l| {
            let mut l = l.borrow_mut();
            if l.len() == REMEMBERED_STREAMS {
                l.remove(0);
            }
            l.push(self);
        });
    }
}
