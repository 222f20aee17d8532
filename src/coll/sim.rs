//! A pure, single-threaded simulator that runs the plans of all ranks together.
//!
//! Each rank has one flat memory in which its Send and Recv views lie (disjoint, or overlapping
//! exactly as NCCL's in-place forms alias them, see [`Layout::for_coll`]), plus its scratch.
//! [`simulate`] first checks every plan statically:
//! - slices are in bounds of their view and element-aligned, peers and deps are valid, nothing
//!   writes through `BufId::Send`, Combine/Copy/Prepare operands are identical or disjoint;
//! - every two steps of a rank that touch the same memory, one of them writing, are ordered by
//!   `deps` (the execution rule of `coll::plan`), checked in terms of memory, so in-place
//!   aliasing hazards between Send and Recv are found whatever the schedule.
//!
//! It then executes the plans in a random order (seeded xorshift) that respects deps and the
//! per-peer FIFO rules, with a transfer happening only once both the k-th send and the k-th
//! receive of a pair have started (rendezvous, in order): that finds deadlocks, length
//! mismatches, reads of memory never written (scratch, or Recv that does not alias the
//! input), and Recv bytes left unwritten at the end. Values are reduced with a caller-given
//! [`Reducer`]; [`IntModel`] makes "every contribution folded exactly once, `pre` exactly once,
//! `post` exactly once" checkable against a simple reference.

use std::fmt;

use crate::coll::algo::{CollArgs, CollKind};
use crate::coll::plan::{BufId, LocalOp, Plan, RecvAction, Slice, Step};

/// A byte range of a rank's memory.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Region {
    pub offset: usize,
    pub len: usize,
}

impl Region {
    pub const fn new(offset: usize, len: usize) -> Self {
        Region { offset, len }
    }
    fn end(&self) -> usize {
        self.offset + self.len
    }
}

/// Where one rank's Send and Recv views lie in its memory.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Layout {
    pub mem_len: usize,
    pub send: Region,
    pub recv: Region,
}

impl Layout {
    /// Send at 0, Recv right after it: no aliasing.
    pub fn disjoint(send_len: usize, recv_len: usize) -> Self {
        Layout { mem_len: send_len + recv_len, send: Region::new(0, send_len), recv: Region::new(send_len, recv_len) }
    }

    /// Views at arbitrary offsets (they may overlap).
    pub fn aliased(send: Region, recv: Region) -> Self {
        Layout { mem_len: send.end().max(recv.end()), send, recv }
    }

    /// NCCL's buffers for `args` on `rank`: sizes from `CollArgs::send_len`/`recv_len`
    /// (0 for buffers the rank must not use), aliased as NCCL's in-place form when
    /// `args.in_place`.
    pub fn for_coll(args: &CollArgs, rank: usize, nranks: usize) -> Self {
        let (s, r) = (args.send_len(rank, nranks), args.recv_len(rank, nranks));
        if !args.in_place || s == 0 || r == 0 {
            return Layout::disjoint(s, r);
        }
        let b = args.bytes;
        match args.kind {
            CollKind::AllGather => Layout::aliased(Region::new(rank * b, s), Region::new(0, r)),
            CollKind::Gather => Layout::aliased(Region::new(rank * b, s), Region::new(0, r)),
            CollKind::ReduceScatter | CollKind::Scatter => Layout::aliased(Region::new(0, s), Region::new(rank * b, r)),
            _ => Layout::aliased(Region::new(0, s), Region::new(0, r)),
        }
    }
}

/// The reduction operator: element-wise over byte slices of whole elements.
pub trait Reducer {
    fn elem_size(&self) -> usize;
    /// `acc = acc (op) other`.
    fn op(&self, acc: &mut [u8], other: &[u8]);
    /// A rank's input entering a reduction.
    fn pre(&self, x: &mut [u8]);
    /// The end of a reduction.
    fn post(&self, x: &mut [u8]);
}

/// Little-endian unsigned integers of `elem_size` (1, 2, 4 or 8) bytes: wrapping add,
/// `pre(x) = 3x`, and a `post` that does not commute with addition, so that applying it to a
/// partial sum, twice, or never, gives a different result. Like a real operator without
/// them, `pre` and `post` are the identity unless `has_pre` / `has_post`.
#[derive(Clone, Copy, Debug)]
pub struct IntModel {
    pub elem_size: usize,
    pub has_pre: bool,
    pub has_post: bool,
}

impl IntModel {
    pub fn new(elem_size: usize, has_pre: bool, has_post: bool) -> Self {
        IntModel { elem_size, has_pre, has_post }
    }
    /// The model for an operation's element size and operator.
    pub fn for_args(args: &CollArgs) -> Self {
        Self::new(args.elem_size, args.has_pre, args.has_post)
    }
    fn mask(&self) -> u64 {
        if self.elem_size >= 8 {
            u64::MAX
        } else {
            (1u64 << (8 * self.elem_size)) - 1
        }
    }
    fn get(&self, b: &[u8]) -> u64 {
        let mut v = [0u8; 8];
        v[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(v)
    }
    fn put(&self, b: &mut [u8], v: u64) {
        let n = b.len();
        b.copy_from_slice(&(v & self.mask()).to_le_bytes()[..n]);
    }
    /// `pre` on one element value.
    pub fn pre_value(&self, x: u64) -> u64 {
        if !self.has_pre {
            return x;
        }
        x.wrapping_mul(3) & self.mask()
    }
    /// `post` on one element value.
    pub fn post_value(&self, x: u64) -> u64 {
        if !self.has_post {
            return x;
        }
        let bits = 8 * self.elem_size as u32;
        let x = x & self.mask();
        let rot = if bits >= 64 { x.rotate_left(13) } else { ((x << 3) | (x >> (bits - 3))) & self.mask() };
        (rot ^ 0x5a5a_5a5a_5a5a_5a5a) & self.mask()
    }
    /// `op` on two element values.
    pub fn op_value(&self, a: u64, b: u64) -> u64 {
        a.wrapping_add(b) & self.mask()
    }
    fn map(&self, x: &mut [u8], f: impl Fn(u64) -> u64) {
        for e in x.chunks_exact_mut(self.elem_size) {
            let v = f(self.get(e));
            self.put(e, v);
        }
    }
}

impl Reducer for IntModel {
    fn elem_size(&self) -> usize {
        self.elem_size
    }
    fn op(&self, acc: &mut [u8], other: &[u8]) {
        let e = self.elem_size;
        for (a, o) in acc.chunks_exact_mut(e).zip(other.chunks_exact(e)) {
            let v = self.op_value(self.get(a), self.get(o));
            self.put(a, v);
        }
    }
    fn pre(&self, x: &mut [u8]) {
        self.map(x, |v| self.pre_value(v));
    }
    fn post(&self, x: &mut [u8]) {
        self.map(x, |v| self.post_value(v));
    }
}

/// `f64` sum: commutative bit for bit but not associative, to check that all ranks compute
/// bit-identical results. `pre` multiplies by 1.1, `post` divides by 3.
#[derive(Clone, Copy, Debug, Default)]
pub struct F64Sum;

impl F64Sum {
    fn each(x: &mut [u8], f: impl Fn(f64) -> f64) {
        for e in x.chunks_exact_mut(8) {
            let v = f(f64::from_le_bytes(e.try_into().unwrap()));
            e.copy_from_slice(&v.to_le_bytes());
        }
    }
}

impl Reducer for F64Sum {
    fn elem_size(&self) -> usize {
        8
    }
    fn op(&self, acc: &mut [u8], other: &[u8]) {
        for (a, o) in acc.chunks_exact_mut(8).zip(other.chunks_exact(8)) {
            let v = f64::from_le_bytes(a.try_into().unwrap()) + f64::from_le_bytes(o.try_into().unwrap());
            a.copy_from_slice(&v.to_le_bytes());
        }
    }
    fn pre(&self, x: &mut [u8]) {
        Self::each(x, |v| v * 1.1);
    }
    fn post(&self, x: &mut [u8]) {
        Self::each(x, |v| v / 3.0);
    }
}

/// What went wrong. `rank`/`step` locate the offending step (index into `Plan::steps`).
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum SimError {
    #[error("simulate: {0}")]
    BadInput(String),
    #[error("rank {rank} step {step}: {msg}")]
    InvalidPlan { rank: usize, step: usize, msg: String },
    #[error("rank {rank} step {step}: {slice:?} out of bounds ({limit} bytes)")]
    OutOfBounds { rank: usize, step: usize, slice: Slice, limit: usize },
    #[error("rank {rank} step {step}: {slice:?} not aligned to {elem_size}-byte elements")]
    Misaligned { rank: usize, step: usize, slice: Slice, elem_size: usize },
    #[error(
        "rank {rank}: steps {first} and {second} both touch {space} byte {offset} (one writes) \
         but are not ordered by deps"
    )]
    Race { rank: usize, first: usize, second: usize, space: &'static str, offset: usize },
    #[error("rank {rank} step {step}: reads {space} byte {offset}, which was never written")]
    UninitRead { rank: usize, step: usize, space: &'static str, offset: usize },
    #[error(
        "send {from}->{to} #{index} (step {send_step}) has {send_len} bytes but the matching \
         receive (step {recv_step}) expects {recv_len}"
    )]
    LengthMismatch {
        from: usize,
        to: usize,
        index: usize,
        send_step: usize,
        recv_step: usize,
        send_len: usize,
        recv_len: usize,
    },
    #[error("deadlock: {0}")]
    Deadlock(String),
    #[error("rank {rank}: Recv byte {offset} was never written")]
    RecvNotWritten { rank: usize, offset: usize },
}

/// Which memory of a rank a byte lives in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Space {
    Mem,
    Scratch,
}

impl Space {
    fn name(self) -> &'static str {
        match self {
            Space::Mem => "buffer",
            Space::Scratch => "scratch",
        }
    }
}

/// A slice translated into a rank's memory.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Loc {
    space: Space,
    offset: usize,
    len: usize,
}

impl Loc {
    fn overlaps(&self, o: &Loc) -> bool {
        self.space == o.space && self.offset < o.offset + o.len && o.offset < self.offset + self.len
    }
}

/// Tiny xorshift64* generator: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One rank's memory and scratch, with a written-bit per byte.
struct Memory {
    layout: Layout,
    data: [Vec<u8>; 2],
    init: [Vec<bool>; 2],
}

impl Memory {
    fn loc(&self, rank: usize, step: usize, s: &Slice, elem: usize) -> Result<Loc, SimError> {
        let (space, view) = match s.buf {
            BufId::Send => (Space::Mem, self.layout.send),
            BufId::Recv => (Space::Mem, self.layout.recv),
            BufId::Scratch => (Space::Scratch, Region::new(0, self.data[1].len())),
        };
        if s.offset.checked_add(s.len).is_none_or(|end| end > view.len) {
            return Err(SimError::OutOfBounds { rank, step, slice: *s, limit: view.len });
        }
        if s.offset % elem != 0 || s.len % elem != 0 {
            return Err(SimError::Misaligned { rank, step, slice: *s, elem_size: elem });
        }
        Ok(Loc { space, offset: view.offset + s.offset, len: s.len })
    }

    fn read(&self, rank: usize, step: usize, l: Loc) -> Result<Vec<u8>, SimError> {
        let i = l.space as usize;
        let range = l.offset..l.offset + l.len;
        if let Some(k) = self.init[i][range.clone()].iter().position(|&w| !w) {
            let (space, offset) = (l.space.name(), l.offset + k);
            return Err(SimError::UninitRead { rank, step, space, offset });
        }
        Ok(self.data[i][range].to_vec())
    }

    fn write(&mut self, l: Loc, bytes: &[u8]) {
        let i = l.space as usize;
        self.data[i][l.offset..l.offset + l.len].copy_from_slice(bytes);
        self.init[i][l.offset..l.offset + l.len].fill(true);
    }
}

/// A step with its slices resolved; what it reads and writes.
#[derive(Clone, Copy, Debug)]
enum Op {
    Send { peer: usize, src: Loc },
    Recv { peer: usize, dst: Loc, action: Act },
    Copy { src: Loc, dst: Loc },
    Prepare { src: Loc, dst: Loc },
    Finalize { buf: Loc },
}

#[derive(Clone, Copy, Debug)]
enum Act {
    Copy,
    Combine(Loc),
    Accumulate,
}

impl Op {
    fn reads(&self) -> Vec<Loc> {
        match *self {
            Op::Send { src, .. } | Op::Copy { src, .. } | Op::Prepare { src, .. } => vec![src],
            Op::Recv { action: Act::Combine(l), .. } => vec![l],
            Op::Recv { dst, action: Act::Accumulate, .. } => vec![dst],
            Op::Recv { action: Act::Copy, .. } => vec![],
            Op::Finalize { buf } => vec![buf],
        }
    }
    fn writes(&self) -> Option<Loc> {
        match *self {
            Op::Send { .. } => None,
            Op::Recv { dst, .. } | Op::Copy { dst, .. } | Op::Prepare { dst, .. } => Some(dst),
            Op::Finalize { buf } => Some(buf),
        }
    }
}

/// Resolve and validate one rank's plan.
fn resolve(rank: usize, nranks: usize, plan: &Plan, mem: &Memory, elem: usize) -> Result<Vec<Op>, SimError> {
    let mut ops = Vec::with_capacity(plan.steps.len());
    for (i, ps) in plan.steps.iter().enumerate() {
        let bad = |msg: String| SimError::InvalidPlan { rank, step: i, msg };
        if let Some(&d) = ps.deps.iter().find(|&&d| d as usize >= i) {
            return Err(bad(format!("dependency {d} does not point backwards")));
        }
        let loc = |s: &Slice| mem.loc(rank, i, s, elem);
        let no_send = |s: &Slice, what: &str| {
            if s.buf == BufId::Send {
                Err(bad(format!("{what} writes through BufId::Send")))
            } else {
                Ok(())
            }
        };
        // Two operands must be the very same memory or disjoint, and of equal length.
        let same_or_apart = |a: &Loc, b: &Loc, what: &str| {
            if a.len != b.len {
                Err(bad(format!("{what}: operands of {} and {} bytes", a.len, b.len)))
            } else if a.overlaps(b) && a != b {
                Err(bad(format!("{what}: operands partially overlap")))
            } else {
                Ok(())
            }
        };
        let op = match ps.step {
            Step::Send { peer, src } => {
                if peer >= nranks {
                    return Err(bad(format!("peer {peer} out of range")));
                }
                Op::Send { peer, src: loc(&src)? }
            }
            Step::Recv { peer, dst, action } => {
                if peer >= nranks {
                    return Err(bad(format!("peer {peer} out of range")));
                }
                no_send(&dst, "receive")?;
                let d = loc(&dst)?;
                let action = match action {
                    RecvAction::Copy => Act::Copy,
                    RecvAction::Accumulate => Act::Accumulate,
                    RecvAction::Combine { local } => {
                        let l = loc(&local)?;
                        same_or_apart(&l, &d, "combine")?;
                        Act::Combine(l)
                    }
                };
                Op::Recv { peer, dst: d, action }
            }
            Step::Local(LocalOp::Copy { src, dst }) => {
                no_send(&dst, "copy")?;
                let (s, d) = (loc(&src)?, loc(&dst)?);
                same_or_apart(&s, &d, "copy")?;
                Op::Copy { src: s, dst: d }
            }
            Step::Local(LocalOp::Prepare { src, dst }) => {
                no_send(&dst, "prepare")?;
                let (s, d) = (loc(&src)?, loc(&dst)?);
                same_or_apart(&s, &d, "prepare")?;
                Op::Prepare { src: s, dst: d }
            }
            Step::Local(LocalOp::Finalize { buf }) => {
                no_send(&buf, "finalize")?;
                Op::Finalize { buf: loc(&buf)? }
            }
        };
        ops.push(op);
    }
    Ok(ops)
}

/// Check that conflicting accesses of one rank are ordered by deps (transitively).
fn check_races(rank: usize, plan: &Plan, ops: &[Op], mem: &Memory, elem: usize) -> Result<(), SimError> {
    let n = ops.len();
    let words = n.div_ceil(64);
    // anc[j]: bitset of the steps j transitively depends on.
    let mut anc = vec![0u64; n * words];
    for (j, ps) in plan.steps.iter().enumerate() {
        for &d in &ps.deps {
            let d = d as usize;
            let (lo, hi) = anc.split_at_mut(j * words);
            let row = &mut hi[..words];
            for (w, a) in row.iter_mut().zip(&lo[d * words..(d + 1) * words]) {
                *w |= a;
            }
            row[d / 64] |= 1 << (d % 64);
        }
    }
    let before = |i: usize, j: usize| anc[j * words + i / 64] & (1 << (i % 64)) != 0;
    const NONE: u32 = u32::MAX;
    let sizes = [mem.layout.mem_len / elem, mem.data[1].len() / elem];
    let mut writer: [Vec<u32>; 2] = sizes.map(|s| vec![NONE; s]);
    let mut readers: [Vec<Vec<u32>>; 2] = sizes.map(|s| vec![Vec::new(); s]);
    for (j, op) in ops.iter().enumerate() {
        let race = |i: u32, l: &Loc, e: usize| SimError::Race {
            rank,
            first: i as usize,
            second: j,
            space: l.space.name(),
            offset: e * elem,
        };
        for l in op.reads() {
            let s = l.space as usize;
            for e in l.offset / elem..(l.offset + l.len) / elem {
                let w = writer[s][e];
                if w != NONE && !before(w as usize, j) {
                    return Err(race(w, &l, e));
                }
                if readers[s][e].last() != Some(&(j as u32)) {
                    readers[s][e].push(j as u32);
                }
            }
        }
        if let Some(l) = op.writes() {
            let s = l.space as usize;
            for e in l.offset / elem..(l.offset + l.len) / elem {
                let w = writer[s][e];
                if w != NONE && !before(w as usize, j) {
                    return Err(race(w, &l, e));
                }
                if let Some(&r) = readers[s][e].iter().find(|&&r| r as usize != j && !before(r as usize, j)) {
                    return Err(race(r, &l, e));
                }
                writer[s][e] = j as u32;
                readers[s][e].clear();
            }
        }
    }
    Ok(())
}

const WAITING: u8 = 0;
const STARTED: u8 = 1;
const DONE: u8 = 2;

/// Execution state of one rank.
struct Run {
    ops: Vec<Op>,
    status: Vec<u8>,
    pending: Vec<u32>,
    dependents: Vec<Vec<u32>>,
    /// Per peer: this rank's sends to it / receives from it, in plan order, and how many started.
    sends: Vec<Vec<u32>>,
    send_head: Vec<usize>,
    recvs: Vec<Vec<u32>>,
    recv_head: Vec<usize>,
}

impl Run {
    /// Whether step `i` may start now (deps done, first unstarted of its FIFO).
    fn startable(&self, i: usize) -> bool {
        if self.status[i] != WAITING || self.pending[i] != 0 {
            return false;
        }
        match self.ops[i] {
            Op::Send { peer, .. } => self.sends[peer].get(self.send_head[peer]) == Some(&(i as u32)),
            Op::Recv { peer, .. } => self.recvs[peer].get(self.recv_head[peer]) == Some(&(i as u32)),
            _ => true,
        }
    }
}

/// Run the plans of all ranks together. `layouts[r]` places rank r's views, `inputs[r]` is
/// the initial content of its Send view (exactly `layouts[r].send.len` bytes). Returns the
/// final content of every rank's Recv view. The same `seed` gives the same schedule.
pub fn simulate(
    plans: &[Plan],
    layouts: &[Layout],
    inputs: &[Vec<u8>],
    reducer: &dyn Reducer,
    seed: u64,
) -> Result<Vec<Vec<u8>>, SimError> {
    let n = plans.len();
    if layouts.len() != n || inputs.len() != n {
        return Err(SimError::BadInput(format!("{n} plans, {} layouts, {} inputs", layouts.len(), inputs.len())));
    }
    let elem = reducer.elem_size().max(1);
    let mut mems = Vec::with_capacity(n);
    for (r, (plan, (layout, input))) in plans.iter().zip(layouts.iter().zip(inputs)).enumerate() {
        if input.len() != layout.send.len || layout.send.end().max(layout.recv.end()) > layout.mem_len {
            return Err(SimError::BadInput(format!("rank {r}: input or layout size mismatch")));
        }
        let mut m = Memory {
            layout: *layout,
            data: [vec![0; layout.mem_len], vec![0; plan.scratch_bytes]],
            init: [vec![false; layout.mem_len], vec![false; plan.scratch_bytes]],
        };
        m.write(Loc { space: Space::Mem, offset: layout.send.offset, len: input.len() }, input);
        mems.push(m);
    }
    let mut runs = Vec::with_capacity(n);
    for (r, plan) in plans.iter().enumerate() {
        let ops = resolve(r, n, plan, &mems[r], elem)?;
        check_races(r, plan, &ops, &mems[r], elem)?;
        let mut run = Run {
            status: vec![WAITING; ops.len()],
            pending: plan.steps.iter().map(|s| s.deps.len() as u32).collect(),
            dependents: vec![Vec::new(); ops.len()],
            sends: vec![Vec::new(); n],
            send_head: vec![0; n],
            recvs: vec![Vec::new(); n],
            recv_head: vec![0; n],
            ops,
        };
        for (i, s) in plan.steps.iter().enumerate() {
            for &d in &s.deps {
                run.dependents[d as usize].push(i as u32);
            }
            match run.ops[i] {
                Op::Send { peer, .. } => run.sends[peer].push(i as u32),
                Op::Recv { peer, .. } => run.recvs[peer].push(i as u32),
                _ => {}
            }
        }
        runs.push(run);
    }

    let mut rng = Rng::new(seed);
    // Enabled actions: steps that may start, and pairs (from, to) with a transfer due.
    let mut ready: Vec<(usize, usize)> = Vec::new();
    for (r, run) in runs.iter().enumerate() {
        ready.extend((0..run.ops.len()).filter(|&i| run.startable(i)).map(|i| (r, i)));
    }
    let mut moved = vec![0usize; n * n];
    let mut due: Vec<(usize, usize)> = Vec::new();
    let mut is_due = vec![false; n * n];
    let transferable = |runs: &[Run], moved: &[usize], a: usize, b: usize| {
        let k = moved[a * n + b];
        k < runs[a].send_head[b] && k < runs[b].recv_head[a]
    };
    let total: usize = runs.iter().map(|r| r.ops.len()).sum();
    let mut done = 0;

    // Completing a step may make dependents startable.
    fn complete(runs: &mut [Run], ready: &mut Vec<(usize, usize)>, r: usize, i: usize) {
        let run = &mut runs[r];
        run.status[i] = DONE;
        for k in 0..run.dependents[i].len() {
            let d = run.dependents[i][k] as usize;
            run.pending[d] -= 1;
            if run.startable(d) {
                ready.push((r, d));
            }
        }
    }

    while !ready.is_empty() || !due.is_empty() {
        let pick = rng.below(ready.len() + due.len());
        if pick < ready.len() {
            let (r, i) = ready.swap_remove(pick);
            let op = runs[r].ops[i];
            match op {
                Op::Send { peer, .. } | Op::Recv { peer, .. } => {
                    let run = &mut runs[r];
                    run.status[i] = STARTED;
                    let (head, list) = if matches!(op, Op::Send { .. }) {
                        run.send_head[peer] += 1;
                        (run.send_head[peer], &run.sends[peer])
                    } else {
                        run.recv_head[peer] += 1;
                        (run.recv_head[peer], &run.recvs[peer])
                    };
                    if let Some(&nx) = list.get(head) {
                        if run.startable(nx as usize) {
                            ready.push((r, nx as usize));
                        }
                    }
                    let (a, b) = if matches!(op, Op::Send { .. }) { (r, peer) } else { (peer, r) };
                    if !is_due[a * n + b] && transferable(&runs, &moved, a, b) {
                        is_due[a * n + b] = true;
                        due.push((a, b));
                    }
                }
                Op::Copy { src, dst } => {
                    let data = mems[r].read(r, i, src)?;
                    mems[r].write(dst, &data);
                    complete(&mut runs, &mut ready, r, i);
                    done += 1;
                }
                Op::Prepare { src, dst } => {
                    let mut data = mems[r].read(r, i, src)?;
                    reducer.pre(&mut data);
                    mems[r].write(dst, &data);
                    complete(&mut runs, &mut ready, r, i);
                    done += 1;
                }
                Op::Finalize { buf } => {
                    let mut data = mems[r].read(r, i, buf)?;
                    reducer.post(&mut data);
                    mems[r].write(buf, &data);
                    complete(&mut runs, &mut ready, r, i);
                    done += 1;
                }
            }
        } else {
            let (a, b) = due[pick - ready.len()];
            let k = moved[a * n + b];
            let (si, ri) = (runs[a].sends[b][k] as usize, runs[b].recvs[a][k] as usize);
            let (Op::Send { src, .. }, Op::Recv { dst, action, .. }) = (runs[a].ops[si], runs[b].ops[ri]) else {
                unreachable!("FIFO lists hold sends and receives only");
            };
            if src.len != dst.len {
                return Err(SimError::LengthMismatch {
                    from: a,
                    to: b,
                    index: k,
                    send_step: si,
                    recv_step: ri,
                    send_len: src.len,
                    recv_len: dst.len,
                });
            }
            let incoming = mems[a].read(a, si, src)?;
            let result = match action {
                Act::Copy => incoming,
                Act::Combine(local) => {
                    let mut mine = mems[b].read(b, ri, local)?;
                    reducer.pre(&mut mine);
                    let mut acc = incoming;
                    reducer.op(&mut acc, &mine);
                    acc
                }
                Act::Accumulate => {
                    let mut acc = mems[b].read(b, ri, dst)?;
                    reducer.op(&mut acc, &incoming);
                    acc
                }
            };
            mems[b].write(dst, &result);
            moved[a * n + b] += 1;
            if !transferable(&runs, &moved, a, b) {
                is_due[a * n + b] = false;
                due.swap_remove(pick - ready.len());
            }
            complete(&mut runs, &mut ready, a, si);
            complete(&mut runs, &mut ready, b, ri);
            done += 2;
        }
    }
    if done != total {
        return Err(SimError::Deadlock(describe_stuck(&runs)));
    }
    let mut out = Vec::with_capacity(n);
    for (r, m) in mems.iter().enumerate() {
        let v = m.layout.recv;
        if let Some(k) = m.init[0][v.offset..v.end()].iter().position(|&w| !w) {
            return Err(SimError::RecvNotWritten { rank: r, offset: k });
        }
        out.push(m.data[0][v.offset..v.end()].to_vec());
    }
    Ok(out)
}

/// A short account of what each rank is stuck on.
fn describe_stuck(runs: &[Run]) -> String {
    let mut out = String::new();
    for (r, run) in runs.iter().enumerate() {
        let stuck: Vec<String> = (0..run.ops.len())
            .filter(|&i| run.status[i] != DONE)
            .take(4)
            .map(|i| {
                let what = match run.ops[i] {
                    Op::Send { peer, .. } => format!("send to {peer}"),
                    Op::Recv { peer, .. } => format!("recv from {peer}"),
                    _ => "local".to_string(),
                };
                let state = if run.status[i] == STARTED { "posted" } else { "waiting" };
                format!("step {i} ({what}, {state})")
            })
            .collect();
        if !stuck.is_empty() {
            out.push_str(&format!("rank {r}: {}; ", stuck.join(", ")));
        }
    }
    out
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "mem {} B, send [{}, {}), recv [{}, {})",
            self.mem_len,
            self.send.offset,
            self.send.end(),
            self.recv.offset,
            self.recv.end()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coll::algo::{plan_with, recv_plan, send_plan, Algorithm, CollArgs, CollKind};
    use crate::coll::plan::PlannedStep;

    const RANKS: [usize; 7] = [1, 2, 3, 4, 5, 7, 8];

    fn random_bytes(rng: &mut Rng, len: usize) -> Vec<u8> {
        (0..len).map(|_| rng.next() as u8).collect()
    }

    fn values(model: &IntModel, b: &[u8]) -> Vec<u64> {
        b.chunks_exact(model.elem_size).map(|e| model.get(e)).collect()
    }

    fn bytes_of(model: &IntModel, v: &[u64]) -> Vec<u8> {
        let mut out = vec![0u8; v.len() * model.elem_size];
        for (e, &x) in out.chunks_exact_mut(model.elem_size).zip(v) {
            model.put(e, x);
        }
        out
    }

    /// What NCCL promises, computed directly.
    fn reference(a: &CollArgs, n: usize, inputs: &[Vec<u8>], m: &IntModel) -> Vec<Vec<u8>> {
        let vals: Vec<Vec<u64>> = inputs.iter().map(|i| values(m, i)).collect();
        let reduced = || -> Vec<u64> {
            let len = vals.iter().map(Vec::len).max().unwrap_or(0);
            (0..len)
                .map(|e| {
                    let mut acc = None;
                    for v in vals.iter().filter(|v| !v.is_empty()) {
                        let x = m.pre_value(v[e]);
                        acc = Some(acc.map_or(x, |s| m.op_value(s, x)));
                    }
                    m.post_value(acc.unwrap())
                })
                .collect()
        };
        let blk = a.bytes / m.elem_size;
        (0..n)
            .map(|r| {
                let v: Vec<u64> = match a.kind {
                    CollKind::AllReduce => reduced(),
                    CollKind::Reduce if r == a.root => reduced(),
                    CollKind::ReduceScatter => reduced()[r * blk..(r + 1) * blk].to_vec(),
                    CollKind::Broadcast => vals[a.root].clone(),
                    CollKind::AllGather => vals.concat(),
                    CollKind::Gather if r == a.root => vals.concat(),
                    CollKind::Scatter => vals[a.root][r * blk..(r + 1) * blk].to_vec(),
                    CollKind::AlltoAll => (0..n).flat_map(|j| vals[j][r * blk..(r + 1) * blk].to_vec()).collect(),
                    _ => vec![],
                };
                bytes_of(m, &v)
            })
            .collect()
    }

    fn run(a: &CollArgs, n: usize, algo: Algorithm, chunk: usize, seed: u64) -> Result<(), String> {
        let m = IntModel::for_args(a);
        let mut rng = Rng::new(seed ^ 0xfeed);
        let layouts: Vec<Layout> = (0..n).map(|r| Layout::for_coll(a, r, n)).collect();
        let inputs: Vec<Vec<u8>> = layouts.iter().map(|l| random_bytes(&mut rng, l.send.len)).collect();
        let plans: Vec<Plan> =
            (0..n).map(|r| plan_with(a, r, n, algo, chunk).map_err(|e| e.to_string())).collect::<Result<_, _>>()?;
        let got = simulate(&plans, &layouts, &inputs, &m, seed).map_err(|e| e.to_string())?;
        let want = reference(a, n, &inputs, &m);
        for r in 0..n {
            if got[r] != want[r] {
                return Err(format!("rank {r}: got {:?}, want {:?}", values(&m, &got[r]), values(&m, &want[r])));
            }
        }
        Ok(())
    }

    /// Every algorithm of `kind` over ranks, counts, chunk sizes, in place or not, roots,
    /// pre/post, and a few schedules.
    fn sweep(kind: CollKind) {
        let elem = 8;
        let mut cases = 0;
        for n in RANKS {
            let mut counts = vec![0, 1, n.saturating_sub(1), 2 * n + 3, 37];
            counts.sort_unstable();
            counts.dedup();
            let roots: Vec<usize> = if kind.uses_root() { vec![0, n - 1, n / 2] } else { vec![0] };
            for &algo in kind.algorithms() {
                for &count in &counts {
                    for (ci, chunk_elems) in [1usize, 3, 1 << 16].into_iter().enumerate() {
                        for in_place in [false, true] {
                            let prepost: &[(bool, bool)] = if !kind.is_reduction() {
                                &[(false, false)]
                            } else if ci == 1 {
                                &[(false, false), (true, false), (false, true), (true, true)]
                            } else {
                                &[(false, false), (true, true)]
                            };
                            for &(has_pre, has_post) in prepost {
                                for (k, &root) in roots.iter().enumerate() {
                                    let a = CollArgs {
                                        kind,
                                        bytes: count * elem,
                                        root,
                                        in_place,
                                        elem_size: elem,
                                        has_pre,
                                        has_post,
                                    };
                                    let seeds = if count >= 2 * n { 2 } else { 1 };
                                    for seed in 0..seeds {
                                        let seed = (seed * 7919 + k * 31 + count) as u64;
                                        if let Err(e) = run(&a, n, algo, chunk_elems * elem, seed) {
                                            let at = format!("n={n} chunk={chunk_elems} seed={seed}");
                                            panic!("{kind} {algo} {at} {a:?}: {e}");
                                        }
                                        cases += 1;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(cases > 100);
    }

    #[test]
    fn allreduce_all_cases() {
        sweep(CollKind::AllReduce);
    }

    #[test]
    fn broadcast_all_cases() {
        sweep(CollKind::Broadcast);
    }

    #[test]
    fn reduce_all_cases() {
        sweep(CollKind::Reduce);
    }

    #[test]
    fn allgather_all_cases() {
        sweep(CollKind::AllGather);
    }

    #[test]
    fn reduce_scatter_all_cases() {
        sweep(CollKind::ReduceScatter);
    }

    #[test]
    fn alltoall_all_cases() {
        sweep(CollKind::AlltoAll);
    }

    #[test]
    fn gather_all_cases() {
        sweep(CollKind::Gather);
    }

    #[test]
    fn scatter_all_cases() {
        sweep(CollKind::Scatter);
    }

    #[test]
    fn small_elements_and_odd_chunk_sizes() {
        // Chunk sizes that are not multiples of the element size are rounded down.
        for elem in [1, 2, 4] {
            for kind in [CollKind::AllReduce, CollKind::ReduceScatter, CollKind::Reduce, CollKind::AllGather] {
                for &algo in kind.algorithms() {
                    for n in [3, 4, 5] {
                        for in_place in [false, true] {
                            let a = CollArgs {
                                kind,
                                bytes: 29 * elem,
                                root: 1,
                                in_place,
                                elem_size: elem,
                                has_pre: true,
                                has_post: true,
                            };
                            run(&a, n, algo, 7, 3).unwrap_or_else(|e| panic!("{kind} {algo} elem={elem} n={n}: {e}"));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn many_chunks() {
        for kind in [CollKind::AllReduce, CollKind::Reduce, CollKind::Broadcast, CollKind::ReduceScatter] {
            for &algo in kind.algorithms() {
                let a = CollArgs {
                    kind,
                    bytes: 3000 * 8,
                    root: 2,
                    in_place: true,
                    elem_size: 8,
                    has_pre: true,
                    has_post: true,
                };
                run(&a, 6, algo, 64, 11).unwrap_or_else(|e| panic!("{kind} {algo}: {e}"));
            }
        }
    }

    /// Concatenate plans as one group would (deps shifted).
    fn concat(plans: &[Plan]) -> Plan {
        let mut out = Plan::new("direct");
        for p in plans {
            let base = out.steps.len() as u32;
            for s in &p.steps {
                let deps: Vec<u32> = s.deps.iter().map(|d| d + base).collect();
                out.steps.push(PlannedStep { step: s.step, deps });
            }
            out.scratch_bytes = out.scratch_bytes.max(p.scratch_bytes);
        }
        out
    }

    #[test]
    fn send_recv_ring_and_self() {
        let m = IntModel::new(8, true, true);
        for n in RANKS {
            for count in [0usize, 1, 5] {
                let bytes = count * 8;
                // Each rank sends to rank + 1 and to itself, receives from rank - 1 and itself.
                let plans: Vec<Plan> = (0..n)
                    .map(|r| {
                        concat(&[
                            send_plan((r + 1) % n, bytes),
                            send_plan(r, bytes),
                            recv_plan((r + n - 1) % n, bytes),
                            recv_plan(r, bytes),
                        ])
                    })
                    .collect();
                // Recv view holds both receives: from the left at 0, from self at `bytes`.
                let mut plans = plans;
                for p in &mut plans {
                    let mut recvs = 0;
                    for s in &mut p.steps {
                        if let Step::Recv { dst, .. } = &mut s.step {
                            dst.offset += recvs * bytes;
                            recvs += 1;
                        }
                    }
                }
                let layouts: Vec<Layout> = (0..n).map(|_| Layout::disjoint(bytes, 2 * bytes)).collect();
                let inputs: Vec<Vec<u8>> = (0..n).map(|r| bytes_of(&m, &vec![r as u64 + 100; count])).collect();
                for seed in 0..3 {
                    let got = simulate(&plans, &layouts, &inputs, &m, seed).unwrap();
                    for r in 0..n {
                        let left = (r + n - 1) % n;
                        assert_eq!(got[r], [inputs[left].clone(), inputs[r].clone()].concat());
                    }
                }
            }
        }
    }

    #[test]
    fn float_allreduce_is_bit_identical_on_every_rank_and_schedule() {
        for n in [3, 5, 6, 8] {
            for &algo in CollKind::AllReduce.algorithms() {
                for in_place in [false, true] {
                    let count = 41;
                    let a = CollArgs {
                        kind: CollKind::AllReduce,
                        bytes: count * 8,
                        root: 0,
                        in_place,
                        elem_size: 8,
                        has_pre: true,
                        has_post: true,
                    };
                    let mut rng = Rng::new(n as u64);
                    let inputs: Vec<Vec<u8>> = (0..n)
                        .map(|_| {
                            (0..count).flat_map(|_| ((rng.next() >> 11) as f64 * 1e-7 - 400.0).to_le_bytes()).collect()
                        })
                        .collect();
                    let layouts: Vec<Layout> = (0..n).map(|r| Layout::for_coll(&a, r, n)).collect();
                    let plans: Vec<Plan> = (0..n).map(|r| plan_with(&a, r, n, algo, 24).unwrap()).collect();
                    let first = simulate(&plans, &layouts, &inputs, &F64Sum, 1).unwrap();
                    for r in 1..n {
                        assert_eq!(first[r], first[0], "{algo} n={n}: rank {r} differs");
                    }
                    for seed in 2..5 {
                        assert_eq!(simulate(&plans, &layouts, &inputs, &F64Sum, seed).unwrap(), first);
                    }
                }
            }
        }
    }

    // ---- The simulator itself catches broken plans. ----

    fn s(buf: BufId, offset: usize, len: usize) -> Slice {
        Slice::new(buf, offset, len)
    }

    fn sim2(p0: Plan, p1: Plan, layout: Layout) -> Result<Vec<Vec<u8>>, SimError> {
        let m = IntModel::new(8, true, true);
        let input = vec![1u8; layout.send.len];
        simulate(&[p0, p1], &[layout, layout], &[input.clone(), input], &m, 5)
    }

    #[test]
    fn detects_missing_dependency() {
        let mut p = Plan::new("t");
        p.recv(1, s(BufId::Recv, 0, 8), RecvAction::Copy, &[]);
        p.send(1, s(BufId::Recv, 0, 8), &[]); // reads Recv without waiting for the receive
        let mut q = Plan::new("t");
        q.send(0, s(BufId::Send, 0, 8), &[]);
        q.recv(0, s(BufId::Recv, 0, 8), RecvAction::Copy, &[]);
        let e = sim2(p, q, Layout::disjoint(8, 8)).unwrap_err();
        assert!(matches!(e, SimError::Race { rank: 0, first: 0, second: 1, .. }), "{e}");
    }

    #[test]
    fn detects_deadlock() {
        let mut p = Plan::new("t");
        let r = p.recv(1, s(BufId::Recv, 0, 8), RecvAction::Copy, &[]);
        p.send(1, s(BufId::Send, 0, 8), &[r]);
        let e = sim2(p.clone(), p, Layout::disjoint(8, 8)).unwrap_err();
        assert!(matches!(e, SimError::Deadlock(_)), "{e}");
    }

    #[test]
    fn matches_per_peer_in_fifo_order() {
        // Rank 0 sends 8 then 16 bytes; rank 1 posts its 16-byte receive first. FIFO matching
        // pairs the first send with the first receive whatever the timing: a mismatch, never
        // an out-of-order match.
        let m = IntModel::new(8, false, false);
        let mut p = Plan::new("t");
        p.send(1, s(BufId::Send, 0, 8), &[]);
        p.send(1, s(BufId::Send, 8, 16), &[]);
        let mut q = Plan::new("t");
        q.recv(0, s(BufId::Recv, 0, 16), RecvAction::Copy, &[]);
        q.recv(0, s(BufId::Recv, 16, 8), RecvAction::Copy, &[]);
        let layouts = [Layout::disjoint(24, 0), Layout::disjoint(0, 24)];
        for seed in 0..8 {
            let e = simulate(&[p.clone(), q.clone()], &layouts, &[vec![0; 24], vec![]], &m, seed);
            assert!(matches!(e, Err(SimError::LengthMismatch { index: 0, .. })), "{e:?}");
        }
        // Listed in the sender's order, the same receives work under every schedule.
        let mut q = Plan::new("t");
        q.recv(0, s(BufId::Recv, 0, 8), RecvAction::Copy, &[]);
        q.recv(0, s(BufId::Recv, 8, 16), RecvAction::Copy, &[]);
        for seed in 0..8 {
            let got = simulate(&[p.clone(), q.clone()], &layouts, &[(0..24).collect(), vec![]], &m, seed);
            assert_eq!(got.unwrap()[1], (0..24).collect::<Vec<u8>>());
        }
    }

    #[test]
    fn detects_length_mismatch() {
        let mut p = Plan::new("t");
        p.send(1, s(BufId::Send, 0, 8), &[]);
        p.recv(1, s(BufId::Recv, 0, 16), RecvAction::Copy, &[]);
        let mut q = Plan::new("t");
        q.send(0, s(BufId::Send, 0, 16), &[]);
        q.recv(0, s(BufId::Recv, 0, 16), RecvAction::Copy, &[]);
        let e = sim2(p, q, Layout::disjoint(16, 16)).unwrap_err();
        assert!(matches!(e, SimError::LengthMismatch { .. }), "{e}");
    }

    #[test]
    fn detects_uninitialised_reads() {
        let mut p = Plan::new("t");
        p.scratch_bytes = 8;
        p.send(0, s(BufId::Scratch, 0, 8), &[]);
        p.recv(0, s(BufId::Recv, 0, 8), RecvAction::Copy, &[]);
        let m = IntModel::new(8, true, true);
        let e = simulate(&[p], &[Layout::disjoint(8, 8)], &[vec![0; 8]], &m, 1).unwrap_err();
        assert!(matches!(e, SimError::UninitRead { space: "scratch", .. }), "{e}");
        // Recv that does not alias the input holds garbage too.
        let mut p = Plan::new("t");
        p.local(LocalOp::Finalize { buf: s(BufId::Recv, 0, 8) }, &[]);
        let e = simulate(&[p], &[Layout::disjoint(8, 8)], &[vec![0; 8]], &m, 1).unwrap_err();
        assert!(matches!(e, SimError::UninitRead { space: "buffer", .. }), "{e}");
    }

    #[test]
    fn detects_bad_slices() {
        let m = IntModel::new(8, true, true);
        let one = |step: Step| {
            let mut p = Plan::new("t");
            p.push(step, &[]);
            simulate(&[p], &[Layout::disjoint(8, 8)], &[vec![0; 8]], &m, 1)
        };
        let oob = one(Step::Send { peer: 0, src: s(BufId::Send, 0, 16) }).unwrap_err();
        assert!(matches!(oob, SimError::OutOfBounds { .. }), "{oob}");
        let mis = one(Step::Local(LocalOp::Copy { src: s(BufId::Send, 4, 4), dst: s(BufId::Recv, 0, 4) }));
        assert!(matches!(mis, Err(SimError::Misaligned { .. })));
        let to_send = one(Step::Local(LocalOp::Copy { src: s(BufId::Recv, 0, 8), dst: s(BufId::Send, 0, 8) }));
        assert!(matches!(to_send, Err(SimError::InvalidPlan { .. })));
        let peer = one(Step::Send { peer: 3, src: s(BufId::Send, 0, 8) });
        assert!(matches!(peer, Err(SimError::InvalidPlan { .. })));
        let unwritten = simulate(&[Plan::new("t")], &[Layout::disjoint(8, 8)], &[vec![0; 8]], &m, 1);
        assert!(matches!(unwritten, Err(SimError::RecvNotWritten { rank: 0, offset: 0 })));
    }

    #[test]
    fn detects_partial_overlap_in_combine() {
        let mut p = Plan::new("t");
        p.send(1, s(BufId::Send, 0, 16), &[]);
        p.recv(1, s(BufId::Recv, 0, 16), RecvAction::Combine { local: s(BufId::Send, 8, 16) }, &[]);
        // Send view at 0..24 and Recv at 0..16 of the same memory: local [8,24) vs dst [0,16).
        let layout = Layout::aliased(Region::new(0, 24), Region::new(0, 16));
        let e = sim2(p.clone(), p, layout).unwrap_err();
        assert!(matches!(e, SimError::InvalidPlan { .. }), "{e}");
    }

    #[test]
    fn out_of_place_plans_fail_when_run_in_place() {
        // The aliasing hazards that `in_place` exists to avoid must show up.
        for (kind, algo) in [
            (CollKind::AllReduce, Algorithm::Ring),
            (CollKind::AllReduce, Algorithm::Tree),
            (CollKind::ReduceScatter, Algorithm::Ring),
            (CollKind::AlltoAll, Algorithm::Direct),
        ] {
            let n = 4;
            let mut a = CollArgs::new(kind, 16 * 8, 8);
            a.has_pre = true;
            let plans: Vec<Plan> = (0..n).map(|r| plan_with(&a, r, n, algo, 16).unwrap()).collect();
            a.in_place = true;
            let layouts: Vec<Layout> = (0..n).map(|r| Layout::for_coll(&a, r, n)).collect();
            let m = IntModel::new(8, true, true);
            let mut rng = Rng::new(9);
            let inputs: Vec<Vec<u8>> = layouts.iter().map(|l| random_bytes(&mut rng, l.send.len)).collect();
            let res = simulate(&plans, &layouts, &inputs, &m, 3);
            match res {
                Err(e) => assert!(!matches!(e, SimError::Deadlock(_)), "{kind} {algo}: {e}"),
                Ok(got) => assert_ne!(got, reference(&a, n, &inputs, &m), "{kind} {algo}: hazard unnoticed"),
            }
        }
    }

    #[test]
    fn int_model_post_is_not_additive() {
        for elem in [1, 2, 4, 8] {
            let m = IntModel::new(elem, true, true);
            let (a, b) = (0x35 & m.mask(), 0x1c2 & m.mask());
            assert_ne!(m.op_value(m.post_value(a), b), m.post_value(m.op_value(a, b)), "elem {elem}");
            assert_ne!(m.post_value(m.post_value(a)), m.post_value(a));
        }
    }
}
