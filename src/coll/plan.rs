//! Schedules as data: what one rank does for one operation, with no sockets and no clock.
//!
//! A [`Plan`] is a list of steps over the operation's buffers. Execution rules, which the
//! executor (`coll::exec`) and the simulator (`coll::sim`) both implement:
//! - a step may start once every step listed in its `deps` has completed;
//! - sends to one peer start in plan order, and so do receives from one peer: the k-th send
//!   from rank A to rank B is matched with the k-th receive posted by B from A, and the two
//!   lengths must be equal (a mismatch is an error, never a truncation);
//! - a peer may be this rank itself (a send to self is a local copy);
//! - generators add a dependency for every read-after-write and write-after-read between
//!   overlapping slices, so any order that respects `deps` and the per-peer FIFOs is correct.

/// Which buffer of the operation a slice lives in.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum BufId {
    /// The caller's send buffer (read-only, except where the plan documents in-place use).
    Send,
    /// The caller's receive buffer.
    Recv,
    /// Executor-owned scratch of `Plan::scratch_bytes` bytes.
    Scratch,
}

/// A byte range of one buffer.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct Slice {
    pub buf: BufId,
    pub offset: usize,
    pub len: usize,
}

impl Slice {
    pub const fn new(buf: BufId, offset: usize, len: usize) -> Self {
        Slice { buf, offset, len }
    }
    pub fn end(&self) -> usize {
        self.offset + self.len
    }
    /// Whether two slices share at least one byte.
    pub fn overlaps(&self, other: &Slice) -> bool {
        self.buf == other.buf && self.offset < other.end() && other.offset < self.end()
    }
    /// The sub-range `[start, start + len)` of this slice.
    pub fn sub(&self, start: usize, len: usize) -> Slice {
        debug_assert!(start + len <= self.len);
        Slice { buf: self.buf, offset: self.offset + start, len }
    }
}

/// What a receive does with the bytes that arrive.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RecvAction {
    /// `dst = incoming`.
    Copy,
    /// `dst = incoming (op) pre(local)`: fold this rank's own input into a partial result
    /// (`pre` is the PreMulSum scalar multiply, identity for other operators). `local` may be
    /// the very same slice as `dst` (in-place), but must not partially overlap it.
    Combine { local: Slice },
    /// `dst = dst (op) incoming`: merge two partial results (no `pre`).
    Accumulate,
}

/// Work that involves no peer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LocalOp {
    /// `dst = src` (may not overlap unless identical, in which case it is a no-op).
    Copy { src: Slice, dst: Slice },
    /// `dst = pre(src)`: this rank's input entering a reduction (`src` may equal `dst`).
    Prepare { src: Slice, dst: Slice },
    /// `buf = post(buf)`: the end of a reduction (integer average divides by the rank count).
    Finalize { buf: Slice },
}

/// One step of a plan.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Step {
    Send { peer: usize, src: Slice },
    Recv { peer: usize, dst: Slice, action: RecvAction },
    Local(LocalOp),
}

/// A step and the earlier steps (indices into `Plan::steps`) it waits for.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PlannedStep {
    pub step: Step,
    pub deps: Vec<u32>,
}

/// Everything one rank does for one operation.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Plan {
    pub steps: Vec<PlannedStep>,
    /// Bytes of scratch the plan's `BufId::Scratch` slices need.
    pub scratch_bytes: usize,
    /// Name of the algorithm, for logs ("ring", "tree", ...).
    pub algorithm: &'static str,
}

impl Plan {
    pub fn new(algorithm: &'static str) -> Self {
        Plan { steps: Vec::new(), scratch_bytes: 0, algorithm }
    }

    /// Append a step; returns its index for use in later `deps`.
    pub fn push(&mut self, step: Step, deps: &[u32]) -> u32 {
        let index = self.steps.len() as u32;
        debug_assert!(deps.iter().all(|&d| d < index), "deps must point backwards");
        self.steps.push(PlannedStep { step, deps: deps.to_vec() });
        index
    }

    pub fn send(&mut self, peer: usize, src: Slice, deps: &[u32]) -> u32 {
        self.push(Step::Send { peer, src }, deps)
    }

    pub fn recv(&mut self, peer: usize, dst: Slice, action: RecvAction, deps: &[u32]) -> u32 {
        self.push(Step::Recv { peer, dst, action }, deps)
    }

    pub fn local(&mut self, op: LocalOp, deps: &[u32]) -> u32 {
        self.push(Step::Local(op), deps)
    }

    /// The peers this plan talks to (excluding `me`), sorted and deduplicated.
    pub fn peers(&self, me: usize) -> Vec<usize> {
        let mut peers: Vec<usize> = self
            .steps
            .iter()
            .filter_map(|s| match s.step {
                Step::Send { peer, .. } | Step::Recv { peer, .. } if peer != me => Some(peer),
                _ => None,
            })
            .collect();
        peers.sort_unstable();
        peers.dedup();
        peers
    }
}
