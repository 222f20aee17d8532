//! The order in which ranks that are threads of one process submit their stream work.
//!
//! CUDA feeds the streams of one context to the GPU through a few hardware queues
//! (`CUDA_DEVICE_MAX_CONNECTIONS`, 8 by default): streams share them, and work on a shared
//! queue runs in the order it was submitted. A stream that waits on a flag then holds up
//! everything submitted after it on its queue, whatever stream that belongs to. Ranks in
//! separate processes have contexts, and queues, of their own. Ranks that are threads of one
//! process do not: if one rank submits a wait before a process mate has submitted the work that
//! wait depends on (the copy-in its worker needs, the flag write rank 0's kernel waits for),
//! and their streams share a queue, both stop for good. The GPU tests with rank threads stopped
//! now and then this way (rounds 19-23 on the H200; with one hardware queue, every time).
//!
//! So, within one process, nobody submits a wait for an operation before every process mate
//! it depends on has submitted its share of that operation. Then the earliest-submitted wait
//! that is still blocked only depends on work submitted before it, which cannot be held up by
//! a later wait: no cycle. Ranks publish how far they got in a table shared by the ranks of a
//! communicator in this process, and wait for each other on the host (a few microseconds; a
//! process with one rank of the communicator skips all of it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::comm::{Comm, CommState};
use crate::error::{Error, Result};

/// Which matching operations a table counts: the one-GPU path's (sequence numbers every rank
/// shares), the staged path's (per pair of ranks, as point-to-point operations involve two) or
/// the device point-to-point path's (per pair, two turns per group: `device_p2p`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Path {
    OneGpu,
    Staged,
    DeviceP2p,
}

/// `submitted[row(a) * nranks + b]`: how many operations involving `b` rank `a` (a rank of
/// this process) has submitted its share of (one-GPU path: the last sequence number, in
/// column 0).
struct Table {
    submitted: Vec<AtomicU64>,
}

/// One rank's view: its process mates and the shared table.
pub struct LocalOrder {
    rank: usize,
    nranks: usize,
    /// Ranks of the communicator in this process, in rank order (this one included).
    local: Vec<usize>,
    table: Arc<Table>,
    /// Staged path: operations this rank has counted with each rank.
    counted: Mutex<Vec<u64>>,
    /// One-GPU path: operations this rank has ordered (64 bits: the path's own 32-bit sequence
    /// numbers wrap within hours of small operations).
    ordered: AtomicU64,
}

/// The tables of this process, by communicator (hash, magic) and path.
type Tables = Mutex<HashMap<(u64, u64, Path), Weak<Table>>>;

fn tables() -> &'static Tables {
    static TABLES: std::sync::OnceLock<Tables> = std::sync::OnceLock::new();
    TABLES.get_or_init(|| Mutex::new(HashMap::new()))
}

impl LocalOrder {
    /// `None` when no other rank of `comm` is a thread of this process (nothing to order).
    pub fn new(comm: &Comm, path: Path) -> Option<LocalOrder> {
        let me = comm.peers.get(comm.rank)?;
        let local: Vec<usize> =
            comm.peers.iter().filter(|p| p.pid == me.pid && p.host_hash == me.host_hash).map(|p| p.rank).collect();
        if local.len() < 2 {
            return None;
        }
        let n = comm.nranks;
        let mut all = tables().lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|_, t| t.strong_count() > 0);
        let key = (comm.comm_hash, comm.magic, path);
        let table = all.get(&key).and_then(Weak::upgrade).unwrap_or_else(|| {
            let t = Arc::new(Table { submitted: (0..local.len() * n).map(|_| AtomicU64::new(0)).collect() });
            all.insert(key, Arc::downgrade(&t));
            t
        });
        Some(LocalOrder {
            rank: comm.rank,
            nranks: n,
            local,
            table,
            counted: Mutex::new(vec![0; n]),
            ordered: AtomicU64::new(0),
        })
    }

    /// The staged path's order for `comm`, made once and kept with the communicator (`None`:
    /// nothing to order).
    pub fn staged(comm: &Comm) -> Option<Arc<LocalOrder>> {
        comm.with_layer_state(|s: &mut super::LayerState| {
            s.staged_order.get_or_insert_with(|| LocalOrder::new(comm, Path::Staged).map(Arc::new)).clone()
        })
    }

    /// The device point-to-point path's order for `comm`, as [`LocalOrder::staged`].
    pub fn device_p2p(comm: &Comm) -> Option<Arc<LocalOrder>> {
        comm.with_layer_state(|s: &mut super::LayerState| {
            s.p2p_order.get_or_insert_with(|| LocalOrder::new(comm, Path::DeviceP2p).map(Arc::new)).clone()
        })
    }

    fn row(&self, rank: usize) -> Option<usize> {
        self.local.iter().position(|&r| r == rank)
    }

    fn word(&self, a: usize, b: usize) -> Option<&AtomicU64> {
        self.row(a).map(|row| &self.table.submitted[row * self.nranks + b])
    }

    /// The ranks of the communicator in this process, this one included.
    pub fn local_ranks(&self) -> &[usize] {
        &self.local
    }

    /// One-GPU path: the number of this rank's next ordered operation (every rank orders the
    /// same operations: all of them but graph captures, which all ranks make alike).
    pub fn next_op(&self) -> u64 {
        self.ordered.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// One-GPU path: this rank has submitted its share of operation `seq`.
    pub fn publish_seq(&self, seq: u64) {
        if let Some(w) = self.word(self.rank, 0) {
            w.fetch_max(seq, Ordering::AcqRel);
        }
    }

    /// One-GPU path: waits until each of `ranks` (process mates) has submitted its share of
    /// operation `seq`.
    pub fn wait_seq(&self, comm: &Comm, ranks: &[usize], seq: u64) -> Result<()> {
        self.wait(&|| comm.state() == CommState::Aborted, || {
            ranks.iter().all(|&r| self.word(r, 0).is_none_or(|w| w.load(Ordering::Acquire) >= seq))
        })
    }

    /// Staged path: counts one operation with each of `partners` (every rank for a collective,
    /// the peer for a send or receive) and returns, per partner, the count it reaches.
    pub fn count(&self, partners: impl Iterator<Item = usize>) -> Vec<(usize, u64)> {
        let mut counted = self.counted.lock().unwrap_or_else(|p| p.into_inner());
        partners
            .filter(|&p| p != self.rank && p < self.nranks)
            .map(|p| {
                counted[p] += 1;
                (p, counted[p])
            })
            .collect()
    }

    /// Device point-to-point path: the count this rank has reached with `partner`.
    pub fn counted_with(&self, partner: usize) -> u64 {
        self.counted.lock().unwrap_or_else(|p| p.into_inner()).get(partner).copied().unwrap_or(0)
    }

    /// Device point-to-point path: counts one operation with each partner, starting from the
    /// larger of this rank's count with it and `floor` (the partner's own count, which it sent):
    /// both ranks of a pair reach the same count, even after one of them skipped a group.
    pub fn count_from(&self, partners: impl Iterator<Item = (usize, u64)>) -> Vec<(usize, u64)> {
        let mut counted = self.counted.lock().unwrap_or_else(|p| p.into_inner());
        partners
            .filter(|&(p, _)| p != self.rank && p < self.nranks)
            .map(|(p, floor)| {
                counted[p] = counted[p].max(floor) + 1;
                (p, counted[p])
            })
            .collect()
    }

    /// Staged path: this rank has submitted its share of the counted operations.
    pub fn publish_counts(&self, counts: &[(usize, u64)]) {
        for &(p, k) in counts {
            if let Some(w) = self.word(self.rank, p) {
                w.fetch_max(k, Ordering::AcqRel);
            }
        }
    }

    /// Staged and device point-to-point paths: waits until every partner in this process has
    /// submitted its share of as many operations with this rank as this rank counted with it.
    pub fn wait_counts(&self, comm: &Comm, counts: &[(usize, u64)]) -> Result<()> {
        self.wait_counts_unless(&|| comm.state() == CommState::Aborted, counts)
    }

    pub fn wait_counts_unless(&self, aborted: &dyn Fn() -> bool, counts: &[(usize, u64)]) -> Result<()> {
        self.wait(aborted, || {
            counts.iter().all(|&(p, k)| self.word(p, self.rank).is_none_or(|w| w.load(Ordering::Acquire) >= k))
        })
    }

    /// Spins, then yields, until `done`; fails when the communicator is aborted, or after
    /// FERROCCL_TIMEOUT without it (mates submit within microseconds unless calls mismatch).
    fn wait(&self, aborted: &dyn Fn() -> bool, done: impl Fn() -> bool) -> Result<()> {
        let start = Instant::now();
        let mut spins = 0u32;
        while !done() {
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
                continue;
            }
            if aborted() {
                return Err(crate::interrupt::aborted("device operation"));
            }
            if crate::interrupt::progress_timeout().is_some_and(|t| start.elapsed() > t) {
                return Err(Error::Timeout(format!(
                    "rank {}: a rank of this process (ranks {:?}) never queued its part of the same device \
                     operation on its stream (FERROCCL_TIMEOUT)",
                    self.rank, self.local
                )));
            }
            if spins < 100_000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        Ok(())
    }
}

/// The views of ranks `local` of an `nranks`-rank communicator, threads of one process, sharing
/// a table (for tests of the paths that use it).
#[cfg(test)]
pub(crate) fn ranks_of_one_process(local: &[usize], nranks: usize) -> Vec<LocalOrder> {
    let table = Arc::new(Table { submitted: (0..local.len() * nranks).map(|_| AtomicU64::new(0)).collect() });
    local
        .iter()
        .map(|&rank| LocalOrder {
            rank,
            nranks,
            local: local.to_vec(),
            table: table.clone(),
            counted: Mutex::new(vec![0; nranks]),
            ordered: AtomicU64::new(0),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranks 0 and 2 of 3 are threads of this process, rank 1 is elsewhere: a rank waits for its
    /// process mate's share of the same operations, never for a rank of another process.
    #[test]
    fn a_rank_waits_for_its_mates_share_only() {
        let mut ranks = ranks_of_one_process(&[0, 2], 3).into_iter();
        let (r0, r2) = (ranks.next().unwrap(), ranks.next().unwrap());
        let never = || false;
        // A send to rank 1 (another process) and a collective: only rank 2 is waited for.
        let to_remote = r0.count([1].into_iter());
        assert_eq!(to_remote, vec![(1, 1)]);
        r0.wait_counts_unless(&never, &to_remote).expect("a remote partner is not waited for");
        let coll = r0.count(0..3);
        assert_eq!(coll, vec![(1, 2), (2, 1)]);
        r0.publish_counts(&coll);
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            let mine = r2.count(0..3);
            assert_eq!(mine, vec![(0, 1), (1, 1)]);
            r2.publish_counts(&mine);
            r2
        });
        let t = Instant::now();
        r0.wait_counts_unless(&never, &coll).expect("mate published");
        assert!(t.elapsed() >= Duration::from_millis(25), "returned before the mate published");
        let r2 = late.join().unwrap();
        // Rank 2 sees rank 0's share at once; the one-GPU sequence numbers likewise.
        r2.wait_counts_unless(&never, &[(0, 1)]).unwrap();
        r0.publish_seq(7);
        r2.wait(&never, || r2.word(0, 0).unwrap().load(Ordering::Acquire) >= 7).unwrap();
        // The device point-to-point path counts on from the larger of both sides' counts: a
        // rank that missed a group (count 1 behind) catches up with its mate's floor.
        assert_eq!(r0.counted_with(2), 1);
        assert_eq!(r0.count_from([(2, 3)].into_iter()), vec![(2, 4)]);
        assert_eq!(r0.count_from([(2, 0), (0, 9)].into_iter()), vec![(2, 5)], "itself is never counted");
        assert_eq!(r2.count_from([(0, 4)].into_iter()), vec![(0, 5)], "rank 2 (at 1) meets rank 0's count");
        // An abort ends a wait that would never end.
        let e = r2.wait_counts_unless(&|| true, &[(0, 5)]).unwrap_err();
        assert!(e.to_string().contains("aborted"), "{e}");
    }
}
