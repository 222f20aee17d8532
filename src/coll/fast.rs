//! What a call outside a group resolves to in the node area, remembered per thread.
//!
//! The choice of node algorithm, the call's signature and its staging limit depend only on the
//! call's parameters (operation and root, count, data type, reduction, host or device call)
//! and its communicator, so [`super::run_one`] keeps the last few per thread and a repeated
//! call skips the choice (about a sixth of a small call's fixed path, measured). What changes
//! from call to call (buffers, in-place and overlap, the communicator's state) is still
//! looked at every time by the caller.
//!
//! Owns nothing shared: entries hold their communicator weakly (a destroyed one is never
//! matched again, and its address cannot be reused while an entry names it).

use std::cell::RefCell;
use std::sync::{Arc, Weak};

use super::node::{NodeAlgo, NodeColl, NodeOp};
use super::stage_trial::{Path, StageTrial};
use super::OpRequest;
use crate::comm::Comm;
use crate::wire::OpSig;

/// Shapes kept per thread: a program alternating a few kinds of small calls (an all-reduce
/// and a broadcast of a residual, say) keeps hitting.
const WAYS: usize = 4;

/// Everything of a node operation but its buffers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    pub coll: NodeColl,
    pub algo: NodeAlgo,
    /// Bytes of one rank's block.
    pub block: usize,
    pub send_len: usize,
    pub recv_len: usize,
    pub sig: OpSig,
    pub stage_max: usize,
    pub stage_off_huge_max: usize,
    pub relay_sizes: super::node::RelaySizes,
}

impl Shape {
    /// The message's size as nccl-tests counts it (all ranks' blocks for these two), which the
    /// staging limits bound.
    pub fn message_bytes(&self, nranks: usize) -> usize {
        match self.coll {
            NodeColl::AllGather | NodeColl::ReduceScatter(_) => self.block * nranks,
            _ => self.block,
        }
    }

    /// This shape with its buffers kept out of the slots (peers reach them by kernel copies).
    fn by_kernel_copies(self) -> Shape {
        Shape { stage_max: 0, stage_off_huge_max: 0, ..self }
    }

    /// The operation over these buffers.
    pub fn op(&self, send: *const u8, recv: *mut u8) -> NodeOp {
        NodeOp::new(self.coll, self.algo, send, recv, self.block, self.sig)
            .with_stage_max(self.stage_max)
            .with_stage_off_huge_max(self.stage_off_huge_max)
            .with_relay_sizes(self.relay_sizes)
    }
}

/// The parameters a shape depends on (the communicator aside).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Key {
    op: super::CollOp,
    count: usize,
    dtype: crate::types::DataType,
    reduction: Option<super::reduce::Reduction>,
    device_call: bool,
}

impl Key {
    fn of(req: &OpRequest) -> Key {
        Key { op: req.op, count: req.count, dtype: req.dtype, reduction: req.reduction, device_call: req.device_call }
    }
}

struct Entry<C> {
    comm: Weak<C>,
    key: Key,
    shape: Shape,
    /// Slots or kernel copies, by timing both (`None`: the size rule alone).
    trial: Option<StageTrial>,
}

/// A call's shape as this call runs it; `trial` names the entry and path to time it under.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Found {
    pub shape: Shape,
    pub trial: Option<(usize, Path)>,
}

/// The last [`WAYS`] shapes resolved, by communicator (`C`: [`Comm`]; the tests use others).
struct Shapes<C> {
    entries: [Option<Entry<C>>; WAYS],
    /// The entry the next insertion replaces (round robin).
    next: usize,
}

impl<C> Shapes<C> {
    fn new() -> Shapes<C> {
        Shapes { entries: std::array::from_fn(|_| None), next: 0 }
    }

    fn find(&self, comm: &Arc<C>, req: &OpRequest) -> Option<Found> {
        let key = Key::of(req);
        let comm = Arc::as_ptr(comm);
        let (i, e) = self.entries.iter().enumerate().find_map(|(i, e)| {
            e.as_ref().filter(|e| e.key == key && std::ptr::eq(e.comm.as_ptr(), comm)).map(|e| (i, e))
        })?;
        Some(match e.trial.map(|t| t.path()) {
            Some(Path::KernelCopies) => {
                Found { shape: e.shape.by_kernel_copies(), trial: Some((i, Path::KernelCopies)) }
            }
            Some(Path::Slots) => Found { shape: e.shape, trial: Some((i, Path::Slots)) },
            None => Found { shape: e.shape, trial: None },
        })
    }

    fn remember(&mut self, comm: &Arc<C>, req: &OpRequest, shape: Shape, tried: bool) {
        let trial = tried.then(StageTrial::default);
        self.entries[self.next] = Some(Entry { comm: Arc::downgrade(comm), key: Key::of(req), shape, trial });
        self.next = (self.next + 1) % WAYS;
    }

    /// Times a call that [`Self::find`] sent down `path` from entry `i`; returns the shape and
    /// the trial's medians when its verdict changed.
    fn record(&mut self, i: usize, path: Path, took: std::time::Duration) -> Option<(Shape, Path, (f64, f64))> {
        let e = self.entries[i].as_mut()?;
        let t = e.trial.as_mut()?;
        let verdict = t.record(path, took)?;
        Some((e.shape, verdict, t.medians_us()))
    }
}

thread_local! {
    static SHAPES: RefCell<Shapes<Comm>> = RefCell::new(Shapes::new());
}

/// The shape this thread resolved for a call like `req` on `comm`, if any, as this call runs it.
pub(crate) fn find(comm: &Arc<Comm>, req: &OpRequest) -> Option<Found> {
    SHAPES.with(|s| s.borrow().find(comm, req))
}

/// Remembers what a call like `req` on `comm` resolved to; `tried`: its later calls choose
/// between slots and kernel copies by timing both ([`super::stage_trial`]).
pub(crate) fn remember(comm: &Arc<Comm>, req: &OpRequest, shape: Shape, tried: bool) {
    SHAPES.with(|s| s.borrow_mut().remember(comm, req, shape, tried));
}

/// Records how long a call that [`find`] sent down a trial's path took.
pub(crate) fn record(comm: &Comm, op: &str, trial: (usize, Path), took: std::time::Duration) {
    let Some((shape, verdict, (slots, kernel))) = SHAPES.with(|s| s.borrow_mut().record(trial.0, trial.1, took)) else {
        return;
    };
    log::debug!(
        target: "COLL",
        "{op} of {} bytes on {} ranks: buffers by {} (median call through slots {slots:.1} us, by kernel copies {kernel:.1} us)",
        shape.message_bytes(comm.nranks),
        comm.nranks,
        match verdict {
            Path::Slots => "slots",
            Path::KernelCopies => "kernel copies",
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coll::CollOp;
    use crate::cuda::memory::MemKind;
    use crate::cuda::stream::Stream;
    use crate::reduce::Reduction;
    use crate::types::{BuiltinOp, DataType};

    fn req(op: CollOp, count: usize, dtype: DataType, red: Option<BuiltinOp>) -> OpRequest {
        OpRequest {
            op,
            send: std::ptr::null(),
            recv: std::ptr::null_mut(),
            count,
            dtype,
            reduction: red.map(|b| Reduction::builtin(dtype, b, 2)),
            mem: MemKind::Host,
            stream: Stream::from_raw(std::ptr::null_mut()),
            pre_device: None,
            device_call: false,
        }
    }

    fn shape(block: usize) -> Shape {
        Shape {
            coll: NodeColl::Broadcast { root: 0 },
            algo: NodeAlgo::OneShot,
            block,
            send_len: block,
            recv_len: block,
            sig: OpSig(block as u32),
            stage_max: 0,
            stage_off_huge_max: 0,
            relay_sizes: crate::coll::node::RelaySizes::NEVER,
        }
    }

    #[test]
    fn a_shape_serves_only_the_same_parameters_on_the_same_communicator() {
        let mut s = Shapes::new();
        let (a, b) = (Arc::new(0u8), Arc::new(0u8));
        let base = req(CollOp::AllReduce, 2, DataType::Float32, Some(BuiltinOp::Sum));
        s.remember(&a, &base, shape(8), false);
        assert_eq!(s.find(&a, &base).map(|f| f.shape.block), Some(8));
        // Buffers are not part of the key: they are checked on every call.
        let moved = OpRequest { send: 8 as *const u8, recv: 16 as *mut u8, ..base };
        assert!(s.find(&a, &moved).is_some());
        let differ = [
            req(CollOp::AllReduce, 3, DataType::Float32, Some(BuiltinOp::Sum)),
            req(CollOp::AllReduce, 2, DataType::Int32, Some(BuiltinOp::Sum)),
            req(CollOp::AllReduce, 2, DataType::Float32, Some(BuiltinOp::Max)),
            req(CollOp::AllReduce, 2, DataType::Float32, Some(BuiltinOp::Avg)),
            req(CollOp::Broadcast { root: 0 }, 2, DataType::Float32, None),
            OpRequest { device_call: true, ..base },
        ];
        for r in &differ {
            assert!(s.find(&a, r).is_none(), "{r:?} was served the shape of {base:?}");
        }
        assert!(s.find(&b, &base).is_none(), "another communicator was served");
        // Roots are told apart.
        let root0 = req(CollOp::Broadcast { root: 0 }, 2, DataType::Float32, None);
        let root1 = req(CollOp::Broadcast { root: 1 }, 2, DataType::Float32, None);
        s.remember(&a, &root0, shape(16), false);
        assert!(s.find(&a, &root1).is_none());
        assert_eq!(s.find(&a, &root0).map(|f| f.shape.block), Some(16));
    }

    #[test]
    fn a_dropped_communicator_is_never_matched_and_old_shapes_make_room() {
        let mut s = Shapes::new();
        let a = Arc::new(0u8);
        let base = req(CollOp::AllGather, 4, DataType::Uint8, None);
        s.remember(&a, &base, shape(4), false);
        let weak = Arc::downgrade(&a);
        drop(a);
        assert!(weak.upgrade().is_none());
        let c = Arc::new(0u8);
        assert!(s.find(&c, &base).is_none());
        // WAYS newer shapes push the first out.
        for i in 0..WAYS {
            s.remember(&c, &req(CollOp::AllGather, 100 + i, DataType::Uint8, None), shape(i), false);
        }
        s.remember(&c, &base, shape(4), false);
        for i in 1..WAYS {
            assert_eq!(
                s.find(&c, &req(CollOp::AllGather, 100 + i, DataType::Uint8, None)).map(|f| f.shape.block),
                Some(i)
            );
        }
        assert!(s.find(&c, &req(CollOp::AllGather, 100, DataType::Uint8, None)).is_none());
    }

    #[test]
    fn a_tried_shape_sends_its_calls_down_the_trial_s_paths() {
        let mut s = Shapes::new();
        let a = Arc::new(0u8);
        let base = req(CollOp::AllGather, 1 << 16, DataType::Uint8, None);
        let limits = Shape { stage_max: 512 << 10, stage_off_huge_max: 1 << 20, ..shape(1 << 16) };
        s.remember(&a, &base, limits, true);
        let mut paths = Vec::new();
        for call in 0..super::super::stage_trial::WINDOW {
            let found = s.find(&a, &base).expect("remembered");
            let (i, path) = found.trial.expect("tried");
            // Kernel copies: nothing of this rank's goes through its slot.
            let staged = (found.shape.stage_max, found.shape.stage_off_huge_max);
            match path {
                Path::Slots => assert_eq!(staged, (512 << 10, 1 << 20)),
                Path::KernelCopies => assert_eq!(staged, (0, 0)),
            }
            paths.push(path);
            let us = if path == Path::Slots { 30 } else { 18 };
            let changed = s.record(i, path, std::time::Duration::from_micros(us));
            assert_eq!(changed.is_some(), call + 1 == super::super::stage_trial::WINDOW, "call {call}");
        }
        assert!(paths.contains(&Path::Slots) && paths.contains(&Path::KernelCopies));
        assert_eq!(s.find(&a, &base).and_then(|f| f.trial).map(|t| t.1), Some(Path::KernelCopies));
        // An untried shape keeps the rule's limits and is not timed.
        let other = req(CollOp::AllGather, 1 << 15, DataType::Uint8, None);
        s.remember(&a, &other, limits, false);
        let found = s.find(&a, &other).expect("remembered");
        assert!(found.trial.is_none());
        assert_eq!(found.shape.stage_max, 512 << 10);
    }
}
