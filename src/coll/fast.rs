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

    fn find(&self, comm: &Arc<C>, req: &OpRequest) -> Option<Shape> {
        let key = Key::of(req);
        let comm = Arc::as_ptr(comm);
        self.entries.iter().flatten().find(|e| e.key == key && std::ptr::eq(e.comm.as_ptr(), comm)).map(|e| e.shape)
    }

    fn remember(&mut self, comm: &Arc<C>, req: &OpRequest, shape: Shape) {
        self.entries[self.next] = Some(Entry { comm: Arc::downgrade(comm), key: Key::of(req), shape });
        self.next = (self.next + 1) % WAYS;
    }
}

thread_local! {
    static SHAPES: RefCell<Shapes<Comm>> = RefCell::new(Shapes::new());
}

/// The shape this thread resolved for a call like `req` on `comm`, if any.
pub(crate) fn find(comm: &Arc<Comm>, req: &OpRequest) -> Option<Shape> {
    SHAPES.with(|s| s.borrow().find(comm, req))
}

/// Remembers what a call like `req` on `comm` resolved to.
pub(crate) fn remember(comm: &Arc<Comm>, req: &OpRequest, shape: Shape) {
    SHAPES.with(|s| s.borrow_mut().remember(comm, req, shape));
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
        s.remember(&a, &base, shape(8));
        assert_eq!(s.find(&a, &base).map(|s| s.block), Some(8));
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
        s.remember(&a, &root0, shape(16));
        assert!(s.find(&a, &root1).is_none());
        assert_eq!(s.find(&a, &root0).map(|s| s.block), Some(16));
    }

    #[test]
    fn a_dropped_communicator_is_never_matched_and_old_shapes_make_room() {
        let mut s = Shapes::new();
        let a = Arc::new(0u8);
        let base = req(CollOp::AllGather, 4, DataType::Uint8, None);
        s.remember(&a, &base, shape(4));
        let weak = Arc::downgrade(&a);
        drop(a);
        assert!(weak.upgrade().is_none());
        let c = Arc::new(0u8);
        assert!(s.find(&c, &base).is_none());
        // WAYS newer shapes push the first out.
        for i in 0..WAYS {
            s.remember(&c, &req(CollOp::AllGather, 100 + i, DataType::Uint8, None), shape(i));
        }
        s.remember(&c, &base, shape(4));
        for i in 1..WAYS {
            assert_eq!(s.find(&c, &req(CollOp::AllGather, 100 + i, DataType::Uint8, None)).map(|s| s.block), Some(i));
        }
        assert!(s.find(&c, &req(CollOp::AllGather, 100, DataType::Uint8, None)).is_none());
    }
}
