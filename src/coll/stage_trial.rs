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
//! Trials take [`WINDOW`] calls: pairs through the slots and by kernel copies, in turn. The
//! second call of each pair is timed (the first pays for the switch), and the median of each
//! path's decides. A trial starts every [`REVISIT`] calls, so a program whose data changes
//! character is followed. Ranks that make the same calls run the same schedule, as each counts
//! its calls of a shape (failed ones too). A rank can still fall out of step, for one thing
//! when its thread's cache of shapes ([`super::fast`]) dropped the shape and another's did
//! not. Each rank also keeps its own verdict. This is safe: the node area's protocol lets
//! each rank choose for its own buffers, and results are the same bits either way. The trial
//! then only times a mix of the two paths. Kernel copies must measure [`MARGIN`] faster to
//! replace the rule's slots.
//!
//! Only collectives in which every rank both gives and takes are tried (all-reduce,
//! all-gather, reduce-scatter): a rank's own time then shows what its choice costs its peers.
//! A broadcast root's does not (its receivers do the reading), and trying broadcasts made
//! 4-rank broadcasts of fresh data 1.2-1.4x slower on the 2-core VM. Ranks sharing cores
//! time each other's descheduling more than their copies: at 4 ranks on the 2 cores the
//! verdicts flipped from launch to launch (bench/results/stage-trial-2026-12-08.md). And only
//! two ranks are tried: on the 16-core host (round 155, two alternations) the trial made
//! reused inputs at 8 and 16 ranks 1.4x and 1.7x slower (geometric means; at 2 ranks 0.89x),
//! where every rank reads every other's buffer and a rank's own time is a poor guide.
//!
//! Costs besides the slower path's calls in each trial: where peers map the buffers anyway
//! (ncclMemAlloc memory, ranks in one process) both paths are the same and the trial only
//! times them; and a trial's kernel copies count toward the huge pages a buffer reached by
//! kernel copies gets (`FERROCCL_HUGE_PAGES`), which a buffer of 1 MiB or more may then get
//! even if the verdict is slots (about a millisecond per 2 MiB region, once).

use std::time::Duration;

use super::node::{NodeAlgo, NodeColl};

/// Which way this rank's buffers reach its peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StagePath {
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

/// Whether repeated calls of a node operation are tried: host all-reduces, all-gathers and
/// reduce-scatters by the direct algorithm, of two ranks with a core each, from [`MIN_BYTES`] up to
/// the largest size the rules may pass through slots (`size`: the message as nccl-tests counts
/// it; the limits: [`super::node::default_stage_max`] and its off-huge-pages range).
pub(crate) fn applies(
    coll: &NodeColl,
    algo: NodeAlgo,
    size: usize,
    stage_limits: (usize, usize),
    nranks: usize,
    ranks_have_cores: bool,
    device_call: bool,
) -> bool {
    let symmetric = matches!(coll, NodeColl::AllReduce(_) | NodeColl::AllGather | NodeColl::ReduceScatter(_));
    symmetric
        && algo == NodeAlgo::Direct
        && nranks == 2
        && ranks_have_cores
        && !device_call
        && size >= MIN_BYTES
        && size <= stage_limits.0.max(stage_limits.1)
}

/// One call of a tried shape: its path, and the trial step to time it under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TrialCall {
    pub path: StagePath,
    /// `Some(k)`: the call is step k of a trial, the second of its pair, to be timed.
    pub timed: Option<u32>,
}

/// One shape's trials and verdict.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StageTrial {
    /// Calls begun so far.
    calls: u32,
    /// The current trial's timed calls through slots and by kernel copies, nanoseconds.
    slots: [u64; PAIRS as usize],
    kernel: [u64; PAIRS as usize],
    /// The last trial's medians (slots, kernel copies), nanoseconds.
    medians: (u64, u64),
    chosen: StagePath,
}

impl Default for StageTrial {
    fn default() -> Self {
        StageTrial {
            calls: 0,
            slots: [0; PAIRS as usize],
            kernel: [0; PAIRS as usize],
            medians: (0, 0),
            chosen: StagePath::Slots,
        }
    }
}

fn median(mut v: [u64; PAIRS as usize]) -> u64 {
    v.sort_unstable();
    let mid = v.len() / 2;
    (v[mid - 1] + v[mid]) / 2
}

/// The path of trial step `k`: pairs of slots and kernel copies in turn.
fn path_of_step(k: u32) -> StagePath {
    if (k / 2) % 2 == 0 {
        StagePath::Slots
    } else {
        StagePath::KernelCopies
    }
}

impl StageTrial {
    /// Counts a call (whether or not it completes) and says how it runs.
    pub fn begin_call(&mut self) -> TrialCall {
        let k = self.calls % REVISIT;
        self.calls = self.calls.wrapping_add(1);
        if k >= WINDOW {
            return TrialCall { path: self.chosen, timed: None };
        }
        TrialCall { path: path_of_step(k), timed: (k % 2 == 1).then_some(k) }
    }

    /// Records the time of trial step `k` (a [`TrialCall::timed`] call); returns the new
    /// verdict when this ends a trial with a different one.
    pub fn record(&mut self, k: u32, took: Duration) -> Option<StagePath> {
        if k >= WINDOW || k % 2 == 0 {
            return None;
        }
        let nanos = took.as_nanos().min(u64::MAX as u128) as u64;
        // Pair k / 2; each path has every other pair.
        let i = (k / 4) as usize;
        match path_of_step(k) {
            StagePath::Slots => self.slots[i] = nanos,
            StagePath::KernelCopies => self.kernel[i] = nanos,
        }
        if k + 1 < WINDOW {
            return None;
        }
        self.medians = (median(self.slots), median(self.kernel));
        let (slots, kernel) = self.medians;
        let verdict = if (kernel as f64) * MARGIN < slots as f64 { StagePath::KernelCopies } else { StagePath::Slots };
        let changed = verdict != self.chosen;
        self.chosen = verdict;
        changed.then_some(verdict)
    }

    /// The last trial's medians, microseconds (slots, kernel copies), for the log.
    pub fn medians_us(&self) -> (f64, f64) {
        (self.medians.0 as f64 / 1e3, self.medians.1 as f64 / 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use StagePath::*;

    /// Runs `calls` calls, each timed as its path's time; returns their paths.
    fn run(trial: &mut StageTrial, slots_us: u64, kernel_us: u64, calls: u32) -> Vec<StagePath> {
        (0..calls)
            .map(|_| {
                let call = trial.begin_call();
                let us = if call.path == Slots { slots_us } else { kernel_us };
                if let Some(k) = call.timed {
                    trial.record(k, Duration::from_micros(us));
                }
                call.path
            })
            .collect()
    }

    #[test]
    fn a_trial_alternates_pairs_then_keeps_the_faster_path() {
        let mut t = StageTrial::default();
        let paths = run(&mut t, 30, 18, WINDOW);
        let pairs: Vec<StagePath> = paths
            .chunks(2)
            .map(|c| {
                assert_eq!(c[0], c[1], "paths come in pairs: {paths:?}");
                c[0]
            })
            .collect();
        assert_eq!(pairs, [Slots, KernelCopies].repeat(PAIRS as usize));
        assert!(run(&mut t, 30, 18, REVISIT - WINDOW).iter().all(|&p| p == KernelCopies));
    }

    #[test]
    fn only_the_second_call_of_each_pair_is_timed() {
        let mut t = StageTrial::default();
        let timed: Vec<Option<u32>> = (0..WINDOW + 2).map(|_| t.begin_call().timed).collect();
        let expect: Vec<Option<u32>> = (0..WINDOW).map(|k| (k % 2 == 1).then_some(k)).chain([None, None]).collect();
        assert_eq!(timed, expect);
    }

    #[test]
    fn slots_stay_unless_kernel_copies_win_by_the_margin() {
        let mut t = StageTrial::default();
        run(&mut t, 20, 19, WINDOW);
        assert_eq!(t.begin_call().path, Slots, "5% faster is within the margin");
        let mut t = StageTrial::default();
        run(&mut t, 20, 25, WINDOW);
        assert_eq!(t.begin_call().path, Slots);
    }

    #[test]
    fn medians_decide_and_outliers_do_not() {
        // One timed call of kernel copies is very fast, one of slots very slow: the medians
        // still say slots.
        let mut t = StageTrial::default();
        for _ in 0..WINDOW {
            let call = t.begin_call();
            let Some(k) = call.timed else { continue };
            let us = match (call.path, k / 4) {
                (Slots, 1) => 900,
                (Slots, _) => 30,
                (KernelCopies, 0) => 2,
                (KernelCopies, _) => 40,
            };
            t.record(k, Duration::from_micros(us));
        }
        assert_eq!(t.begin_call().path, Slots);
        assert_eq!(t.medians_us(), (30.0, 40.0));
    }

    #[test]
    fn later_trials_follow_a_change_in_the_data() {
        let mut t = StageTrial::default();
        run(&mut t, 30, 18, REVISIT);
        // The inputs now change between calls: slots win, and the verdict says so once.
        let mut changes = 0;
        for _ in 0..WINDOW {
            let call = t.begin_call();
            let us = if call.path == Slots { 30 } else { 46 };
            if let Some(k) = call.timed {
                changes += t.record(k, Duration::from_micros(us)).is_some() as u32;
            }
        }
        assert_eq!(changes, 1);
        assert!(run(&mut t, 30, 46, REVISIT - WINDOW).iter().all(|&p| p == Slots));
    }

    #[test]
    fn failed_calls_keep_ranks_in_step() {
        // A call that fails is counted at its start, so a rank whose call failed stays on
        // its peers' schedule.
        let (mut a, mut b) = (StageTrial::default(), StageTrial::default());
        for call in 0..(2 * REVISIT) {
            let (ca, cb) = (a.begin_call(), b.begin_call());
            if call % REVISIT < WINDOW {
                assert_eq!(ca.path, cb.path, "call {call}");
            }
            if let Some(k) = ca.timed {
                a.record(k, Duration::from_micros(10 + (call % 7) as u64));
            }
            // b's timed calls fail every third time: never recorded.
            if let Some(k) = cb.timed.filter(|_| call % 3 != 0) {
                b.record(k, Duration::from_micros(40 - (call % 5) as u64));
            }
        }
    }

    #[test]
    fn only_two_rank_symmetric_direct_host_calls_in_the_slot_range_are_tried() {
        let ar = NodeColl::AllReduce(crate::reduce::Reduction::builtin(
            crate::types::DataType::Float32,
            crate::types::BuiltinOp::Sum,
            2,
        ));
        let limits = (128 << 10, 2 << 20);
        assert!(applies(&ar, NodeAlgo::Direct, 64 << 10, limits, 2, true, false));
        assert!(applies(&ar, NodeAlgo::Direct, 2 << 20, limits, 2, true, false), "off-huge-pages range");
        assert!(!applies(&ar, NodeAlgo::Direct, (2 << 20) + 4, limits, 2, true, false));
        assert!(!applies(&ar, NodeAlgo::Direct, MIN_BYTES - 4, limits, 2, true, false));
        assert!(!applies(&ar, NodeAlgo::OneShot, 64 << 10, limits, 2, true, false));
        assert!(!applies(&ar, NodeAlgo::Direct, 64 << 10, limits, 2, false, false), "ranks sharing cores");
        assert!(!applies(&ar, NodeAlgo::Direct, 64 << 10, limits, 2, true, true), "device calls");
        assert!(!applies(&NodeColl::Broadcast { root: 0 }, NodeAlgo::Direct, 64 << 10, limits, 2, true, false));
        assert!(applies(&NodeColl::AllGather, NodeAlgo::Direct, 64 << 10, limits, 2, true, false));
        assert!(!applies(&NodeColl::AllGather, NodeAlgo::Direct, 64 << 10, limits, 8, true, false), "8 ranks");
    }
}
