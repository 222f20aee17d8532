//! A staged operation's buffers, arriving and leaving piece by piece.
//!
//! The staged path (`coll::stream`) copies a device operation's input to pinned host memory,
//! runs the host engine on it, and copies the output back, all in the caller's stream order.
//! Waiting for the whole input before the engine starts, and for the engine to finish before
//! the output goes back, adds both copies to the operation's time. Instead the stream marks
//! each input piece landed as its copy completes, the executor (`coll::exec`) starts a step
//! once the input it touches has landed, and releases an output piece as soon as the last
//! plan step that writes it has completed; the stream copies each released piece back while
//! the engine works on the rest.
//!
//! The stream copies the input pieces in the order the plan reads them ([`input_order`]) and
//! waits for the output pieces in the order the plan finishes them ([`output_order`]): in a
//! ring each rank first sends its own block, which for all but rank 0 does not start at
//! offset 0, and the block it reduces last is not the one at the end.
//!
//! Flags are 32-bit words in pinned host memory that hold the operation's sequence number
//! once set (older numbers before): the stream writes the landed flags and waits for the
//! released ones with stream memory operations, one stream per operation. A last word marks
//! the operation abandoned when the caller could not queue all of its input.

use std::sync::atomic::{AtomicU32, Ordering};

use super::plan::{BufId, LocalOp, Plan, RecvAction, Slice, Step};

/// Pieces of one buffer at most (and flags of each kind).
pub const MAX_PIECES: usize = 16;

/// Words of the flag block: `MAX_PIECES` landed flags, `MAX_PIECES` released flags, then the
/// abandoned mark.
pub const FLAG_WORDS: usize = 2 * MAX_PIECES + 1;

/// Bytes of the flag block.
pub const FLAG_BYTES: usize = 4 * FLAG_WORDS;

/// A buffer of `len` bytes cut into pieces of `piece` bytes (the last may be shorter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pieces {
    pub piece: usize,
    pub len: usize,
}

impl Pieces {
    /// Pieces of at least `min_piece` bytes (rounded up to whole elements), at most
    /// [`MAX_PIECES`]; none for an empty buffer.
    pub fn new(len: usize, min_piece: usize, elem: usize) -> Pieces {
        let elem = elem.max(1);
        let piece = min_piece.max(len.div_ceil(MAX_PIECES)).max(1).div_ceil(elem) * elem;
        Pieces { piece, len }
    }

    pub fn count(&self) -> usize {
        self.len.div_ceil(self.piece)
    }

    /// Byte range `[start, end)` of piece `k`.
    pub fn range(&self, k: usize) -> (usize, usize) {
        (k * self.piece, ((k + 1) * self.piece).min(self.len))
    }

    /// Every piece, as a mask (bit k: piece k).
    fn all(&self) -> u32 {
        ((1u64 << self.count()) - 1) as u32
    }

    /// The pieces `s` overlaps (none if it is empty).
    fn touched_by(&self, s: &Slice) -> std::ops::Range<usize> {
        if s.len == 0 || self.len == 0 {
            return 0..0;
        }
        s.offset / self.piece..((s.end() - 1) / self.piece + 1).min(self.count())
    }

    fn mask_of(&self, s: &Slice) -> u32 {
        self.touched_by(s).fold(0, |m, k| m | 1 << k)
    }
}

/// The order to copy the input pieces in: by the first plan step that reads each (pieces no
/// step reads last, in buffer order), so that the engine's first steps find theirs landed.
pub fn input_order(plan: &Plan, input: Pieces) -> Vec<usize> {
    let mut first = vec![usize::MAX; input.count()];
    for (i, planned) in plan.steps.iter().enumerate().rev() {
        for s in send_slices(&planned.step).iter().flatten() {
            input.touched_by(s).for_each(|k| first[k] = i);
        }
    }
    let mut order: Vec<usize> = (0..input.count()).collect();
    order.sort_by_key(|&k| first[k]);
    order
}

/// The order to wait for the output pieces in and copy them back: by the last plan step that
/// writes each (pieces no step writes, released at the start, first), which is about the
/// order the engine releases them.
pub fn output_order(plan: &Plan, output: Pieces) -> Vec<usize> {
    let mut last = vec![None; output.count()];
    for (i, planned) in plan.steps.iter().enumerate() {
        if let Some(s) = written(&planned.step) {
            output.touched_by(&s).for_each(|k| last[k] = Some(i));
        }
    }
    let mut order: Vec<usize> = (0..output.count()).collect();
    order.sort_by_key(|&k| last[k]);
    order
}

/// `a` has reached `b` in sequence-number order (wrapping).
pub fn reached(a: u32, b: u32) -> bool {
    a.wrapping_sub(b) < u32::MAX / 2
}

/// One staged operation's landed and released flags, as the executor sees them.
#[derive(Clone, Copy, Debug)]
pub struct StageProgress {
    flags: *const AtomicU32,
    seq: u32,
    /// The send buffer's pieces: each lands on its own.
    pub input: Pieces,
    /// The receive buffer's pieces: each is released on its own.
    pub output: Pieces,
}

// SAFETY: the flag words are atomics in pinned memory that the staged job keeps alive until
// the operation is done, whichever thread runs it.
unsafe impl Send for StageProgress {}

impl StageProgress {
    /// # Safety
    /// `flags` points to [`FLAG_BYTES`] bytes of 4-aligned memory that stay valid while the
    /// value (or a copy) is in use, and are only accessed as 32-bit atomic words.
    pub unsafe fn new(flags: *mut u8, seq: u32, input: Pieces, output: Pieces) -> StageProgress {
        debug_assert!(input.count() <= MAX_PIECES && output.count() <= MAX_PIECES);
        debug_assert_eq!(flags as usize % 4, 0);
        StageProgress { flags: flags as *const AtomicU32, seq, input, output }
    }

    fn word(&self, index: usize) -> &AtomicU32 {
        debug_assert!(index < FLAG_WORDS);
        // SAFETY: `new`'s contract: FLAG_WORDS aligned words, alive while self is used.
        unsafe { &*self.flags.add(index) }
    }

    /// Marks every flag of this operation unset (before the stream is given any of them).
    pub fn reset(&self) {
        for i in 0..FLAG_WORDS {
            self.word(i).store(self.seq.wrapping_sub(1), Ordering::Relaxed);
        }
    }

    /// Byte offset of landed-flag `k` and released-flag `k` in the flag block.
    pub fn landed_offset(k: usize) -> usize {
        4 * k
    }
    pub fn released_offset(k: usize) -> usize {
        4 * (MAX_PIECES + k)
    }

    pub fn seq(&self) -> u32 {
        self.seq
    }

    /// The input pieces landed, as a mask (bit k: piece k).
    pub fn landed_mask(&self) -> u32 {
        (0..self.input.count())
            .filter(|&k| reached(self.word(k).load(Ordering::Acquire), self.seq))
            .fold(0, |m, k| m | 1 << k)
    }

    pub fn all_landed(&self) -> bool {
        self.landed_mask() == self.input.all()
    }

    /// The input pieces a step reads or writes, which must have landed before it starts.
    pub fn input_needed(&self, step: &Step) -> u32 {
        send_slices(step).iter().flatten().fold(0, |m, s| m | self.input.mask_of(s))
    }

    /// Marks the operation abandoned: some of its input will never land (the caller could not
    /// queue its copy), so the engine must give up rather than wait for it.
    pub fn abandon(&self) {
        self.word(2 * MAX_PIECES).store(self.seq, Ordering::Release);
    }

    pub fn abandoned(&self) -> bool {
        reached(self.word(2 * MAX_PIECES).load(Ordering::Acquire), self.seq)
    }

    fn release(&self, k: usize) {
        self.word(MAX_PIECES + k).store(self.seq, Ordering::Release);
    }

    /// Releases every output piece (the operation is over, or failed).
    pub fn release_all(&self) {
        (0..self.output.count()).for_each(|k| self.release(k));
    }

    /// Per output piece, how many of the plan's steps write it; pieces no step writes are
    /// released now.
    pub fn count_writers(&self, plan: &Plan, writers: &mut Vec<u32>) {
        writers.clear();
        writers.resize(self.output.count(), 0);
        for planned in &plan.steps {
            if let Some(s) = written(&planned.step) {
                self.for_pieces_of(&s, |k| writers[k] += 1);
            }
        }
        for (k, &n) in writers.iter().enumerate() {
            if n == 0 {
                self.release(k);
            }
        }
    }

    /// A step has completed: the output pieces it wrote that no other step still writes
    /// are released. Returns the last piece released, if any.
    pub fn step_done(&self, step: &Step, writers: &mut [u32]) -> Option<usize> {
        let mut released = None;
        if let Some(s) = written(step) {
            self.for_pieces_of(&s, |k| {
                writers[k] -= 1;
                if writers[k] == 0 {
                    self.release(k);
                    released = Some(k);
                }
            });
        }
        released
    }

    fn for_pieces_of(&self, s: &Slice, f: impl FnMut(usize)) {
        if s.buf == BufId::Recv {
            self.output.touched_by(s).for_each(f);
        }
    }
}

/// The slice of the receive buffer a step writes, if any.
fn written(step: &Step) -> Option<Slice> {
    let s = match *step {
        Step::Send { .. } => return None,
        Step::Recv { dst, .. } => dst,
        Step::Local(LocalOp::Copy { dst, .. } | LocalOp::Prepare { dst, .. }) => dst,
        Step::Local(LocalOp::Finalize { buf }) => buf,
    };
    (s.buf == BufId::Recv).then_some(s)
}

/// The send-buffer slices a step reads or writes.
fn send_slices(step: &Step) -> [Option<Slice>; 2] {
    let slices: [Option<Slice>; 2] = match *step {
        Step::Send { src, .. } => [Some(src), None],
        Step::Recv { dst, action: RecvAction::Combine { local }, .. } => [Some(dst), Some(local)],
        Step::Recv { dst, .. } => [Some(dst), None],
        Step::Local(LocalOp::Copy { src, dst } | LocalOp::Prepare { src, dst }) => [Some(src), Some(dst)],
        Step::Local(LocalOp::Finalize { buf }) => [Some(buf), None],
    };
    slices.map(|s| s.filter(|s| s.buf == BufId::Send && s.len > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Block(Vec<AtomicU32>);

    impl Block {
        fn new() -> Block {
            Block((0..FLAG_WORDS).map(|_| AtomicU32::new(0)).collect())
        }
        fn progress(&self, seq: u32, input: Pieces, output: Pieces) -> StageProgress {
            // SAFETY: the block holds FLAG_WORDS atomics and outlives the value in the test.
            let p = unsafe { StageProgress::new(self.0.as_ptr() as *mut u8, seq, input, output) };
            p.reset();
            p
        }
        fn land(&self, k: usize, seq: u32) {
            self.0[k].store(seq, Ordering::Release);
        }
        fn released(&self, k: usize, seq: u32) -> bool {
            reached(self.0[MAX_PIECES + k].load(Ordering::Acquire), seq)
        }
    }

    #[test]
    fn pieces_cover_the_buffer_in_whole_elements() {
        let p = Pieces::new(10 << 20, 1 << 20, 4);
        assert_eq!((p.piece, p.count()), (1 << 20, 10));
        assert_eq!(p.range(9), (9 << 20, 10 << 20));
        // Never more than MAX_PIECES, and pieces are whole elements.
        let p = Pieces::new(100 << 20, 1 << 20, 12);
        assert!(p.count() <= MAX_PIECES && p.piece % 12 == 0);
        assert_eq!(p.range(p.count() - 1).1, 100 << 20);
        assert_eq!(Pieces::new(0, 1 << 20, 4).count(), 0);
    }

    #[test]
    fn input_lands_piece_by_piece_and_only_for_this_operation() {
        let b = Block::new();
        let input = Pieces { piece: 100, len: 250 };
        let p = b.progress(7, input, Pieces { piece: 100, len: 0 });
        assert_eq!(p.landed_mask(), 0);
        b.land(1, 7); // before piece 0: the pieces land in the plan's order, not the buffer's
        assert_eq!(p.landed_mask(), 0b010);
        b.land(0, 6); // an older operation's flag is not this one's
        assert_eq!(p.landed_mask(), 0b010);
        b.land(0, 7);
        assert!(!p.all_landed());
        b.land(2, 7);
        assert!(p.all_landed());
        assert!(!p.abandoned());
        p.abandon();
        assert!(p.abandoned());
        // The next operation on the same flags starts with nothing landed and not abandoned.
        let next = b.progress(8, input, Pieces { piece: 100, len: 0 });
        assert_eq!((next.landed_mask(), next.abandoned()), (0, false));
    }

    #[test]
    fn output_piece_is_released_after_its_last_writer() {
        let b = Block::new();
        let output = Pieces { piece: 100, len: 300 };
        let p = b.progress(3, Pieces { piece: 100, len: 0 }, output);
        let mut plan = Plan::new("test");
        let recv = |o, l| Slice::new(BufId::Recv, o, l);
        // Piece 0: one receive; piece 1: a receive then a finalize; piece 2: nothing.
        let a = plan.recv(1, recv(0, 150), RecvAction::Copy, &[]);
        let f = plan.local(LocalOp::Finalize { buf: recv(100, 100) }, &[a]);
        let s = plan.send(1, Slice::new(BufId::Send, 0, 100), &[]);
        let mut writers = Vec::new();
        p.count_writers(&plan, &mut writers);
        assert_eq!(writers, vec![1, 2, 0]);
        assert!(b.released(2, 3) && !b.released(0, 3) && !b.released(1, 3));
        p.step_done(&plan.steps[s as usize].step, &mut writers);
        assert!(!b.released(0, 3));
        p.step_done(&plan.steps[a as usize].step, &mut writers);
        assert!(b.released(0, 3) && !b.released(1, 3));
        p.step_done(&plan.steps[f as usize].step, &mut writers);
        assert!(b.released(1, 3));
    }

    #[test]
    fn steps_need_the_input_pieces_they_touch() {
        let b = Block::new();
        let p = b.progress(1, Pieces { piece: 100, len: 250 }, Pieces { piece: 100, len: 250 });
        let send = |o, l| Slice::new(BufId::Send, o, l);
        let recv = |o, l| Slice::new(BufId::Recv, o, l);
        assert_eq!(p.input_needed(&Step::Send { peer: 1, src: send(100, 50) }), 0b010);
        assert_eq!(p.input_needed(&Step::Send { peer: 1, src: send(150, 100) }), 0b110);
        assert_eq!(p.input_needed(&Step::Send { peer: 1, src: recv(100, 50) }), 0);
        assert_eq!(p.input_needed(&Step::Send { peer: 1, src: send(100, 0) }), 0);
        let combine = Step::Recv { peer: 1, dst: recv(0, 10), action: RecvAction::Combine { local: send(240, 10) } };
        assert_eq!(p.input_needed(&combine), 0b100);
        let prep = Step::Local(LocalOp::Prepare { src: send(0, 64), dst: recv(0, 64) });
        assert_eq!(p.input_needed(&prep), 0b001);
    }

    /// A 2-rank ring all-reduce as rank 1 plans it: send its own half (the upper one), then
    /// combine the peer's lower half with its own, then receive the reduced upper half.
    #[test]
    fn pieces_go_in_the_order_the_plan_reads_and_finishes_them() {
        let send = |o, l| Slice::new(BufId::Send, o, l);
        let recv = |o, l| Slice::new(BufId::Recv, o, l);
        let mut plan = Plan::new("ring");
        let s0 = plan.send(0, send(200, 200), &[]);
        let c = plan.recv(0, recv(0, 200), RecvAction::Combine { local: send(0, 200) }, &[]);
        plan.send(0, recv(0, 200), &[c]);
        plan.recv(0, recv(200, 200), RecvAction::Copy, &[s0]);
        let pieces = Pieces { piece: 100, len: 400 };
        assert_eq!(input_order(&plan, pieces), vec![2, 3, 0, 1]);
        assert_eq!(output_order(&plan, pieces), vec![0, 1, 2, 3]);
        // Output: the combined lower half is final first; a piece nothing writes goes first.
        let mut plan = Plan::new("ring");
        plan.recv(0, recv(200, 100), RecvAction::Copy, &[]);
        plan.recv(0, recv(0, 200), RecvAction::Copy, &[]);
        assert_eq!(output_order(&plan, pieces), vec![3, 2, 0, 1]);
        // Input no step reads goes last, in place order.
        let mut plan = Plan::new("one");
        plan.send(0, send(300, 100), &[]);
        assert_eq!(input_order(&plan, pieces), vec![3, 0, 1, 2]);
    }
}
