//! Operations on CUDA device buffers, ordered on the caller's stream.
//!
//! A call with device buffers returns at once. What it does is queued on the caller's stream
//! (and, for a group, on each stream its operations name):
//!
//! ```text
//! stream:  copy inputs to pinned staging -> write ready[slot] = seq -> wait done >= seq -> copy outputs back -> write out[slot] = seq
//! worker:                            wait ready[*] >= seq -> run the host engine on staging -> done = seq
//! ```
//!
//! A single operation of two pieces or more (FERROCCL_STAGE_PIECE each, at most 16) is
//! staged piece by piece ([`super::progressive`]): the stream flags each input piece as its copy
//! lands and copies each output piece back as soon as the worker releases it, while the host
//! engine starts every step once the input it reads has landed. The copies then overlap the
//! transfers instead of adding to them. From 32 MiB (`FERROCCL_STAGE_SEPARATE_MIN`) on, an all-reduce,
//! broadcast or reduce is instead run as separate operations on pieces of its buffers, which
//! the host engine runs faster than one operation of that size.
//!
//! The host engine ([`super::run`]) runs unchanged on the staged copies, on a worker thread
//! that belongs to the calling thread (so one thread's calls keep their order, and ranks that
//! are threads of one process progress independently). Streams and the worker hand work to
//! each other through 32-bit flags in pinned host memory with stream memory operations, never
//! a spinning kernel and never a host callback that waits (a blocked callback would stall
//! every stream of the process; a captured operation's host node only sends a message). Work
//! queued after the operation on the stream waits for it; work before it is finished before
//! its inputs are read.
//!
//! With one rank, operations are a device copy or one kernel on the caller's stream; when every
//! rank uses this host's one GPU, one rank's kernels read and write all ranks' buffers through
//! CUDA IPC (no staging, [`super::one_gpu`]); otherwise the staged path above runs. The first
//! two can be captured in a CUDA graph, and the staged path too ([`super::captured`]: staging
//! and a flag of the graph's own, and a host node that hands each replay to the worker).
//!
//! Failures are asynchronous: the communicator's async error is set (`ncclCommGetAsyncError`),
//! and the streams are released all the same, so nothing waits forever on a failed operation.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::captured::{Captured, GraphStaging};
use super::local_order::LocalOrder;
use super::progressive::{self, reached, Pieces, StageProgress};
use super::staging_pool::{staging_size, StagingPool, Taken};
use super::{buffer_lengths, one_gpu, CollOp, OpRequest};
use crate::comm::{Comm, CommState};
use crate::cuda::batch::Launches;
use crate::cuda::driver::{self, Context};
use crate::cuda::kernels;
use crate::cuda::memory::{MemKind, Pinned};
use crate::cuda::stream::Stream;
use crate::error::{Error, Result};
use crate::types::DataType;

/// Streams one worker can serve (each has a ready and an out flag).
const MAX_STREAMS: usize = 256;

/// The flags streams and the worker exchange: `done`, then `ready[slot]`, then `out[slot]`.
struct Flags {
    mem: Pinned,
    dev: u64,
}

impl Flags {
    fn new() -> Result<Flags> {
        let mem = Pinned::new(4 * (1 + 2 * MAX_STREAMS))?;
        let dev = mem.device_ptr()?;
        Ok(Flags { mem, dev })
    }

    fn word(&self, index: usize) -> &AtomicU32 {
        debug_assert!(index < 1 + 2 * MAX_STREAMS);
        // SAFETY: the pinned block holds 1 + 2*MAX_STREAMS aligned u32 words (page-aligned
        // allocation) and lives as long as self; the GPU writes them with 32-bit stores, so
        // atomic access from the host is sound.
        unsafe { &*(self.mem.as_ptr() as *const AtomicU32).add(index) }
    }

    fn done_addr(&self) -> u64 {
        self.dev
    }
    fn ready_addr(&self, slot: usize) -> u64 {
        self.dev + 4 * (1 + slot) as u64
    }
    fn out_addr(&self, slot: usize) -> u64 {
        self.dev + 4 * (1 + MAX_STREAMS + slot) as u64
    }
    fn ready(&self, slot: usize) -> u32 {
        self.word(1 + slot).load(Ordering::Acquire)
    }
    fn out(&self, slot: usize) -> u32 {
        self.word(1 + MAX_STREAMS + slot).load(Ordering::Acquire)
    }
    fn set_done(&self, seq: u32) {
        self.word(0).store(seq, Ordering::Release);
    }
}

/// What one calling thread's worker shares with that thread.
struct Shared {
    flags: Flags,
    context: Context,
    /// Streams by slot.
    streams: Mutex<Vec<Stream>>,
    pool: Mutex<StagingPool<Pinned>>,
    submitted: AtomicU32,
    completed: Mutex<u32>,
    completed_changed: Condvar,
}

impl Shared {
    fn slot_of(&self, stream: Stream) -> Result<usize> {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = streams.iter().position(|s| *s == stream) {
            return Ok(i);
        }
        if streams.len() == MAX_STREAMS {
            return Err(Error::invalid_usage(format!("more than {MAX_STREAMS} CUDA streams used from one thread")));
        }
        streams.push(stream);
        Ok(streams.len() - 1)
    }

    fn lock_pool(&self) -> std::sync::MutexGuard<'_, StagingPool<Pinned>> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A staging buffer of at least `len` bytes for job `job` (its last sequence number): a
    /// pooled one free by the pool's rules (the same-stream rule for stream `same_stream`),
    /// else a new one.
    fn take_staging(&self, len: usize, same_stream: Option<usize>, job: u32) -> Result<Taken<Pinned>> {
        let mut pool = self.lock_pool();
        if let Some(i) = pool.find(len, same_stream, |s| self.flags.out(s)) {
            return Ok(pool.take(i, job));
        }
        drop(pool);
        let (mem, size) = self.new_staging(len)?;
        Ok(self.lock_pool().add(mem, size, job))
    }

    /// A new pinned buffer for `len` bytes, none in the pool serving: the buffer and its size.
    fn new_staging(&self, len: usize) -> Result<(Pinned, usize)> {
        let (count, bytes) = self.lock_pool().totals();
        log::debug!(target: "COLL", "staging pool: new pinned buffer of {} bytes for {len} (pool holds {count} \
            buffers, {bytes} bytes, none free and of a serving size)", staging_size(len));
        let mem = Pinned::new(staging_size(len))?;
        let size = mem.len();
        Ok((mem, size))
    }

    fn wait_completed(&self, seq: u32) {
        let mut done = self.completed.lock().unwrap_or_else(|p| p.into_inner());
        while !reached(*done, seq) {
            done = self.completed_changed.wait(done).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl GraphStaging for Shared {
    fn hold_new(&self, len: usize) -> Result<(usize, Arc<Pinned>)> {
        let mut pool = self.lock_pool();
        if let Some(i) = pool.find(len, None, |s| self.flags.out(s)) {
            let t = pool.hold_for_graph(i);
            return Ok((t.index, t.buf));
        }
        drop(pool);
        let (mem, size) = self.new_staging(len)?;
        let t = self.lock_pool().add_for_graph(mem, size);
        Ok((t.index, t.buf))
    }

    fn hold_again(&self, index: usize) -> Arc<Pinned> {
        self.lock_pool().hold_for_graph(index).buf
    }

    fn release(&self, index: usize) {
        self.lock_pool().release_from_graph(index);
    }
}

/// The staging buffers one job being queued has taken (pool indices, and the stream slot
/// that copies each). Dropped before [`Claim::hand_over`] (its enqueue returned before the
/// worker got the job), they are free again once their streams pass the job's number.
struct Claim<'a> {
    shared: &'a Shared,
    job: u32,
    taken: Vec<(usize, usize)>,
    handed: bool,
}

impl<'a> Claim<'a> {
    fn new(shared: &'a Shared, job: u32) -> Claim<'a> {
        Claim { shared, job, taken: Vec::new(), handed: false }
    }

    /// A buffer of at least `len` bytes, copied on stream `slot`.
    fn take(&mut self, len: usize, slot: usize) -> Result<Arc<Pinned>> {
        self.take_under(len, slot, Some(slot))
    }

    /// A buffer the host writes at enqueue (a progressive flag block): never one an earlier
    /// call on the stream may still use (the pool's same-stream rule), and never taken by that
    /// rule later.
    fn take_host_written(&mut self, len: usize, slot: usize) -> Result<Arc<Pinned>> {
        self.take_under(len, slot, None)
    }

    /// A buffer for stream `slot`, found under the same-stream rule for `same_stream`.
    fn take_under(&mut self, len: usize, slot: usize, same_stream: Option<usize>) -> Result<Arc<Pinned>> {
        let t = self.shared.take_staging(len, same_stream, self.job)?;
        self.taken.push((t.index, slot));
        Ok(t.buf)
    }

    /// The job goes to the worker: its buffers are busy until the streams pass `marks`.
    /// `queued_whole`: every copy and flag of the job is on its streams, so a later call on
    /// the stream that copies a buffer may take it (the pool's same-stream rule). Returns the
    /// pool indices, for the job.
    fn hand_over(&mut self, marks: &[(usize, u32)], queued_whole: bool) -> Vec<usize> {
        self.handed = true;
        let mut pool = self.shared.lock_pool();
        for &(index, slot) in &self.taken {
            pool.handed_over(index, marks, queued_whole.then_some(slot));
        }
        self.taken.iter().map(|&(index, _)| index).collect()
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.handed {
            return;
        }
        let mut pool = self.shared.lock_pool();
        for &(index, slot) in &self.taken {
            pool.abandoned_before_worker(index, &[(slot, self.job)]);
        }
    }
}

/// One group's (or call's) device operations, as the worker runs them.
pub(super) struct Job {
    seq: u32,
    /// Per communicator, its operations in call order, on staged host copies.
    by_comm: Vec<(Arc<Comm>, Vec<OpRequest>)>,
    slots: Vec<usize>,
    /// Pool indices of its staging buffers (the last job of a chunked operation holds them).
    staging: Vec<usize>,
    /// Queuing its stream work failed part-way: the worker only signals done, so that whatever
    /// the streams already wait for is released.
    abandoned: bool,
    /// One operation whose staged buffers land and leave piece by piece.
    progress: Option<StageProgress>,
}

// SAFETY: a job carries addresses of staging memory it owns and of host buffers whose
// submitter waits for the job (API contract); the worker is the only user while it runs.
unsafe impl Send for Job {}

/// What a stream worker is handed: jobs in submission order, and the replays and releases of
/// operations captured into CUDA graphs ([`captured`]), as CUDA reaches them.
pub(super) enum ToWorker {
    Job(Job),
    Replay(Arc<Captured>),
    Release(Arc<Captured>),
}

struct Worker {
    shared: Arc<Shared>,
    jobs: mpsc::Sender<ToWorker>,
}

thread_local! {
    static WORKER: RefCell<Option<Worker>> = const { RefCell::new(None) };
}

fn with_worker<T>(f: impl FnOnce(&Worker) -> Result<T>) -> Result<T> {
    WORKER.with(|w| {
        let mut w = w.borrow_mut();
        if w.is_none() {
            *w = Some(start_worker()?);
        }
        f(w.as_ref().expect("set above"))
    })
}

fn start_worker() -> Result<Worker> {
    let context = driver::current_context()
        .ok_or_else(|| Error::invalid_usage("device buffers passed from a thread without a current CUDA context"))?;
    let shared = Arc::new(Shared {
        flags: Flags::new()?,
        context,
        streams: Mutex::new(Vec::new()),
        pool: Mutex::new(StagingPool::new()),
        submitted: AtomicU32::new(0),
        completed: Mutex::new(0),
        completed_changed: Condvar::new(),
    });
    let (tx, rx) = mpsc::channel::<ToWorker>();
    let worker_shared = shared.clone();
    std::thread::Builder::new()
        .name("ferroccl-stream".into())
        .spawn(move || worker_loop(&worker_shared, rx))
        .map_err(|e| Error::system("spawn stream worker", e))?;
    log::info!(target: "INIT", "CUDA: device-buffer operations of this thread run on a stream worker");
    Ok(Worker { shared, jobs: tx })
}

/// A worker's inbox: the channel, and the jobs taken from it while waiting for an earlier
/// job's inputs (a replay that job's stream waits behind must run meanwhile).
struct Inbox<'a> {
    shared: &'a Shared,
    rx: mpsc::Receiver<ToWorker>,
    pending: VecDeque<Job>,
}

impl Inbox<'_> {
    /// The next job, running replays and releases that arrive before it. `None`: every sender
    /// is gone (the thread and its graphs).
    fn next_job(&mut self) -> Option<Job> {
        loop {
            if let Some(job) = self.pending.pop_front() {
                return Some(job);
            }
            match self.rx.recv().ok()? {
                ToWorker::Job(job) => return Some(job),
                other => run_other(self.shared, other),
            }
        }
    }

    /// Runs the replays and releases already sent, keeping jobs for later.
    fn serve_graphs(&mut self) {
        while let Ok(msg) = self.rx.try_recv() {
            match msg {
                ToWorker::Job(job) => self.pending.push_back(job),
                other => run_other(self.shared, other),
            }
        }
    }
}

/// A replay of a captured operation, run at once (its stream waits for it), or a destroyed
/// graph's operation, whose buffers go back to the pool.
fn run_other(shared: &Shared, msg: ToWorker) {
    match msg {
        ToWorker::Replay(captured) => {
            let mut ops = captured.ops();
            let progress = captured.progress();
            let started = Instant::now();
            // The stream waits for the flags whatever happens: a panic is reported as a failure.
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_ops(&mut ops, progress.as_ref())))
                .unwrap_or_else(|_| Err(Error::internal("the host engine panicked in a graph replay")));
            if let Err(e) = ran {
                report_failure(&ops, &e);
            }
            captured.release();
            let count: usize = ops.iter().map(|(_, r)| r.len()).sum();
            log::trace!(target: "COLL", "graph replay of {count} captured operation(s): host engine {} us",
                started.elapsed().as_micros());
        }
        ToWorker::Release(captured) => {
            for index in captured.pool_indices() {
                shared.release(index);
            }
            log::debug!(target: "COLL", "a CUDA graph with staged operations was destroyed: its staging is free again");
            // The operation may hold the last references to its communicators, whose teardown
            // can wait for streams (CUDA frees), one of which may wait for this worker.
            let dropped = std::thread::Builder::new().name("ferroccl-graph-drop".into()).spawn(move || drop(captured));
            if let Err(e) = dropped {
                log::warn!(target: "COLL", "could not drop a destroyed graph's operation off the stream worker: {e}");
            }
        }
        ToWorker::Job(_) => unreachable!("jobs are queued, not run here"),
    }
}

/// Runs staged operations on the host engine (`progress`: one operation staged piece by piece).
fn run_ops(by_comm: &mut [(Arc<Comm>, Vec<OpRequest>)], progress: Option<&StageProgress>) -> Result<()> {
    for (comm, reqs) in by_comm.iter_mut() {
        comm.check_usable("device operation")?;
        for req in reqs.iter_mut() {
            read_staged_scalar(req)?;
        }
    }
    match (progress, &*by_comm) {
        (Some(progress), [(comm, reqs)]) if reqs.len() == 1 => super::run_progressive(comm, &reqs[0], *progress),
        _ => super::run(by_comm),
    }
}

/// A failed device operation's error goes to its communicators (`ncclCommGetAsyncError`).
fn report_failure(by_comm: &[(Arc<Comm>, Vec<OpRequest>)], e: &Error) {
    log::warn!(target: "COLL", "device-buffer operation failed: {e}");
    for (comm, _) in by_comm {
        comm.set_async_error(e);
    }
}

fn worker_loop(shared: &Shared, rx: mpsc::Receiver<ToWorker>) {
    if let Err(e) = driver::make_current(shared.context) {
        log::warn!(target: "INIT", "stream worker: {e}");
    }
    let mut inbox = Inbox { shared, rx, pending: VecDeque::new() };
    while let Some(mut job) = inbox.next_job() {
        let received = Instant::now();
        let received_wall = crate::debug::wall_us();
        let waited = if job.abandoned {
            Err(Error::internal("queuing the device operation on its stream failed (see the caller's error)"))
        } else {
            wait_ready(shared, &job, &mut inbox)
        };
        let ready = Instant::now();
        let result = waited.and_then(|()| run_ops(&mut job.by_comm, job.progress.as_ref()));
        if let Some(progress) = &job.progress {
            progress.release_all();
        }
        if let Err(e) = &result {
            report_failure(&job.by_comm, e);
        }
        // Released before the streams are: the caller's next operation on another stream,
        // queued as soon as this one's stream has passed it, must find these buffers free (a
        // new pinned allocation costs milliseconds).
        //
        // A job given up part-way never queued its out flag, so a later operation's would free
        // its buffers while a receive the engine posted before giving up may still write into
        // them (transports with helper threads): they are retired. Rare, and a leak.
        let retire = job.progress.as_ref().is_some_and(StageProgress::abandoned);
        {
            let mut pool = shared.lock_pool();
            for &index in &job.staging {
                pool.finished(index, job.seq, retire);
            }
        }
        shared.flags.set_done(job.seq);
        log::trace!(target: "COLL", "staged job {}: inputs ready after {} us, host engine {} us; worker got it @{} \
            and released the streams @{} (wall us)", job.seq, (ready - received).as_micros(), ready.elapsed().as_micros(),
            received_wall, crate::debug::wall_us());
        let mut done = shared.completed.lock().unwrap_or_else(|p| p.into_inner());
        *done = job.seq;
        shared.completed_changed.notify_all();
    }
}

/// Waits until every stream of the job has copied its inputs, running the graph replays that
/// arrive meanwhile (a stream may reach this job only after a replay queued before it). Gives
/// up when a communicator of the job is aborted (its streams are then released with the
/// others).
fn wait_ready(shared: &Shared, job: &Job, inbox: &mut Inbox<'_>) -> Result<()> {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        if job.slots.iter().all(|&slot| reached(shared.flags.ready(slot), job.seq)) {
            return Ok(());
        }
        inbox.serve_graphs();
        if job.by_comm.iter().any(|(c, _)| c.state() == CommState::Aborted) {
            return Err(Error::invalid_usage("communicator was aborted"));
        }
        if job.progress.as_ref().is_some_and(StageProgress::abandoned) {
            return Err(Error::internal("queuing the device operation on its stream failed (see the caller's error)"));
        }
        spins += 1;
        if spins < 2000 {
            std::hint::spin_loop();
        } else if start.elapsed() < Duration::from_millis(2) {
            // The copies in are usually under way: a sleep, however short, costs the timer
            // slack (50 us by default), so give the core away without one.
            std::thread::yield_now();
        } else {
            // The stream is still busy with earlier work.
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

/// Device-buffer operations of one group (or one call), in call order. Returns once they are
/// queued on their streams; host-buffer operations in the same group make it wait for all.
pub fn submit(ops: Vec<(Arc<Comm>, OpRequest)>) -> Result<()> {
    // Sends and receives between GPUs that reach each other go first, on every rank alike.
    let (direct, mut ops) = super::device_p2p::split(ops)?;
    let mut p2p_error = None;
    if !direct.is_empty() {
        drain_current_thread();
        // Pairs whose buffers CUDA IPC cannot share come back, to be staged on both sides; a
        // refused pair fails the call once the rest of the group is queued (its peers wait
        // for their part of it).
        let (staged, error) = super::device_p2p::submit_all(direct);
        ops.extend(staged);
        p2p_error = error;
    }
    let rest = submit_rest(ops);
    match p2p_error {
        Some(e) => Err(e),
        None => rest,
    }
}

/// [`submit`] for all but the directly copied sends and receives.
fn submit_rest(ops: Vec<(Arc<Comm>, OpRequest)>) -> Result<()> {
    if ops.is_empty() {
        return Ok(());
    }
    let has_host = ops.iter().any(|(_, r)| !r.mem.is_device());
    if !has_host && ops.iter().all(|(c, r)| single_rank_applies(c, r)) {
        return single_rank_group(&ops);
    }
    if one_gpu::applies(&ops) {
        // The thread's staged operations queued before run first (same order on every rank).
        drain_current_thread();
        let comm = ops[0].0.clone();
        let reqs: Vec<OpRequest> = ops.into_iter().map(|(_, r)| r).collect();
        return one_gpu::submit(&comm, &reqs);
    }
    if let Some(per_comm) = one_gpu::applies_per_communicator(&ops) {
        drain_current_thread();
        return one_gpu::submit_each(per_comm);
    }
    let mut capturing = false;
    for (_, req) in &ops {
        capturing |= req.mem.is_device() && req.stream.is_capturing()?;
    }
    if capturing {
        return with_worker(|w| super::captured::capture(ops, w.jobs.clone(), &*w.shared));
    }
    let seq = with_worker(|w| enqueue(w, ops))?;
    if has_host {
        wait_for(seq)?;
    }
    Ok(())
}

/// One rank: the result is the input (a device copy on the stream), or the input run through
/// the reduction's multiply or divide (one kernel on the stream).
fn single_rank_applies(comm: &Comm, req: &OpRequest) -> bool {
    comm.nranks == 1 && !matches!(req.op, CollOp::Send { .. } | CollOp::Recv { .. })
}

/// A group of one-rank operations: each stream's run of consecutive operations goes out in as
/// few launches as their buffers allow (cuda::batch), small copies included.
fn single_rank_group(ops: &[(Arc<Comm>, OpRequest)]) -> Result<()> {
    let grouped = ops.len() > 1;
    let mut current: Option<(Stream, Launches)> = None;
    for (_, req) in ops {
        if current.as_ref().is_none_or(|(s, _)| *s != req.stream) {
            if let Some((_, mut l)) = current.take() {
                l.flush()?;
            }
            current = Some((req.stream, Launches::new(req.stream)));
        }
        if let Some((_, l)) = current.as_mut() {
            single_rank(req, l, grouped)?;
        }
    }
    match current {
        Some((_, mut l)) => l.flush(),
        None => Ok(()),
    }
}

/// Whether `stream` belongs to the calling thread's current context, whose kernels a launch
/// on it uses (a device copy works from any context: a group of one-rank communicators on
/// several GPUs keeps its copies there).
fn stream_of_current_context(stream: Stream) -> bool {
    let Some(current) = driver::current_context() else { return false };
    stream.0 <= 2 || stream.context().is_ok_and(|c| c == current)
}

/// Copies up to this size in a group of one-rank operations run as kernels, so that the
/// group's copies share launches; larger ones stay device copies (cuMemcpyAsync), which move
/// large buffers fastest.
const GROUPED_COPY_MAX: usize = 256 << 10;

fn single_rank(req: &OpRequest, launches: &mut Launches, grouped: bool) -> Result<()> {
    let (send_len, recv_len) = buffer_lengths(req, 0, 1)?;
    if send_len.min(recv_len) == 0 {
        return Ok(());
    }
    match req.reduction {
        Some(red) if red.has_pre() || red.has_post() => {
            let (kind, pre, post_div) = kernels::from_reduction(&red);
            let pre = [match req.pre_device {
                Some(at) => kernels::PreScalar::Device(at as *const u8),
                None => pre,
            }];
            let f = kernels::Fold {
                dtype: req.dtype,
                kind,
                out: req.recv,
                inputs: &[req.send],
                pre: if red.has_pre() { &pre } else { &[] },
                post_div,
                count: req.count,
                more_outs: &[],
            };
            // SAFETY: both buffers are the caller's device memory of `count` elements, valid
            // until the stream has run the kernel (API contract).
            unsafe { launches.fold(&f) }
        }
        _ if std::ptr::eq(req.send, req.recv) => Ok(()),
        _ if grouped
            && send_len.min(recv_len) <= GROUPED_COPY_MAX
            && kernels::loaded(DataType::Uint8)
            && stream_of_current_context(req.stream) =>
        {
            let f = kernels::Fold {
                dtype: DataType::Uint8,
                kind: crate::reduce::ReduceKind::Sum,
                out: req.recv,
                inputs: &[req.send],
                pre: &[],
                post_div: None,
                count: send_len.min(recv_len),
                more_outs: &[],
            };
            // SAFETY: as above, for a copy of min(send, recv) bytes (a one-input fold).
            unsafe { launches.fold(&f) }
        }
        // SAFETY: as above, for a copy of min(send, recv) bytes.
        _ => unsafe { launches.copy(req.recv, req.send, send_len.min(recv_len)) },
    }
}

/// Stages a job's copies and flag operations on its streams and hands it to the worker.
fn enqueue(w: &Worker, ops: Vec<(Arc<Comm>, OpRequest)>) -> Result<u32> {
    if let [(comm, req)] = ops.as_slice() {
        if let Some(plan) = chunk_plan(req, separate_piece_bytes()) {
            return enqueue_chunked(w, comm.clone(), *req, &plan);
        }
    }
    if progressive_applies(&ops, piece_bytes())? {
        let (comm, req) = ops.into_iter().next().expect("one operation");
        return enqueue_progressive(w, comm, req, piece_bytes());
    }
    let shared = &w.shared;
    let seq = shared.submitted.load(Ordering::Relaxed).wrapping_add(1);
    let order = MatesOrder::count(&ops);
    // Streams in order of first use, with the operations on each.
    let mut streams: Vec<(Stream, usize)> = Vec::new();
    for (_, req) in &ops {
        if req.mem.is_device() && !streams.iter().any(|(s, _)| *s == req.stream) {
            streams.push((req.stream, shared.slot_of(req.stream)?));
        }
    }
    let mut claim = Claim::new(shared, seq);
    let mut staged: Vec<(Arc<Comm>, OpRequest)> = Vec::with_capacity(ops.len());
    // (stream, device destination, staged source, bytes) for after the job.
    let mut copies_out: Vec<(Stream, *mut u8, *const u8, usize)> = Vec::new();
    for (comm, req) in ops {
        let s = stage_request(&comm, req, |len| Ok(claim.take(len, shared.slot_of(req.stream)?)?.as_ptr()))?;
        // In stream order: the stream copies the device scalar and the input before the ready
        // flag, after which the worker reads them.
        for (dst, src, len) in s.copies_in() {
            // SAFETY: the pool keeps the staging buffer (held by the job, then busy) until the
            // stream has passed this operation; the source is the caller's device buffer or
            // scalar, valid per the API contract.
            unsafe { req.stream.copy(dst, src, len)? };
        }
        if let Some((dst, src, len)) = s.copy_out {
            copies_out.push((req.stream, dst, src, len));
        }
        staged.push((comm, s.host));
    }
    let marks: Vec<(usize, u32)> = streams.iter().map(|&(_, slot)| (slot, seq)).collect();
    let queued = (|| -> Result<()> {
        // Every stream's flag first, then the waits: a wait holds up whatever was submitted
        // after it on its hardware queue (see local_order), this rank's other streams included.
        for &(stream, slot) in &streams {
            stream.write_flag(shared.flags.ready_addr(slot), seq)?;
        }
        order.publish_and_wait()?;
        for &(stream, slot) in &streams {
            stream.wait_flag(shared.flags.done_addr(), seq)?;
            for &(s, dst, src, len) in &copies_out {
                if s == stream {
                    // SAFETY: as above, for the way back.
                    unsafe { stream.copy(dst, src, len)? };
                }
            }
            stream.write_flag(shared.flags.out_addr(slot), seq)?;
        }
        Ok(())
    })();
    // Once a flag may be out, the number goes to the worker whatever failed (given up, it only
    // signals done): no later job may be taken for ready by these ready flags, and a stream
    // that already waits for this number is released.
    let by_comm = if queued.is_ok() { super::by_communicator(staged) } else { Vec::new() };
    shared.submitted.store(seq, Ordering::Relaxed);
    let job = Job {
        seq,
        by_comm,
        slots: streams.iter().map(|&(_, slot)| slot).collect(),
        staging: claim.hand_over(&marks, queued.is_ok()),
        abandoned: queued.is_err(),
        progress: None,
    };
    w.jobs.send(ToWorker::Job(job)).map_err(|_| Error::internal("stream worker has stopped"))?;
    queued.map(|()| seq)
}

/// A copy the stream makes: destination, source, bytes.
pub(super) type StagingCopy = (*mut u8, *const u8, usize);

/// The host engine's twin of a request, and the copies its stream makes around the run.
pub(super) struct StagedRequest {
    pub host: OpRequest,
    /// The device scalar, into staging.
    pub scalar_in: Option<StagingCopy>,
    /// The input, into staging.
    pub input_in: Option<StagingCopy>,
    /// The output, out of staging.
    pub copy_out: Option<StagingCopy>,
}

impl StagedRequest {
    /// The copies into staging, the scalar first.
    pub fn copies_in(&self) -> impl Iterator<Item = StagingCopy> + '_ {
        self.scalar_in.iter().chain(self.input_in.iter()).copied()
    }
}

/// Puts a request's device buffers and device scalar on staging from `take` (bytes -> a
/// buffer's address; asked for the scalar, the input, the output, in that order). A host
/// request comes back as it is.
pub(super) fn stage_request(
    comm: &Comm,
    req: OpRequest,
    mut take: impl FnMut(usize) -> Result<*mut u8>,
) -> Result<StagedRequest> {
    let mut staged = StagedRequest { host: req, scalar_in: None, input_in: None, copy_out: None };
    if let Some(at) = req.pre_device {
        let s = take(8)?;
        staged.scalar_in = Some((s, at as *const u8, req.dtype.size()));
        staged.host.pre_device = Some(s as usize);
    }
    if !req.mem.is_device() {
        return Ok(staged);
    }
    let (send_len, recv_len) = buffer_lengths(&req, comm.rank, comm.nranks)?;
    staged.host.mem = MemKind::Host;
    // The host engine never sees a device address, even of a buffer it does not use.
    staged.host.send = std::ptr::null();
    staged.host.recv = std::ptr::null_mut();
    if send_len > 0 {
        let s = take(send_len)?;
        staged.input_in = Some((s, req.send, send_len));
        staged.host.send = s;
    }
    if recv_len > 0 {
        let s = take(recv_len)?;
        staged.host.recv = s;
        staged.copy_out = Some((req.recv, s, recv_len));
    }
    Ok(staged)
}

/// A staged operation's device-resident PreMulSum scalar, copied by its stream into pinned
/// memory before the ready flag: read now and made the reduction's scalar.
fn read_staged_scalar(req: &mut OpRequest) -> Result<()> {
    let (Some(at), Some(red)) = (req.pre_device.take(), req.reduction.as_mut()) else { return Ok(()) };
    let mut bits = [0u8; 8];
    // SAFETY: `at` is 8 bytes of pinned staging memory the job owns, written by the stream
    // before the ready flag this worker has seen.
    unsafe { std::ptr::copy_nonoverlapping(at as *const u8, bits.as_mut_ptr(), req.dtype.size()) };
    *red = crate::reduce::Reduction::pre_mul_sum(req.dtype, &bits)?;
    Ok(())
}

/// The smallest piece a staged buffer is copied in or out as (FERROCCL_STAGE_PIECE, default
/// 256 KiB; at most [`progressive::MAX_PIECES`] pieces): the host engine starts on the input
/// as its first piece lands and each output piece goes back once it is final, so the copies
/// overlap the transfers. An operation smaller than two pieces is staged whole.
pub(super) fn piece_bytes() -> usize {
    static PIECE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PIECE.get_or_init(|| (crate::env::get_bytes("FERROCCL_STAGE_PIECE") as usize).max(4096))
}

/// The smallest separate operation a large staged one is cut into ([`chunk_plan`]): at least
/// [`SEPARATE_PIECE_MIN`], and at least [`piece_bytes`].
fn separate_piece_bytes() -> usize {
    piece_bytes().max(SEPARATE_PIECE_MIN)
}

/// Each separate operation costs the host engine a start and an end of its own: on an H100
/// host over sockets (round 128, bench/results/staged-tls-2026-12-06.md), a 32 MiB TLS
/// all-reduce cut into 16 operations of 2 MiB ran each (but a call's first) in 750-1020 us,
/// about 35% above its share of one host operation, with its input ready and the worker idle
/// under 15 us between them. Pieces are cut evenly ([`chunk_plan`]). In 8 MiB operations
/// (two alternations, device busbw / the floor): 32 MiB 0.67-0.72 -> 0.93-0.94 with TLS,
/// 0.68-0.79 -> 0.94-0.95 plaintext; 64 MiB 0.75-0.93 -> 0.90-0.94 TLS, 0.93-1.05 ->
/// 1.04-1.17 plaintext.
const SEPARATE_PIECE_MIN: usize = 8 << 20;

/// Whether a job of these operations is staged piece by piece: one device operation (of any
/// kind: the pieces are byte ranges of its buffers, which the ranks need not cut alike)
/// with a buffer of at least two pieces.
fn progressive_applies(ops: &[(Arc<Comm>, OpRequest)], piece: usize) -> Result<bool> {
    let [(comm, req)] = ops else { return Ok(false) };
    Ok(req.mem.is_device() && worth_pieces(buffer_lengths(req, comm.rank, comm.nranks)?, piece))
}

pub(super) fn worth_pieces((send_len, recv_len): (usize, usize), piece: usize) -> bool {
    send_len.max(recv_len) >= 2 * piece
}

/// Queues one operation piece by piece ([`progressive`]): its ready flag, then each input
/// piece's copy and landed flag, in the order its plan reads them; then, per output piece in
/// the order the plan finishes them, a wait for its released flag and its copy back; last a
/// wait for the whole job and the out flag. The worker runs the operation once, starting each
/// step when the input it reads has landed. It gets the job before the copies are queued
/// (queuing them takes tens of microseconds, and waking the worker as long), and gives up if
/// queuing them fails part-way.
fn enqueue_progressive(w: &Worker, comm: Arc<Comm>, req: OpRequest, piece: usize) -> Result<u32> {
    let began = crate::debug::wall_us();
    let shared = &w.shared;
    let stream = req.stream;
    let slot = shared.slot_of(stream)?;
    let (send_len, recv_len) = buffer_lengths(&req, comm.rank, comm.nranks)?;
    let es = req.dtype.size();
    let seq = shared.submitted.load(Ordering::Relaxed).wrapping_add(1);
    let mut claim = Claim::new(shared, seq);
    let send_stage = if send_len > 0 { Some(claim.take(send_len, slot)?) } else { None };
    let recv_stage = if recv_len > 0 { Some(claim.take(recv_len, slot)?) } else { None };
    let scalar_stage = if req.pre_device.is_some() { Some(claim.take(8, slot)?) } else { None };
    // The host resets the flag block here, at enqueue, while the stream and the worker may
    // still be at an earlier job: it is never shared under the same-stream rule.
    let data_buffers = claim.taken.len();
    let flag_stage = claim.take_host_written(progressive::FLAG_BYTES, slot)?;
    let flags_dev = flag_stage.device_ptr()?;
    let input = Pieces::new(send_len, piece, es);
    let output = Pieces::new(recv_len, piece, es);
    // SAFETY: the flag block is FLAG_BYTES (or more) of page-aligned pinned memory, kept by
    // the job (then by the pool's busy marks) until the stream and the worker are past it.
    let progress = unsafe { StageProgress::new(flag_stage.as_ptr(), seq, input, output) };
    progress.reset();
    let mut host = req;
    host.mem = MemKind::Host;
    host.send = send_stage.as_ref().map_or(std::ptr::null(), |s| s.as_ptr() as *const u8);
    host.recv = recv_stage.as_ref().map_or(std::ptr::null_mut(), |s| s.as_ptr());
    host.pre_device = scalar_stage.as_ref().map(|s| s.as_ptr() as usize);
    // The plan the worker will follow (the same call on the same request: the same plan).
    let (input_order, output_order) = super::staged_orders(&comm, &host, input, output);
    let order = MatesOrder::count(&[(comm.clone(), req)]);
    let send_base = send_stage.as_ref().map(|s| s.as_ptr());
    let recv_base = recv_stage.as_ref().map(|s| s.as_ptr());
    let scalar_base = scalar_stage.as_ref().map(|s| s.as_ptr());
    shared.submitted.store(seq, Ordering::Relaxed);
    // Handed over before its copies are queued: the same-stream rule is allowed below, once
    // they all are.
    let staging = claim.hand_over(&[(slot, seq)], false);
    let data_staging = staging[..data_buffers].to_vec();
    let job = Job {
        seq,
        by_comm: vec![(comm, vec![host])],
        slots: vec![slot],
        staging,
        abandoned: false,
        progress: Some(progress),
    };
    // Every flag the stream waits for is set by the worker, whatever happens below: if
    // queuing fails, the job is abandoned (the worker gives up on it) or, on the way back,
    // still runs (its peers need it); either way its staging stays busy.
    w.jobs.send(ToWorker::Job(job)).map_err(|_| Error::internal("stream worker has stopped"))?;
    let handed_over = crate::debug::wall_us();
    // Until the input is queued, leaving this function by any way (an error, or a panic that
    // the FFI boundary catches) abandons the job, so that the worker does not wait for it.
    let mut unqueued = AbandonOnDrop(Some(progress));
    // The copies below: the staging buffers are kept (by the job, then the pool's busy marks)
    // until the stream has passed the out flag; the device sides are the caller's buffers,
    // valid per the API contract; the ranges lie within both (Pieces cover exactly the
    // buffer's length).
    let queued_in = (|| -> Result<()> {
        if let (Some(at), Some(s)) = (req.pre_device, scalar_base) {
            // SAFETY: see above; `at` is the caller's device scalar of one element.
            unsafe { stream.copy(s, at as *const u8, es)? };
        }
        stream.write_flag(shared.flags.ready_addr(slot), seq)?;
        if let Some(base) = send_base {
            // SAFETY: see above.
            unsafe { queue_input_pieces(stream, (base, req.send), input, &input_order, flags_dev, seq)? };
        }
        Ok(())
    })();
    queued_in?;
    unqueued.0 = None;
    order.publish_and_wait()?;
    if let Some(base) = recv_base {
        // SAFETY: see above, for the way back.
        unsafe { queue_output_pieces(stream, (req.recv, base), output, &output_order, flags_dev, seq)? };
    }
    // The staging is the worker's until the job is done (a send may still read it).
    stream.wait_flag(shared.flags.done_addr(), seq)?;
    stream.write_flag(shared.flags.out_addr(slot), seq)?;
    {
        let mut pool = shared.lock_pool();
        for &index in &data_staging {
            pool.allow_same_stream(index, slot);
        }
    }
    log::trace!(target: "COLL", "staged job {seq}: enqueue began @{began}, handed to the worker @{handed_over}, \
        queued @{} (wall us)", crate::debug::wall_us());
    Ok(seq)
}

/// Queues an input's copy into staging piece by piece, in `order`, each piece followed by its
/// landed flag (in the flag block at device address `flags`) set to `seq`.
///
/// # Safety
/// `staging` and `src` (destination, source) are valid for `input.len` bytes for as long as
/// the stream may run the copies.
pub(super) unsafe fn queue_input_pieces(
    stream: Stream,
    (staging, src): (*mut u8, *const u8),
    input: Pieces,
    order: &[usize],
    flags: u64,
    seq: u32,
) -> Result<()> {
    for &k in order {
        let (a, b) = input.range(k);
        // SAFETY: the range lies within both buffers (caller's contract; Pieces cover len).
        unsafe { stream.copy(staging.wrapping_add(a), src.wrapping_add(a), b - a)? };
        stream.write_flag(flags + StageProgress::landed_offset(k) as u64, seq)?;
    }
    Ok(())
}

/// Queues, per output piece in `order`, a wait for its released flag to reach `seq` and its
/// copy back from staging.
///
/// # Safety
/// `dst` and `staging` (destination, source) are valid for `output.len` bytes for as long as
/// the stream may run the copies.
pub(super) unsafe fn queue_output_pieces(
    stream: Stream,
    (dst, staging): (*mut u8, *const u8),
    output: Pieces,
    order: &[usize],
    flags: u64,
    seq: u32,
) -> Result<()> {
    for &k in order {
        let (a, b) = output.range(k);
        stream.wait_flag(flags + StageProgress::released_offset(k) as u64, seq)?;
        // SAFETY: the range lies within both buffers (caller's contract; Pieces cover len).
        unsafe { stream.copy(dst.wrapping_add(a), staging.wrapping_add(a), b - a)? };
    }
    Ok(())
}

/// Abandons a staged operation when dropped while still armed (see `enqueue_progressive`).
struct AbandonOnDrop(Option<StageProgress>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        if let Some(progress) = self.0 {
            progress.abandon();
        }
    }
}

/// From this size on (FERROCCL_STAGE_SEPARATE_MIN, default 32 MiB), an all-reduce, broadcast
/// or reduce is staged as separate operations on pieces of its buffers (at most 16), each
/// copied in, run and copied back on its own: on the
/// H200 host (rounds 30-31) the host engine, run by the stream worker, takes one staged
/// operation of 32 MiB and more over sockets at half the speed or less of the same bytes as
/// 2-4 MiB operations in sequence, so the pieces win there (0.70-0.75x of host buffers at
/// 32 MiB against 0.50-0.85x) while piecewise staging of one operation wins below (16 MiB:
/// 0.66-0.87x against 0.59-0.65x).
fn separate_pieces_min() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| crate::env::get_bytes("FERROCCL_STAGE_SEPARATE_MIN") as usize)
}

/// How to cut a staged operation into separate operations: element ranges [a, b) of every
/// buffer, in order, covering the per-rank count exactly, in pieces of one size, at least
/// `chunk_bytes` (the last within an element per piece of it), and at most
/// [`progressive::MAX_PIECES`] of them. `None`: below [`separate_pieces_min`] or two whole
/// `chunk_bytes` (staged piecewise as one operation instead), when its pieces are not
/// contiguous ranges (all-gather, reduce-scatter, all-to-all, gather and scatter: pieces of
/// their per-rank blocks need strided copies), or for point-to-point (see below).
#[derive(Clone, Debug, PartialEq, Eq)]
struct ChunkPlan {
    ranges: Vec<(usize, usize)>,
}

/// The element ranges a large staged operation is run as separate operations on
/// ([`chunk_plan`]), if it is.
pub(super) fn separate_ranges(req: &OpRequest) -> Option<Vec<(usize, usize)>> {
    chunk_plan(req, separate_piece_bytes()).map(|plan| plan.ranges)
}

/// Every rank plans alike: the plan depends only on the operation, count and type.
fn chunk_plan(req: &OpRequest, chunk_bytes: usize) -> Option<ChunkPlan> {
    if !req.mem.is_device() {
        return None;
    }
    match req.op {
        CollOp::AllReduce | CollOp::Broadcast { .. } | CollOp::Reduce { .. } => {}
        // A send alone on one rank may meet a receive inside a group on the other, which runs
        // whole: both sides must cut alike, so point-to-point never is.
        CollOp::Send { .. } | CollOp::Recv { .. } => return None,
        CollOp::AllGather | CollOp::ReduceScatter | CollOp::AlltoAll => return None,
        CollOp::Gather { .. } | CollOp::Scatter { .. } => return None,
    }
    if req.count.saturating_mul(req.dtype.size()) < separate_pieces_min() {
        return None;
    }
    // As many pieces as whole `chunk_bytes` fit (at most MAX_PIECES), of one size (the last
    // shorter by less than an element per piece): a short tail would pay a whole operation's
    // start and end. Fewer than two: staged piece by piece as one operation instead.
    let es = req.dtype.size();
    let len = req.count * es;
    let n = (len / chunk_bytes.max(1)).min(progressive::MAX_PIECES);
    if n < 2 {
        return None;
    }
    let pieces = Pieces::new(len, len.div_ceil(n), es);
    let ranges = (0..pieces.count()).map(|k| pieces.range(k)).map(|(a, b)| (a / es, b / es)).collect();
    Some(ChunkPlan { ranges })
}

/// Queues one large operation as pieces ([`ChunkPlan`]): every piece's copy-in and ready flag
/// first, then per piece a wait for its done flag and its copy-out. The worker runs the
/// pieces in order as separate host operations (sequence numbers first..=last).
fn enqueue_chunked(w: &Worker, comm: Arc<Comm>, req: OpRequest, plan: &ChunkPlan) -> Result<u32> {
    let shared = &w.shared;
    let stream = req.stream;
    let slot = shared.slot_of(stream)?;
    let es = req.dtype.size();
    let (send_len, recv_len) = buffer_lengths(&req, comm.rank, comm.nranks)?;
    let first = shared.submitted.load(Ordering::Relaxed).wrapping_add(1);
    let last = first.wrapping_add(plan.ranges.len() as u32 - 1);
    let mut claim = Claim::new(shared, last);
    let send_stage = if send_len > 0 { Some(claim.take(send_len, slot)?) } else { None };
    let recv_stage = if recv_len > 0 { Some(claim.take(recv_len, slot)?) } else { None };
    let scalar_stage = if req.pre_device.is_some() { Some(claim.take(8, slot)?) } else { None };
    let mut jobs = Vec::with_capacity(plan.ranges.len());
    let order = MatesOrder::count(&[(comm.clone(), req)]);
    let queued = (|| -> Result<()> {
        if let (Some(at), Some(s)) = (req.pre_device, &scalar_stage) {
            // SAFETY: the pool keeps the staging buffers (held by the last piece's job, then
            // busy) until the stream has passed the last copy-out; the sources are the
            // caller's device buffers, valid per the API contract. Offsets below stay inside
            // the buffers: the ranges cover `count` exactly.
            unsafe { stream.copy(s.as_ptr(), at as *const u8, es)? };
        }
        for (k, &(a, b)) in plan.ranges.iter().enumerate() {
            let seq = first.wrapping_add(k as u32);
            let len = (b - a) * es;
            let mut host = req;
            host.mem = MemKind::Host;
            host.count = b - a;
            host.send = std::ptr::null();
            host.recv = std::ptr::null_mut();
            host.pre_device = scalar_stage.as_ref().map(|s| s.as_ptr() as usize);
            if let Some(st) = &send_stage {
                let dst = st.as_ptr().wrapping_add(a * es);
                // SAFETY: as above.
                unsafe { stream.copy(dst, req.send.wrapping_add(a * es), len)? };
                host.send = dst;
            }
            if let Some(st) = &recv_stage {
                host.recv = st.as_ptr().wrapping_add(a * es);
            }
            jobs.push(Job {
                seq,
                by_comm: vec![(comm.clone(), vec![host])],
                slots: vec![slot],
                staging: Vec::new(),
                abandoned: false,
                progress: None,
            });
            stream.write_flag(shared.flags.ready_addr(slot), seq)?;
        }
        order.publish_and_wait()?;
        for (k, &(a, b)) in plan.ranges.iter().enumerate() {
            stream.wait_flag(shared.flags.done_addr(), first.wrapping_add(k as u32))?;
            let Some(st) = &recv_stage else { continue };
            // SAFETY: as above, for the way back.
            unsafe { stream.copy(req.recv.wrapping_add(a * es), st.as_ptr().wrapping_add(a * es), (b - a) * es)? };
        }
        stream.write_flag(shared.flags.out_addr(slot), last)
    })();
    // Every sequence number up to `last` goes to the worker, even when queuing failed part-way:
    // a stream may already wait for any of them.
    while jobs.len() < plan.ranges.len() {
        let seq = first.wrapping_add(jobs.len() as u32);
        jobs.push(Job {
            seq,
            by_comm: vec![(comm.clone(), Vec::new())],
            slots: vec![slot],
            staging: Vec::new(),
            abandoned: true,
            progress: None,
        });
    }
    if queued.is_err() {
        for job in &mut jobs {
            job.abandoned = true;
        }
    }
    if let Some(job) = jobs.last_mut() {
        job.staging = claim.hand_over(&[(slot, last)], queued.is_ok());
    }
    shared.submitted.store(last, Ordering::Relaxed);
    for job in jobs {
        w.jobs.send(ToWorker::Job(job)).map_err(|_| Error::internal("stream worker has stopped"))?;
    }
    queued.map(|()| last)
}

/// A staged job's place in the submission order of the ranks that are threads of this
/// process (`local_order`): its waits go on its streams only once every process mate it
/// exchanges with has submitted its own copy-ins and flags for the matching operations.
struct MatesOrder {
    /// Per communicator with process mates: the counts this job brings each partner to.
    counts: Vec<CommCounts>,
}

/// A communicator, its order, and (partner, count) pairs.
type CommCounts = (Arc<Comm>, Arc<LocalOrder>, Vec<(usize, u64)>);

impl MatesOrder {
    /// Counts the job's operations with their partners (a collective: every rank; a send or
    /// receive: its peer). Every rank counts every operation, whatever then fails.
    fn count(ops: &[(Arc<Comm>, OpRequest)]) -> MatesOrder {
        let mut counts: Vec<CommCounts> = Vec::new();
        for (comm, req) in ops {
            let Some(order) = LocalOrder::staged(comm) else { continue };
            let partners: Vec<usize> = match req.op {
                CollOp::Send { peer } | CollOp::Recv { peer } => vec![peer],
                _ => (0..comm.nranks).collect(),
            };
            let reached = order.count(partners.into_iter());
            let at = match counts.iter().position(|(c, _, _)| Arc::ptr_eq(c, comm)) {
                Some(i) => i,
                None => {
                    counts.push((comm.clone(), order, Vec::new()));
                    counts.len() - 1
                }
            };
            let merged = &mut counts[at].2;
            for (p, k) in reached {
                match merged.iter_mut().find(|(q, _)| *q == p) {
                    Some(e) => e.1 = e.1.max(k),
                    None => merged.push((p, k)),
                }
            }
        }
        MatesOrder { counts }
    }

    /// This rank has submitted its share (also said when queuing failed part-way, so that
    /// no mate waits for it for ever).
    fn publish(&self) {
        for (_, order, counts) in &self.counts {
            order.publish_counts(counts);
        }
    }

    fn publish_and_wait(&self) -> Result<()> {
        self.publish();
        for (comm, order, counts) in &self.counts {
            order.wait_counts(comm, counts)?;
        }
        Ok(())
    }
}

/// Every way out of an enqueue publishes (idempotent): a failure part-way must not leave
/// mates waiting.
impl Drop for MatesOrder {
    fn drop(&mut self) {
        self.publish();
    }
}

fn wait_for(seq: u32) -> Result<()> {
    WORKER.with(|w| {
        if let Some(w) = w.borrow().as_ref() {
            w.shared.wait_completed(seq);
        }
    });
    Ok(())
}

/// Host-buffer operations run on the calling thread; any device-buffer operations this thread
/// queued before them must finish first (the same order on every rank).
pub fn drain_current_thread() {
    WORKER.with(|w| {
        if let Some(w) = w.borrow().as_ref() {
            let seq = w.shared.submitted.load(Ordering::Relaxed);
            w.shared.wait_completed(seq);
        }
    });
}

/// Rejects device buffers of a device other than the communicator's, and calls that mix host
/// and device buffers. Returns the call's memory kind.
pub fn memory_kind(comm: &Comm, req: &OpRequest, function: &str) -> Result<MemKind> {
    // No driver, or no context current in this thread: the driver knows no pointer here, so
    // both buffers are host memory. One context check per call, not one per buffer.
    let Some(current) = crate::cuda::driver::current_context() else {
        return Ok(MemKind::Host);
    };
    let (send_len, recv_len) = buffer_lengths(req, comm.rank, comm.nranks)?;
    let send = (send_len > 0).then(|| crate::cuda::memory::classify_in_context(&current, req.send));
    let recv = (recv_len > 0).then(|| crate::cuda::memory::classify_in_context(&current, req.recv));
    let kind = match (send, recv) {
        (Some(a), Some(b)) if a.is_device() != b.is_device() => {
            return Err(Error::invalid_argument(format!(
                "{function}: sendbuff is {} memory but recvbuff is {} memory; both must be host or both device memory",
                describe(a),
                describe(b)
            )))
        }
        (Some(k), _) | (None, Some(k)) => k,
        (None, None) => MemKind::Host,
    };
    if let MemKind::Device { device } = kind {
        if device != comm.cuda_dev {
            return Err(Error::invalid_argument(format!(
                "{function}: buffers are on CUDA device {device} but the communicator uses device {}",
                comm.cuda_dev
            )));
        }
    }
    Ok(kind)
}

fn describe(k: MemKind) -> String {
    match k {
        MemKind::Host => "host".into(),
        MemKind::Device { device } => format!("CUDA device {device}"),
    }
}

/// Buffers and bytes in the calling thread's staging pool, for diagnostics and tests.
pub fn staging_pool_on_current_thread() -> (usize, usize) {
    WORKER.with(|w| w.borrow().as_ref().map_or((0, 0), |w| w.shared.lock_pool().totals()))
}

/// Pending jobs of the calling thread, for diagnostics.
pub fn pending_on_current_thread() -> u32 {
    WORKER.with(|w| {
        w.borrow().as_ref().map_or(0, |w| {
            let done = *w.shared.completed.lock().unwrap_or_else(|p| p.into_inner());
            w.shared.submitted.load(Ordering::Relaxed).wrapping_sub(done)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_compare_across_wrap() {
        assert!(reached(5, 5));
        assert!(reached(6, 5));
        assert!(!reached(4, 5));
        assert!(reached(2, u32::MAX - 1));
        assert!(!reached(u32::MAX - 1, 2));
    }

    fn device_req(op: CollOp, count: usize) -> OpRequest {
        OpRequest {
            op,
            send: std::ptr::null(),
            recv: std::ptr::null_mut(),
            count,
            dtype: DataType::Float32,
            reduction: None,
            mem: MemKind::Device { device: 0 },
            stream: Stream(0),
            pre_device: None,
            device_call: true,
        }
    }

    #[test]
    fn large_staged_operations_are_cut_into_separate_pieces_that_cover_them_exactly() {
        let piece = 256 << 10;
        for op in [CollOp::AllReduce, CollOp::Broadcast { root: 1 }, CollOp::Reduce { root: 0 }] {
            let count = (separate_pieces_min() / 4) + 1_000_003;
            let plan = chunk_plan(&device_req(op, count), piece).expect("large enough to cut");
            assert!(plan.ranges.len() <= progressive::MAX_PIECES, "{op:?}");
            let mut next = 0;
            for &(a, b) in &plan.ranges {
                assert_eq!(a, next, "{op:?}: gap or overlap");
                assert!(b > a, "{op:?}: empty piece");
                next = b;
            }
            assert_eq!(next, count, "{op:?}: every element once");
            // Every rank plans alike: the plan ignores the rank and the buffers.
            assert_eq!(chunk_plan(&device_req(op, count), piece), Some(plan));
        }
    }

    #[test]
    fn separate_pieces_are_even_at_least_eight_mib_and_at_most_sixteen() {
        assert!(separate_piece_bytes() >= SEPARATE_PIECE_MIN);
        // Floats: 32 MiB as four pieces of 8 MiB; 33 MiB and a float as four of about 8.25 MiB
        // (no short tail); 1 GiB as sixteen of 64 MiB.
        let cases =
            [(32usize << 20, 4), (33 << 20, 4), ((32 << 20) + 4, 4), (64 << 20, 8), (128 << 20, 16), (1 << 30, 16)];
        for (bytes, pieces) in cases {
            let plan = chunk_plan(&device_req(CollOp::AllReduce, bytes / 4), SEPARATE_PIECE_MIN).expect("cut");
            assert_eq!(plan.ranges.len(), pieces, "{bytes} bytes");
            let sizes: Vec<usize> = plan.ranges.iter().map(|&(a, b)| (b - a) * 4).collect();
            assert!(sizes.iter().all(|&s| s >= SEPARATE_PIECE_MIN - 4 * pieces), "{bytes} bytes: {sizes:?}");
            assert!(sizes[0] - sizes[pieces - 1] < 4 * pieces, "{bytes} bytes: uneven {sizes:?}");
        }
        // Under two whole pieces (a separate minimum set below 16 MiB): not cut.
        assert_eq!(chunk_plan(&device_req(CollOp::AllReduce, (12 << 20) / 4), SEPARATE_PIECE_MIN), None);
    }

    #[test]
    fn smaller_host_and_block_layout_operations_are_not_cut() {
        let piece = 256 << 10;
        let at = separate_pieces_min() / 4;
        assert_eq!(chunk_plan(&device_req(CollOp::AllReduce, at - 1), piece), None);
        assert!(chunk_plan(&device_req(CollOp::AllReduce, at), piece).is_some());
        for op in [
            CollOp::Send { peer: 1 },
            CollOp::Recv { peer: 0 },
            CollOp::AllGather,
            CollOp::ReduceScatter,
            CollOp::AlltoAll,
            CollOp::Gather { root: 0 },
            CollOp::Scatter { root: 0 },
        ] {
            assert_eq!(chunk_plan(&device_req(op, 100_000_000), piece), None, "{op:?}");
        }
        let mut host = device_req(CollOp::AllReduce, 100_000_000);
        host.mem = MemKind::Host;
        assert_eq!(chunk_plan(&host, piece), None);
    }

    #[test]
    fn operations_of_two_pieces_or_more_are_staged_piecewise() {
        let piece = 256 << 10;
        assert!(!worth_pieces((2 * piece - 1, 2 * piece - 1), piece));
        assert!(worth_pieces((2 * piece, 0), piece), "a broadcast root's or reduce's input alone");
        assert!(worth_pieces((0, 2 * piece), piece), "a broadcast receiver's output alone");
        // Every piece is whole elements, the pieces cover the buffer, and there are never more
        // than MAX_PIECES (each has a flag of each kind).
        for len in [2 * piece, 1_000_003 * 4, 256 << 20] {
            let p = Pieces::new(len, piece, 4);
            assert!(p.count() >= 2 && p.count() <= progressive::MAX_PIECES, "{len}");
            assert_eq!(p.range(p.count() - 1).1, len);
            assert_eq!(p.piece % 4, 0);
        }
    }

    #[test]
    fn without_cuda_no_worker_is_needed() {
        // Draining and counting with no device work ever submitted must not start anything.
        drain_current_thread();
        assert_eq!(pending_on_current_thread(), 0);
    }
}
