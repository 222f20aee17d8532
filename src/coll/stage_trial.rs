//! Slots or kernel copies for a repeated host call, chosen by timing both on the calls the
//! program makes.
//!
//! Where the size rules ([`super::node::default_stage_max`]) pass a rank's private buffer
//! through its slot, its peers could instead read it in place by kernel copies. Which is faster
//! depends on where the data is, not on its size. A fresh input (rewritten since the call
//! before, as an application's) comes from the writer's cache either way, and the slot's plain
//! copies win: 2-rank all-gather of 256 KiB, 29-32 against 45-48 us on an Intel 2-core VM. A
//! reused input (a benchmark's) still sits in its readers' caches from the call before, so
//! reading it in place moves nothing: 18 against 25-28 us
//! (bench/results/ag-arrays-intel-vm-2026-12-07.md). The library cannot tell the two apart
//! without reading the data. So a repeated call of such a size times both paths, every rank on
//! the same calls, and keeps the faster.
//!
//! Every rank runs the same schedule, since every rank makes the same calls. Trials take
//! [`WINDOW`] calls: pairs through the slots and by kernel copies, in turn. The second call of
//! each pair is timed (the first pays for the switch), and the median of each path's decides.
//! A trial starts every [`REVISIT`] calls, so a program whose data changes character is
//! followed. Between trials each rank keeps its own verdict. Ranks may differ; the node
//! area's protocol lets each rank choose for its own buffers, and results are the same either
//! way. Kernel copies must measure [`MARGIN`] faster to replace the rule's slots.
//!
//! Only collectives in which every rank both gives and takes are tried (all-reduce,
//! all-gather, reduce-scatter): a rank's own time then shows what its choice costs its peers.
//! A broadcast root's does not (its receivers do the reading), and trying broadcasts made
//! 4-rank broadcasts of fresh data 1.2-1.4x slower on the 2-core VM.

use std::time::Duration;

/// Which way this rank's buffers reach its peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// The size rule's choice: through this rank's slot.
    Slots,
    /// Peers read (and write) this rank's buffers in place.
    KernelCopies,
}

/// Calls per trial: [`PAIRS`] pairs of each path, in turn (slots first). Pairs, because the
/// first call after a switch pays for the switch (lines in other caches, pages to prepare).
pub(crate) const WINDOW: u32 = 4 * PAIRS;
const PAIRS: u32 = 4;
/// A trial starts every this many calls of one shape (a trial's calls on the slower path are
/// then under 1% of all).
pub(crate) const REVISIT: u32 = 1024;
/// How much faster kernel copies must be, median against median.
const MARGIN: f64 = 1.1;
/// Smallest message (as nccl-tests sizes it) that is tried: below, a kernel copy's system call
/// and page lookups cost more than the copy it saves.
pub(crate) const MIN_BYTES: usize = 32 << 10;

/// One shape's trials and verdict.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StageTrial {
    /// Calls timed so far.
    calls: u32,
    /// The current trial's timed calls of each path, nanoseconds.
    times: [[u64; PAIRS as usize]; 2],
    /// The last trial's medians, nanoseconds.
    medians: [u64; 2],
    chosen: Path,
}

impl Default for StageTrial {
    fn default() -> Self {
        StageTrial { calls: 0, times: [[0; PAIRS as usize]; 2], medians: [0; 2], chosen: Path::Slots }
    }
}

fn median(mut v: [u64; PAIRS as usize]) -> u64 {
    v.sort_unstable();
    let mid = v.len() / 2;
    (v[mid - 1] + v[mid]) / 2
}

impl StageTrial {
    /// The path the next call takes.
    pub fn path(&self) -> Path {
        let k = self.calls % REVISIT;
        if k < WINDOW {
            return if (k / 2) % 2 == 0 { Path::Slots } else { Path::KernelCopies };
        }
        self.chosen
    }

    /// Records the time of a call that took [`Self::path`]; returns the new verdict when a
    /// trial ends with a different one.
    pub fn record(&mut self, path: Path, took: Duration) -> Option<Path> {
        let k = self.calls % REVISIT;
        self.calls = self.calls.wrapping_add(1);
        if k >= WINDOW || k % 2 == 0 {
            return None;
        }
        // The second call of pair k / 2: pairs alternate slots, kernel copies.
        self.times[path as usize][(k / 4) as usize] = took.as_nanos().min(u64::MAX as u128) as u64;
        if k + 1 < WINDOW {
            return None;
        }
        self.medians = [median(self.times[0]), median(self.times[1])];
        let [slots, kernel] = self.medians;
        let verdict = if (kernel as f64) * MARGIN < slots as f64 { Path::KernelCopies } else { Path::Slots };
        let changed = verdict != self.chosen;
        self.chosen = verdict;
        changed.then_some(verdict)
    }

    /// The last trial's medians, microseconds (slots, kernel copies), for the log.
    pub fn medians_us(&self) -> (f64, f64) {
        (self.medians[0] as f64 / 1e3, self.medians[1] as f64 / 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(trial: &mut StageTrial, slots_us: u64, kernel_us: u64, calls: u32) -> Vec<Path> {
        (0..calls)
            .map(|_| {
                let p = trial.path();
                let us = if p == Path::Slots { slots_us } else { kernel_us };
                trial.record(p, Duration::from_micros(us));
                p
            })
            .collect()
    }

    #[test]
    fn a_trial_alternates_pairs_then_keeps_the_faster_path() {
        let mut t = StageTrial::default();
        let paths = run(&mut t, 30, 18, WINDOW);
        use Path::*;
        let pairs: Vec<Path> = paths
            .chunks(2)
            .map(|c| {
                assert_eq!(c[0], c[1], "paths come in pairs: {paths:?}");
                c[0]
            })
            .collect();
        assert_eq!(pairs, [Slots, KernelCopies].repeat(PAIRS as usize));
        assert_eq!(t.path(), KernelCopies);
        assert!(run(&mut t, 30, 18, REVISIT - WINDOW).iter().all(|&p| p == KernelCopies));
    }

    #[test]
    fn slots_stay_unless_kernel_copies_win_by_the_margin() {
        let mut t = StageTrial::default();
        run(&mut t, 20, 19, WINDOW);
        assert_eq!(t.path(), Path::Slots, "5% faster is within the margin");
        let mut t = StageTrial::default();
        run(&mut t, 20, 25, WINDOW);
        assert_eq!(t.path(), Path::Slots);
    }

    #[test]
    fn medians_of_the_second_calls_decide_and_outliers_do_not() {
        // First calls of each pair (a switch) are slow and not counted; one second call of
        // kernel copies is very fast, one of slots very slow: the medians still say slots.
        let mut t = StageTrial::default();
        for k in 0..WINDOW {
            let p = t.path();
            let (first, pair) = (k % 2 == 0, k / 2);
            let us = match (p, first) {
                (_, true) => 5000,
                (Path::Slots, false) if pair == 2 => 900,
                (Path::Slots, false) => 30,
                (Path::KernelCopies, false) if pair == 1 => 2,
                (Path::KernelCopies, false) => 40,
            };
            t.record(p, Duration::from_micros(us));
        }
        assert_eq!(t.path(), Path::Slots);
        assert_eq!(t.medians_us(), (30.0, 40.0));
    }

    #[test]
    fn later_trials_follow_a_change_in_the_data() {
        let mut t = StageTrial::default();
        run(&mut t, 30, 18, REVISIT);
        assert_eq!(t.path(), Path::Slots, "a new trial starts with slots");
        // The inputs now change between calls: slots win, and the verdict says so once.
        let mut changes = 0;
        for _ in 0..WINDOW {
            let p = t.path();
            let us = if p == Path::Slots { 30 } else { 46 };
            changes += t.record(p, Duration::from_micros(us)).is_some() as u32;
        }
        assert_eq!(changes, 1);
        assert_eq!(t.path(), Path::Slots);
        assert!(run(&mut t, 30, 46, REVISIT - WINDOW).iter().all(|&p| p == Path::Slots));
    }

    #[test]
    fn ranks_on_the_same_calls_try_the_same_paths() {
        // Whatever their timings, two ranks making the same calls explore in step.
        let (mut a, mut b) = (StageTrial::default(), StageTrial::default());
        for call in 0..(2 * REVISIT) {
            let (pa, pb) = (a.path(), b.path());
            if call % REVISIT < WINDOW {
                assert_eq!(pa, pb, "call {call}");
            }
            a.record(pa, Duration::from_micros(10 + (call % 7) as u64));
            b.record(pb, Duration::from_micros(40 - (call % 5) as u64));
        }
    }
}
