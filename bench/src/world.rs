//! Rendezvous between the benchmark's ranks: threads of this process through shared memory, and
//! processes through [`Procs`] (MPI; thread 0, the main thread, makes every MPI call:
//! `MPI_THREAD_FUNNELED`).

use std::sync::{Barrier, Mutex};

use crate::procs::{Procs, ReduceOp};

/// How `-a` combines per-rank times (nccl-tests' `Allreduce` modes).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Combine {
    Rank0,
    Avg,
    Min,
    Max,
    Sum,
}

impl Combine {
    pub fn from_average(a: u8) -> Combine {
        match a {
            0 => Combine::Rank0,
            2 => Combine::Min,
            3 => Combine::Max,
            _ => Combine::Avg,
        }
    }

    /// The reduction over ranks (None: rank 0's own value, no reduction).
    fn reduce_op(self) -> Option<ReduceOp> {
        match self {
            Combine::Rank0 => None,
            Combine::Avg | Combine::Sum => Some(ReduceOp::Sum),
            Combine::Min => Some(ReduceOp::Min),
            Combine::Max => Some(ReduceOp::Max),
        }
    }
}

pub struct World {
    pub nprocs: usize,
    pub proc_: usize,
    pub nthreads: usize,
    barrier: Barrier,
    slots: Mutex<Vec<f64>>,
    result: Mutex<f64>,
    procs: Procs,
}

impl World {
    pub fn new(nthreads: usize, procs: Procs) -> World {
        World {
            nprocs: procs.nprocs(),
            proc_: procs.index(),
            nthreads,
            barrier: Barrier::new(nthreads),
            slots: Mutex::new(vec![0.0; nthreads]),
            result: Mutex::new(0.0),
            procs,
        }
    }

    pub fn nranks(&self) -> usize {
        self.nprocs * self.nthreads
    }

    pub fn rank_of(&self, thread: usize) -> usize {
        self.proc_ * self.nthreads + thread
    }

    /// Every rank of every process waits here.
    pub fn barrier(&self, thread: usize) {
        self.barrier.wait();
        if thread == 0 {
            self.procs.barrier();
        }
        self.barrier.wait();
    }

    /// Combines one value per rank; every rank gets the result. With `Rank0` each process keeps
    /// its own thread 0's value (as nccl-tests does: no MPI reduction).
    pub fn allreduce(&self, thread: usize, value: f64, how: Combine) -> f64 {
        self.slots.lock().unwrap()[thread] = value;
        self.barrier.wait();
        if thread == 0 {
            let slots = self.slots.lock().unwrap();
            let global = match how.reduce_op() {
                None => slots[0],
                Some(op) => self.procs.allreduce(op.apply(slots.iter().copied()), op),
            };
            let global = if how == Combine::Avg { global / self.nranks() as f64 } else { global };
            *self.result.lock().unwrap() = global;
        }
        self.barrier.wait();
        let r = *self.result.lock().unwrap();
        self.barrier.wait();
        r
    }

    /// Process 0 receives every process's `text` (in process order); others get None.
    /// Called by thread 0 only, outside the benchmark threads.
    pub fn gather_text(&self, text: &str) -> Option<Vec<String>> {
        let all = self.procs.gather(text.as_bytes())?;
        Some(all.iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect())
    }

    /// Process 0's bytes, given to every process (thread 0 only).
    pub fn broadcast_bytes(&self, bytes: &mut [u8]) {
        self.procs.broadcast(bytes);
    }

    /// One value from every process, in process order (thread 0 only).
    pub fn allgather_u64(&self, value: u64) -> Vec<u64> {
        self.procs.allgather_u64(value)
    }

    /// Sum of one integer per process (thread 0 only).
    pub fn sum_procs(&self, value: f64) -> f64 {
        self.procs.allreduce(value, ReduceOp::Sum)
    }

    /// Aborts every process (MPI_Abort under MPI, else exit).
    pub fn abort(&self, code: i32) -> ! {
        self.procs.abort(code)
    }
}
