//! Collective operations on host memory: argument checks, buffer layout (NCCL's count and
//! in-place rules), algorithm choice, and execution of the resulting plans.
//!
//! - [`plan`]: the step data model; [`algo`]: plan generators (ring, tree, direct) and the
//!   size-based choice; `sim`: a socket-free simulator for the tests (not shipped);
//! - [`plan_cache`]: plans by operation shape, per communicator; [`exec`]: the progress
//!   engine; [`node`]: node-area algorithms;
//! - `reduce`: the element-wise kernels, re-exported from the bottom-level [`crate::reduce`].
//!
//! Sits above `comm` (it runs on a communicator's connections); nothing below uses it.

pub mod algo;
mod captured;
pub mod device_p2p;
pub mod estimate;
pub mod exec;
mod fast;
pub mod local_order;
pub mod node;
pub mod one_gpu;
pub mod plan;
pub mod plan_cache;
pub mod progressive;
pub use crate::reduce;
#[cfg(test)]
mod sim;
mod stage_trial;
mod staging_pool;
pub mod stream;

use std::sync::Arc;

use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::transport::OpSig;
use crate::types::DataType;
use algo::CollKind;
use exec::{CommWork, OpBuffers, Work};
use reduce::Reduction;

/// What this layer keeps per communicator (in [`Comm::with_layer_state`]'s slot).
#[derive(Default)]
pub(crate) struct LayerState {
    pub plans: plan_cache::PlanCache,
    /// The one-GPU path's flag page, once a device operation used it.
    pub gpu: Option<Arc<one_gpu::CommGpu>>,
    pub gpu_logged: bool,
    /// The device point-to-point path's inbox and peer pages, once a send or receive used it.
    pub p2p: Option<Arc<device_p2p::P2pState>>,
    /// The staged path's submission order among ranks of this process, once decided.
    pub staged_order: Option<Option<Arc<local_order::LocalOrder>>>,
    /// The device point-to-point path's submission order among ranks of this process.
    pub p2p_order: Option<Option<Arc<local_order::LocalOrder>>>,
}

/// Which operation, with its root or peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollOp {
    AllReduce,
    Broadcast { root: usize },
    Reduce { root: usize },
    AllGather,
    ReduceScatter,
    AlltoAll,
    Gather { root: usize },
    Scatter { root: usize },
    Send { peer: usize },
    Recv { peer: usize },
}

impl CollOp {
    pub fn name(&self) -> &'static str {
        match self {
            CollOp::AllReduce => "AllReduce",
            CollOp::Broadcast { .. } => "Broadcast",
            CollOp::Reduce { .. } => "Reduce",
            CollOp::AllGather => "AllGather",
            CollOp::ReduceScatter => "ReduceScatter",
            CollOp::AlltoAll => "AlltoAll",
            CollOp::Gather { .. } => "Gather",
            CollOp::Scatter { .. } => "Scatter",
            CollOp::Send { .. } => "Send",
            CollOp::Recv { .. } => "Recv",
        }
    }
}

/// One call as the user made it (pointers are the user's; see [`OpBuffers`]).
#[derive(Clone, Copy, Debug)]
pub struct OpRequest {
    pub op: CollOp,
    pub send: *const u8,
    pub recv: *mut u8,
    pub count: usize,
    pub dtype: DataType,
    pub reduction: Option<Reduction>,
    /// Where the buffers live: host operations run on the calling thread, device ones on
    /// `stream` ([`stream`]).
    pub mem: crate::cuda::memory::MemKind,
    pub stream: crate::cuda::stream::Stream,
    /// A PreMulSum scalar in device memory (`ncclScalarDevice` on a device-buffer call): read
    /// in stream order when the operation runs, so `reduction`'s pre bits are not used.
    pub pre_device: Option<usize>,
    /// The caller passed device buffers. Stays set on the host copies the staged path runs
    /// and on the one-GPU path's host exchanges, so that the signature tells a rank that
    /// passed host buffers apart from one that passed device buffers (a collective's ranks
    /// must agree: their paths differ).
    pub device_call: bool,
}

// SAFETY: a request carries the user's addresses; the API contract keeps them valid until the
// operation completes, whichever thread executes it.
unsafe impl Send for OpRequest {}

/// Bytes of the send and receive buffers this rank uses (NCCL's rules; 0 = unused).
pub(crate) fn buffer_lengths(req: &OpRequest, rank: usize, nranks: usize) -> Result<(usize, usize)> {
    let bytes = req
        .count
        .checked_mul(req.dtype.size())
        .ok_or_else(|| Error::invalid_argument(format!("count {} overflows", req.count)))?;
    let all =
        bytes.checked_mul(nranks).ok_or_else(|| Error::invalid_argument(format!("count {} overflows", req.count)))?;
    Ok(match req.op {
        CollOp::AllReduce => (bytes, bytes),
        CollOp::Broadcast { root } => (if rank == root { bytes } else { 0 }, bytes),
        CollOp::Reduce { root } => (bytes, if rank == root { bytes } else { 0 }),
        CollOp::AllGather => (bytes, all),
        CollOp::ReduceScatter => (all, bytes),
        CollOp::AlltoAll => (all, all),
        CollOp::Gather { root } => (bytes, if rank == root { all } else { 0 }),
        CollOp::Scatter { root } => (if rank == root { all } else { 0 }, bytes),
        CollOp::Send { .. } => (bytes, 0),
        CollOp::Recv { .. } => (0, bytes),
    })
}

/// Checks a call's arguments against the communicator; nothing is changed on error.
pub fn validate(comm: &Comm, req: &OpRequest) -> Result<()> {
    let n = comm.nranks;
    match req.op {
        CollOp::Broadcast { root } | CollOp::Reduce { root } | CollOp::Gather { root } | CollOp::Scatter { root }
            if root >= n =>
        {
            return Err(Error::invalid_argument(format!("root {root} is out of range for {n} ranks")))
        }
        CollOp::Send { peer } | CollOp::Recv { peer } if peer >= n => {
            return Err(Error::invalid_argument(format!("peer {peer} is out of range for {n} ranks")))
        }
        _ => {}
    }
    let (send_len, recv_len) = buffer_lengths(req, comm.rank, n)?;
    if send_len > 0 && req.send.is_null() {
        return Err(Error::invalid_argument(format!("sendbuff is NULL with count {}", req.count)));
    }
    if recv_len > 0 && req.recv.is_null() {
        return Err(Error::invalid_argument(format!("recvbuff is NULL with count {}", req.count)));
    }
    let needs_reduction = matches!(req.op, CollOp::AllReduce | CollOp::Reduce { .. } | CollOp::ReduceScatter);
    if needs_reduction && req.reduction.is_none() {
        return Err(Error::internal("reduction operation without an operator"));
    }
    Ok(())
}

/// A group's operations per communicator: call order kept within each, communicators in order
/// of first appearance (the shape [`run`] takes).
pub fn by_communicator(ops: Vec<(Arc<Comm>, OpRequest)>) -> Vec<(Arc<Comm>, Vec<OpRequest>)> {
    let mut by_comm: Vec<(Arc<Comm>, Vec<OpRequest>)> = Vec::new();
    for (comm, req) in ops {
        match by_comm.iter_mut().find(|(c, _)| Arc::ptr_eq(c, &comm)) {
            Some((_, list)) => list.push(req),
            None => by_comm.push((comm, vec![req])),
        }
    }
    by_comm
}

/// Runs every queued operation of a group, per communicator in call order.
pub fn run(by_comm: &[(Arc<Comm>, Vec<OpRequest>)]) -> Result<()> {
    let tuning = tuning()?;
    let mut guards = Vec::with_capacity(by_comm.len());
    for (comm, _) in by_comm {
        guards.push(comm.links()?);
    }
    let mut comm_works = Vec::with_capacity(by_comm.len());
    for ((comm, reqs), links) in by_comm.iter().zip(guards.iter_mut()) {
        let mut works = reqs.iter().map(|r| prepare(comm, r, tuning, true)).collect::<Result<Vec<_>>>()?;
        isolate_cross_op_inputs(&mut works);
        comm_works.push(CommWork { rank: comm.rank, links, works });
    }
    exec::execute(&mut comm_works)
}

/// Runs one operation outside a group: the same as [`run`] without its per-group
/// bookkeeping, which is a visible part of a small operation's cost. A node operation skips
/// the executor's step queues too.
pub fn run_one(comm: &Arc<Comm>, req: &OpRequest) -> Result<()> {
    let mut links = comm.links()?;
    if req.count == 0 {
        // Every plan of count 0 is empty and no node algorithm takes it: nothing to run.
        return Ok(());
    }
    if comm.nranks == 1 && !matches!(req.op, CollOp::Send { .. } | CollOp::Recv { .. }) {
        return run_single(req);
    }
    // A call shaped like a recent one skips the choice, unless its input needs a private copy.
    if let Some(fast::Found { shape, timed }) = fast::find(comm, req) {
        if !needs_copy(req, comm.rank, shape.block, shape.send_len, shape.recv_len) {
            let Some(timed) = timed else {
                return exec::execute_node(comm.rank, &mut links, &mut shape.op(req.send, req.recv));
            };
            let start = std::time::Instant::now();
            exec::execute_node(comm.rank, &mut links, &mut shape.op(req.send, req.recv))?;
            fast::record(comm, req, timed, start.elapsed());
            return Ok(());
        }
    }
    let tuning = tuning()?;
    let layout = layout(comm, req)?;
    if let Some(shape) = node_shape(comm, req, &layout, tuning, true)? {
        // FERROCCL_NODE_STAGE_MAX fixes the limit; FERROCCL_NODE_STAGE_TRIAL=0 keeps the rules.
        let tried = tuning.node_stage_trial
            && tuning.node_stage_max.is_none()
            && stage_trial::applies(
                &shape.coll,
                shape.algo,
                shape.message_bytes(comm.nranks),
                (shape.stage_max, shape.stage_off_huge_max),
                comm.nranks,
                comm.nranks <= crate::topo::usable_cores(),
                req.device_call,
            );
        fast::remember(comm, req, shape, tried.then(stage_trial::StageTrial::default));
        // `layout` keeps a private copy of an overlapping input alive until this returns.
        return exec::execute_node(comm.rank, &mut links, &mut shape.op(layout.bufs.send, layout.bufs.recv));
    }
    let works = vec![plan_work(comm, req, layout, tuning, true)?];
    exec::execute(&mut [CommWork { rank: comm.rank, links: &mut links, works }])
}

/// A collective of a one-rank communicator: its result is its own input, through the
/// reduction's scaling (PreMulSum, average) for the reducing ones, so it is a local copy with
/// no plan and no executor (an 8-byte all-reduce took 0.25 us through them on the 2-core VM,
/// Open MPI's 0.01). Sends and receives to itself still pair up through the executor.
fn run_single(req: &OpRequest) -> Result<()> {
    let (send_len, recv_len) = buffer_lengths(req, 0, 1)?;
    if send_len != recv_len {
        return Err(Error::internal(format!("one-rank {}: {send_len} bytes in, {recv_len} out", req.op.name())));
    }
    let (send, recv) = (req.send, req.recv);
    let reduction = match req.op {
        CollOp::AllReduce | CollOp::Reduce { .. } | CollOp::ReduceScatter => req.reduction,
        _ => None,
    };
    let Some(red) = reduction else {
        if !std::ptr::eq(send, recv) {
            // SAFETY: the caller's buffers, valid for `send_len` (= `recv_len`) bytes each (API
            // contract, checked for null by validate); they may overlap, which `copy` allows.
            unsafe { crate::memcopy::copy_bytes(send, recv, send_len) };
        }
        return Ok(());
    };
    let (s, r) = (send as usize, recv as usize);
    // Overlapping other than in place: from a private copy of the input, taken first.
    let overlapping = s != r && s < r + recv_len && r < s + send_len;
    // SAFETY: the caller's send buffer, valid for `send_len` bytes, read before any write.
    let private = overlapping.then(|| unsafe { std::slice::from_raw_parts(send, send_len) }.to_vec());
    // SAFETY: the caller's receive buffer, valid for `recv_len` bytes and ours until we return;
    // no other reference into it is alive below (the input is the private copy when they overlap).
    let out = unsafe { std::slice::from_raw_parts_mut(recv, recv_len) };
    if s == r {
        red.prepare_in_place(out)?;
    } else {
        let input: &[u8] = match &private {
            Some(copy) => copy,
            // SAFETY: the caller's send buffer, valid for `send_len` bytes, apart from `out`.
            None => unsafe { std::slice::from_raw_parts(send, send_len) },
        };
        red.prepare(out, input)?;
    }
    red.finalize(out)
}

/// Runs one staged device operation whose input lands and whose output leaves piece by
/// piece (`progressive`): the executor starts each step once the input it reads has landed.
pub fn run_progressive(comm: &Arc<Comm>, req: &OpRequest, stage: progressive::StageProgress) -> Result<()> {
    let tuning = tuning()?;
    let mut links = comm.links()?;
    let mut work = prepare(comm, req, tuning, true)?;
    if work.send_copy.is_some() {
        // A private copy of the input is taken before any of it has landed.
        return Err(Error::internal("staged send and receive buffers overlap"));
    }
    work.stage = Some(stage);
    exec::execute(&mut [CommWork { rank: comm.rank, links: &mut links, works: vec![work] }])
}

/// The orders in which a staged operation's input pieces are copied in and its output pieces
/// copied back: the order its plan reads and finishes them ([`progressive::input_order`],
/// [`progressive::output_order`]). A node-level operation starts once all of its input has
/// landed and releases its output at once, so buffer order is as good as any; so it is when
/// the request cannot be planned (the worker reports that).
pub fn staged_orders(
    comm: &Comm,
    req: &OpRequest,
    input: progressive::Pieces,
    output: progressive::Pieces,
) -> (Vec<usize>, Vec<usize>) {
    match tuning().and_then(|t| prepare(comm, req, t, false)) {
        Ok(work) if work.node.is_none() => {
            (progressive::input_order(&work.plan, input), progressive::output_order(&work.plan, output))
        }
        _ => ((0..input.count()).collect(), (0..output.count()).collect()),
    }
}

/// Turns a request into a plan over its buffers; `announce`: log the choice (COLL, TUNING),
/// which a caller only looking ahead at the plan leaves to the call that runs it.
fn prepare(comm: &Comm, req: &OpRequest, tuning: &'static algo::Tuning, announce: bool) -> Result<Work> {
    let layout = layout(comm, req)?;
    match node_shape(comm, req, &layout, tuning, announce)? {
        Some(shape) => Ok(Work {
            plan: node_plan(shape.algo),
            node: Some(shape.op(layout.bufs.send, layout.bufs.recv)),
            bufs: layout.bufs,
            reduction: req.reduction,
            send_copy: layout.send_copy,
            sig: layout.sig,
            stage: None,
        }),
        None => plan_work(comm, req, layout, tuning, announce),
    }
}

/// A call's buffers as this rank uses them.
struct Layout {
    bufs: OpBuffers,
    /// Private copy of an input that overlaps the output other than in NCCL's in-place
    /// forms; `bufs.send` points into it.
    send_copy: Option<Vec<u64>>,
    in_place: bool,
    /// Bytes of one rank's block (`count` elements).
    block: usize,
    sig: OpSig,
}

fn layout(comm: &Comm, req: &OpRequest) -> Result<Layout> {
    let rank = comm.rank;
    let (send_len, recv_len) = buffer_lengths(req, rank, comm.nranks)?;
    let block = req.count * req.dtype.size();
    let in_place = in_place(req, rank, block);
    let mut bufs = OpBuffers { send: req.send, send_len, recv: req.recv, recv_len };
    let mut send_copy = None;
    if needs_copy(req, rank, block, send_len, recv_len) {
        let mut copy = vec![0u64; send_len.div_ceil(8)];
        // SAFETY: the user's send buffer is valid for send_len bytes (API contract); copy is ours.
        unsafe { crate::memcopy::copy_bytes(req.send, copy.as_mut_ptr() as *mut u8, send_len) };
        bufs.send = copy.as_ptr() as *const u8;
        send_copy = Some(copy);
    }
    Ok(Layout { bufs, send_copy, in_place, block, sig: signature(req) })
}

/// Whether the call takes one of NCCL's in-place forms.
fn in_place(req: &OpRequest, rank: usize, block: usize) -> bool {
    let send = req.send as usize;
    let recv = req.recv as usize;
    match req.op {
        CollOp::AllReduce | CollOp::Broadcast { .. } | CollOp::Reduce { .. } => send == recv && send != 0,
        CollOp::AllGather => send != 0 && send == recv + rank * block,
        CollOp::ReduceScatter => recv != 0 && recv == send + rank * block,
        CollOp::Gather { root } => rank == root && send != 0 && send == recv + root * block,
        CollOp::Scatter { root } => rank == root && recv != 0 && recv == send + root * block,
        CollOp::AlltoAll | CollOp::Send { .. } | CollOp::Recv { .. } => false,
    }
}

/// Whether send and receive memory overlap other than in an in-place form: the call then
/// works from a private copy of its input.
fn needs_copy(req: &OpRequest, rank: usize, block: usize, send_len: usize, recv_len: usize) -> bool {
    let (send, recv) = (req.send as usize, req.recv as usize);
    let overlap = send_len > 0 && recv_len > 0 && send < recv + recv_len && recv < send + send_len;
    overlap && !in_place(req, rank, block)
}

/// What the node-level operation for this call would be, bar its buffers, if one applies.
fn node_shape(
    comm: &Comm,
    req: &OpRequest,
    layout: &Layout,
    tuning: &algo::Tuning,
    announce: bool,
) -> Result<Option<fast::Shape>> {
    let n = comm.nranks;
    let Some(algo) = node_algorithm(comm, req, layout.block, tuning) else { return Ok(None) };
    let coll = match req.op {
        CollOp::AllReduce => {
            node::NodeColl::AllReduce(req.reduction.ok_or_else(|| Error::internal("all-reduce without an operator"))?)
        }
        CollOp::AllGather => node::NodeColl::AllGather,
        CollOp::Broadcast { root } => node::NodeColl::Broadcast { root },
        CollOp::Gather { root } => node::NodeColl::Gather { root },
        CollOp::ReduceScatter => node::NodeColl::ReduceScatter(
            req.reduction.ok_or_else(|| Error::internal("reduce-scatter without an operator"))?,
        ),
        _ => return Err(Error::internal(format!("no node algorithm for {}", req.op.name()))),
    };
    if announce {
        log::debug!(target: "COLL", "{} count {} datatype {} in_place {} algorithm {}", req.op.name(), req.count, req.dtype, layout.in_place, algo.name());
    }
    let oversubscribed = n > crate::topo::usable_cores();
    // FERROCCL_NODE_STAGE_MAX sets one limit, huge pages or not.
    let (stage_max, stage_off_huge_max) = match tuning.node_stage_max {
        Some(max) => (max, max),
        None => {
            // Measured once per process, and only where the rule asks (two ranks with a core each).
            let slow_copies = n == 2 && !oversubscribed && crate::transport::peer_mem::small_page_kernel_copies_slow();
            (
                node::default_stage_max(&coll, n, oversubscribed),
                node::default_stage_off_huge_max(&coll, n, oversubscribed, slow_copies),
            )
        }
    };
    let relay_sizes = match tuning.node_relay_min {
        Some(min) => node::RelaySizes::from_min(min),
        None => node::default_relay_sizes(n, oversubscribed),
    };
    let bufs = &layout.bufs;
    Ok(Some(fast::Shape {
        coll,
        algo,
        block: layout.block,
        send_len: bufs.send_len,
        recv_len: bufs.recv_len,
        sig: layout.sig,
        stage_max,
        stage_off_huge_max,
        relay_sizes,
    }))
}

/// A call's work through the plan executor (ring, tree, direct messages).
fn plan_work(
    comm: &Comm,
    req: &OpRequest,
    layout: Layout,
    tuning: &'static algo::Tuning,
    announce: bool,
) -> Result<Work> {
    let n = comm.nranks;
    let (kind, root) = match req.op {
        CollOp::AllReduce => (CollKind::AllReduce, 0),
        CollOp::Broadcast { root } => (CollKind::Broadcast, root),
        CollOp::Reduce { root } => (CollKind::Reduce, root),
        CollOp::AllGather => (CollKind::AllGather, 0),
        CollOp::ReduceScatter => (CollKind::ReduceScatter, 0),
        CollOp::AlltoAll => (CollKind::AlltoAll, 0),
        CollOp::Gather { root } => (CollKind::Gather, root),
        CollOp::Scatter { root } => (CollKind::Scatter, root),
        CollOp::Send { peer } => (CollKind::Send, peer),
        CollOp::Recv { peer } => (CollKind::Recv, peer),
    };
    let in_place = layout.in_place;
    let args = algo::CollArgs {
        kind,
        bytes: layout.block,
        root,
        in_place,
        elem_size: req.dtype.size(),
        has_pre: req.reduction.is_some_and(|r| r.has_pre()),
        has_post: req.reduction.is_some_and(|r| r.has_post()),
    };
    let choice = algo::choose(kind, args.total_bytes(n), n, tuning.tree_threshold, &tuning.selection);
    if let Some(reason) = choice.fallback_reason.as_ref().filter(|_| announce) {
        log::info!(target: "TUNING", "{}: {reason}", req.op.name());
    }
    let plan = plan_cache::cached_plan(comm, &args, choice.algorithm, tuning.chunk_bytes)?;
    if announce {
        log::debug!(target: "COLL", "{} count {} datatype {} in_place {in_place} algorithm {} steps {}", req.op.name(), req.count, req.dtype, plan.algorithm, plan.steps.len());
    }
    let Layout { bufs, send_copy, sig, .. } = layout;
    Ok(Work { plan, bufs, reduction: req.reduction, send_copy, node: None, sig, stage: None })
}

/// The signature of a call (`wire::sig`): what every rank's matching call must agree on.
pub(crate) fn signature(req: &OpRequest) -> OpSig {
    let dtype = DataType::ALL.iter().position(|&d| d == req.dtype).unwrap_or(0) as u32;
    let op = req.reduction.map_or(0, |r| {
        let kind = match r.kind {
            reduce::ReduceKind::Sum => 0,
            reduce::ReduceKind::Prod => 1,
            reduce::ReduceKind::Max => 2,
            reduce::ReduceKind::Min => 3,
        };
        OpSig::op_code(kind, r.has_pre(), r.has_post())
    });
    let (kind, root) = match req.op {
        CollOp::AllReduce => (1, 0),
        CollOp::Broadcast { root } => (2, root),
        CollOp::Reduce { root } => (3, root),
        CollOp::AllGather => (4, 0),
        CollOp::ReduceScatter => (5, 0),
        CollOp::AlltoAll => (6, 0),
        CollOp::Gather { root } => (7, root),
        CollOp::Scatter { root } => (8, root),
        // A send matches a receive of as many bytes, whatever type each side names. Device
        // buffers on one side and host buffers on the other take different paths (the device
        // side may exchange buffer descriptions instead of data): told apart below.
        CollOp::Send { .. } | CollOp::Recv { .. } => (crate::wire::sig::KIND_P2P, 0),
    };
    let sig = match req.op {
        CollOp::Send { .. } | CollOp::Recv { .. } => {
            OpSig::new(kind, 0, 0, 0, req.count.wrapping_mul(req.dtype.size()))
        }
        _ => OpSig::new(kind, dtype, op, root, req.count),
    };
    if req.device_call {
        sig.on_device()
    } else {
        sig
    }
}

/// The node-level algorithm for this call, if one applies. Depends only on what every rank
/// of the communicator agrees on (the operation, its size, the communicator, the
/// configuration), as all ranks must choose alike.
fn node_algorithm(comm: &Comm, req: &OpRequest, bytes: usize, tuning: &algo::Tuning) -> Option<node::NodeAlgo> {
    if !comm.node_area || !tuning.selection.is_default() || bytes == 0 {
        return None;
    }
    match req.op {
        // An all-gather's one-shot reads n blocks as an all-reduce's reads n inputs: the same
        // crossover, in bytes per rank.
        CollOp::AllReduce | CollOp::AllGather => {
            let oversubscribed = comm.nranks > crate::topo::usable_cores();
            node::NodeAlgo::for_size(bytes, comm.nranks, oversubscribed, tuning.node_one_shot_max)
        }
        // Small broadcasts: the root posts into a slot and returns, the others copy it out.
        CollOp::Broadcast { .. } => {
            let oversubscribed = comm.nranks > crate::topo::usable_cores();
            node::NodeAlgo::for_broadcast(bytes, comm.nranks, oversubscribed, tuning.node_one_shot_max)
        }
        // Each rank reads its block of every input once: one round, where a ring takes n - 1.
        // Small ones one-shot (each rank posts its whole input, as all-reduce does), when
        // the whole input fits the one-shot slot.
        CollOp::ReduceScatter => {
            let oversubscribed = comm.nranks > crate::topo::usable_cores();
            match node::NodeAlgo::for_size(bytes, comm.nranks, oversubscribed, tuning.node_one_shot_max) {
                Some(node::NodeAlgo::OneShot) if bytes * comm.nranks <= node::ONE_SHOT_INPUT_MAX => {
                    Some(node::NodeAlgo::OneShot)
                }
                _ => Some(node::NodeAlgo::Direct),
            }
        }
        // Small gathers (the device path's per-call exchange among them) one-shot: every rank
        // posts its block, the root copies all; the signatures are compared both ways.
        CollOp::Gather { .. } if bytes <= node::ONE_SHOT_INPUT_MAX => Some(node::NodeAlgo::OneShot),
        _ => None,
    }
}

/// The (step-less) plan a node-level operation carries, for logs and the executor.
fn node_plan(algo: node::NodeAlgo) -> Arc<plan::Plan> {
    static PLANS: std::sync::OnceLock<[Arc<plan::Plan>; 2]> = std::sync::OnceLock::new();
    let plans = PLANS
        .get_or_init(|| [node::NodeAlgo::OneShot, node::NodeAlgo::Direct].map(|a| Arc::new(plan::Plan::new(a.name()))));
    plans[algo as usize].clone()
}

/// Algorithm tuning from the environment (NCCL_ALGO, FERROCCL_CHUNK_SIZE,
/// FERROCCL_TREE_THRESHOLD, FERROCCL_NODE_ONESHOT_MAX, FERROCCL_NODE_STAGE_MAX,
/// FERROCCL_NODE_RELAY_MIN, FERROCCL_NODE_STAGE_TRIAL), parsed once.
fn tuning() -> Result<&'static algo::Tuning> {
    static TUNING: std::sync::OnceLock<std::result::Result<algo::Tuning, String>> = std::sync::OnceLock::new();
    let t = TUNING.get_or_init(|| {
        let selection = match crate::env::get_str("NCCL_ALGO") {
            Some(s) => algo::AlgoSelection::parse(&s).map_err(|e| format!("NCCL_ALGO: {e}"))?,
            None => algo::AlgoSelection::default(),
        };
        Ok(algo::Tuning {
            chunk_bytes: crate::env::get_bytes("FERROCCL_CHUNK_SIZE").max(1) as usize,
            tree_threshold: crate::env::get_bytes("FERROCCL_TREE_THRESHOLD") as usize,
            selection,
            node_one_shot_max: crate::env::get_bytes_opt("FERROCCL_NODE_ONESHOT_MAX").map(|b| b as usize),
            node_stage_max: crate::env::get_bytes_opt("FERROCCL_NODE_STAGE_MAX").map(|b| b as usize),
            node_relay_min: crate::env::get_bytes_opt("FERROCCL_NODE_RELAY_MIN").map(|b| b as usize),
            node_stage_trial: crate::env::get_bool("FERROCCL_NODE_STAGE_TRIAL"),
        })
    });
    t.as_ref().map_err(|e| Error::invalid_usage(e.clone()))
}

/// Operations of one group run concurrently, so one operation's input must not be another's
/// output (in-place sendrecv: ncclSend and ncclRecv on the same buffer). Such inputs are
/// copied aside before anything starts, as a rank's send data is defined at call time.
fn isolate_cross_op_inputs(works: &mut [Work]) {
    let ranges: Vec<(usize, usize)> = works.iter().map(|w| (w.bufs.recv as usize, w.bufs.recv_len)).collect();
    for (i, w) in works.iter_mut().enumerate() {
        let (s, sl) = (w.bufs.send as usize, w.bufs.send_len);
        if sl == 0 || w.send_copy.is_some() {
            continue;
        }
        let clash = ranges.iter().enumerate().any(|(j, &(r, rl))| j != i && rl > 0 && s < r + rl && r < s + sl);
        if clash {
            let mut copy = vec![0u64; sl.div_ceil(8)];
            // SAFETY: the caller's send buffer is valid for send_len bytes (API contract).
            unsafe { crate::memcopy::copy_bytes(w.bufs.send, copy.as_mut_ptr() as *mut u8, sl) };
            w.bufs.send = copy.as_ptr() as *const u8;
            w.send_copy = Some(copy);
        }
    }
}
