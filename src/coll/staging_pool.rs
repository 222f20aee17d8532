//! The pinned staging buffers of one stream worker ([`super::stream`]), and when each may be
//! taken again.
//!
//! A staged call copies its device inputs into a buffer on its stream, the worker runs the
//! host engine on it, and the stream copies the output back. A buffer is in use until both
//! the worker and every stream that copies it are past the call. Two rules free it for the
//! next call:
//!
//! - **Passed:** the worker has finished the call that holds it, and every stream it names has
//!   passed that call's out flag.
//! - **Same stream:** a later call on the stream that copies it may take it at once, while the
//!   earlier call is still in flight. Stream order makes this safe once the earlier call is
//!   queued whole: the later call's copies into the buffer come after the earlier call's wait
//!   for the worker and its copy back, and the worker reads or writes it for the later call
//!   only after that call's ready flag, which the stream writes after them too.
//!
//! Without the second rule, a client that queues many calls before it synchronises (as
//! nccl-tests does) made the pool grow by a set of pinned buffers per call in flight, each a
//! millisecond-scale allocation that is never freed.
//!
//! Operations captured into CUDA graphs (`captured`) hold their buffers for as long as the
//! graph lives, and give them back here when it is destroyed.
//!
//! Buffers are never freed while the worker lives: freeing pinned memory can wait for every
//! stream of the context, including one that waits on this library. This module holds only
//! the bookkeeping; the buffers are whatever `B` is (pinned memory in the library, plain
//! values in the tests).

use std::sync::Arc;

use super::progressive::reached;

/// One buffer and its state.
struct Entry<B> {
    buf: Arc<B>,
    len: usize,
    /// The job (its last sequence number) that holds it until the worker has finished it.
    held_by: Option<u32>,
    /// (stream slot, sequence number): each stream's out flag must reach its number.
    busy_until: Vec<(usize, u32)>,
    /// The stream whose later calls may take it while it is still in use (the same-stream
    /// rule). Set only once the call that took it is queued whole on that stream.
    reusable_on: Option<usize>,
    /// Never taken again: a job gave up while the engine may still write into it.
    retired: bool,
    /// Captured operations (of live graphs) that use it; taken by nothing else meanwhile.
    graph_holds: usize,
}

/// A buffer taken for a job being queued.
pub(super) struct Taken<B> {
    pub index: usize,
    pub buf: Arc<B>,
}

pub(super) struct StagingPool<B> {
    entries: Vec<Entry<B>>,
}

impl<B> StagingPool<B> {
    pub fn new() -> Self {
        StagingPool { entries: Vec::new() }
    }

    /// The smallest buffer that serves `len` bytes: passed, or under the same-stream rule for
    /// a call on stream `same_stream` (`None`: a buffer the host writes at enqueue, which only
    /// a passed one may be). `out` reads a stream's out flag.
    pub fn find(&self, len: usize, same_stream: Option<usize>, out: impl Fn(usize) -> u32) -> Option<usize> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| !e.retired && e.graph_holds == 0 && serves(e.len, len))
            .filter(|(_, e)| {
                (same_stream.is_some() && e.reusable_on == same_stream)
                    || (e.held_by.is_none() && e.busy_until.iter().all(|&(s, seq)| reached(out(s), seq)))
            })
            .min_by_key(|(_, e)| e.len)
            .map(|(i, _)| i)
    }

    /// Takes buffer `index` for job `job` (its last sequence number).
    pub fn take(&mut self, index: usize, job: u32) -> Taken<B> {
        let e = &mut self.entries[index];
        e.held_by = Some(job);
        e.busy_until.clear();
        e.reusable_on = None;
        Taken { index, buf: e.buf.clone() }
    }

    /// Adds a new buffer of `len` bytes, taken for job `job`.
    pub fn add(&mut self, buf: B, len: usize, job: u32) -> Taken<B> {
        let index = self.push(buf, len);
        self.take(index, job)
    }

    /// A new free buffer of `len` bytes; its index.
    fn push(&mut self, buf: B, len: usize) -> usize {
        self.entries.push(Entry {
            buf: Arc::new(buf),
            len,
            held_by: None,
            busy_until: Vec::new(),
            reusable_on: None,
            retired: false,
            graph_holds: 0,
        });
        self.entries.len() - 1
    }

    /// Holds `index` for one more captured operation (a passed buffer found by [`find`], or
    /// one the graph's operations already share).
    ///
    /// [`find`]: StagingPool::find
    pub fn hold_for_graph(&mut self, index: usize) -> Taken<B> {
        let e = &mut self.entries[index];
        debug_assert!(e.held_by.is_none(), "a buffer held by a job is never held for a graph");
        e.graph_holds += 1;
        e.busy_until.clear();
        e.reusable_on = None;
        Taken { index, buf: e.buf.clone() }
    }

    /// Adds a new buffer of `len` bytes, held for a captured operation.
    pub fn add_for_graph(&mut self, buf: B, len: usize) -> Taken<B> {
        let index = self.push(buf, len);
        self.hold_for_graph(index)
    }

    /// A captured operation that held `index` went with its graph, whose launched work is
    /// done: free again once no other captured operation holds it.
    pub fn release_from_graph(&mut self, index: usize) {
        let e = &mut self.entries[index];
        debug_assert!(e.graph_holds > 0, "released more often than held");
        e.graph_holds = e.graph_holds.saturating_sub(1);
    }

    /// The job that took `index` is handed to the worker: the buffer is busy until the
    /// streams in `marks` pass their numbers. `reusable_on`: the stream that copies it, once
    /// the job is queued whole there (see the module's same-stream rule); `None` otherwise.
    pub fn handed_over(&mut self, index: usize, marks: &[(usize, u32)], reusable_on: Option<usize>) {
        let e = &mut self.entries[index];
        e.busy_until = marks.to_vec();
        e.reusable_on = reusable_on;
    }

    /// A job whose enqueue returned before its buffers reached the worker: nothing but the
    /// stream may still touch them, so they are free once the streams pass `marks`.
    pub fn abandoned_before_worker(&mut self, index: usize, marks: &[(usize, u32)]) {
        let e = &mut self.entries[index];
        e.held_by = None;
        e.busy_until = marks.to_vec();
        e.reusable_on = None;
    }

    /// Allows the same-stream rule for `index` (see [`StagingPool::handed_over`]) once a job
    /// handed over before its copies were queued has queued them whole.
    pub fn allow_same_stream(&mut self, index: usize, slot: usize) {
        let e = &mut self.entries[index];
        if !e.retired && e.graph_holds == 0 {
            e.reusable_on = Some(slot);
        }
    }

    /// The worker has finished job `job` with `index`; `retire`: it gave up while the engine
    /// may still write into the buffer, which is then never taken again.
    pub fn finished(&mut self, index: usize, job: u32, retire: bool) {
        let e = &mut self.entries[index];
        if retire {
            e.retired = true;
            e.reusable_on = None;
        } else if e.held_by == Some(job) {
            e.held_by = None;
        }
    }

    /// Buffers and bytes held.
    pub fn totals(&self) -> (usize, usize) {
        (self.entries.len(), self.entries.iter().map(|e| e.len).sum())
    }
}

/// Bytes of a new staging buffer for `len` bytes: a power of two, a page at least.
pub(super) fn staging_size(len: usize) -> usize {
    len.next_power_of_two().max(4096)
}

/// Whether a buffer of `have` bytes serves `len`: large enough, and at most one size class
/// above what a new one would be, so that a piece's flag block or a small operation never
/// ties up a large buffer that the next large operation then allocates again.
pub(super) fn serves(have: usize, len: usize) -> bool {
    have >= len && have <= 2 * staging_size(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    /// Out flags of four streams, all at `seq`.
    fn flags_at(seq: u32) -> impl Fn(usize) -> u32 {
        move |_| seq
    }

    #[test]
    fn buffers_held_by_graphs_are_taken_by_nothing_else_until_every_holder_releases_them() {
        let mut pool = StagingPool::new();
        let a = pool.add_for_graph((), 4096);
        // A second operation of the same capture shares it.
        let again = pool.hold_for_graph(a.index);
        assert_eq!(again.index, a.index);
        assert_eq!(pool.find(4096, None, flags_at(0)), None, "held by two captured operations");
        assert_eq!(pool.find(4096, Some(0), flags_at(0)), None, "not under the same-stream rule either");
        pool.release_from_graph(a.index);
        assert_eq!(pool.find(4096, None, flags_at(0)), None, "still held by one");
        pool.release_from_graph(a.index);
        assert_eq!(pool.find(4096, None, flags_at(0)), Some(a.index), "free once both graphs are gone");
        // A job's buffer, passed, may be held for a graph; then no job takes it.
        let j = pool.add((), 8192, 1);
        pool.handed_over(j.index, &[(0, 1)], Some(0));
        pool.finished(j.index, 1, false);
        assert_eq!(pool.find(8192, None, flags_at(1)), Some(j.index));
        pool.hold_for_graph(j.index);
        assert_eq!(pool.find(8192, None, flags_at(1)), None);
        assert_eq!(pool.find(8192, Some(0), flags_at(1)), None);
    }

    #[test]
    fn a_later_call_on_the_same_stream_reuses_buffers_still_in_flight() {
        let mut pool = StagingPool::new();
        // Job 1 on stream 0 takes a send and a receive buffer of 64 MiB.
        let send = pool.add((), 64 * MIB, 1);
        let recv = pool.add((), 64 * MIB, 1);
        // While it is being queued, nothing else may take them, not even on its own stream.
        assert_eq!(pool.find(64 * MIB, Some(0), flags_at(0)), None);
        pool.handed_over(send.index, &[(0, 1)], Some(0));
        pool.handed_over(recv.index, &[(0, 1)], Some(0));
        // Job 2 on stream 0, queued before job 1 has run: both buffers again, no new one.
        let a = pool.find(60 * MIB, Some(0), flags_at(0)).expect("same stream");
        let a = pool.take(a, 2);
        let b = pool.find(60 * MIB, Some(0), flags_at(0)).expect("same stream, second buffer");
        assert_ne!(a.index, b, "one job never gets one buffer twice");
        pool.take(b, 2);
        // Another stream must wait for the worker and stream 0's out flag.
        assert_eq!(pool.find(60 * MIB, Some(1), flags_at(0)), None);
        assert_eq!(pool.totals(), (2, 128 * MIB));
    }

    #[test]
    fn other_streams_wait_for_the_worker_and_every_stream_named() {
        let mut pool = StagingPool::new();
        let t = pool.add((), 4096, 7);
        // A group on streams 0 and 2; the buffer is copied on stream 2.
        pool.handed_over(t.index, &[(0, 7), (2, 7)], Some(2));
        let out = |at: [u32; 3]| move |s: usize| at[s];
        assert_eq!(pool.find(4096, Some(1), out([7, 0, 7])), None, "held by the worker");
        pool.finished(t.index, 7, false);
        assert_eq!(pool.find(4096, Some(1), out([7, 0, 6])), None, "stream 2 not past its out flag");
        assert_eq!(pool.find(4096, Some(1), out([6, 0, 7])), None, "stream 0 not past its out flag");
        assert_eq!(pool.find(4096, Some(1), out([7, 0, 7])), Some(t.index));
        assert_eq!(pool.find(4096, Some(2), out([0, 0, 0])), Some(t.index), "its own stream at once");
    }

    #[test]
    fn a_buffer_not_queued_whole_waits_for_its_streams_and_the_worker() {
        let mut pool = StagingPool::new();
        let t = pool.add((), 4096, 3);
        // Handed over without the same-stream rule (queuing failed part-way, or a flag block
        // the host resets at enqueue).
        pool.handed_over(t.index, &[(0, 3)], None);
        assert_eq!(pool.find(4096, Some(0), flags_at(2)), None);
        assert_eq!(pool.find(4096, Some(0), flags_at(3)), None, "the worker still holds it");
        pool.finished(t.index, 3, false);
        assert_eq!(pool.find(4096, Some(0), flags_at(2)), None);
        assert_eq!(pool.find(4096, Some(0), flags_at(3)), Some(t.index));
    }

    #[test]
    fn the_worker_finishing_an_earlier_job_leaves_a_later_holder_alone() {
        let mut pool = StagingPool::new();
        let t = pool.add((), 4096, 1);
        pool.handed_over(t.index, &[(0, 1)], Some(0));
        let again = pool.find(4096, Some(0), flags_at(0)).unwrap();
        pool.take(again, 2);
        pool.handed_over(again, &[(0, 2)], None);
        pool.finished(t.index, 1, false);
        // Job 2 still holds it: stream 0 passing job 2's out flag is not enough.
        assert_eq!(pool.find(4096, Some(1), flags_at(2)), None);
        pool.finished(t.index, 2, false);
        assert_eq!(pool.find(4096, Some(1), flags_at(2)), Some(t.index));
    }

    #[test]
    fn buffers_the_host_writes_at_enqueue_take_only_passed_ones() {
        let mut pool = StagingPool::new();
        // A small call's 4 KiB scalar or input, still in flight on stream 0.
        let t = pool.add((), 4096, 1);
        pool.handed_over(t.index, &[(0, 1)], Some(0));
        assert_eq!(pool.find(132, Some(0), flags_at(0)), Some(t.index), "a data buffer may share it");
        assert_eq!(pool.find(132, None, flags_at(0)), None, "a flag block reset now may not");
        pool.finished(t.index, 1, false);
        assert_eq!(pool.find(132, None, flags_at(1)), Some(t.index));
    }

    #[test]
    fn retired_buffers_are_never_taken_again() {
        let mut pool = StagingPool::new();
        let t = pool.add((), 4096, 1);
        pool.handed_over(t.index, &[(0, 1)], None);
        pool.finished(t.index, 1, true);
        pool.allow_same_stream(t.index, 0);
        assert_eq!(pool.find(4096, Some(0), flags_at(100)), None);
    }

    #[test]
    fn buffers_abandoned_before_the_worker_are_free_once_the_stream_passes() {
        let mut pool = StagingPool::new();
        let t = pool.add((), 4096, 5);
        pool.abandoned_before_worker(t.index, &[(1, 5)]);
        assert_eq!(pool.find(4096, Some(1), flags_at(4)), None);
        assert_eq!(pool.find(4096, Some(1), flags_at(5)), Some(t.index));
    }

    #[test]
    fn small_requests_do_not_take_large_buffers_and_the_smallest_fit_wins() {
        assert!(serves(4096, 8));
        assert!(!serves(64 * MIB, 8));
        assert!(serves(256 * MIB, 70_000_000));
        assert!(!serves(64 * MIB, 70_000_000));
        let mut pool = StagingPool::new();
        let big = pool.add((), 8 * MIB, 1);
        let small = pool.add((), 4 * MIB, 1);
        for t in [&big, &small] {
            pool.handed_over(t.index, &[(0, 1)], Some(0));
        }
        assert_eq!(pool.find(3 * MIB, Some(0), flags_at(0)), Some(small.index));
        assert_eq!(pool.find(5 * MIB, Some(0), flags_at(0)), Some(big.index));
        assert_eq!(pool.find(4096, Some(0), flags_at(0)), None);
        assert_eq!(staging_size(3 << 20), 4 << 20);
        assert_eq!(staging_size(8), 4096);
    }
}
