//! What a call outside a group resolves to in the node area, remembered per thread.
//!
//! The choice of node algorithm, the call's signature and its staging limit depend only on the
//! call's parameters (operation and root, count, data type, reduction, host or device call)
//! and its communicator, so [`super::run_one`] keeps the last few per thread and a repeated
//! call skips the choice (about a sixth of a small call's fixed path, measured). What changes
//! from call to call (buffers, in-place and overlap, the communicator's state) is still
//! looked at every time by the caller.
//!
//! A shape that [`super::stage_trial`] applies to also carries its trial: which of its calls
//! try slots or kernel copies, their times and the verdict, logged (TRACE, COLL) when it changes.
//!
//! Owns nothing shared: entries hold their communicator weakly (a destroyed one is never
//! matched again, and its address cannot be reused while an entry names it).

use std::cell::RefCell;
use std::sync::{Arc, Weak};

use super::node::{NodeAlgo, NodeColl, NodeOp};
use super::stage_trial::{StagePath, StageTrial};
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
    /// The message's size as nccl-tests counts it ([`NodeColl::message_bytes`]).
    pub fn message_bytes(&self, nranks: usize) -> usize {
        self.coll.message_bytes(self.block, nranks)
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

/// A call's shape as this call runs it; `timed`: the entry and trial step to time it under.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Found {
    pub shape: Shape,
    pub timed: Option<(usize, u32)>,
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

    fn position(&self, comm: &Arc<C>, key: &Key) -> Option<usize> {
        let comm = Arc::as_ptr(comm);
        self.entries
            .iter()
            .position(|e| e.as_ref().is_some_and(|e| e.key == *key && std::ptr::eq(e.comm.as_ptr(), comm)))
    }

    /// The shape of a call like `req` as this call runs it; a tried shape counts the call.
    fn find(&mut self, comm: &Arc<C>, req: &OpRequest) -> Option<Found> {
        let i = self.position(comm, &Key::of(req))?;
        let e = self.entries[i].as_mut()?;
        let Some(trial) = e.trial.as_mut() else { return Some(Found { shape: e.shape, timed: None }) };
        let call = trial.begin_call();
        let shape = match call.path {
            StagePath::Slots => e.shape,
            StagePath::KernelCopies => e.shape.by_kernel_copies(),
        };
        Some(Found { shape, timed: call.timed.map(|k| (i, k)) })
    }

    /// Remembers a shape; one already kept for the same call keeps its place and its trial.
    fn remember(&mut self, comm: &Arc<C>, req: &OpRequest, shape: Shape, trial: Option<StageTrial>) {
        let key = Key::of(req);
        if let Some(e) = self.position(comm, &key).and_then(|i| self.entries[i].as_mut()) {
            e.shape = shape;
            if e.trial.is_none() {
                e.trial = trial;
            }
            return;
        }
        self.entries[self.next] = Some(Entry { comm: Arc::downgrade(comm), key, shape, trial });
        self.next = (self.next + 1) % WAYS;
    }

    /// Times trial step `k` of the call like `req` that [`Self::find`] found at entry `i`;
    /// returns the shape, the new verdict and the trial's medians when the verdict changed.
    fn record(
        &mut self,
        comm: &Arc<C>,
        req: &OpRequest,
        (i, k): (usize, u32),
        took: std::time::Duration,
    ) -> Option<(Shape, StagePath, (f64, f64))> {
        // The entry is still the call's unless something in between replaced it.
        let e = self.entries[i]
            .as_mut()
            .filter(|e| e.key == Key::of(req) && std::ptr::eq(e.comm.as_ptr(), Arc::as_ptr(comm)))?;
        let t = e.trial.as_mut()?;
        let verdict = t.record(k, took)?;
        Some((e.shape, verdict, t.medians_us()))
    }
}

thread_local! {
    static SHAPES: RefCell<Shapes<Comm>> = RefCell::new(Shapes::new());
}

/// The shape this thread resolved for a call like `req` on `comm`, if any, as this call runs it.
pub(crate) fn find(comm: &Arc<Comm>, req: &OpRequest) -> Option<Found> {
    SHAPES.with(|s| s.borrow_mut().find(comm, req))
}

/// Remembers what a call like `req` on `comm` resolved to; with `trial`, its later calls choose
/// between slots and kernel copies by timing both ([`super::stage_trial`]).
pub(crate) fn remember(comm: &Arc<Comm>, req: &OpRequest, shape: Shape, trial: Option<StageTrial>) {
    SHAPES.with(|s| s.borrow_mut().remember(comm, req, shape, trial));
}

/// Records how long a timed trial call (a [`Found::timed`] one) took.
pub(crate) fn record(comm: &Arc<Comm>, req: &OpRequest, timed: (usize, u32), took: std::time::Duration) {
    let Some((shape, verdict, (slots, kernel))) = SHAPES.with(|s| s.borrow_mut().record(comm, req, timed, took)) else {
        return;
    };
    log::debug!(
        target: "COLL",
        "{} of {} bytes on {} ranks: buffers by {} (median call through slots {slots:.1} us, by kernel copies {kernel:.1} us)",
        req.op.name(),
        shape.message_bytes(comm.nranks),
        comm.nranks,
        match verdict {
            StagePath::Slots => "slots",
            StagePath::KernelCopies => "kernel copies",
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
        s.remember(&a, &base, shape(8), None);
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
        s.remember(&a, &root0, shape(16), None);
        assert!(s.find(&a, &root1).is_none());
        assert_eq!(s.find(&a, &root0).map(|f| f.shape.block), Some(16));
    }

    #[test]
    fn a_dropped_communicator_is_never_matched_and_old_shapes_make_room() {
        let mut s = Shapes::new();
        let a = Arc::new(0u8);
        let base = req(CollOp::AllGather, 4, DataType::Uint8, None);
        s.remember(&a, &base, shape(4), None);
        let weak = Arc::downgrade(&a);
        drop(a);
        assert!(weak.upgrade().is_none());
        let c = Arc::new(0u8);
        assert!(s.find(&c, &base).is_none());
        // WAYS newer shapes push the first out.
        for i in 0..WAYS {
            s.remember(&c, &req(CollOp::AllGather, 100 + i, DataType::Uint8, None), shape(i), None);
        }
        s.remember(&c, &base, shape(4), None);
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
        use super::super::stage_trial::WINDOW;
        let mut s = Shapes::new();
        let a = Arc::new(0u8);
        let base = req(CollOp::AllGather, 1 << 16, DataType::Uint8, None);
        let limits = Shape { stage_max: 512 << 10, stage_off_huge_max: 1 << 20, ..shape(1 << 16) };
        s.remember(&a, &base, limits, Some(StageTrial::default()));
        let mut kernel_calls = 0;
        for call in 0..WINDOW {
            let found = s.find(&a, &base).expect("remembered");
            // Kernel copies: nothing of this rank's goes through its slot.
            let staged = (found.shape.stage_max, found.shape.stage_off_huge_max);
            assert!(staged == (512 << 10, 1 << 20) || staged == (0, 0), "{staged:?}");
            kernel_calls += (staged == (0, 0)) as u32;
            let Some(timed) = found.timed else { continue };
            let us = if staged == (0, 0) { 18 } else { 30 };
            let changed = s.record(&a, &base, timed, std::time::Duration::from_micros(us));
            assert_eq!(changed.is_some(), call + 1 == WINDOW, "call {call}");
        }
        assert_eq!(kernel_calls, WINDOW / 2);
        // Remembering the same call again keeps its trial (and verdict).
        s.remember(&a, &base, limits, Some(StageTrial::default()));
        let found = s.find(&a, &base).expect("remembered");
        assert_eq!((found.shape.stage_max, found.timed), (0, None));
        // A record for an entry that no longer holds the call changes nothing.
        let other = req(CollOp::AllGather, 1 << 15, DataType::Uint8, None);
        assert!(s.record(&a, &other, (0, 1), std::time::Duration::from_micros(1)).is_none());
        // An untried shape keeps the rule's limits and is not timed.
        s.remember(&a, &other, limits, None);
        let found = s.find(&a, &other).expect("remembered");
        assert!(found.timed.is_none());
        assert_eq!(found.shape.stage_max, 512 << 10);
    }
}
