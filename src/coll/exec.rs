//! Runs plans over a communicator's connections: the progress engine for host buffers.
//!
//! One call drives every operation of a group, across all the communicators the group
//! touches, from the calling thread, so many communicators driven by one thread (ncclCommInitAll)
//! progress together. It posts each step once its dependencies are done, keeps the per-peer
//! FIFO order of sends and receives (the matching rule in `plan`), reduces arriving chunks
//! straight into the destination, and sleeps in `poll` when nothing can move.
//!
//! Before each sleep (never while data moves) it checks the communicators' abort flags and
//! the no-progress watchdog (`interrupt`): an aborted communicator or `FERROCCL_TIMEOUT`
//! without progress ends the call with an error, releasing the connections.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::plan::{BufId, LocalOp, Plan, RecvAction, Slice, Step};
use super::progressive::StageProgress;
use super::reduce::Reduction;
use crate::error::{Error, Result};
use crate::interrupt::Watchdog;
use crate::transport::links::Links;
use crate::transport::{MemRegion, OpSig, RecvOp, RequestId, WaitHint};

/// The caller's memory for one operation.
///
/// Created at the C boundary from the user's pointers; the caller guarantees (as NCCL's API
/// requires) that the buffers are valid for the given lengths until the operation completes.
#[derive(Clone, Copy, Debug)]
pub struct OpBuffers {
    pub send: *const u8,
    pub send_len: usize,
    pub recv: *mut u8,
    pub recv_len: usize,
}

/// One operation ready to run.
pub struct Work {
    pub plan: std::sync::Arc<Plan>,
    pub bufs: OpBuffers,
    pub reduction: Option<Reduction>,
    /// Owned copy of the send buffer when the caller's buffers overlap in a way the plan does
    /// not handle; `bufs.send` then points into it.
    pub send_copy: Option<Vec<u64>>,
    /// A node-level operation (`coll::node`) instead of the plan's steps (it has none).
    pub node: Option<super::node::NodeOp>,
    /// The call's signature, sent with every message and compared by the receiver.
    pub sig: OpSig,
    /// Staged device buffers that arrive and leave piece by piece (`coll::progressive`).
    pub stage: Option<StageProgress>,
}

// SAFETY: Work only carries addresses of memory its submitter keeps alive until completion.
unsafe impl Send for Work {}

/// All of one communicator's operations in a group.
pub struct CommWork<'a> {
    pub rank: usize,
    pub links: &'a mut Links,
    pub works: Vec<Work>,
}

type StepRef = (usize, usize); // (work index, step index)

#[derive(Default)]
struct WorkState {
    done: Vec<bool>,
    remaining: usize,
    scratch: Vec<u64>,
    /// Staged input pieces known landed, as a mask (refreshed from the flags when a step
    /// needs more).
    landed: u32,
    /// Per staged output piece, the steps still to write it.
    writers: Vec<u32>,
    /// With TRACE logging: when staged input was seen landed and output pieces released.
    stage_log: Vec<StageEvent>,
}

/// A staged-buffer event (TRACE): input pieces seen landed, an output piece released, a send or
/// receive step posted or completed, or a sleep of the executor waiting for its sockets.
#[derive(Clone, Copy, Debug)]
enum StageEvent {
    Landed {
        pieces: u32,
        at: Instant,
    },
    Released {
        piece: usize,
        at: Instant,
    },
    Posted {
        send: bool,
        step: usize,
        at: Instant,
        cpu: usize,
    },
    Completed {
        send: bool,
        step: usize,
        at: Instant,
        cpu: usize,
    },
    /// `cpus`: the CPU the thread slept on and the one it woke on (which CPU a woken thread is
    /// placed on decides whether it waits behind a spinning one).
    Slept {
        from: Instant,
        at: Instant,
        cpus: (usize, usize),
    },
}

fn tracing_stages() -> bool {
    log::log_enabled!(target: "COLL", log::Level::Trace)
}

/// Records an event of a staged work (TRACE only).
fn stage_event(work: &Work, ws: &mut WorkState, event: impl FnOnce(Instant, usize) -> StageEvent) {
    if work.stage.is_some() && tracing_stages() {
        ws.stage_log.push(event(Instant::now(), rustix::thread::sched_getcpu()));
    }
}

struct PostedRecv {
    peer: usize,
    req: RequestId,
    step: StepRef,
    staging: Option<Vec<u64>>,
}

#[derive(Default)]
struct CommState {
    /// One entry per work of the current operation (entries beyond `works` are spares).
    work_state: Vec<WorkState>,
    send_queues: Vec<VecDeque<StepRef>>,
    recv_queues: Vec<VecDeque<StepRef>>,
    posted_sends: Vec<(usize, RequestId, StepRef)>,
    posted_recvs: Vec<PostedRecv>,
    locals: Vec<StepRef>,
    /// Works that are node-level operations, run one at a time in call order.
    node_works: VecDeque<usize>,
    remaining: usize,
    /// A step waits for staged input still being copied in: poll, there is no descriptor to
    /// sleep on.
    gated: bool,
}

/// Runs every work of every communicator to completion.
pub fn execute(comms: &mut [CommWork<'_>]) -> Result<()> {
    // Bookkeeping and staging buffers outlive the call, per thread: allocating them per
    // operation was most of a small operation's cost, and zero-filling fresh staging showed
    // up as page faults on the socket path.
    let mut kept = KEPT.with(|k| std::mem::take(&mut *k.borrow_mut()));
    if kept.states.len() < comms.len() {
        kept.states.resize_with(comms.len(), CommState::default);
    }
    let states = &mut kept.states[..comms.len()];
    let mut result = Ok(());
    for (cw, st) in comms.iter().zip(states.iter_mut()) {
        result = reset_state(st, cw);
        if result.is_err() {
            break;
        }
    }
    let started = Instant::now();
    if result.is_ok() {
        result = run_to_completion(comms, states, &mut kept.staging);
    }
    log_stage_events(comms, states, started);
    kept.trim();
    KEPT.with(|k| *k.borrow_mut() = kept);
    result
}

/// TRACE: when each staged work's input was seen landed and its output pieces released.
fn log_stage_events(comms: &[CommWork<'_>], states: &[CommState], started: Instant) {
    for (cw, st) in comms.iter().zip(states) {
        for (work, ws) in cw.works.iter().zip(&st.work_state) {
            let Some(stage) = &work.stage else { continue };
            if ws.stage_log.is_empty() {
                continue;
            }
            let us = |at: &Instant| at.duration_since(started).as_micros();
            let events: Vec<String> = ws
                .stage_log
                .iter()
                .map(|e| match e {
                    StageEvent::Landed { pieces, at } => format!("L{pieces:x}@{}", us(at)),
                    StageEvent::Released { piece, at } => format!("R{piece}@{}", us(at)),
                    StageEvent::Posted { send, step, at, cpu } => {
                        format!("{}{step}@{}c{cpu}", if *send { "S" } else { "V" }, us(at))
                    }
                    StageEvent::Completed { send, step, at, cpu } => {
                        format!("{}{step}@{}c{cpu}", if *send { "s" } else { "v" }, us(at))
                    }
                    StageEvent::Slept { from, at, cpus } => {
                        format!("Z{}@{}c{}>{}", at.duration_since(*from).as_micros(), us(from), cpus.0, cpus.1)
                    }
                })
                .collect();
            let slice = |s: &Slice| format!("{:?}{}K+{}K", s.buf, s.offset >> 10, s.len >> 10);
            let steps: Vec<String> = work
                .plan
                .steps
                .iter()
                .enumerate()
                .map(|(i, p)| match &p.step {
                    Step::Send { peer, src } => format!("{i}:S{peer}:{}", slice(src)),
                    Step::Recv { peer, dst, .. } => format!("{i}:V{peer}:{}", slice(dst)),
                    Step::Local(_) => format!("{i}:local"),
                })
                .collect();
            log::trace!(
                target: "COLL",
                "staged job {}: {} us from @{} (wall us); {}; plan {} {}",
                stage.seq(),
                started.elapsed().as_micros(),
                crate::debug::wall_us().saturating_sub(started.elapsed().as_micros()),
                events.join(" "),
                work.plan.algorithm,
                steps.join(" ")
            );
        }
    }
}

/// Runs one node-level operation (a call outside a group) to completion: the loop of
/// [`execute`] without its step queues, so a small call pays only for polling its own
/// counters (the queue bookkeeping was a visible share of a 2-rank call's floor).
pub fn execute_node(rank: usize, links: &mut Links, op: &mut super::node::NodeOp) -> Result<()> {
    let spin_rounds =
        if links.local_ranks() > crate::topo::usable_cores() { SPIN_ROUNDS_OVERSUBSCRIBED } else { SPIN_ROUNDS };
    if op.algo() == super::node::NodeAlgo::OneShot {
        // Folds straight from the slots: no scratch.
        return drive_node(rank, links, op, &mut Vec::new(), spin_rounds);
    }
    let mut scratch = NODE_SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let result = drive_node(rank, links, op, &mut scratch, spin_rounds);
    if scratch.capacity() * 8 <= MAX_KEPT_BYTES {
        NODE_SCRATCH.with(|s| *s.borrow_mut() = scratch);
    }
    result
}

fn drive_node(
    rank: usize,
    links: &mut Links,
    op: &mut super::node::NodeOp,
    scratch: &mut Vec<u64>,
    spin_rounds: u32,
) -> Result<()> {
    let mut spin = Spin::new(spin_rounds);
    let mut watch = Watchdog::new(crate::interrupt::progress_timeout());
    loop {
        let area = links.node_area().ok_or_else(|| Error::internal("node operation without a node area"))?;
        let progressed = op.progress(area, scratch)?;
        if op.is_done() {
            return Ok(());
        }
        if spin.keep_polling(progressed, &mut watch) {
            continue;
        }
        if links.interrupt().is_set() {
            return Err(crate::interrupt::aborted(&format!("operation on rank {rank}")));
        }
        if let Some(idle) = watch.idle(|| links.progress_mark()) {
            let mut peers = links.node().map_or_else(Vec::new, |area| op.waiting_for(area));
            peers.retain(|&p| p != rank);
            return Err(timeout_error(idle, &[waiting_line(rank, links.nranks(), &peers)]));
        }
        // Counters in shared memory: nothing to sleep on.
        if spin.idle_rounds() > 20_000 {
            std::thread::sleep(Duration::from_micros(50));
        } else {
            std::thread::yield_now();
        }
    }
}

thread_local! {
    /// The scratch of [`execute_node`], kept between calls as [`Kept`] keeps the executor's.
    static NODE_SCRATCH: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Staging buffers kept per thread between operations.
const MAX_POOLED: usize = 16;
/// Larger scratch or staging buffers are freed after the operation rather than kept.
const MAX_KEPT_BYTES: usize = 8 << 20;

/// What one thread keeps between operations.
#[derive(Default)]
struct Kept {
    states: Vec<CommState>,
    staging: Vec<Vec<u64>>,
}

impl Kept {
    /// Forgets the last operation (its steps, queues and buffers' addresses) and frees
    /// what is too large to keep.
    fn trim(&mut self) {
        self.staging.retain(|b| b.len() * 8 <= MAX_KEPT_BYTES);
        self.staging.truncate(MAX_POOLED);
        self.states.truncate(4);
        for st in &mut self.states {
            st.clear();
            for ws in &mut st.work_state {
                if ws.scratch.capacity() * 8 > MAX_KEPT_BYTES {
                    ws.scratch = Vec::new();
                }
            }
        }
    }
}

thread_local! {
    static KEPT: std::cell::RefCell<Kept> = std::cell::RefCell::new(Kept::default());
}

/// Idle progress rounds spent spinning before the thread starts yielding or sleeping, when
/// each polling rank of this host has a core of its own (about 0.1-1 ms).
const SPIN_ROUNDS: u32 = 4096;
/// The same when ranks outnumber cores: yield almost at once, so the rank this one waits
/// for gets the core.
const SPIN_ROUNDS_OVERSUBSCRIBED: u32 = 64;

/// While transfers are posted, a spinning thread yields every this many idle rounds (tens of
/// microseconds). The threads this one wakes (a socket's sleeping reader, or the helper thread
/// a posted transfer is handed to) are often placed on this CPU, the scheduler expecting the
/// waker to sleep next (a socket's wakeup even says so); a waker that spins instead keeps them
/// off the CPU until it is preempted, milliseconds later. Measured on the H200 host (round 50,
/// staged device-buffer all-reduce over loopback, 2 processes): 1 MiB took 3.7-3.8 ms without
/// the yield and 0.9-1.0 ms with it; a peer's sent bytes were read only after the sender went
/// to sleep (round 41 trace).
const TRANSFER_YIELD_EVERY: u32 = 64;

/// Whether any communicator waits on a transfer it has posted (a socket one, or any other).
fn transfers_posted(states: &[CommState]) -> bool {
    states.iter().any(|st| !st.posted_sends.is_empty() || !st.posted_recvs.is_empty())
}

/// The first idle rounds of a wait, spent spinning (and, oversubscribed, yielding every 8).
struct Spin {
    rounds: u32,
    idle: u32,
}

impl Spin {
    fn new(rounds: u32) -> Spin {
        Spin { rounds, idle: 0 }
    }

    /// After one polling round: whether to poll again at once (it progressed, which also
    /// resets the watchdog, or it spins one more idle round). `false` once the spinning rounds
    /// are used up: the caller then checks for interrupts and timeouts, and yields or sleeps.
    fn keep_polling(&mut self, progressed: bool, watch: &mut Watchdog) -> bool {
        if progressed {
            self.idle = 0;
            watch.progressed();
            return true;
        }
        self.idle = self.idle.saturating_add(1);
        if self.idle >= self.rounds {
            return false;
        }
        std::hint::spin_loop();
        if self.rounds == SPIN_ROUNDS_OVERSUBSCRIBED && self.idle % 8 == 0 {
            std::thread::yield_now();
        }
        true
    }

    /// Idle rounds so far.
    fn idle_rounds(&self) -> u32 {
        self.idle
    }
}

/// Whether more ranks poll on this host than there are cores for them.
fn oversubscribed(comms: &[CommWork<'_>]) -> bool {
    comms.iter().map(|c| c.links.local_ranks()).max().unwrap_or(1) > crate::topo::usable_cores()
}

fn run_to_completion(comms: &mut [CommWork<'_>], states: &mut [CommState], pool: &mut Vec<Vec<u64>>) -> Result<()> {
    // Set when a peer is first found not connected yet: reading the clock on every
    // operation is a visible part of a small one's cost.
    let mut connect_deadline = None;
    // Spinning answers fastest (Open MPI's shared memory does the same); yielding early only
    // pays when another rank needs this core.
    let mut spin = Spin::new(if oversubscribed(comms) { SPIN_ROUNDS_OVERSUBSCRIBED } else { SPIN_ROUNDS });
    let mut watch = Watchdog::new(crate::interrupt::progress_timeout());
    loop {
        let mut progressed = false;
        let mut all_done = true;
        for (cw, st) in comms.iter_mut().zip(states.iter_mut()) {
            if st.remaining == 0 {
                continue;
            }
            progressed |= progress_comm(cw, st, pool, &mut connect_deadline)?;
            all_done &= st.remaining == 0;
        }
        if all_done {
            return Ok(());
        }
        if spin.keep_polling(progressed, &mut watch) {
            if spin.idle_rounds() % TRANSFER_YIELD_EVERY == 0 && transfers_posted(states) {
                std::thread::yield_now();
            }
            continue;
        }
        for cw in comms.iter() {
            if cw.links.interrupt().is_set() {
                return Err(crate::interrupt::aborted(&format!("operation on rank {}", cw.rank)));
            }
            if cw.works.iter().any(|w| w.stage.as_ref().is_some_and(StageProgress::abandoned)) {
                return Err(Error::internal("the staged input's copies could not all be queued on the stream"));
            }
        }
        let mark = || comms.iter().fold(0u64, |m, cw| m.wrapping_add(cw.links.progress_mark()));
        if let Some(idle) = watch.idle(mark) {
            return Err(no_progress(comms, states, idle));
        }
        let slept_from = Instant::now();
        let slept_on = if tracing_stages() { rustix::thread::sched_getcpu() } else { 0 };
        wait_for_io(comms, states, spin.idle_rounds());
        if tracing_stages() {
            let cpus = (slept_on, rustix::thread::sched_getcpu());
            for (cw, st) in comms.iter().zip(states.iter_mut()) {
                if let Some(w) = cw.works.iter().position(|w| w.stage.is_some()) {
                    st.work_state[w].stage_log.push(StageEvent::Slept { from: slept_from, at: Instant::now(), cpus });
                }
            }
        }
    }
}

/// The timeout error: how long nothing moved, and per communicator the ranks waited for.
fn no_progress(comms: &[CommWork<'_>], states: &[CommState], idle: Duration) -> Error {
    let parts: Vec<String> = comms
        .iter()
        .zip(states)
        .filter(|(_, st)| st.remaining > 0)
        .map(|(cw, st)| waiting_line(cw.rank, cw.links.nranks(), &waited_peers(cw, st)))
        .collect();
    timeout_error(idle, &parts)
}

/// "rank R (of N) was waiting for ranks A, B": one communicator's part of a timeout error.
fn waiting_line(rank: usize, nranks: usize, peers: &[usize]) -> String {
    let list = if peers.is_empty() {
        "no identifiable rank".to_owned()
    } else {
        let names: Vec<String> = peers.iter().map(usize::to_string).collect();
        format!("rank{} {}", if peers.len() > 1 { "s" } else { "" }, names.join(", "))
    };
    format!("rank {rank} (of {nranks}) was waiting for {list}")
}

fn timeout_error(idle: Duration, parts: &[String]) -> Error {
    Error::Timeout(format!(
        "no progress for {:.1} s (FERROCCL_TIMEOUT): {}; the communicator is unusable, destroy or abort it",
        idle.as_secs_f64(),
        parts.join("; ")
    ))
}

/// The peers one communicator's unfinished work waits on: posted requests, the fronts of
/// the per-peer queues whose dependencies are met, and the node operation's laggards.
fn waited_peers(cw: &CommWork<'_>, st: &CommState) -> Vec<usize> {
    let mut peers: Vec<usize> = st.posted_sends.iter().map(|&(p, _, _)| p).collect();
    peers.extend(st.posted_recvs.iter().map(|p| p.peer));
    for queues in [&st.send_queues, &st.recv_queues] {
        for (peer, q) in queues.iter().enumerate() {
            if let Some(&(w, s)) = q.front() {
                if deps_done(&cw.works[w], &st.work_state[w], s) {
                    peers.push(peer);
                }
            }
        }
    }
    if let (Some(&w), Some(area)) = (st.node_works.front(), cw.links.node()) {
        if let Some(op) = &cw.works[w].node {
            peers.extend(op.waiting_for(area));
        }
    }
    peers.retain(|&p| p != cw.rank);
    peers.sort_unstable();
    peers.dedup();
    peers
}

impl CommState {
    /// Empties the queues, keeping their capacity.
    fn clear(&mut self) {
        self.send_queues.iter_mut().for_each(VecDeque::clear);
        self.recv_queues.iter_mut().for_each(VecDeque::clear);
        self.posted_sends.clear();
        for p in self.posted_recvs.drain(..) {
            drop(p.staging);
        }
        self.locals.clear();
        self.node_works.clear();
        self.remaining = 0;
        self.gated = false;
    }
}

/// Makes `st` the state of `cw`'s works, reusing its allocations.
fn reset_state(st: &mut CommState, cw: &CommWork<'_>) -> Result<()> {
    let nranks = cw.links_nranks();
    st.clear();
    st.send_queues.resize_with(nranks, VecDeque::new);
    st.recv_queues.resize_with(nranks, VecDeque::new);
    if st.work_state.len() < cw.works.len() {
        st.work_state.resize_with(cw.works.len(), WorkState::default);
    }
    for (w, work) in cw.works.iter().enumerate() {
        let n = work.plan.steps.len();
        let ws = &mut st.work_state[w];
        ws.done.clear();
        ws.done.resize(n, false);
        ws.remaining = n;
        ws.scratch.clear();
        ws.scratch.resize(work.plan.scratch_bytes.div_ceil(8), 0);
        ws.landed = 0;
        ws.stage_log.clear();
        match &work.stage {
            // A node operation has no steps: its output goes back once it is done.
            Some(_) if work.node.is_some() => {}
            Some(stage) => stage.count_writers(&work.plan, &mut ws.writers),
            None => {}
        }
        st.remaining += n;
        if work.node.is_some() {
            st.node_works.push_back(w);
            st.remaining += 1;
        }
        for (s, planned) in work.plan.steps.iter().enumerate() {
            check_slices(work, &planned.step)?;
            match planned.step {
                Step::Send { peer, .. } => queue(&mut st.send_queues, peer, nranks, (w, s))?,
                Step::Recv { peer, .. } => queue(&mut st.recv_queues, peer, nranks, (w, s))?,
                Step::Local(_) => st.locals.push((w, s)),
            }
            if planned.step_needs_reduction() && work.reduction.is_none() {
                return Err(Error::internal("plan reduces but the operation has no reduction"));
            }
        }
    }
    Ok(())
}

impl CommWork<'_> {
    fn links_nranks(&self) -> usize {
        self.links.nranks()
    }
}

impl super::plan::PlannedStep {
    fn step_needs_reduction(&self) -> bool {
        matches!(
            self.step,
            Step::Recv { action: RecvAction::Combine { .. } | RecvAction::Accumulate, .. }
                | Step::Local(LocalOp::Prepare { .. } | LocalOp::Finalize { .. })
        )
    }
}

fn queue(queues: &mut [VecDeque<StepRef>], peer: usize, nranks: usize, r: StepRef) -> Result<()> {
    if peer >= nranks {
        return Err(Error::internal(format!("plan names peer {peer} of {nranks}")));
    }
    queues[peer].push_back(r);
    Ok(())
}

fn buf_len(work: &Work, buf: BufId) -> usize {
    match buf {
        BufId::Send => work.bufs.send_len,
        BufId::Recv => work.bufs.recv_len,
        BufId::Scratch => work.plan.scratch_bytes,
    }
}

/// Plans come from our own generators, but a bad one must fail, never touch foreign memory.
fn check_slices(work: &Work, step: &Step) -> Result<()> {
    let check = |s: &Slice| {
        if s.end() > buf_len(work, s.buf) {
            Err(Error::internal(format!("plan slice {s:?} outside its {}-byte buffer", buf_len(work, s.buf))))
        } else {
            Ok(())
        }
    };
    match step {
        Step::Send { src, .. } => check(src),
        Step::Recv { dst, action, .. } => {
            check(dst)?;
            if let RecvAction::Combine { local } = action {
                check(local)?;
            }
            Ok(())
        }
        Step::Local(LocalOp::Copy { src, dst } | LocalOp::Prepare { src, dst }) => check(src).and(check(dst)),
        Step::Local(LocalOp::Finalize { buf }) => check(buf),
    }
}

fn deps_done(work: &Work, ws: &WorkState, s: usize) -> bool {
    work.plan.steps[s].deps.iter().all(|&d| ws.done[d as usize])
}

/// A step may start: its dependencies are done and the staged input it touches has landed.
fn can_start(work: &Work, ws: &mut WorkState, s: usize, gated: &mut bool) -> bool {
    if !deps_done(work, ws, s) {
        return false;
    }
    let Some(stage) = &work.stage else { return true };
    let needed = stage.input_needed(&work.plan.steps[s].step);
    if needed & !ws.landed != 0 {
        let landed = stage.landed_mask();
        if landed != ws.landed && tracing_stages() {
            ws.stage_log.push(StageEvent::Landed { pieces: landed, at: Instant::now() });
        }
        ws.landed = landed;
        if needed & !ws.landed != 0 {
            *gated = true;
            return false;
        }
    }
    true
}

fn mark_done(works: &[Work], st: &mut CommState, (w, s): StepRef) {
    let ws = &mut st.work_state[w];
    debug_assert!(!ws.done[s]);
    ws.done[s] = true;
    ws.remaining -= 1;
    st.remaining -= 1;
    if let Some(stage) = &works[w].stage {
        let released = stage.step_done(&works[w].plan.steps[s].step, &mut ws.writers);
        if let Some(piece) = released.filter(|_| tracing_stages()) {
            ws.stage_log.push(StageEvent::Released { piece, at: Instant::now() });
        }
    }
}

/// Address of a slice (bounds were checked in `reset_state`).
fn addr(work: &Work, ws: &mut WorkState, s: &Slice) -> *mut u8 {
    let base = match s.buf {
        BufId::Send => work.bufs.send as *mut u8,
        BufId::Recv => work.bufs.recv,
        BufId::Scratch => ws.scratch.as_mut_ptr() as *mut u8,
    };
    base.wrapping_add(s.offset)
}

fn progress_comm(
    cw: &mut CommWork<'_>,
    st: &mut CommState,
    pool: &mut Vec<Vec<u64>>,
    deadline: &mut Option<Instant>,
) -> Result<bool> {
    let me = cw.rank;
    let mut progressed = false;
    st.gated = false;

    // The node-level operation in front, if any (staged input: once all of it has landed).
    if let Some(&w) = st.node_works.front() {
        let landed = cw.works[w].stage.as_ref().is_none_or(StageProgress::all_landed);
        st.gated |= !landed;
        if landed {
            let area = cw.links.node_area().ok_or_else(|| Error::internal("node operation without a node area"))?;
            let op = cw.works[w].node.as_mut().expect("node_works holds node operations");
            progressed |= op.progress(area, &mut st.work_state[w].scratch)?;
            if op.is_done() {
                st.node_works.pop_front();
                st.remaining -= 1;
                if let Some(stage) = &cw.works[w].stage {
                    stage.release_all();
                }
            }
        }
    }

    // Local steps.
    let mut i = 0;
    while i < st.locals.len() {
        let (w, s) = st.locals[i];
        if can_start(&cw.works[w], &mut st.work_state[w], s, &mut st.gated) {
            let Step::Local(op) = cw.works[w].plan.steps[s].step else { unreachable!("locals hold local steps") };
            run_local(&cw.works[w], &mut st.work_state[w], &op)?;
            st.locals.swap_remove(i);
            mark_done(&cw.works, st, (w, s));
            progressed = true;
        } else {
            i += 1;
        }
    }

    // Sends and receives to self: matched in FIFO order, done as copies.
    while let (Some(&(sw, ss)), Some(&(rw, rs))) = (st.send_queues[me].front(), st.recv_queues[me].front()) {
        if !can_start(&cw.works[sw], &mut st.work_state[sw], ss, &mut st.gated)
            || !can_start(&cw.works[rw], &mut st.work_state[rw], rs, &mut st.gated)
        {
            break;
        }
        let Step::Send { src, .. } = cw.works[sw].plan.steps[ss].step else { unreachable!() };
        let Step::Recv { dst, action, .. } = cw.works[rw].plan.steps[rs].step else { unreachable!() };
        cw.works[rw].sig.check(cw.works[sw].sig, me, me)?;
        if src.len != dst.len {
            return Err(Error::invalid_usage(format!(
                "send to self of {} bytes matched a receive of {} bytes",
                src.len, dst.len
            )));
        }
        let mut staging = take_staging(pool, src.len);
        let src_ptr = addr(&cw.works[sw], &mut st.work_state[sw], &src);
        // SAFETY: src is a checked slice of a live buffer; staging is our own allocation of
        // at least src.len bytes, so the regions cannot overlap.
        unsafe { crate::memcopy::copy_bytes(src_ptr, staging.as_mut_ptr() as *mut u8, src.len) };
        apply_recv(&cw.works[rw], &mut st.work_state[rw], &dst, &action, &staging)?;
        pool.push(std::mem::take(&mut staging));
        st.send_queues[me].pop_front();
        st.recv_queues[me].pop_front();
        mark_done(&cw.works, st, (sw, ss));
        mark_done(&cw.works, st, (rw, rs));
        progressed = true;
    }

    // Post sends whose dependencies are met, in per-peer order.
    for peer in 0..st.send_queues.len() {
        if peer == me {
            continue;
        }
        while let Some(&(w, s)) = st.send_queues[peer].front() {
            if !can_start(&cw.works[w], &mut st.work_state[w], s, &mut st.gated) {
                break;
            }
            let Step::Send { src, .. } = cw.works[w].plan.steps[s].step else { unreachable!() };
            let ptr = addr(&cw.works[w], &mut st.work_state[w], &src);
            // SAFETY: a checked slice of a live buffer that the plan does not write until this
            // send has completed (the plan's dependency rule).
            let region = unsafe { MemRegion::new(ptr, src.len) };
            let conn = cw.links.send_conn(peer)?;
            match conn.isend(region, cw.works[w].sig).map_err(|e| name_ranks(e, me, peer))? {
                Some(req) => {
                    st.send_queues[peer].pop_front();
                    st.posted_sends.push((peer, req, (w, s)));
                    stage_event(&cw.works[w], &mut st.work_state[w], |at, cpu| StageEvent::Posted {
                        send: true,
                        step: s,
                        at,
                        cpu,
                    });
                    progressed = true;
                }
                None => break,
            }
        }
    }

    // Post receives likewise: straight into the destination for copies, else into staging.
    for peer in 0..st.recv_queues.len() {
        if peer == me {
            continue;
        }
        while let Some(&(w, s)) = st.recv_queues[peer].front() {
            if !can_start(&cw.works[w], &mut st.work_state[w], s, &mut st.gated) {
                break;
            }
            let Some(conn) = cw.links.recv_conn(peer)? else {
                let deadline = *deadline.get_or_insert_with(|| Instant::now() + crate::bootstrap::timeout());
                if Instant::now() > deadline {
                    return Err(Error::Timeout(format!("rank {peer} never connected to rank {me}")));
                }
                break;
            };
            let Step::Recv { dst, action, .. } = cw.works[w].plan.steps[s].step else { unreachable!() };
            let dst_ptr = addr(&cw.works[w], &mut st.work_state[w], &dst);
            // SAFETY: a checked slice of a live buffer, untouched by the plan until this
            // receive completes (the plan's dependency rule).
            let dst_region = unsafe { MemRegion::new(dst_ptr, dst.len) };
            let on_arrival = match action {
                RecvAction::Copy => Some(RecvOp::Copy),
                _ if !conn.reduces_on_arrival() => None,
                RecvAction::Accumulate => {
                    Some(RecvOp::Accumulate { reduction: cw.works[w].reduction.expect("checked in reset_state") })
                }
                RecvAction::Combine { local } => {
                    let local_ptr = addr(&cw.works[w], &mut st.work_state[w], &local);
                    if local.len != dst.len || (local_ptr != dst_ptr && ranges_overlap(local_ptr, dst_ptr, dst.len)) {
                        return Err(Error::internal("combine with partially overlapping or unequal slices"));
                    }
                    // SAFETY: a checked slice of a live buffer, read-only for the receive's life.
                    let local = unsafe { MemRegion::new(local_ptr, local.len) };
                    Some(RecvOp::Combine { local, reduction: cw.works[w].reduction.expect("checked in reset_state") })
                }
            };
            let sig = cw.works[w].sig;
            let (posted, staging) = match on_arrival {
                Some(op) => (conn.irecv_op(dst_region, op, sig).map_err(|e| name_ranks(e, me, peer))?, None),
                None => {
                    let mut buf = take_staging(pool, dst.len);
                    // SAFETY: staging is owned by the PostedRecv entry until the request completes.
                    let region = unsafe { MemRegion::new(buf.as_mut_ptr() as *mut u8, dst.len) };
                    (conn.irecv(region, sig).map_err(|e| name_ranks(e, me, peer))?, Some(buf))
                }
            };
            match posted {
                Some(req) => {
                    st.recv_queues[peer].pop_front();
                    st.posted_recvs.push(PostedRecv { peer, req, step: (w, s), staging });
                    stage_event(&cw.works[w], &mut st.work_state[w], |at, cpu| StageEvent::Posted {
                        send: false,
                        step: s,
                        at,
                        cpu,
                    });
                    progressed = true;
                }
                None => {
                    if let Some(b) = staging {
                        pool.push(b);
                    }
                    break;
                }
            }
        }
    }

    // Complete what finished.
    let mut i = 0;
    while i < st.posted_sends.len() {
        let (peer, req, r) = st.posted_sends[i];
        let conn = cw.links.send_conn(peer)?;
        if conn.test(req).map_err(|e| name_ranks(e, me, peer))?.is_some() {
            st.posted_sends.swap_remove(i);
            stage_event(&cw.works[r.0], &mut st.work_state[r.0], |at, cpu| StageEvent::Completed {
                send: true,
                step: r.1,
                at,
                cpu,
            });
            mark_done(&cw.works, st, r);
            progressed = true;
        } else {
            i += 1;
        }
    }
    let mut i = 0;
    while i < st.posted_recvs.len() {
        let peer = st.posted_recvs[i].peer;
        let conn = cw.links.recv_conn(peer)?.ok_or_else(|| Error::internal("posted receive lost its connection"))?;
        if conn.test(st.posted_recvs[i].req).map_err(|e| name_ranks(e, me, peer))?.is_none() {
            i += 1;
            continue;
        }
        let posted = st.posted_recvs.swap_remove(i);
        let (w, s) = posted.step;
        stage_event(&cw.works[w], &mut st.work_state[w], |at, cpu| StageEvent::Completed {
            send: false,
            step: s,
            at,
            cpu,
        });
        if let Some(staging) = posted.staging {
            let Step::Recv { dst, action, .. } = cw.works[w].plan.steps[s].step else { unreachable!() };
            apply_recv(&cw.works[w], &mut st.work_state[w], &dst, &action, &staging)?;
            pool.push(staging);
        }
        mark_done(&cw.works, st, (w, s));
        progressed = true;
    }
    Ok(progressed)
}

/// A transport's error with the ranks named: a mismatch ("this rank", "the peer"), or a
/// failed connection (which transports name by address).
fn name_ranks(e: Error, me: usize, peer: usize) -> Error {
    match e {
        Error::InvalidUsage(m) if m.starts_with("mismatched calls") => Error::InvalidUsage(
            m.replace("this rank", &format!("rank {me}")).replace("the peer", &format!("rank {peer}")),
        ),
        Error::Remote(m) if !m.contains(&format!("rank {peer}")) => {
            Error::Remote(format!("rank {me} with rank {peer}: {m}"))
        }
        other => other,
    }
}

fn take_staging(pool: &mut Vec<Vec<u64>>, bytes: usize) -> Vec<u64> {
    let words = bytes.div_ceil(8).max(1);
    match pool.iter().position(|b| b.len() >= words) {
        Some(i) => pool.swap_remove(i),
        None => vec![0u64; words],
    }
}

/// Bytes of a staging buffer.
fn staging_bytes(staging: &[u64], len: usize) -> &[u8] {
    debug_assert!(len <= staging.len() * 8);
    // SAFETY: u64 storage reinterpreted as bytes; len is within the allocation.
    unsafe { std::slice::from_raw_parts(staging.as_ptr() as *const u8, len) }
}

fn apply_recv(work: &Work, ws: &mut WorkState, dst: &Slice, action: &RecvAction, staging: &[u64]) -> Result<()> {
    let incoming = staging_bytes(staging, dst.len);
    let dst_ptr = addr(work, ws, dst);
    match action {
        RecvAction::Copy => {
            // SAFETY: dst is a checked slice of a live buffer; staging is a separate allocation.
            unsafe { crate::memcopy::copy_bytes(incoming.as_ptr(), dst_ptr, dst.len) };
            Ok(())
        }
        RecvAction::Accumulate => {
            let red = work.reduction.as_ref().expect("checked in reset_state");
            // SAFETY: dst is a checked slice no other step touches while this one runs.
            let dst_bytes = unsafe { std::slice::from_raw_parts_mut(dst_ptr, dst.len) };
            red.accumulate(dst_bytes, incoming)
        }
        RecvAction::Combine { local } => {
            let red = work.reduction.as_ref().expect("checked in reset_state");
            let local_ptr = addr(work, ws, local) as *const u8;
            if local.len != dst.len {
                return Err(Error::internal("combine with slices of different lengths"));
            }
            // SAFETY: dst is a checked slice no other step touches while this one runs.
            let dst_bytes = unsafe { std::slice::from_raw_parts_mut(dst_ptr, dst.len) };
            if std::ptr::eq(local_ptr, dst_ptr) {
                red.combine_in_place(dst_bytes, incoming)
            } else if ranges_overlap(local_ptr, dst_ptr, dst.len) {
                Err(Error::internal("combine with partially overlapping slices"))
            } else {
                // SAFETY: local is a checked slice of a live buffer, disjoint from dst.
                let local_bytes = unsafe { std::slice::from_raw_parts(local_ptr, local.len) };
                red.combine(dst_bytes, incoming, local_bytes)
            }
        }
    }
}

fn ranges_overlap(a: *const u8, b: *const u8, len: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    a < b + len && b < a + len
}

fn run_local(work: &Work, ws: &mut WorkState, op: &LocalOp) -> Result<()> {
    match op {
        LocalOp::Copy { src, dst } => {
            let s = addr(work, ws, src) as *const u8;
            let d = addr(work, ws, dst);
            if src.len != dst.len {
                return Err(Error::internal("local copy of different lengths"));
            }
            if !std::ptr::eq(s, d) {
                // SAFETY: both are checked slices of live buffers; `copy` handles overlap.
                unsafe { crate::memcopy::copy_bytes(s, d, src.len) };
            }
            Ok(())
        }
        LocalOp::Prepare { src, dst } => {
            let red = work.reduction.as_ref().expect("checked in reset_state");
            let s = addr(work, ws, src) as *const u8;
            let d = addr(work, ws, dst);
            // SAFETY: dst is a checked slice no other step touches while this one runs.
            let dst_bytes = unsafe { std::slice::from_raw_parts_mut(d, dst.len) };
            if std::ptr::eq(s, d) {
                red.prepare_in_place(dst_bytes)
            } else if ranges_overlap(s, d, dst.len) {
                Err(Error::internal("prepare with partially overlapping slices"))
            } else {
                // SAFETY: src is a checked slice of a live buffer, disjoint from dst.
                red.prepare(dst_bytes, unsafe { std::slice::from_raw_parts(s, src.len) })
            }
        }
        LocalOp::Finalize { buf } => {
            let red = work.reduction.as_ref().expect("checked in reset_state");
            let p = addr(work, ws, buf);
            // SAFETY: a checked slice no other step touches while this one runs.
            red.finalize(unsafe { std::slice::from_raw_parts_mut(p, buf.len) })
        }
    }
}

/// Sleeps until a socket with posted work is ready (or a short timeout, as a safety net).
/// Connections without a descriptor to wait on (shared memory) are polled: then the thread
/// only yields, and naps briefly after a long idle stretch so oversubscribed ranks share cores.
fn wait_for_io(comms: &[CommWork<'_>], states: &[CommState], idle_rounds: u32) {
    let mut fds: Vec<libc::pollfd> = Vec::new();
    // Node operations wait on counters in shared memory, and gated steps on copies from the
    // GPU: nothing to sleep on.
    let mut must_spin = states.iter().any(|st| !st.node_works.is_empty() || st.gated);
    let mut add = |h: Option<WaitHint>| match h {
        Some(h) => {
            let mut events = 0;
            if h.readable {
                events |= libc::POLLIN;
            }
            if h.writable {
                events |= libc::POLLOUT;
            }
            fds.push(libc::pollfd { fd: h.fd, events, revents: 0 });
        }
        None => must_spin = true,
    };
    for (cw, st) in comms.iter().zip(states) {
        for (peer, q) in st.recv_queues.iter().enumerate() {
            if !q.is_empty() && peer != cw.rank && cw.links.recv_connected(peer).is_none() {
                add(cw.links.accept_hint(peer));
            }
        }
        for &(peer, _, _) in &st.posted_sends {
            add(cw.links.send_connected(peer).and_then(|c| c.wait_hint()));
        }
        for p in &st.posted_recvs {
            add(cw.links.recv_connected(p.peer).and_then(|c| c.wait_hint()));
        }
    }
    if must_spin {
        if idle_rounds > 20_000 {
            std::thread::sleep(Duration::from_micros(50));
        } else {
            std::thread::yield_now();
        }
        return;
    }
    fds.sort_by_key(|p| (p.fd, p.events));
    fds.dedup_by_key(|p| (p.fd, p.events));
    let timeout = Duration::from_millis(20);
    // SAFETY: fds is a valid array of pollfd for the duration of the call.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout.as_millis() as i32) };
}
