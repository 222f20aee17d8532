//! Plan generators for every collective, and the choice of algorithm.
//!
//! Everything here is a pure function of its arguments: no I/O, no environment, no clock.
//! A generator returns the [`Plan`] of one rank; run together, the plans of all ranks perform
//! the collective (`coll::sim` checks that they do, under random schedules).
//!
//! # What `CollArgs::bytes` means
//!
//! Always NCCL's `count` argument times the element size, so for most collectives it is *not*
//! the total message size (see [`CollArgs::total_bytes`]). With `B = bytes`, `n` ranks and
//! `r` this rank, the buffers a plan may touch are:
//!
//! | kind          | NCCL count | Send bytes    | Recv bytes    | in place means              |
//! |---------------|------------|---------------|---------------|-----------------------------|
//! | AllReduce     | count      | B             | B             | Send == Recv                |
//! | Broadcast     | count      | B (root only) | B             | root: Send == Recv          |
//! | Reduce        | count      | B             | B (root only) | root: Send == Recv          |
//! | AllGather     | sendcount  | B             | n*B           | Send == Recv + r*B          |
//! | ReduceScatter | recvcount  | n*B           | B             | Recv == Send + r*B          |
//! | AlltoAll      | count      | n*B           | n*B           | Send == Recv                |
//! | Gather        | count      | B             | n*B (root only) | root: Send == Recv + root*B |
//! | Scatter       | count      | n*B (root only) | B           | root: Recv == Send + root*B |
//! | Send          | count      | B             | unused        | never                       |
//! | Recv          | count      | unused        | B             | never                       |
//!
//! Buffers marked "root only" are unused on other ranks. Unused buffers are never referenced
//! by the plan (NCCL allows them to be NULL). [`CollArgs::send_len`] and
//! [`CollArgs::recv_len`] return these sizes.
//!
//! # In place
//!
//! With `in_place` the executor passes aliasing buffers as in the table; plans are written so
//! that no byte of Send is read after the aliased byte of Recv was written (other than a step
//! reading its own destination, which the plan rules allow). Where Send and Recv are the same
//! memory, plans address the caller's input through `BufId::Recv`, so `BufId::Send` is not used
//! at all for AllReduce, rooted Broadcast/Reduce, AllGather and AlltoAll in place. In-place
//! ReduceScatter reads the other ranks' blocks through `BufId::Send` and its own through `Recv`;
//! it never uses Recv as temporary storage (that would destroy Send block `r`), so it needs
//! more scratch than the out-of-place form.
//!
//! # Reductions
//!
//! A rank's input enters a reduction exactly once: through `RecvAction::Combine` (which applies
//! `pre` itself) or through `LocalOp::Prepare` before being sent. `Finalize` is applied exactly
//! once to every final result, before it is copied to other ranks, and only if `has_post`.
//! Partial results are merged with `Accumulate` (no `pre`), always in an order fixed by the
//! plan, so results do not depend on timing.

use std::fmt;

use crate::coll::plan::{BufId, LocalOp, Plan, RecvAction, Slice};
use crate::error::{Error, Result};

/// Chunk size of pipelined algorithms unless the caller says otherwise.
pub const DEFAULT_CHUNK_BYTES: usize = 512 << 10;
/// Messages of at most this many bytes (total size) use the latency algorithm by default.
pub const DEFAULT_TREE_THRESHOLD: usize = 64 << 10;
/// Scratch slots (of one chunk each) a chain reduce uses on intermediate ranks.
const CHAIN_SLOTS: usize = 8;
/// Chunks are enlarged so that no buffer is cut into more pieces than this: a tiny
/// `chunk_bytes` must not turn a huge message into millions of steps.
const MAX_CHUNKS: usize = 1 << 16;

/// A collective or point-to-point operation.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum CollKind {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AlltoAll,
    Gather,
    Scatter,
    Send,
    Recv,
}

impl CollKind {
    pub const ALL: [CollKind; 10] = [
        CollKind::AllReduce,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::AlltoAll,
        CollKind::Gather,
        CollKind::Scatter,
        CollKind::Send,
        CollKind::Recv,
    ];

    /// NCCL's name of the function (as in its logs and `NCCL_ALGO` prefixes).
    pub const fn name(self) -> &'static str {
        match self {
            CollKind::AllReduce => "AllReduce",
            CollKind::Broadcast => "Broadcast",
            CollKind::Reduce => "Reduce",
            CollKind::AllGather => "AllGather",
            CollKind::ReduceScatter => "ReduceScatter",
            CollKind::AlltoAll => "AlltoAll",
            CollKind::Gather => "Gather",
            CollKind::Scatter => "Scatter",
            CollKind::Send => "Send",
            CollKind::Recv => "Recv",
        }
    }

    /// Whether the operation reduces (uses `has_pre`/`has_post`).
    pub const fn is_reduction(self) -> bool {
        matches!(self, CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter)
    }

    /// Whether `CollArgs::root` is meaningful (a root, or the peer of Send/Recv).
    pub const fn uses_root(self) -> bool {
        matches!(
            self,
            CollKind::Broadcast
                | CollKind::Reduce
                | CollKind::Gather
                | CollKind::Scatter
                | CollKind::Send
                | CollKind::Recv
        )
    }

    /// Index among NCCL's `NCCL_ALGO` function prefixes, for the collectives it tunes.
    const fn nccl_func(self) -> Option<usize> {
        match self {
            CollKind::Broadcast => Some(0),
            CollKind::Reduce => Some(1),
            CollKind::AllGather => Some(2),
            CollKind::ReduceScatter => Some(3),
            CollKind::AllReduce => Some(4),
            _ => None,
        }
    }

    /// The algorithms ferroccl implements for this operation, preferred-for-bandwidth first.
    pub const fn algorithms(self) -> &'static [Algorithm] {
        match self {
            CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce => &[Algorithm::Ring, Algorithm::Tree],
            CollKind::AllGather | CollKind::ReduceScatter => &[Algorithm::Ring],
            _ => &[Algorithm::Direct],
        }
    }
}

impl fmt::Display for CollKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A family of plans.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Algorithm {
    /// Bandwidth: pipelined ring (AllReduce, AllGather, ReduceScatter) or chain along the ring
    /// (Broadcast from the root, Reduce towards it).
    Ring,
    /// Latency (`NCCL_ALGO=tree`): recursive doubling (AllReduce), binomial tree
    /// (Broadcast, Reduce).
    Tree,
    /// Every transfer posted at once (AlltoAll, Gather, Scatter, Send, Recv).
    Direct,
}

impl Algorithm {
    /// Name for logs; also `Plan::algorithm`.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
            Algorithm::Direct => "direct",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// NCCL's algorithm names, in NCCL's order (bit `i` of an [`AlgoSelection`] mask).
const NCCL_ALGOS: [&str; 7] = ["tree", "ring", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat"];
/// NCCL's function prefixes for `NCCL_ALGO`, in NCCL's order.
const NCCL_FUNCS: [&str; 5] = ["broadcast", "reduce", "allgather", "reducescatter", "allreduce"];
const TREE_BIT: u8 = 1 << 0;
const RING_BIT: u8 = 1 << 1;
const ALL_ALGOS: u8 = (1 << NCCL_ALGOS.len()) - 1;

/// Which algorithms a user allows, per collective: a parsed `NCCL_ALGO`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct AlgoSelection {
    /// Per NCCL function prefix, a mask over `NCCL_ALGOS`.
    enabled: [u8; 5],
    /// The string it was parsed from ("" when nothing was forced), for messages.
    source: String,
}

impl Default for AlgoSelection {
    fn default() -> Self {
        AlgoSelection { enabled: [ALL_ALGOS; 5], source: String::new() }
    }
}

impl AlgoSelection {
    /// Everything allowed (`NCCL_ALGO` unset).
    pub fn all() -> Self {
        Self::default()
    }

    /// Parse NCCL's syntax: `list[;func:list]...` where `list` is a comma list of algorithm
    /// names, optionally starting with `^` (everything except those), and `func` is one of
    /// `broadcast, reduce, allgather, reducescatter, allreduce`. Only the first entry may
    /// lack a prefix. Names are NCCL's (`tree, ring, collnetdirect, collnetchain, nvls,
    /// nvlstree, pat`), case-insensitive; the ones ferroccl does not implement are accepted
    /// and simply never chosen. An empty string allows everything.
    pub fn parse(s: &str) -> Result<Self> {
        let mut sel = AlgoSelection { enabled: [ALL_ALGOS; 5], source: s.to_string() };
        let bad = |what: String| Error::invalid_argument(format!("NCCL_ALGO={s:?}: {what}"));
        for (i, entry) in s.split(';').map(str::trim).enumerate() {
            if entry.is_empty() {
                continue;
            }
            let (funcs, list) = match entry.split_once(':') {
                Some((prefix, list)) => {
                    let prefix = prefix.trim();
                    let f = NCCL_FUNCS
                        .iter()
                        .position(|name| name.eq_ignore_ascii_case(prefix))
                        .ok_or_else(|| bad(format!("unknown function {prefix:?}")))?;
                    (f..f + 1, list.trim())
                }
                None if i == 0 => (0..NCCL_FUNCS.len(), entry),
                None => return Err(bad(format!("entry {entry:?} lacks a function prefix"))),
            };
            let (exclude, list) = match list.strip_prefix('^') {
                Some(rest) => (true, rest),
                None => (false, list),
            };
            let mut mask = 0u8;
            for name in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
                let a = NCCL_ALGOS
                    .iter()
                    .position(|algo| algo.eq_ignore_ascii_case(name))
                    .ok_or_else(|| bad(format!("unknown algorithm {name:?}")))?;
                mask |= 1 << a;
            }
            if mask == 0 && !exclude {
                return Err(bad(format!("entry {entry:?} names no algorithm")));
            }
            let mask = if exclude { ALL_ALGOS & !mask } else { mask };
            for f in funcs {
                sel.enabled[f] = mask;
            }
        }
        Ok(sel)
    }

    /// Whether the user allows `algo` for `coll` (`Direct` and untuned operations: always).
    pub fn allows(&self, coll: CollKind, algo: Algorithm) -> bool {
        let Some(f) = coll.nccl_func() else { return true };
        match algo {
            Algorithm::Ring => self.enabled[f] & RING_BIT != 0,
            Algorithm::Tree => self.enabled[f] & TREE_BIT != 0,
            Algorithm::Direct => true,
        }
    }

    /// The string this was parsed from.
    /// Whether the user left the choice to ferroccl (no NCCL_ALGO).
    pub fn is_default(&self) -> bool {
        self.source.is_empty()
    }

    pub fn source(&self) -> &str {
        &self.source
    }
}

/// Knobs of plan generation. Every rank must use the same values (chunking must match).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Tuning {
    /// Largest piece of a pipelined transfer; rounded down to a multiple of the element size
    /// (at least one element), and raised so that no buffer has more than 65536 chunks.
    pub chunk_bytes: usize,
    /// Messages of at most this total size use the latency algorithm by default.
    pub tree_threshold: usize,
    pub selection: AlgoSelection,
    /// Node all-reduces (all-gathers: per rank) of at most this many bytes go one-shot;
    /// `None`: chosen by rank count.
    pub node_one_shot_max: Option<usize>,
    /// Node direct and pull operations pass a rank's buffers that its peers cannot map
    /// through its slot up to this size (a rank's own choice, published to its peers).
    /// `None`: chosen per collective and rank count (`node::default_stage_max`).
    pub node_stage_max: Option<usize>,
    /// Node all-gathers of at least this many bytes (the whole message) at three or more
    /// ranks go by relay. `None`: chosen by rank count and buffer kind
    /// (`node::default_relay_sizes`).
    pub node_relay_min: Option<usize>,
    /// Repeated host calls that the rules pass through slots try kernel copies too and keep
    /// the faster (`coll::stage_trial`); off: the rules alone.
    pub node_stage_trial: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            tree_threshold: DEFAULT_TREE_THRESHOLD,
            selection: AlgoSelection::default(),
            node_one_shot_max: None,
            node_stage_max: None,
            node_relay_min: None,
            node_stage_trial: true,
        }
    }
}

/// One operation, as far as plans care (the module docs say what each field means per kind).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CollArgs {
    pub kind: CollKind,
    /// NCCL's `count` argument times `elem_size` (a per-rank block for AllGather,
    /// ReduceScatter, AlltoAll, Gather, Scatter).
    pub bytes: usize,
    /// The root (Broadcast, Reduce, Gather, Scatter) or the peer (Send, Recv); else ignored.
    pub root: usize,
    /// The buffers alias as NCCL's in-place form of this collective (see module docs).
    pub in_place: bool,
    /// Bytes per element: every slice boundary is a multiple of it.
    pub elem_size: usize,
    /// The operator has a `pre` step (PreMulSum, float average); reductions only.
    pub has_pre: bool,
    /// The operator has a `post` step (integer average); reductions only.
    pub has_post: bool,
}

impl CollArgs {
    /// Out of place, root 0, no pre/post.
    pub fn new(kind: CollKind, bytes: usize, elem_size: usize) -> Self {
        CollArgs { kind, bytes, root: 0, in_place: false, elem_size, has_pre: false, has_post: false }
    }

    /// NCCL's message size (`nBytes`), which algorithm choice compares with thresholds:
    /// `bytes * nranks` for AllGather, ReduceScatter, AlltoAll, Gather and Scatter.
    pub fn total_bytes(&self, nranks: usize) -> usize {
        match self.kind {
            CollKind::AllGather
            | CollKind::ReduceScatter
            | CollKind::AlltoAll
            | CollKind::Gather
            | CollKind::Scatter => self.bytes.saturating_mul(nranks),
            _ => self.bytes,
        }
    }

    /// Bytes of the Send buffer that `rank`'s plan may reference (0: not used at all).
    pub fn send_len(&self, rank: usize, nranks: usize) -> usize {
        let is_root = rank == self.root;
        match self.kind {
            CollKind::AllReduce | CollKind::Reduce | CollKind::AllGather | CollKind::Gather => self.bytes,
            CollKind::Send => self.bytes,
            CollKind::Broadcast if is_root => self.bytes,
            CollKind::ReduceScatter | CollKind::AlltoAll => self.bytes * nranks,
            CollKind::Scatter if is_root => self.bytes * nranks,
            CollKind::Broadcast | CollKind::Scatter | CollKind::Recv => 0,
        }
    }

    /// Bytes of the Recv buffer that `rank`'s plan may reference (0: not used at all).
    pub fn recv_len(&self, rank: usize, nranks: usize) -> usize {
        let is_root = rank == self.root;
        match self.kind {
            CollKind::AllReduce
            | CollKind::Broadcast
            | CollKind::ReduceScatter
            | CollKind::Scatter
            | CollKind::Recv => self.bytes,
            CollKind::Reduce if is_root => self.bytes,
            CollKind::AllGather | CollKind::AlltoAll => self.bytes * nranks,
            CollKind::Gather if is_root => self.bytes * nranks,
            CollKind::Reduce | CollKind::Gather | CollKind::Send => 0,
        }
    }
}

/// The algorithm for one operation, and why the user's selection was overridden, if it was.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Choice {
    pub algorithm: Algorithm,
    /// Set when `NCCL_ALGO` allowed none of the algorithms implemented for this operation;
    /// the caller should log it (once).
    pub fallback_reason: Option<String>,
}

/// Pick the algorithm for `coll` with a total message size of `bytes` (see
/// [`CollArgs::total_bytes`]): the latency algorithm at or below `tree_threshold` bytes, ring
/// above, among those `forced` allows; ring if it allows none of them.
pub fn choose(coll: CollKind, bytes: usize, nranks: usize, tree_threshold: usize, forced: &AlgoSelection) -> Choice {
    let available = coll.algorithms();
    let allowed: Vec<Algorithm> = available.iter().copied().filter(|&a| forced.allows(coll, a)).collect();
    let algorithm = match allowed.as_slice() {
        [] => {
            let names: Vec<&str> = available.iter().map(|a| a.name()).collect();
            let reason = format!(
                "NCCL_ALGO={:?} allows none of the algorithms ferroccl implements for {} ({}); \
                 using ring",
                forced.source(),
                coll.name(),
                names.join(", ")
            );
            return Choice { algorithm: Algorithm::Ring, fallback_reason: Some(reason) };
        }
        [only] => *only,
        _ if bytes > tree_threshold || nranks <= 1 => Algorithm::Ring,
        _ => Algorithm::Tree,
    };
    Choice { algorithm, fallback_reason: None }
}

/// The plan of `rank` for `op`, with the algorithm `choose` picks (call `choose` and
/// [`plan_with`] instead to see the fallback reason).
pub fn plan(op: &CollArgs, rank: usize, nranks: usize, tuning: &Tuning) -> Result<Plan> {
    validate(op, rank, nranks)?;
    let choice = choose(op.kind, op.total_bytes(nranks), nranks, tuning.tree_threshold, &tuning.selection);
    plan_with(op, rank, nranks, choice.algorithm, tuning.chunk_bytes)
}

/// The plan of `rank` for `op` with a given algorithm (which must be one of
/// `op.kind.algorithms()`).
pub fn plan_with(op: &CollArgs, rank: usize, nranks: usize, algorithm: Algorithm, chunk_bytes: usize) -> Result<Plan> {
    validate(op, rank, nranks)?;
    if !op.kind.algorithms().contains(&algorithm) {
        return Err(Error::invalid_argument(format!("algorithm {algorithm} is not implemented for {}", op.kind)));
    }
    let c = Ctx::new(op, rank, nranks, chunk_bytes);
    Ok(match (op.kind, algorithm) {
        (CollKind::AllReduce, Algorithm::Ring) => ring_allreduce(&c),
        (CollKind::AllReduce, _) => rd_allreduce(&c),
        (CollKind::Broadcast, Algorithm::Ring) => chain_broadcast(&c),
        (CollKind::Broadcast, _) => binomial_broadcast(&c),
        (CollKind::Reduce, Algorithm::Ring) => chain_reduce(&c),
        (CollKind::Reduce, _) => binomial_reduce(&c),
        (CollKind::AllGather, _) => ring_allgather(&c),
        (CollKind::ReduceScatter, _) => ring_reduce_scatter(&c),
        (CollKind::AlltoAll, _) => direct_alltoall(&c),
        (CollKind::Gather, _) => direct_gather(&c),
        (CollKind::Scatter, _) => direct_scatter(&c),
        (CollKind::Send, _) => send_plan(op.root, op.bytes),
        (CollKind::Recv, _) => recv_plan(op.root, op.bytes),
    })
}

/// `ncclSend` of `bytes` bytes from the start of Send to `peer` (which may be this rank).
pub fn send_plan(peer: usize, bytes: usize) -> Plan {
    let mut b = Builder::new(Algorithm::Direct);
    if bytes > 0 {
        b.send(peer, Slice::new(BufId::Send, 0, bytes), &[]);
    }
    b.finish()
}

/// `ncclRecv` of `bytes` bytes from `peer` into the start of Recv.
pub fn recv_plan(peer: usize, bytes: usize) -> Plan {
    let mut b = Builder::new(Algorithm::Direct);
    if bytes > 0 {
        b.recv(peer, Slice::new(BufId::Recv, 0, bytes), RecvAction::Copy, &[]);
    }
    b.finish()
}

fn validate(op: &CollArgs, rank: usize, nranks: usize) -> Result<()> {
    let bad = |m: String| Err(Error::invalid_argument(format!("{}: {m}", op.kind)));
    if nranks == 0 || rank >= nranks {
        return bad(format!("rank {rank} out of range for {nranks} ranks"));
    }
    if op.kind.uses_root() && op.root >= nranks {
        let what = if matches!(op.kind, CollKind::Send | CollKind::Recv) { "peer" } else { "root" };
        return bad(format!("{what} {} out of range for {nranks} ranks", op.root));
    }
    if op.elem_size == 0 || op.bytes % op.elem_size != 0 {
        return bad(format!("{} bytes is not a whole number of {}-byte elements", op.bytes, op.elem_size));
    }
    if op.bytes.checked_mul(nranks).and_then(|t| t.checked_mul(2)).is_none() {
        return bad(format!("{} bytes times {nranks} ranks overflows", op.bytes));
    }
    Ok(())
}

/// Everything a generator needs, with the chunk size already rounded to whole elements.
struct Ctx {
    rank: usize,
    n: usize,
    bytes: usize,
    elem: usize,
    chunk: usize,
    root: usize,
    in_place: bool,
    pre: bool,
    post: bool,
}

impl Ctx {
    fn new(op: &CollArgs, rank: usize, n: usize, chunk_bytes: usize) -> Self {
        let elem = op.elem_size.max(1);
        let reduction = op.kind.is_reduction();
        let chunk = chunk_bytes.max(op.bytes.div_ceil(MAX_CHUNKS));
        Ctx {
            rank,
            n,
            bytes: op.bytes,
            elem,
            chunk: (chunk / elem).max(1) * elem,
            root: op.root,
            in_place: op.in_place,
            pre: reduction && op.has_pre,
            post: reduction && op.has_post,
        }
    }

    /// Where this rank's input lies when Send and Recv are the same memory (in place) or not.
    fn input(&self) -> BufId {
        if self.in_place {
            BufId::Recv
        } else {
            BufId::Send
        }
    }

    fn next(&self) -> usize {
        (self.rank + 1) % self.n
    }

    fn prev(&self) -> usize {
        (self.rank + self.n - 1) % self.n
    }

    /// `(rank - k) mod n` for any `k < 2n`.
    fn back(&self, k: usize) -> usize {
        (self.rank + 2 * self.n - k) % self.n
    }

    /// Chunk `i` of the byte range `[off, off + len)` of `buf`.
    fn chunk_of(&self, buf: BufId, off: usize, len: usize, i: usize) -> Slice {
        let start = i * self.chunk;
        Slice::new(buf, off + start, self.chunk.min(len - start))
    }

    fn nchunks(&self, len: usize) -> usize {
        len.div_ceil(self.chunk)
    }
}

/// `Plan` plus bookkeeping: optional deps, and scratch size from the slices used.
struct Builder {
    plan: Plan,
}

impl Builder {
    fn new(algo: Algorithm) -> Self {
        Builder { plan: Plan::new(algo.name()) }
    }

    fn note(&mut self, s: &Slice) {
        if s.buf == BufId::Scratch {
            self.plan.scratch_bytes = self.plan.scratch_bytes.max(s.end());
        }
    }

    fn deps(deps: &[Option<u32>]) -> Vec<u32> {
        let mut v: Vec<u32> = deps.iter().flatten().copied().collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    fn send(&mut self, peer: usize, src: Slice, deps: &[Option<u32>]) -> u32 {
        self.note(&src);
        self.plan.send(peer, src, &Self::deps(deps))
    }

    fn recv(&mut self, peer: usize, dst: Slice, action: RecvAction, deps: &[Option<u32>]) -> u32 {
        self.note(&dst);
        if let RecvAction::Combine { local } = action {
            self.note(&local);
        }
        self.plan.recv(peer, dst, action, &Self::deps(deps))
    }

    fn local(&mut self, op: LocalOp, deps: &[Option<u32>]) -> u32 {
        match op {
            LocalOp::Copy { src, dst } | LocalOp::Prepare { src, dst } => {
                self.note(&src);
                self.note(&dst);
            }
            LocalOp::Finalize { buf } => self.note(&buf),
        }
        self.plan.local(op, &Self::deps(deps))
    }

    fn finish(self) -> Plan {
        self.plan
    }
}

/// Byte ranges `(offset, len)` of `n` near-equal element-aligned blocks covering `bytes`
/// (the first `count % n` blocks one element longer; some may be empty).
fn blocks(bytes: usize, elem: usize, n: usize) -> Vec<(usize, usize)> {
    let count = bytes / elem;
    let (base, extra) = (count / n, count % n);
    let mut off = 0;
    (0..n)
        .map(|b| {
            let len = (base + usize::from(b < extra)) * elem;
            let block = (off, len);
            off += len;
            block
        })
        .collect()
}

/// One rank's whole job: `Recv = post(pre(input))` (or a plain copy); `n == 1` of every
/// collective that has one buffer each way.
fn local_only(c: &Ctx, algo: Algorithm) -> Plan {
    let len = c.bytes;
    let mut b = Builder::new(algo);
    if len == 0 {
        return b.finish();
    }
    let dst = Slice::new(BufId::Recv, 0, len);
    let src = if c.in_place { dst } else { Slice::new(BufId::Send, 0, len) };
    let mut last = None;
    if c.pre {
        last = Some(b.local(LocalOp::Prepare { src, dst }, &[]));
    } else if !c.in_place {
        last = Some(b.local(LocalOp::Copy { src, dst }, &[]));
    }
    if c.post {
        b.local(LocalOp::Finalize { buf: dst }, &[last]);
    }
    b.finish()
}

/// Ring AllReduce: reduce-scatter then all-gather around `rank -> rank + 1`, each of the `n`
/// blocks pipelined in chunks. At step `s` (of `2(n-1)`) a rank sends block `rank - s` and
/// receives block `rank - s - 1`; after step `n - 2` it owns the full sum of block `rank + 1`.
/// Steps are listed step-major, so a chunk of step `s + 1` is sendable as soon as that chunk
/// of step `s` arrived. Needs no scratch: partial sums live in Recv.
fn ring_allreduce(c: &Ctx) -> Plan {
    if c.bytes == 0 || c.n == 1 {
        return local_only(c, Algorithm::Ring);
    }
    let mut b = Builder::new(Algorithm::Ring);
    let (n, input) = (c.n, c.input());
    let blocks = blocks(c.bytes, c.elem, n);
    let nch: Vec<usize> = blocks.iter().map(|&(_, len)| c.nchunks(len)).collect();
    let at = |buf, blk: usize, i| c.chunk_of(buf, blocks[blk].0, blocks[blk].1, i);
    // Per block and chunk: the step whose result is sent next, and the last send reading Recv.
    let mut ready: Vec<Vec<Option<u32>>> = nch.iter().map(|&k| vec![None; k]).collect();
    let mut reader = ready.clone();
    for s in 0..2 * (n - 1) {
        let (sb, rb) = (c.back(s), c.back(s + 1));
        for i in 0..nch[sb] {
            let (src, dep) = if s > 0 {
                (at(BufId::Recv, sb, i), ready[sb][i])
            } else if c.pre {
                // Our own input must enter the sum pre-multiplied: stage it in our Recv block,
                // which is not written again before the all-gather phase.
                let dst = at(BufId::Recv, sb, i);
                (dst, Some(b.local(LocalOp::Prepare { src: at(input, sb, i), dst }, &[])))
            } else {
                (at(input, sb, i), None)
            };
            let id = b.send(c.next(), src, &[dep]);
            if src.buf == BufId::Recv {
                reader[sb][i] = Some(id);
            }
        }
        for i in 0..nch[rb] {
            let dst = at(BufId::Recv, rb, i);
            let id = if s < n - 1 {
                // Reduce-scatter: nothing read this block of Recv yet; in place, `local` is
                // `dst` itself and is read by this very step.
                let id = b.recv(c.prev(), dst, RecvAction::Combine { local: at(input, rb, i) }, &[]);
                if s == n - 2 && c.post {
                    b.local(LocalOp::Finalize { buf: dst }, &[Some(id)])
                } else {
                    id
                }
            } else {
                // All-gather: overwrite only after our earlier send of this chunk read it.
                b.recv(c.prev(), dst, RecvAction::Copy, &[reader[rb][i]])
            };
            ready[rb][i] = Some(id);
        }
    }
    b.finish()
}

/// Ring ReduceScatter: the reduce-scatter half of [`ring_allreduce`] over blocks of exactly
/// `bytes` each, shifted by one so that rank `r` ends with block `r`. At step `s` (of `n-1`)
/// a rank sends block `r - s - 1` and receives block `r - s - 2`. Partial sums alternate
/// between two block-sized areas (so a chunk can arrive while the previous one is being
/// forwarded): Recv and scratch out of place, two scratch areas in place.
fn ring_reduce_scatter(c: &Ctx) -> Plan {
    if c.bytes == 0 || c.n == 1 {
        return local_only(c, Algorithm::Ring);
    }
    let mut b = Builder::new(Algorithm::Ring);
    let (n, blk) = (c.n, c.bytes);
    let nch = c.nchunks(blk);
    // Area 0 is Recv, 1 and 2 are scratch. Temporary `t` (-1: our prepared input, s: the
    // partial received at step s) lives in `area(t)`; the final one (t = n - 2) in Recv.
    let area = |t: isize| -> usize {
        let last = n as isize - 2;
        if t == last {
            0
        } else if c.in_place {
            1 + t.rem_euclid(2) as usize
        } else {
            (last - t).rem_euclid(2) as usize
        }
    };
    let at = |area: usize, i| match area {
        0 => c.chunk_of(BufId::Recv, 0, blk, i),
        a => c.chunk_of(BufId::Scratch, (a - 1) * blk, blk, i),
    };
    let send_block = |block: usize, i| c.chunk_of(BufId::Send, block * blk, blk, i);
    let mut reader: [Vec<Option<u32>>; 3] = std::array::from_fn(|_| vec![None; nch]);
    let mut ready: Vec<Option<u32>> = vec![None; nch];
    for s in 0..n - 1 {
        let (sb, rb) = (c.back(s + 1), c.back(s + 2));
        for i in 0..nch {
            if s > 0 {
                let a = area(s as isize - 1);
                reader[a][i] = Some(b.send(c.next(), at(a, i), &[ready[i]]));
            } else if c.pre {
                let a = area(-1);
                let dst = at(a, i);
                let p = b.local(LocalOp::Prepare { src: send_block(sb, i), dst }, &[reader[a][i]]);
                reader[a][i] = Some(b.send(c.next(), dst, &[Some(p)]));
            } else {
                // Block sb != r, so in place this is not the memory of Recv.
                b.send(c.next(), send_block(sb, i), &[]);
            }
        }
        for i in 0..nch {
            let a = area(s as isize);
            let dst = at(a, i);
            // In place our own block is Recv itself: name it so (local == dst).
            let local = if c.in_place && rb == c.rank { dst } else { send_block(rb, i) };
            let mut id = b.recv(c.prev(), dst, RecvAction::Combine { local }, &[reader[a][i]]);
            if s == n - 2 && c.post {
                id = b.local(LocalOp::Finalize { buf: dst }, &[Some(id)]);
            }
            ready[i] = Some(id);
        }
    }
    b.finish()
}

/// Ring AllGather: at step `s` (of `n-1`) a rank forwards block `r - s` (its own at step 0)
/// and receives block `r - s - 1`, chunk by chunk.
fn ring_allgather(c: &Ctx) -> Plan {
    let (n, blk) = (c.n, c.bytes);
    let mut b = Builder::new(Algorithm::Ring);
    if blk == 0 {
        return b.finish();
    }
    let own = Slice::new(BufId::Recv, c.rank * blk, blk);
    if !c.in_place {
        b.local(LocalOp::Copy { src: Slice::new(BufId::Send, 0, blk), dst: own }, &[]);
    }
    let nch = c.nchunks(blk);
    let mut ready: Vec<Option<u32>> = vec![None; nch];
    for s in 0..n - 1 {
        let (sb, rb) = (c.back(s), c.back(s + 1));
        for (i, dep) in ready.iter().enumerate() {
            let src = if s > 0 {
                c.chunk_of(BufId::Recv, sb * blk, blk, i)
            } else if c.in_place {
                c.chunk_of(BufId::Recv, c.rank * blk, blk, i)
            } else {
                c.chunk_of(BufId::Send, 0, blk, i)
            };
            b.send(c.next(), src, &[*dep]);
        }
        for (i, dep) in ready.iter_mut().enumerate() {
            let dst = c.chunk_of(BufId::Recv, rb * blk, blk, i);
            *dep = Some(b.recv(c.prev(), dst, RecvAction::Copy, &[]));
        }
    }
    b.finish()
}

/// Broadcast along the ring: root, root + 1, ..., each rank forwarding a chunk as soon as it
/// arrived.
fn chain_broadcast(c: &Ctx) -> Plan {
    let mut b = Builder::new(Algorithm::Ring);
    if c.bytes == 0 {
        return b.finish();
    }
    let pos = (c.rank + c.n - c.root) % c.n;
    let all = |buf| Slice::new(buf, 0, c.bytes);
    let nch = c.nchunks(c.bytes);
    if pos == 0 {
        if !c.in_place {
            b.local(LocalOp::Copy { src: all(BufId::Send), dst: all(BufId::Recv) }, &[]);
        }
        if c.n > 1 {
            for i in 0..nch {
                b.send(c.next(), c.chunk_of(c.input(), 0, c.bytes, i), &[]);
            }
        }
        return b.finish();
    }
    for i in 0..nch {
        let dst = c.chunk_of(BufId::Recv, 0, c.bytes, i);
        let id = b.recv(c.prev(), dst, RecvAction::Copy, &[]);
        if pos < c.n - 1 {
            b.send(c.next(), dst, &[Some(id)]);
        }
    }
    b.finish()
}

/// Reduce along the ring towards the root: root + 1 starts, each rank folds its input into the
/// passing chunk and forwards it; the root folds last and finalizes. Intermediate ranks keep
/// chunks in a small ring of scratch slots (never in Recv, which they may not have).
fn chain_reduce(c: &Ctx) -> Plan {
    if c.bytes == 0 || c.n == 1 {
        return local_only(c, Algorithm::Ring);
    }
    let mut b = Builder::new(Algorithm::Ring);
    let pos = (c.rank + 2 * c.n - c.root - 1) % c.n; // root is at n - 1
    let nch = c.nchunks(c.bytes);
    let send_at = |i| c.chunk_of(BufId::Send, 0, c.bytes, i);
    let slot = |i: usize| {
        let len = c.chunk.min(c.bytes - i * c.chunk);
        Slice::new(BufId::Scratch, (i % CHAIN_SLOTS) * c.chunk, len)
    };
    // Last send that read each slot, which the next write to that slot must wait for.
    let mut reader: Vec<Option<u32>> = vec![None; CHAIN_SLOTS.min(nch)];
    for i in 0..nch {
        let war = reader[i % CHAIN_SLOTS];
        if pos == c.n - 1 {
            let dst = c.chunk_of(BufId::Recv, 0, c.bytes, i);
            let local = if c.in_place { dst } else { send_at(i) };
            let id = b.recv(c.prev(), dst, RecvAction::Combine { local }, &[]);
            if c.post {
                b.local(LocalOp::Finalize { buf: dst }, &[Some(id)]);
            }
        } else if pos == 0 && !c.pre {
            b.send(c.next(), send_at(i), &[]);
        } else {
            let dst = slot(i);
            let id = if pos == 0 {
                b.local(LocalOp::Prepare { src: send_at(i), dst }, &[war])
            } else {
                b.recv(c.prev(), dst, RecvAction::Combine { local: send_at(i) }, &[war])
            };
            reader[i % CHAIN_SLOTS] = Some(b.send(c.next(), dst, &[Some(id)]));
        }
    }
    b.finish()
}

/// Binomial tree over ranks relative to `root`: `(parent, children)` of relative rank `v`,
/// children largest subtree first (MPICH's broadcast order).
fn binomial(v: usize, n: usize) -> (Option<usize>, Vec<usize>) {
    let mut mask = 1;
    let mut parent = None;
    while mask < n {
        if v & mask != 0 {
            parent = Some(v - mask);
            break;
        }
        mask <<= 1;
    }
    let mut children = Vec::new();
    mask >>= 1;
    while mask > 0 {
        if v + mask < n {
            children.push(v + mask);
        }
        mask >>= 1;
    }
    (parent, children)
}

/// Binomial-tree Broadcast: each rank receives every chunk from its parent and forwards it to
/// its children.
fn binomial_broadcast(c: &Ctx) -> Plan {
    let mut b = Builder::new(Algorithm::Tree);
    if c.bytes == 0 {
        return b.finish();
    }
    let v = (c.rank + c.n - c.root) % c.n;
    let abs = |rel: usize| (rel + c.root) % c.n;
    let (parent, children) = binomial(v, c.n);
    let nch = c.nchunks(c.bytes);
    let mut have: Vec<Option<u32>> = vec![None; nch];
    let src_buf = match parent {
        None => {
            if !c.in_place {
                let (src, dst) = (Slice::new(BufId::Send, 0, c.bytes), Slice::new(BufId::Recv, 0, c.bytes));
                b.local(LocalOp::Copy { src, dst }, &[]);
            }
            c.input()
        }
        Some(p) => {
            for (i, h) in have.iter_mut().enumerate() {
                let dst = c.chunk_of(BufId::Recv, 0, c.bytes, i);
                *h = Some(b.recv(abs(p), dst, RecvAction::Copy, &[]));
            }
            BufId::Recv
        }
    };
    for &child in &children {
        for (i, h) in have.iter().enumerate() {
            b.send(abs(child), c.chunk_of(src_buf, 0, c.bytes, i), &[*h]);
        }
    }
    b.finish()
}

/// Binomial-tree Reduce: each rank folds its children's partial sums (smallest subtree first,
/// in a fixed order) into its own input and passes the result to its parent.
fn binomial_reduce(c: &Ctx) -> Plan {
    if c.bytes == 0 || c.n == 1 {
        return local_only(c, Algorithm::Tree);
    }
    let mut b = Builder::new(Algorithm::Tree);
    let v = (c.rank + c.n - c.root) % c.n;
    let abs = |rel: usize| (rel + c.root) % c.n;
    let (parent, mut children) = binomial(v, c.n);
    children.reverse();
    let is_root = parent.is_none();
    let input = if is_root { c.input() } else { BufId::Send };
    let acc_buf = if is_root { BufId::Recv } else { BufId::Scratch };
    for i in 0..c.nchunks(c.bytes) {
        let src = c.chunk_of(input, 0, c.bytes, i);
        let acc = c.chunk_of(acc_buf, 0, c.bytes, i);
        let mut last = None;
        let mut out = src;
        if children.is_empty() && c.pre {
            last = Some(b.local(LocalOp::Prepare { src, dst: acc }, &[]));
            out = acc;
        }
        for (k, &child) in children.iter().enumerate() {
            let action = if k == 0 { RecvAction::Combine { local: src } } else { RecvAction::Accumulate };
            last = Some(b.recv(abs(child), acc, action, &[last]));
            out = acc;
        }
        match parent {
            Some(p) => {
                b.send(abs(p), out, &[last]);
            }
            None if c.post => {
                b.local(LocalOp::Finalize { buf: acc }, &[last]);
            }
            None => {}
        }
    }
    b.finish()
}

/// Recursive-doubling AllReduce. With `p` the largest power of two <= n and `e = n - p`, the
/// even ranks below `2e` first hand their input to the next rank and get the result back at
/// the end; the other `p` ranks exchange full (chunked) partial results with partners at
/// distance 1, 2, 4, ... in a renumbering without the extras. Partners compute `a op b` and
/// `b op a`, which are bit-identical, so every rank ends with the same bits.
fn rd_allreduce(c: &Ctx) -> Plan {
    if c.bytes == 0 || c.n == 1 {
        return local_only(c, Algorithm::Tree);
    }
    let mut b = Builder::new(Algorithm::Tree);
    let (n, r) = (c.n, c.rank);
    let p = 1usize << n.ilog2();
    let extra = n - p;
    let input = c.input();
    let nch = c.nchunks(c.bytes);
    let at = |buf, i| c.chunk_of(buf, 0, c.bytes, i);
    if r < 2 * extra && r % 2 == 0 {
        // Extra rank: contribute, then wait for the result. The final receive overwrites Recv,
        // which our send may be reading (in place, or staged there by Prepare).
        let mut sent = vec![None; nch];
        for (i, s) in sent.iter_mut().enumerate() {
            let (src, dep) = if c.pre {
                let dst = at(BufId::Recv, i);
                (dst, Some(b.local(LocalOp::Prepare { src: at(input, i), dst }, &[])))
            } else {
                (at(input, i), None)
            };
            let id = b.send(r + 1, src, &[dep]);
            *s = (src.buf == BufId::Recv).then_some(id);
        }
        for (i, s) in sent.iter().enumerate() {
            b.recv(r + 1, at(BufId::Recv, i), RecvAction::Copy, &[*s]);
        }
        return b.finish();
    }
    let merged = r < 2 * extra; // odd rank that absorbs rank r - 1
    let id = if merged { r / 2 } else { r - extra };
    let rank_of = |id: usize| if id < extra { 2 * id + 1 } else { id + extra };
    // Per chunk: last step writing our partial in Recv, last send reading the staging copy.
    let mut cur: Vec<Option<u32>> = vec![None; nch];
    let mut staged: Vec<Option<u32>> = vec![None; nch];
    if merged {
        for (i, cur) in cur.iter_mut().enumerate() {
            let dst = at(BufId::Recv, i);
            let local = at(input, i);
            *cur = Some(b.recv(r - 1, dst, RecvAction::Combine { local }, &[]));
        }
    }
    let mut mask = 1;
    while mask < p {
        let peer = rank_of(id ^ mask);
        let first = mask == 1 && !merged;
        // Stage what we send, so the incoming data can be folded into Recv meanwhile.
        let mut copies = vec![None; nch];
        for (i, cp) in copies.iter_mut().enumerate() {
            let (src, dst) = (at(BufId::Recv, i), at(BufId::Scratch, i));
            let op = if !first {
                Some(LocalOp::Copy { src, dst })
            } else if c.pre {
                Some(LocalOp::Prepare { src: at(input, i), dst })
            } else if c.in_place {
                Some(LocalOp::Copy { src, dst })
            } else {
                None // send straight from Send
            };
            *cp = op.map(|op| b.local(op, &[cur[i], staged[i]]));
        }
        for (i, cp) in copies.iter().enumerate() {
            let src = if cp.is_some() { at(BufId::Scratch, i) } else { at(BufId::Send, i) };
            let id = b.send(peer, src, &[*cp]);
            staged[i] = cp.map(|_| id);
        }
        for (i, cp) in copies.iter().enumerate() {
            let dst = at(BufId::Recv, i);
            let action = if first { RecvAction::Combine { local: at(input, i) } } else { RecvAction::Accumulate };
            // Only after the staging step read Recv (it follows the previous write to Recv).
            cur[i] = Some(b.recv(peer, dst, action, &[*cp, cur[i]]));
        }
        mask <<= 1;
    }
    for (i, cur) in cur.iter_mut().enumerate() {
        if c.post {
            *cur = Some(b.local(LocalOp::Finalize { buf: at(BufId::Recv, i) }, &[*cur]));
        }
    }
    if merged {
        for (i, cur) in cur.iter().enumerate() {
            b.send(r - 1, at(BufId::Recv, i), &[*cur]);
        }
    }
    b.finish()
}

/// AlltoAll: block `j` of Send goes to rank `j`'s Recv block `rank`, all posted at once, peers
/// in the order rank + 1, rank + 2, ... (and receives from rank - 1, rank - 2, ...). In place,
/// the outgoing blocks are first copied to scratch so incoming ones can land at once.
fn direct_alltoall(c: &Ctx) -> Plan {
    let (n, blk) = (c.n, c.bytes);
    let mut b = Builder::new(Algorithm::Direct);
    if blk == 0 {
        return b.finish();
    }
    let block = |buf, j: usize| Slice::new(buf, j * blk, blk);
    if !c.in_place {
        b.local(LocalOp::Copy { src: block(BufId::Send, c.rank), dst: block(BufId::Recv, c.rank) }, &[]);
    }
    let mut staged = vec![None; n];
    for k in 1..n {
        let j = (c.rank + k) % n;
        if c.in_place {
            let (src, dst) = (block(BufId::Recv, j), block(BufId::Scratch, j));
            staged[j] = Some(b.local(LocalOp::Copy { src, dst }, &[]));
        }
    }
    for k in 1..n {
        let j = (c.rank + k) % n;
        let src = if c.in_place { block(BufId::Scratch, j) } else { block(BufId::Send, j) };
        b.send(j, src, &[staged[j]]);
    }
    for k in 1..n {
        let j = (c.rank + n - k) % n;
        b.recv(j, block(BufId::Recv, j), RecvAction::Copy, &[staged[j]]);
    }
    b.finish()
}

/// Gather: every rank sends its block to the root, which receives them all at once.
fn direct_gather(c: &Ctx) -> Plan {
    let (n, blk) = (c.n, c.bytes);
    let mut b = Builder::new(Algorithm::Direct);
    if blk == 0 {
        return b.finish();
    }
    let mine = Slice::new(BufId::Send, 0, blk);
    if c.rank != c.root {
        b.send(c.root, mine, &[]);
        return b.finish();
    }
    if !c.in_place {
        b.local(LocalOp::Copy { src: mine, dst: Slice::new(BufId::Recv, c.rank * blk, blk) }, &[]);
    }
    for k in 1..n {
        let j = (c.rank + k) % n;
        b.recv(j, Slice::new(BufId::Recv, j * blk, blk), RecvAction::Copy, &[]);
    }
    b.finish()
}

/// Scatter: the root sends block `j` of Send to rank `j`, all at once.
fn direct_scatter(c: &Ctx) -> Plan {
    let (n, blk) = (c.n, c.bytes);
    let mut b = Builder::new(Algorithm::Direct);
    if blk == 0 {
        return b.finish();
    }
    let mine = Slice::new(BufId::Recv, 0, blk);
    if c.rank != c.root {
        b.recv(c.root, mine, RecvAction::Copy, &[]);
        return b.finish();
    }
    if !c.in_place {
        b.local(LocalOp::Copy { src: Slice::new(BufId::Send, c.rank * blk, blk), dst: mine }, &[]);
    }
    for k in 1..n {
        let j = (c.rank + k) % n;
        b.send(j, Slice::new(BufId::Send, j * blk, blk), &[]);
    }
    b.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coll::plan::Step;

    fn args(kind: CollKind, count: usize) -> CollArgs {
        CollArgs::new(kind, count * 8, 8)
    }

    #[test]
    fn parses_nccl_algo_syntax() {
        let all = AlgoSelection::parse("").unwrap();
        assert_eq!(all, AlgoSelection { source: String::new(), ..AlgoSelection::all() });
        let ring = AlgoSelection::parse("Ring").unwrap();
        assert!(ring.allows(CollKind::AllReduce, Algorithm::Ring));
        assert!(!ring.allows(CollKind::AllReduce, Algorithm::Tree));
        let not_tree = AlgoSelection::parse("^TREE").unwrap();
        assert!(not_tree.allows(CollKind::Broadcast, Algorithm::Ring));
        assert!(!not_tree.allows(CollKind::Broadcast, Algorithm::Tree));
        let per = AlgoSelection::parse("ring,collnetdirect;allreduce:tree,nvls;broadcast:^ring").unwrap();
        assert!(per.allows(CollKind::Reduce, Algorithm::Ring));
        assert!(!per.allows(CollKind::Reduce, Algorithm::Tree));
        assert!(per.allows(CollKind::AllReduce, Algorithm::Tree));
        assert!(!per.allows(CollKind::AllReduce, Algorithm::Ring));
        assert!(per.allows(CollKind::Broadcast, Algorithm::Tree));
        assert!(!per.allows(CollKind::Broadcast, Algorithm::Ring));
        // Untuned operations ignore NCCL_ALGO.
        assert!(per.allows(CollKind::AlltoAll, Algorithm::Direct));
        // A prefix-only selection leaves the other functions alone.
        let only = AlgoSelection::parse("AllReduce:tree").unwrap();
        assert!(only.allows(CollKind::AllGather, Algorithm::Ring));
        assert!(AlgoSelection::parse(" ring , tree ;reduce: pat").is_ok());
        assert!(AlgoSelection::parse("^").unwrap().allows(CollKind::AllReduce, Algorithm::Tree));
    }

    #[test]
    fn rejects_bad_nccl_algo() {
        for bad in ["foo", "ring,foo", "ring;tree", "bogus:ring", "ring,^tree", "allreduce:", "ring;allreduce:tree:x"] {
            let e = AlgoSelection::parse(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{bad}: {e}");
            assert!(e.to_string().contains("NCCL_ALGO"), "{e}");
        }
    }

    #[test]
    fn chooses_by_size_and_selection() {
        let all = AlgoSelection::all();
        let t = DEFAULT_TREE_THRESHOLD;
        let pick = |k, b, sel: &AlgoSelection| choose(k, b, 8, t, sel);
        assert_eq!(pick(CollKind::AllReduce, t, &all).algorithm, Algorithm::Tree);
        assert_eq!(pick(CollKind::AllReduce, t + 1, &all).algorithm, Algorithm::Ring);
        assert_eq!(pick(CollKind::Broadcast, 8, &all).algorithm, Algorithm::Tree);
        assert_eq!(pick(CollKind::Reduce, 1 << 30, &all).algorithm, Algorithm::Ring);
        assert_eq!(pick(CollKind::AllGather, 8, &all).algorithm, Algorithm::Ring);
        assert_eq!(pick(CollKind::AlltoAll, 8, &all).algorithm, Algorithm::Direct);
        assert_eq!(pick(CollKind::Send, 8, &all).algorithm, Algorithm::Direct);
        assert_eq!(choose(CollKind::AllReduce, 8, 1, t, &all).algorithm, Algorithm::Ring);
        let tree = AlgoSelection::parse("tree").unwrap();
        let c = pick(CollKind::AllReduce, 1 << 30, &tree);
        assert_eq!(c, Choice { algorithm: Algorithm::Tree, fallback_reason: None });
        let c = pick(CollKind::AllGather, 8, &tree);
        assert_eq!(c.algorithm, Algorithm::Ring);
        let reason = c.fallback_reason.unwrap();
        assert!(reason.contains("AllGather") && reason.contains("\"tree\""), "{reason}");
        let nvls = AlgoSelection::parse("nvls").unwrap();
        assert!(pick(CollKind::AllReduce, 8, &nvls).fallback_reason.is_some());
        let per = AlgoSelection::parse("ring;allreduce:tree").unwrap();
        assert_eq!(pick(CollKind::AllReduce, 1 << 30, &per).algorithm, Algorithm::Tree);
        assert_eq!(pick(CollKind::Broadcast, 8, &per).algorithm, Algorithm::Ring);
        // ReduceScatter compares the total size, not one block.
        let a = args(CollKind::ReduceScatter, 1024);
        assert_eq!(a.total_bytes(16), 1024 * 8 * 16);
    }

    #[test]
    fn plan_uses_choice_and_validates() {
        let tuning = Tuning::default();
        let small = args(CollKind::AllReduce, 16);
        assert_eq!(plan(&small, 0, 4, &tuning).unwrap().algorithm, "tree");
        let big = args(CollKind::AllReduce, 1 << 20);
        assert_eq!(plan(&big, 0, 4, &tuning).unwrap().algorithm, "ring");
        let forced = Tuning { selection: AlgoSelection::parse("ring").unwrap(), ..Tuning::default() };
        assert_eq!(plan(&small, 0, 4, &forced).unwrap().algorithm, "ring");
        let inval = |a: CollArgs, rank, n| matches!(plan(&a, rank, n, &tuning), Err(Error::InvalidArgument(_)));
        assert!(inval(small, 4, 4));
        assert!(inval(small, 0, 0));
        assert!(inval(CollArgs { root: 4, ..args(CollKind::Broadcast, 4) }, 0, 4));
        assert!(inval(CollArgs { root: 9, ..args(CollKind::Send, 4) }, 0, 4));
        assert!(inval(CollArgs { bytes: 12, ..small }, 0, 4));
        assert!(inval(CollArgs { elem_size: 0, ..small }, 0, 4));
        assert!(inval(CollArgs { bytes: usize::MAX / 8 * 8, ..args(CollKind::AllGather, 1) }, 0, 4));
        let e = plan_with(&args(CollKind::AllGather, 4), 0, 4, Algorithm::Tree, 64).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)));
    }

    fn all_plans(a: &CollArgs, n: usize, chunk: usize) -> Vec<(Algorithm, Vec<Plan>)> {
        a.kind
            .algorithms()
            .iter()
            .map(|&algo| (algo, (0..n).map(|r| plan_with(a, r, n, algo, chunk).unwrap()).collect()))
            .collect()
    }

    #[test]
    fn count_zero_is_empty_and_one_rank_is_local() {
        for kind in CollKind::ALL {
            for in_place in [false, true] {
                let a = CollArgs { in_place, has_pre: true, has_post: true, ..args(kind, 0) };
                for n in [1, 2, 5] {
                    for (_, plans) in all_plans(&a, n, 64) {
                        assert!(plans.iter().all(|p| p.steps.is_empty() && p.scratch_bytes == 0));
                    }
                }
                let a = CollArgs { bytes: 40, ..a };
                for (algo, plans) in all_plans(&a, 1, 16) {
                    let p = &plans[0];
                    let remote = |s: &Step| match *s {
                        Step::Send { peer, .. } | Step::Recv { peer, .. } => peer != 0,
                        Step::Local(_) => false,
                    };
                    assert!(!p.steps.iter().any(|s| remote(&s.step)), "{kind} {algo}");
                    if !matches!(kind, CollKind::Send | CollKind::Recv) {
                        assert!(p.steps.len() <= 2, "{kind} {algo}: {:?}", p.steps);
                    }
                }
            }
        }
    }

    #[test]
    fn pre_and_post_steps_only_when_needed() {
        for kind in CollKind::ALL {
            for (has_pre, has_post) in [(false, false), (true, false), (false, true)] {
                for in_place in [false, true] {
                    let a = CollArgs { in_place, has_pre, has_post, root: 1, ..args(kind, 37) };
                    for (algo, plans) in all_plans(&a, 5, 24) {
                        for p in &plans {
                            for s in &p.steps {
                                match s.step {
                                    Step::Local(LocalOp::Prepare { .. }) => {
                                        assert!(has_pre && kind.is_reduction(), "{kind} {algo}")
                                    }
                                    Step::Local(LocalOp::Finalize { .. }) => {
                                        assert!(has_post && kind.is_reduction(), "{kind} {algo}")
                                    }
                                    _ => {}
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn messages_and_scratch_stay_bounded() {
        let chunk = 64;
        for kind in CollKind::ALL {
            for in_place in [false, true] {
                let a = CollArgs { in_place, has_pre: true, has_post: true, root: 2, ..args(kind, 1000) };
                for (algo, plans) in all_plans(&a, 6, chunk) {
                    for (r, p) in plans.iter().enumerate() {
                        let limit = if algo == Algorithm::Direct { a.bytes } else { chunk };
                        for s in &p.steps {
                            if let Step::Send { src: x, .. } | Step::Recv { dst: x, .. } = s.step {
                                assert!(x.len <= limit && x.len > 0, "{kind} {algo}: {x:?}");
                            }
                        }
                        let scratch = match (kind, algo) {
                            (CollKind::AllReduce, Algorithm::Ring)
                            | (CollKind::Broadcast, _)
                            | (CollKind::AllGather, _)
                            | (CollKind::Gather | CollKind::Scatter, _) => 0,
                            (CollKind::Reduce, Algorithm::Ring) => CHAIN_SLOTS * chunk,
                            (CollKind::ReduceScatter, _) if in_place => 2 * a.bytes,
                            (CollKind::ReduceScatter, _) => a.bytes,
                            (CollKind::AlltoAll, _) if in_place => 6 * a.bytes,
                            _ => a.bytes,
                        };
                        assert!(p.scratch_bytes <= scratch, "{kind} {algo} rank {r}: {}", p.scratch_bytes);
                    }
                }
            }
        }
    }

    #[test]
    fn huge_messages_get_bounded_chunk_counts() {
        let a = CollArgs::new(CollKind::Broadcast, 1 << 30, 4);
        let p = plan_with(&a, 1, 2, Algorithm::Ring, 4).unwrap();
        assert!(p.steps.len() <= MAX_CHUNKS, "{}", p.steps.len());
        assert!(p.steps.iter().all(|s| match s.step {
            Step::Recv { dst, .. } => dst.len % 4 == 0,
            _ => true,
        }));
    }

    /// Transitive deps of step `j`.
    fn ancestors(p: &Plan, j: usize) -> Vec<bool> {
        let mut anc = vec![false; p.steps.len()];
        let mut stack: Vec<u32> = p.steps[j].deps.clone();
        while let Some(d) = stack.pop() {
            if !std::mem::replace(&mut anc[d as usize], true) {
                stack.extend(&p.steps[d as usize].deps);
            }
        }
        anc
    }

    #[test]
    fn ring_chunks_overlap_across_steps() {
        // 4 ranks, 4 chunks per block: rank 0 receives block 3 at step 0 and forwards it at
        // step 1. Forwarding chunk 0 must not wait for chunk 1 of the same block to arrive.
        let (n, chunk) = (4, 16);
        let a = CollArgs { has_pre: true, ..args(CollKind::AllReduce, 32) };
        let p = plan_with(&a, 0, n, Algorithm::Ring, chunk).unwrap();
        let block3 = 3 * 8 * 8;
        let find = |want: &dyn Fn(&Step) -> bool| p.steps.iter().position(|s| want(&s.step)).unwrap();
        let recv_c1 = find(&|s| matches!(s, Step::Recv { dst, .. } if dst.offset == block3 + chunk));
        let recv_c0 = find(&|s| matches!(s, Step::Recv { dst, .. } if dst.offset == block3));
        let send_c0 = find(&|s| matches!(s, Step::Send { src, .. } if *src == Slice::new(BufId::Recv, block3, 16)));
        let anc = ancestors(&p, send_c0);
        assert!(anc[recv_c0] && !anc[recv_c1]);
        // The same holds for the all-gather half and for ReduceScatter and AllGather.
        for kind in [CollKind::ReduceScatter, CollKind::AllGather] {
            let a = args(kind, 8);
            let p = plan_with(&a, 0, n, Algorithm::Ring, chunk).unwrap();
            let recvs: Vec<usize> =
                (0..p.steps.len()).filter(|&i| matches!(p.steps[i].step, Step::Recv { .. })).collect();
            let sends: Vec<usize> =
                (0..p.steps.len()).filter(|&i| matches!(p.steps[i].step, Step::Send { .. })).collect();
            // Second-step send of chunk 0 depends on the first-step receive of chunk 0 only.
            let anc = ancestors(&p, sends[4]);
            assert!(anc[recvs[0]] && !anc[recvs[1]], "{kind}");
        }
    }

    #[test]
    fn blocks_cover_exactly() {
        for (count, n) in [(0, 3), (1, 4), (7, 3), (9, 3), (100, 7)] {
            let b = blocks(count * 4, 4, n);
            assert_eq!(b.len(), n);
            assert_eq!(b.iter().map(|x| x.1).sum::<usize>(), count * 4);
            for w in b.windows(2) {
                assert_eq!(w[0].0 + w[0].1, w[1].0);
                assert!(w[0].1 >= w[1].1 && w[0].1 - w[1].1 <= 4);
            }
        }
    }
}
