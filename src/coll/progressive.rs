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
//! Flags are 32-bit words in pinned host memory that hold the operation's sequence number
//! once set (older numbers before): the stream writes the landed flags and waits for the
//! released ones with stream memory operations, in order, one stream per operation.

use std::sync::atomic::{AtomicU32, Ordering};

use super::plan::{BufId, LocalOp, Plan, RecvAction, Slice, Step};

/// Pieces of one buffer at most (and flags of each kind).
pub const MAX_PIECES: usize = 16;

/// Bytes of the flag block: `MAX_PIECES` landed flags, then `MAX_PIECES` released flags.
pub const FLAG_BYTES: usize = 8 * MAX_PIECES;

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
        debug_assert!(index < 2 * MAX_PIECES);
        // SAFETY: `new`'s contract: 2 * MAX_PIECES aligned words, alive while self is used.
        unsafe { &*self.flags.add(index) }
    }

    /// Marks every flag of this operation unset (before the stream is given any of them).
    pub fn reset(&self) {
        for i in 0..2 * MAX_PIECES {
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

    /// Bytes of input landed, from the start (one stream copies the pieces in order).
    pub fn landed_bytes(&self) -> usize {
        let n = self.input.count();
        let k = (0..n).take_while(|&k| reached(self.word(k).load(Ordering::Acquire), self.seq)).count();
        if k == n {
            self.input.len
        } else {
            k * self.input.piece
        }
    }

    pub fn all_landed(&self) -> bool {
        self.landed_bytes() == self.input.len
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

    /// Bytes of input that must have landed before a step may start (it touches them).
    pub fn input_needed(step: &Step) -> usize {
        send_extent(step)
    }

    fn for_pieces_of(&self, s: &Slice, mut f: impl FnMut(usize)) {
        if s.buf != BufId::Recv || s.len == 0 || self.output.len == 0 {
            return;
        }
        let first = s.offset / self.output.piece;
        let last = (s.end() - 1) / self.output.piece;
        (first..=last.min(self.output.count() - 1)).for_each(&mut f);
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

/// End of the send-buffer bytes a step reads or writes (0: none).
fn send_extent(step: &Step) -> usize {
    let slices: [Option<Slice>; 2] = match *step {
        Step::Send { src, .. } => [Some(src), None],
        Step::Recv { dst, action: RecvAction::Combine { local }, .. } => [Some(dst), Some(local)],
        Step::Recv { dst, .. } => [Some(dst), None],
        Step::Local(LocalOp::Copy { src, dst } | LocalOp::Prepare { src, dst }) => [Some(src), Some(dst)],
        Step::Local(LocalOp::Finalize { buf }) => [Some(buf), None],
    };
    slices.iter().flatten().filter(|s| s.buf == BufId::Send && s.len > 0).map(Slice::end).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Block(Vec<AtomicU32>);

    impl Block {
        fn new() -> Block {
            Block((0..2 * MAX_PIECES).map(|_| AtomicU32::new(0)).collect())
        }
        fn progress(&self, seq: u32, input: Pieces, output: Pieces) -> StageProgress {
            // SAFETY: the block holds 2 * MAX_PIECES atomics and outlives the value in the test.
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
    fn input_lands_in_order_and_only_for_this_operation() {
        let b = Block::new();
        let input = Pieces { piece: 100, len: 250 };
        let p = b.progress(7, input, Pieces { piece: 100, len: 0 });
        assert_eq!(p.landed_bytes(), 0);
        b.land(1, 7); // out of order: piece 0 still missing
        assert_eq!(p.landed_bytes(), 0);
        b.land(0, 6); // an older operation's flag is not this one's
        assert_eq!(p.landed_bytes(), 0);
        b.land(0, 7);
        assert_eq!(p.landed_bytes(), 200);
        b.land(2, 7);
        assert!(p.all_landed());
        assert_eq!(p.landed_bytes(), 250);
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
    fn steps_need_the_send_bytes_they_touch() {
        let send = |o, l| Slice::new(BufId::Send, o, l);
        let recv = |o, l| Slice::new(BufId::Recv, o, l);
        assert_eq!(StageProgress::input_needed(&Step::Send { peer: 1, src: send(100, 50) }), 150);
        assert_eq!(StageProgress::input_needed(&Step::Send { peer: 1, src: recv(100, 50) }), 0);
        let combine = Step::Recv { peer: 1, dst: recv(0, 10), action: RecvAction::Combine { local: send(40, 10) } };
        assert_eq!(StageProgress::input_needed(&combine), 50);
        let prep = Step::Local(LocalOp::Prepare { src: send(0, 64), dst: recv(0, 64) });
        assert_eq!(StageProgress::input_needed(&prep), 64);
    }
}
