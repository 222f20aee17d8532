//! Rendezvous between the benchmark's ranks: threads of this process through shared memory, and
//! processes through MPI (thread 0, the main thread, makes every MPI call: `MPI_THREAD_FUNNELED`).

use std::sync::{Barrier, Mutex};

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
}

#[cfg(feature = "mpi")]
pub struct Mpi {
    pub comm: mpi::topology::SimpleCommunicator,
}

// SAFETY: the communicator is only used by thread 0, which is the thread that initialised MPI
// (MPI_THREAD_FUNNELED); other threads only carry the reference.
#[cfg(feature = "mpi")]
unsafe impl Sync for Mpi {}
// SAFETY: as for Sync: only thread 0 makes MPI calls through it.
#[cfg(feature = "mpi")]
unsafe impl Send for Mpi {}

pub struct World {
    pub nprocs: usize,
    pub proc_: usize,
    pub nthreads: usize,
    barrier: Barrier,
    slots: Mutex<Vec<f64>>,
    result: Mutex<f64>,
    #[cfg(feature = "mpi")]
    pub mpi: Option<Mpi>,
}

impl World {
    pub fn new(nprocs: usize, proc_: usize, nthreads: usize, #[cfg(feature = "mpi")] mpi: Option<Mpi>) -> World {
        World {
            nprocs,
            proc_,
            nthreads,
            barrier: Barrier::new(nthreads),
            slots: Mutex::new(vec![0.0; nthreads]),
            result: Mutex::new(0.0),
            #[cfg(feature = "mpi")]
            mpi,
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
            #[cfg(feature = "mpi")]
            if let Some(m) = &self.mpi {
                use mpi::traits::*;
                m.comm.barrier();
            }
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
            let local = match how {
                Combine::Rank0 => slots[0],
                Combine::Avg | Combine::Sum => slots.iter().sum(),
                Combine::Min => slots.iter().copied().fold(f64::INFINITY, f64::min),
                Combine::Max => slots.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            };
            #[allow(unused_mut)]
            let mut global = local;
            #[cfg(feature = "mpi")]
            if let (Some(m), false) = (&self.mpi, how == Combine::Rank0) {
                use mpi::collective::SystemOperation;
                use mpi::traits::*;
                let op = match how {
                    Combine::Min => SystemOperation::min(),
                    Combine::Max => SystemOperation::max(),
                    _ => SystemOperation::sum(),
                };
                m.comm.all_reduce_into(&local, &mut global, op);
            }
            if how == Combine::Avg {
                global /= self.nranks() as f64;
            }
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
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            use mpi::traits::*;
            const LINE: usize = 8192;
            let mut mine = vec![0u8; LINE];
            let b = text.as_bytes();
            let n = b.len().min(LINE - 1);
            mine[..n].copy_from_slice(&b[..n]);
            let root = m.comm.process_at_rank(0);
            if self.proc_ == 0 {
                let mut all = vec![0u8; LINE * self.nprocs];
                root.gather_into_root(&mine[..], &mut all[..]);
                return Some(
                    all.chunks(LINE)
                        .map(|c| {
                            let end = c.iter().position(|&x| x == 0).unwrap_or(c.len());
                            String::from_utf8_lossy(&c[..end]).into_owned()
                        })
                        .collect(),
                );
            }
            root.gather_into(&mine[..]);
            return None;
        }
        Some(vec![text.to_string()])
    }

    /// Process 0's bytes, given to every process (thread 0 only).
    pub fn broadcast_bytes(&self, bytes: &mut [u8]) {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            use mpi::traits::*;
            m.comm.process_at_rank(0).broadcast_into(bytes);
        }
        let _ = bytes;
    }

    /// One value from every process, in process order (thread 0 only).
    pub fn allgather_u64(&self, value: u64) -> Vec<u64> {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            use mpi::traits::*;
            let mut out = vec![0u64; self.nprocs];
            m.comm.all_gather_into(&value, &mut out[..]);
            return out;
        }
        vec![value]
    }

    /// Sum of one integer per process (thread 0 only).
    pub fn sum_procs(&self, value: f64) -> f64 {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            use mpi::collective::SystemOperation;
            use mpi::traits::*;
            let mut out = 0.0f64;
            m.comm.all_reduce_into(&value, &mut out, SystemOperation::sum());
            return out;
        }
        value
    }

    /// Aborts every process (MPI_Abort under MPI, else exit).
    pub fn abort(&self, code: i32) -> ! {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            use mpi::traits::*;
            m.comm.abort(code);
        }
        std::process::exit(code)
    }
}
