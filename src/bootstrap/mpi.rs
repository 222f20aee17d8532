//! Communicators straight from MPI communicators: rank 0 makes a unique id and broadcasts it
//! over a duplicate of the caller's communicator (the caller's own is never touched, and MPI
//! is never initialised or finalised here).

use crate::error::{Error, Result};

/// (rank, size, unique id bytes) for the MPI communicator with Fortran handle `fcomm`.
#[cfg(feature = "mpi")]
pub fn exchange_id(
    fcomm: std::ffi::c_int,
    make_id: impl FnOnce() -> Result<[u8; 128]>,
) -> Result<(usize, usize, [u8; 128])> {
    use mpi::raw::FromRaw;
    use mpi::topology::SimpleCommunicator;
    use mpi::traits::{Communicator, Root};

    if !mpi::environment::is_initialized() || mpi::environment::is_finalized() {
        return Err(Error::invalid_usage("ferrocclCommInitMpi: MPI is not initialized (call MPI_Init first)"));
    }
    // SAFETY: MPI is initialised; MPI_Comm_f2c accepts any handle value and returns
    // MPI_COMM_NULL for invalid ones, which we check before use.
    let raw = unsafe { mpi::ffi::MPI_Comm_f2c(fcomm) };
    // SAFETY: reading an extern static handle constant of the MPI library.
    let null = unsafe { mpi::ffi::RSMPI_COMM_NULL };
    if raw == null {
        return Err(Error::invalid_argument(format!(
            "ferrocclCommInitMpi: MPI communicator handle {fcomm} is MPI_COMM_NULL or invalid"
        )));
    }
    let mut dup = null;
    // SAFETY: raw is a valid communicator; dup receives a new one we own.
    let rc = unsafe { mpi::ffi::MPI_Comm_dup(raw, &mut dup) };
    if rc != 0 {
        return Err(Error::invalid_argument(format!("ferrocclCommInitMpi: MPI_Comm_dup failed with code {rc}")));
    }
    // SAFETY: dup is a communicator we own; SimpleCommunicator frees it on drop.
    let comm = unsafe { SimpleCommunicator::from_raw(dup) };
    let (rank, size) = (comm.rank() as usize, comm.size() as usize);
    let mut id = [0u8; 128];
    // Rank 0's failure must not leave the others waiting: broadcast a status byte first.
    let mut status = [0u8; 1];
    let mut err = None;
    if rank == 0 {
        match make_id() {
            Ok(b) => id = b,
            Err(e) => {
                status[0] = 1;
                err = Some(e);
            }
        }
    }
    comm.process_at_rank(0).broadcast_into(&mut status[..]);
    if status[0] != 0 {
        return Err(err.unwrap_or_else(|| Error::remote("ferrocclCommInitMpi: rank 0 could not create the unique id")));
    }
    comm.process_at_rank(0).broadcast_into(&mut id[..]);
    Ok((rank, size, id))
}

#[cfg(not(feature = "mpi"))]
pub fn exchange_id(
    _fcomm: std::ffi::c_int,
    _make_id: impl FnOnce() -> Result<[u8; 128]>,
) -> Result<(usize, usize, [u8; 128])> {
    Err(Error::invalid_usage(
        "ferrocclCommInitMpi: ferroccl was built without MPI support (build with mpicc on PATH or MPI=1)",
    ))
}
