//! Rendezvous between the benchmark's processes: none (one process), MPI, or, for a `--canary`
//! phase under mpirun, a relay to the phase's parent process, which makes the MPI calls for
//! it (a phase process is not an MPI process: see canary.rs and relay.rs).
//!
//! Only one thread of a process calls these (thread 0, the one that initialised MPI:
//! `MPI_THREAD_FUNNELED`).

use crate::relay;

/// How values from every process are combined.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ReduceOp {
    Sum,
    Min,
    Max,
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
        }
    }

    pub fn parse(s: &str) -> Option<ReduceOp> {
        [ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max].into_iter().find(|op| op.name() == s)
    }

    /// The operation on values already at hand (one process, or a relay's test).
    pub fn apply(self, values: impl IntoIterator<Item = f64>) -> f64 {
        let values = values.into_iter();
        match self {
            ReduceOp::Sum => values.sum(),
            ReduceOp::Min => values.fold(f64::INFINITY, f64::min),
            ReduceOp::Max => values.fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

#[cfg(feature = "mpi")]
pub struct Mpi {
    pub comm: mpi::topology::SimpleCommunicator,
}

pub enum Procs {
    /// This process is the whole run.
    Single,
    #[cfg(feature = "mpi")]
    Mpi(Mpi),
    /// A canary phase under MPI: its parent process makes the MPI calls.
    Relay(relay::Client),
}

// SAFETY: the MPI communicator is only used by thread 0, which is the thread that initialised
// MPI (MPI_THREAD_FUNNELED); other threads only carry the reference. The relay client is
// behind a mutex.
unsafe impl Sync for Procs {}
// SAFETY: as for Sync: only thread 0 makes MPI calls through it.
unsafe impl Send for Procs {}

impl Procs {
    pub fn nprocs(&self) -> usize {
        match self {
            Procs::Single => 1,
            #[cfg(feature = "mpi")]
            Procs::Mpi(m) => {
                use mpi::traits::*;
                m.comm.size() as usize
            }
            Procs::Relay(r) => r.nprocs(),
        }
    }

    /// This process's index.
    pub fn index(&self) -> usize {
        match self {
            Procs::Single => 0,
            #[cfg(feature = "mpi")]
            Procs::Mpi(m) => {
                use mpi::traits::*;
                m.comm.rank() as usize
            }
            Procs::Relay(r) => r.index(),
        }
    }

    pub fn barrier(&self) {
        match self {
            Procs::Single => {}
            #[cfg(feature = "mpi")]
            Procs::Mpi(m) => {
                use mpi::traits::*;
                m.comm.barrier();
            }
            Procs::Relay(r) => r.barrier(),
        }
    }

    /// `value` combined over processes; every process gets the result.
    pub fn allreduce(&self, value: f64, op: ReduceOp) -> f64 {
        match self {
            Procs::Single => value,
            #[cfg(feature = "mpi")]
            Procs::Mpi(m) => {
                use mpi::collective::SystemOperation;
                use mpi::traits::*;
                let mpi_op = match op {
                    ReduceOp::Sum => SystemOperation::sum(),
                    ReduceOp::Min => SystemOperation::min(),
                    ReduceOp::Max => SystemOperation::max(),
                };
                let mut out = 0.0f64;
                m.comm.all_reduce_into(&value, &mut out, mpi_op);
                out
            }
            Procs::Relay(r) => r.allreduce(value, op),
        }
    }

    /// Process 0 receives every process's bytes, in process order; the others get None.
    pub fn gather(&self, bytes: &[u8]) -> Option<Vec<Vec<u8>>> {
        match self {
            Procs::Single => Some(vec![bytes.to_vec()]),
            #[cfg(feature = "mpi")]
            Procs::Mpi(m) => mpi_gather(&m.comm, bytes),
            Procs::Relay(r) => r.gather(bytes),
        }
    }

    /// Process 0's bytes, given to every process (same length everywhere).
    pub fn broadcast(&self, bytes: &mut [u8]) {
        match self {
            Procs::Single => {}
            #[cfg(feature = "mpi")]
            Procs::Mpi(m) => {
                use mpi::traits::*;
                m.comm.process_at_rank(0).broadcast_into(bytes);
            }
            Procs::Relay(r) => r.broadcast(bytes),
        }
    }

    /// One value from every process, in process order.
    pub fn allgather_u64(&self, value: u64) -> Vec<u64> {
        match self {
            Procs::Single => vec![value],
            #[cfg(feature = "mpi")]
            Procs::Mpi(m) => {
                use mpi::traits::*;
                let mut out = vec![0u64; m.comm.size() as usize];
                m.comm.all_gather_into(&value, &mut out[..]);
                out
            }
            Procs::Relay(r) => r.allgather_u64(value),
        }
    }

    /// Ends every process: MPI_Abort under MPI; a relayed phase just exits (its parent sees it
    /// and aborts the job).
    pub fn abort(&self, code: i32) -> ! {
        #[cfg(feature = "mpi")]
        if let Procs::Mpi(m) = self {
            use mpi::traits::*;
            m.comm.abort(code);
        }
        std::process::exit(code)
    }
}

/// Variable-length gather: the lengths first, then the bytes.
#[cfg(feature = "mpi")]
fn mpi_gather(comm: &mpi::topology::SimpleCommunicator, bytes: &[u8]) -> Option<Vec<Vec<u8>>> {
    use mpi::datatype::PartitionMut;
    use mpi::traits::*;
    use mpi::Count;
    let root = comm.process_at_rank(0);
    let len = bytes.len() as Count;
    if comm.rank() != 0 {
        root.gather_into(&len);
        root.gather_varcount_into(bytes);
        return None;
    }
    let mut lens = vec![0 as Count; comm.size() as usize];
    root.gather_into_root(&len, &mut lens[..]);
    let displs: Vec<Count> = lens.iter().scan(0, |at, &n| Some(std::mem::replace(at, *at + n))).collect();
    let mut all = vec![0u8; lens.iter().sum::<Count>() as usize];
    root.gather_varcount_into_root(bytes, &mut PartitionMut::new(&mut all[..], &lens[..], &displs[..]));
    Some(lens.iter().zip(&displs).map(|(&n, &at)| all[at as usize..(at + n) as usize].to_vec()).collect())
}

/// This process's MPI environment, when it has one (MPI_Finalize on drop). Declare it before
/// anything that holds its communicator, so that it is dropped last.
pub struct MpiSession {
    #[cfg(feature = "mpi")]
    universe: Option<mpi::environment::Universe>,
}

impl MpiSession {
    pub fn start(use_mpi: bool) -> Result<MpiSession, String> {
        if use_mpi && !cfg!(feature = "mpi") {
            return Err("this build has no MPI support (build with --features mpi)".into());
        }
        #[cfg(feature = "mpi")]
        let universe = if use_mpi {
            let (u, _level) = mpi::initialize_with_threading(mpi::Threading::Funneled)
                .ok_or("MPI is already initialised".to_string())?;
            Some(u)
        } else {
            None
        };
        Ok(MpiSession {
            #[cfg(feature = "mpi")]
            universe,
        })
    }

    /// The processes of this run as MPI sees them (one without MPI).
    pub fn procs(&self) -> Procs {
        #[cfg(feature = "mpi")]
        if let Some(u) = &self.universe {
            return Procs::Mpi(Mpi { comm: u.world() });
        }
        Procs::Single
    }
}
