//! The folds of one group gathered into few launches.
//!
//! A group of small collectives would otherwise cost one kernel launch each, and at a few
//! bytes a launch costs more than its work. [`Launches`] holds the folds queued on one stream
//! and sends consecutive ones of the same kernel out as one batch launch
//! ([`kernels::FoldBatch`], up to [`kernels::BATCH_MAX`] folds of up to 1 MiB each), where they
//! run side by side.
//! That is safe only between folds that do not depend on each other: a fold joins the batch
//! unless it reads or writes bytes a queued one writes, or writes bytes a queued one reads
//! (identical folds may write the same bytes: they write the same values). Anything else on
//! the stream (a copy) first sends out what is queued, so stream order is kept.

use std::ops::Range;

use super::kernels::{self, FanOut, Fold, FoldParams, BATCH_MAX};
use super::stream::Stream;
use crate::error::Result;
use crate::reduce::ReduceKind;
use crate::types::DataType;

/// Folds that read or write a buffer of more bytes than this launch alone, as before
/// batching: their launch costs little next to their work, and a batch's rows are as wide as
/// its widest fold's.
const BATCH_FOLD_MAX: u64 = 1 << 20;

/// A fold waiting for its launch, with the bytes it reads and writes.
struct Queued {
    params: FoldParams,
    reads: Vec<Range<u64>>,
    writes: Vec<Range<u64>>,
}

impl Queued {
    fn new(params: FoldParams, elem_size: usize) -> Queued {
        let (reads, writes) = params.footprint(elem_size);
        Queued { params, reads, writes }
    }

    /// Whether running `self` and `other` at once could give another result than running
    /// them one after the other.
    fn conflicts(&self, other: &Queued) -> bool {
        overlap(&self.writes, &other.reads)
            || overlap(&other.writes, &self.reads)
            || (self.params != other.params && overlap(&self.writes, &other.writes))
    }
}

fn overlap(a: &[Range<u64>], b: &[Range<u64>]) -> bool {
    a.iter().any(|x| b.iter().any(|y| x.start < y.end && y.start < x.end))
}

/// Where a new fold goes.
enum Admit {
    /// Into the queued batch.
    Join,
    /// Into a new batch, after the queued one.
    After,
    /// Into a launch of its own, after the queued batch (a large fold).
    Alone,
}

/// The launches [`Launches`] makes of `folds` queued in this order: each range is one launch
/// (the host emulation of the kernels runs them as the GPU would; no fold is launched here).
pub fn plan(folds: &[(DataType, ReduceKind, FoldParams)]) -> Vec<Range<usize>> {
    let mut l = Launches::new(Stream(0));
    let mut launches = Vec::new();
    let mut start = 0;
    for (i, &(dtype, kind, params)) in folds.iter().enumerate() {
        let q = Queued::new(params, dtype.size());
        let admit = l.admit((dtype, kind), &q);
        if !matches!(admit, Admit::Join) {
            if i > start {
                launches.push(start..i);
            }
            start = i;
            l.queued.clear();
        }
        l.kernel = Some((dtype, kind));
        l.queued.push(q);
        if matches!(admit, Admit::Alone) {
            launches.push(i..i + 1);
            start = i + 1;
            l.queued.clear();
            l.kernel = None;
        }
    }
    if start < folds.len() {
        launches.push(start..folds.len());
    }
    launches
}

/// Kernel launches queued on one stream, sent out in batches (see the module comment).
/// Nothing is launched until [`Launches::flush`] (or a copy) is called: dropping it discards
/// what is queued.
pub struct Launches {
    stream: Stream,
    kernel: Option<(DataType, ReduceKind)>,
    queued: Vec<Queued>,
}

impl Launches {
    pub fn new(stream: Stream) -> Launches {
        Launches { stream, kernel: None, queued: Vec::new() }
    }

    /// Queues `f` ([`kernels::fold`]).
    ///
    /// # Safety
    /// As for [`kernels::fold`], until the launch has run.
    pub unsafe fn fold(&mut self, f: &Fold<'_>) -> Result<()> {
        let p = kernels::fold_params(f)?;
        if f.count == 0 {
            return Ok(());
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { self.push(f.dtype, f.kind, p) }
    }

    /// Queues a grouped copy ([`kernels::fan_out`]); `Ok(false)` (nothing queued) where the
    /// one-launch form does not apply.
    ///
    /// # Safety
    /// As for [`kernels::fan_out`], until the launch has run.
    pub unsafe fn fan_out(&mut self, f: &FanOut<'_>) -> Result<bool> {
        let Some(p) = kernels::fan_out_params(f) else { return Ok(false) };
        if f.bytes > 0 {
            // SAFETY: the caller's contract; a copy is the byte type's sum kernel with one
            // input (fan_out_params).
            unsafe { self.push(DataType::Uint8, ReduceKind::Sum, p)? };
        }
        Ok(true)
    }

    /// Queues a grouped fold ([`kernels::fold_groups`]); `Ok(false)` (nothing queued) where
    /// the one-launch form does not apply.
    ///
    /// # Safety
    /// As for [`kernels::fold_groups`], until the launch has run.
    pub unsafe fn fold_groups(&mut self, f: &Fold<'_>, outs: &[*mut u8], group_bytes: usize) -> Result<bool> {
        let Some(p) = kernels::grouped_fold_params(f, outs, group_bytes)? else { return Ok(false) };
        if f.count > 0 {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.push(f.dtype, f.kind, p)? };
        }
        Ok(true)
    }

    /// Sends out what is queued, then queues a copy on the stream.
    ///
    /// # Safety
    /// As for [`Stream::copy`].
    pub unsafe fn copy(&mut self, dst: *mut u8, src: *const u8, bytes: usize) -> Result<()> {
        self.flush()?;
        // SAFETY: the caller's contract, passed on.
        unsafe { self.stream.copy(dst, src, bytes) }
    }

    /// Launches what is queued: one fold as a plain launch, several as one batch.
    pub fn flush(&mut self) -> Result<()> {
        let Some((dtype, kind)) = self.kernel.take() else { return Ok(()) };
        let params: Vec<FoldParams> = self.queued.drain(..).map(|q| q.params).collect();
        // SAFETY: every fold was queued under its launch's contract (the unsafe queuing
        // functions), and none conflicts with another in the batch (push).
        unsafe {
            match params.as_slice() {
                [] => Ok(()),
                [one] => kernels::launch(self.stream, dtype, kind, *one),
                many => kernels::launch_batch(self.stream, dtype, kind, many),
            }
        }
    }

    /// Queues a fold.
    ///
    /// # Safety
    /// As for [`kernels::fold`] with `params`, until the launch has run.
    unsafe fn push(&mut self, dtype: DataType, kind: ReduceKind, params: FoldParams) -> Result<()> {
        let q = Queued::new(params, dtype.size());
        match self.admit((dtype, kind), &q) {
            Admit::Alone => {
                self.flush()?;
                // SAFETY: the caller's contract; the folds queued before it went out first,
                // so stream order holds.
                return unsafe { kernels::launch(self.stream, dtype, kind, params) };
            }
            Admit::After => self.flush()?,
            Admit::Join => {}
        }
        self.kernel = Some((dtype, kind));
        self.queued.push(q);
        Ok(())
    }

    /// How `q`, a fold of `kernel`, goes out next to the queued folds.
    fn admit(&self, kernel: (DataType, ReduceKind), q: &Queued) -> Admit {
        if q.reads.iter().chain(&q.writes).any(|r| r.end - r.start > BATCH_FOLD_MAX) {
            Admit::Alone
        } else if self.joins(kernel, q) {
            Admit::Join
        } else {
            Admit::After
        }
    }

    /// Whether `q`, a fold of `kernel`, can go out in the same launch as the queued folds.
    fn joins(&self, kernel: (DataType, ReduceKind), q: &Queued) -> bool {
        self.kernel == Some(kernel)
            && self.queued.len() < BATCH_MAX
            && self.queued.iter().all(|other| !other.conflicts(q))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy_fold(out: usize, input: usize, count: usize) -> FoldParams {
        kernels::fold_params(&Fold {
            dtype: DataType::Float32,
            kind: ReduceKind::Sum,
            out: out as *mut u8,
            inputs: &[input as *const u8, (input + 0x10_0000) as *const u8],
            pre: &[],
            post_div: None,
            count,
            more_outs: &[],
        })
        .expect("valid fold")
    }

    fn queued(p: FoldParams) -> Queued {
        Queued::new(p, 4)
    }

    #[test]
    fn independent_and_identical_folds_may_share_a_launch() {
        // Two all-reduces into separate outputs from separate inputs.
        let a = queued(copy_fold(0x1000, 0x8000, 16));
        let b = queued(copy_fold(0x2000, 0x9000, 16));
        assert!(!a.conflicts(&b) && !b.conflicts(&a));
        // The same out-of-place fold twice writes the same values.
        let twin = queued(copy_fold(0x1000, 0x8000, 16));
        assert!(!a.conflicts(&twin));
        // Adjacent but not overlapping: 16 floats end at 0x1040.
        let next = queued(copy_fold(0x1040, 0xa000, 16));
        assert!(!a.conflicts(&next));
    }

    #[test]
    fn dependent_folds_do_not() {
        let a = queued(copy_fold(0x1000, 0x8000, 16));
        // Reads what a writes.
        assert!(a.conflicts(&queued(copy_fold(0x3000, 0x1020, 16))));
        // Writes what a reads (its second input sits 1 MiB past the first).
        assert!(a.conflicts(&queued(copy_fold(0x10_8010, 0x20_0000, 4))));
        // Writes other values where a writes.
        assert!(a.conflicts(&queued(copy_fold(0x1020, 0xa000, 16))));
        // The same fold in place twice: the second reads the first's result.
        let in_place = queued(copy_fold(0x8000, 0x8000, 16));
        assert!(in_place.conflicts(&queued(copy_fold(0x8000, 0x8000, 16))));
    }

    #[test]
    fn device_scalars_count_as_reads() {
        let scalar = 0x1010usize;
        let p = kernels::fold_params(&Fold {
            dtype: DataType::Float32,
            kind: ReduceKind::Sum,
            out: 0x5000 as *mut u8,
            inputs: &[0x6000 as *const u8],
            pre: &[kernels::PreScalar::Device(scalar as *const u8)],
            post_div: None,
            count: 4,
            more_outs: &[],
        })
        .expect("valid fold");
        assert!(queued(p).conflicts(&queued(copy_fold(0x1000, 0x8000, 16))));
    }

    #[test]
    fn grouped_copies_cover_every_group() {
        // Two sources of 64 bytes into two outputs of 2 x 64 bytes.
        let fan = |outs: [usize; 2], sources: [usize; 2]| {
            let s = sources.map(|a| a as *const u8);
            let o = outs.map(|a| a as *mut u8);
            // A grouped copy is a fold of bytes.
            Queued::new(kernels::fan_out_params(&FanOut { sources: &s, outs: &o, bytes: 64 }).expect("usable"), 1)
        };
        let a = fan([0x1000, 0x2000], [0x8000, 0x9000]);
        // Writing into the second group of a's first output conflicts; just past it does not.
        assert!(a.conflicts(&queued(copy_fold(0x1040, 0xa000, 4))));
        assert!(!a.conflicts(&queued(copy_fold(0x1080, 0xa000, 4))));
        // Writing a's second source conflicts.
        assert!(a.conflicts(&queued(copy_fold(0x9030, 0xa000, 4))));
    }

    #[test]
    fn a_batch_takes_one_kernel_up_to_its_limit() {
        let mut l = Launches::new(Stream(0));
        let f32_sum = (DataType::Float32, ReduceKind::Sum);
        for k in 0..BATCH_MAX {
            let q = queued(copy_fold(0x1000 * (k + 1), 0x100_0000 + 0x1000 * k, 16));
            assert!(k == 0 || l.joins(f32_sum, &q), "fold {k} should join");
            l.kernel = Some(f32_sum);
            l.queued.push(q);
        }
        let more = queued(copy_fold(0x20_0000, 0x30_0000, 16));
        assert!(!l.joins(f32_sum, &more), "the batch is full");
        l.queued.truncate(2);
        assert!(l.joins(f32_sum, &more));
        assert!(!l.joins((DataType::Float32, ReduceKind::Max), &more), "another kernel");
        assert!(!l.joins(f32_sum, &queued(copy_fold(0x3000, 0x1000, 16))), "reads a queued output");
    }

    #[test]
    fn plans_cut_at_the_limit_dependencies_other_kernels_and_large_folds() {
        let f32_sum = |p| (DataType::Float32, ReduceKind::Sum, p);
        let independent: Vec<_> =
            (0..9).map(|k| f32_sum(copy_fold(0x1000 * (k + 1), 0x100_0000 + 0x1000 * k, 16))).collect();
        assert_eq!(plan(&independent), vec![0..7, 7..9]);
        let mut mixed = independent[..3].to_vec();
        // Reads fold 0's output; then another kernel; then a fold of 2 MiB; then one more.
        mixed.push(f32_sum(copy_fold(0x50_0000, 0x1000, 16)));
        mixed.push((DataType::Float32, ReduceKind::Max, copy_fold(0x60_0000, 0x70_0000, 16)));
        mixed.push(f32_sum(copy_fold(0x80_0000, 0x200_0000, 512 << 10)));
        mixed.push(f32_sum(copy_fold(0x90_0000, 0xa0_0000, 16)));
        assert_eq!(plan(&mixed), vec![0..3, 3..4, 4..5, 5..6, 6..7]);
    }
}
