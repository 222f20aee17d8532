//! Communicator creation and teardown.

use std::ffi::c_int;

use super::{boundary, boundary_progress, non_null};
use crate::bootstrap::{self, UniqueId};
use crate::comm::{self, Comm, Entry};
use crate::config::{self, CommConfig};
use crate::coverage::Coverage;
use crate::creation::{self, Make, Request};
use crate::error::{Error, Result};
use crate::group::Progress;
use crate::interrupt::Interrupt;
use crate::types::{ncclComm_t, ncclConfig_t, ncclResult_t, ncclUniqueId, NCCL_SPLIT_NOCOLOR};

/// Generates an id to be given to every rank before ncclCommInitRank. Starts the rendezvous
/// root in this process.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ncclResult_t {
    boundary("ncclGetUniqueId", || {
        non_null(uniqueId, "ncclGetUniqueId", "uniqueId")?;
        crate::encryption::freeze();
        crate::debug::version_banner(&crate::version::banner());
        let id = match bootstrap::env_unique_id()? {
            Some(id) => id,
            None => bootstrap::create_unique_id()?,
        };
        // SAFETY: checked non-null; the caller provides a writable ncclUniqueId.
        unsafe { uniqueId.write(ncclUniqueId::from_bytes(&id.encode())) };
        Ok(())
    })
}

/// Creates a communicator with a configuration (multi-process or multi-thread). A
/// non-blocking one (config.blocking = 0 or NCCL_COMM_BLOCKING=0) returns ncclInProgress at
/// once with a valid handle; poll ncclCommGetAsyncError until it returns ncclSuccess.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommInitRankConfig(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    boundary_progress("ncclCommInitRankConfig", || {
        // SAFETY: config is NULL or a caller-initialised ncclConfig_t.
        let cfg = unsafe { parse_config(config) }?;
        init_rank_checked("ncclCommInitRankConfig", comm, nranks, &commId, rank, cfg, true)
    })
}

/// Creates a communicator (multi-process or multi-thread). As in NCCL, outside a group it
/// returns once the communicator exists, even when NCCL_COMM_BLOCKING=0.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    boundary_progress("ncclCommInitRank", || {
        init_rank_checked("ncclCommInitRank", comm, nranks, &commId, rank, config::from_environment(), false)
    })
}

/// Creates `ndev` communicators in this process, one per rank (ranks are threads). Returns
/// once they exist, also when NCCL_COMM_BLOCKING=0 makes them non-blocking.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommInitAll(comm: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> ncclResult_t {
    boundary("ncclCommInitAll", || {
        non_null(comm, "ncclCommInitAll", "comm")?;
        if ndev < 1 {
            return Err(Error::invalid_argument(format!("ncclCommInitAll: ndev {ndev} must be at least 1")));
        }
        let n = ndev as usize;
        let devs: Vec<c_int> = if devlist.is_null() {
            (0..ndev).collect()
        } else {
            // SAFETY: the caller passes ndev device numbers.
            unsafe { std::slice::from_raw_parts(devlist, n) }.to_vec()
        };
        crate::encryption::freeze();
        let id = bootstrap::create_unique_id()?;
        let cuda_program = crate::cuda::driver::current_context().is_some();
        let threads: Vec<_> = devs
            .into_iter()
            .enumerate()
            .map(|(rank, dev)| {
                std::thread::Builder::new().name("ferroccl-init".into()).spawn(move || {
                    let comm = Comm::init_rank(&id, n, rank, config::from_environment(), dev, Interrupt::new())?;
                    if cuda_program {
                        prepare_device_kernels(crate::cuda::driver::primary_context(dev));
                    }
                    Ok(comm)
                })
            })
            .collect::<std::io::Result<_>>()
            .map_err(|e| Error::system("spawn init thread", e))?;
        let mut comms = Vec::with_capacity(n);
        for t in threads {
            comms.push(t.join().unwrap_or_else(|_| Err(Error::internal("init thread panicked")))?);
        }
        for (i, c) in comms.into_iter().enumerate() {
            // SAFETY: the caller provides room for ndev handles.
            unsafe { comm.add(i).write(comm::register_handle(c)) };
        }
        Ok(())
    })
}

/// Creates a communicator from several ids (NCCL spreads the rendezvous over them; ferroccl
/// currently rendezvouses at the first). Non-blocking as ncclCommInitRankConfig.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommInitRankScalable(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    myrank: c_int,
    nId: c_int,
    commIds: *mut ncclUniqueId,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    boundary_progress("ncclCommInitRankScalable", || {
        non_null(commIds, "ncclCommInitRankScalable", "commIds")?;
        if nId < 1 || nId > nranks.max(1) {
            return Err(Error::invalid_argument(format!("ncclCommInitRankScalable: nId {nId} must be in 1..=nranks")));
        }
        // SAFETY: config is NULL or a caller-initialised ncclConfig_t.
        let cfg = unsafe { parse_config(config) }?;
        // SAFETY: commIds holds nId ids; we read the first.
        let first = unsafe { commIds.read() };
        init_rank_checked("ncclCommInitRankScalable", newcomm, nranks, &first, myrank, cfg, true)
    })
}

/// Reads and resolves an optional config (NULL: NCCL_CONFIG_INITIALIZER's, then the
/// environment).
///
/// # Safety
/// `config` must be NULL or point to a caller-initialised ncclConfig_t.
pub(crate) unsafe fn parse_config(config: *const ncclConfig_t) -> Result<CommConfig> {
    if config.is_null() {
        return Ok(config::from_environment());
    }
    // SAFETY: forwarded from the caller.
    let raw = unsafe { config::read_config(config) }?;
    // SAFETY: string fields of a caller-initialised config are NULL or valid strings.
    unsafe { config::resolve(&raw) }
}

/// `own_group`: NCCL wraps the call in a group of its own (all but ncclCommInitRank).
fn init_rank_checked(
    function: &'static str,
    out: *mut ncclComm_t,
    nranks: c_int,
    id: &ncclUniqueId,
    rank: c_int,
    cfg: CommConfig,
    own_group: bool,
) -> Result<Progress> {
    non_null(out, function, "comm")?;
    if nranks < 1 {
        return Err(Error::invalid_argument(format!("{function}: nranks {nranks} must be at least 1")));
    }
    if rank < 0 || rank >= nranks {
        return Err(Error::invalid_argument(format!("{function}: rank {rank} is out of range for {nranks} ranks")));
    }
    let uid = UniqueId::decode(&id.to_bytes()).map_err(|e| e.context(function))?;
    crate::encryption::freeze();
    let (nranks, rank) = (nranks as usize, rank as usize);
    // The device current at the call (cudaSetDevice before each init in a group), not on the
    // thread that later runs the deferred init.
    let device = current_device();
    let context = crate::cuda::driver::current_context();
    let req = Request { function, blocking: cfg.blocking, own_group, makes_comm: true, parent: None };
    let make: Make = Box::new(move |interrupt| {
        if rank == 0 && uid.magic == bootstrap::id::COMM_ID_ENV_MAGIC {
            bootstrap::start_env_root(&uid)?;
        }
        let comm = Comm::init_rank(&uid, nranks, rank, cfg, device, interrupt)?;
        prepare_device_kernels(context);
        Ok(Some(comm))
    });
    creation::create(req, make, handle_writer(out))
}

/// Writes the caller's `*out` (now, or when a deferred creation ends).
fn handle_writer(out: *mut ncclComm_t) -> impl Fn(ncclComm_t) + Send + 'static {
    let out_addr = out as usize;
    move |handle| {
        // SAFETY: checked non-null by the caller; NCCL's contract keeps `out` valid until the
        // call (or the enclosing group) ends, which is when deferred creations write it.
        unsafe { (out_addr as *mut ncclComm_t).write(handle) }
    }
}

/// In a CUDA program, builds and loads the reduction kernels at init, while no stream waits on
/// the library: loading code later could wait for such a stream. Without NVRTC this only
/// warns; a reduction on device memory then fails with the reason.
fn prepare_device_kernels(context: Option<crate::cuda::driver::Context>) {
    let Some(ctx) = context else { return };
    let prepared = crate::cuda::driver::make_current(ctx).and_then(|()| {
        crate::cuda::stream::probe_batch_capture();
        crate::cuda::kernels::prepare_current_device()
    });
    if let Err(e) = prepared {
        log::warn!(target: "INIT", "CUDA reduction kernels are not available: {e}");
    }
}

/// The CUDA device of the calling thread (0 without CUDA or without a current context).
fn current_device() -> c_int {
    crate::cuda::driver::current_device().unwrap_or(0)
}

/// Marks the communicator finalized; it then only accepts Destroy. Host operations are
/// complete when their calls return, so nothing is left to flush: ncclSuccess at once, also on
/// a non-blocking communicator (NCCL allows ncclInProgress there; polling sees ncclSuccess).
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
    boundary("ncclCommFinalize", || {
        let c = comm::lookup(comm, "ncclCommFinalize")?;
        // Device-buffer operations this thread queued complete first (their streams get there).
        crate::coll::stream::drain_current_thread();
        c.finalize()
    })
}

/// Frees the communicator's local resources. As NCCL, refused (ncclInvalidArgument) while a
/// non-blocking init, split or shrink of it is in progress: poll first, or abort.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
    boundary("ncclCommDestroy", || {
        if comm.is_null() {
            return Ok(()); // as NCCL: destroying NULL is a no-op
        }
        match comm::entry(comm, "ncclCommDestroy")? {
            Entry::Creating(c) if !c.failed() => return Err(c.refusal("ncclCommDestroy", comm)),
            Entry::Ready(c) if c.busy() => {
                return Err(Error::invalid_argument(
                    "ncclCommDestroy: a non-blocking split or shrink of this communicator is still in progress \
                     (ncclCommGetAsyncError returns ncclInProgress)",
                ))
            }
            _ => {}
        }
        let c = match comm::unregister(comm, "ncclCommDestroy")? {
            Entry::Ready(c) => c,
            Entry::Creating(_) => {
                log::info!(target: "DESTROY", "comm {comm:p} (failed to initialise) - Destroy COMPLETE");
                return Ok(());
            }
        };
        crate::coll::stream::drain_current_thread();
        // One coverage line per communicator, at teardown: data connections are made on
        // first use, so only then is the picture complete.
        Coverage::log(&c);
        c.abort();
        log::info!(target: "DESTROY", "comm {:p} rank {} nranks {} - Destroy COMPLETE", comm, c.rank, c.nranks);
        Ok(())
    })
}

/// Frees the communicator at once, abandoning anything in flight. On a communicator whose
/// non-blocking creation is still running, stops it (its waits poll the abort flag) and
/// returns once it has stopped.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
    boundary("ncclCommAbort", || {
        if comm.is_null() {
            return Ok(()); // as NCCL: aborting NULL is a no-op
        }
        let c = match comm::unregister(comm, "ncclCommAbort")? {
            Entry::Ready(c) => c,
            Entry::Creating(creation) => {
                creation.cancel();
                log::info!(target: "DESTROY", "comm {comm:p} (creation stopped) - Abort COMPLETE");
                return Ok(());
            }
        };
        // One coverage line per communicator, at teardown: data connections are made on
        // first use, so only then is the picture complete.
        Coverage::log(&c);
        crate::coll::one_gpu::release_streams(&c);
        crate::coll::device_p2p::release_streams(&c);
        c.abort();
        log::info!(target: "DESTROY", "comm {:p} rank {} nranks {} - Abort COMPLETE", comm, c.rank, c.nranks);
        Ok(())
    })
}

/// Splits a communicator by color, ordering the new ranks by key. The parent's mode decides
/// whether the call waits (as NCCL); the new communicator takes `config`, or the parent's.
/// Non-blocking: returns ncclInProgress, `*newcomm` is valid at once (NULL for
/// NCCL_SPLIT_NOCOLOR), and both it and the parent report ncclInProgress until done.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommSplit(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    boundary_progress("ncclCommSplit", || {
        let parent = comm::lookup(comm, "ncclCommSplit")?;
        non_null(newcomm, "ncclCommSplit", "newcomm")?;
        if color < NCCL_SPLIT_NOCOLOR {
            return Err(Error::invalid_argument(format!(
                "ncclCommSplit: color {color} must be >= 0 or NCCL_SPLIT_NOCOLOR"
            )));
        }
        parent.check_usable("ncclCommSplit")?;
        let cfg = child_config(&parent, config)?;
        let req = Request {
            function: "ncclCommSplit",
            blocking: parent.config.blocking,
            own_group: true,
            makes_comm: color != NCCL_SPLIT_NOCOLOR,
            parent: Some(parent.clone()),
        };
        let make: Make = Box::new(move |interrupt| parent.split(color, key, cfg, interrupt));
        creation::create(req, make, handle_writer(newcomm))
    })
}

/// The config of a split's or shrink's new communicator: `config`, else the parent's.
fn child_config(parent: &Comm, config: *const ncclConfig_t) -> Result<CommConfig> {
    if config.is_null() {
        Ok(parent.config.clone())
    } else {
        // SAFETY: config is a caller-initialised ncclConfig_t.
        unsafe { parse_config(config) }
    }
}

/// Makes a communicator of the ranks not in `excludeRanksList`, renumbered in order; only
/// those ranks call it (the excluded ones may have failed). NCCL_SHRINK_DEFAULT needs a
/// healthy parent, which stays usable. NCCL_SHRINK_ABORT first aborts the parent: operations
/// blocked on it in other threads return, its connections close, later operations on it
/// fail; free it with ncclCommAbort or ncclCommDestroy. Bad arguments change nothing.
/// Blocking or not as ncclCommSplit.
#[unsafe(no_mangle)]
pub extern "C" fn ncclCommShrink(
    comm: ncclComm_t,
    excludeRanksList: *mut c_int,
    excludeRanksCount: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    shrinkFlags: c_int,
) -> ncclResult_t {
    boundary_progress("ncclCommShrink", || {
        let parent = comm::lookup(comm, "ncclCommShrink")?;
        non_null(newcomm, "ncclCommShrink", "newcomm")?;
        if excludeRanksCount > 0 {
            non_null(excludeRanksList, "ncclCommShrink", "excludeRanksList")?;
        }
        if shrinkFlags & !NCCL_SHRINK_ABORT != 0 {
            return Err(Error::invalid_argument(format!(
                "ncclCommShrink: unknown shrinkFlags {shrinkFlags:#x} (NCCL_SHRINK_DEFAULT 0 or NCCL_SHRINK_ABORT 1)"
            )));
        }
        let listed = match usize::try_from(excludeRanksCount) {
            // SAFETY: checked non-null; the caller passes excludeRanksCount ranks (read, never
            // reordered: NCCL sorts the caller's list in place, ferroccl leaves it alone).
            Ok(n) if n > 0 => unsafe { std::slice::from_raw_parts(excludeRanksList, n) },
            _ => &[],
        };
        let excluded = comm::shrink_exclusions(parent.nranks, parent.rank, listed)?;
        let abort = shrinkFlags & NCCL_SHRINK_ABORT != 0;
        if !abort {
            parent.check_usable("ncclCommShrink")?;
        }
        let cfg = child_config(&parent, config)?;
        if abort {
            crate::coll::one_gpu::release_streams(&parent);
            crate::coll::device_p2p::release_streams(&parent);
            parent.abort();
        }
        let req = Request {
            function: "ncclCommShrink",
            blocking: parent.config.blocking,
            own_group: true,
            makes_comm: true,
            parent: Some(parent.clone()),
        };
        let make: Make = Box::new(move |interrupt| parent.shrink(&excluded, cfg, interrupt).map(Some));
        creation::create(req, make, handle_writer(newcomm))
    })
}

/// ncclCommShrink flag: abort the parent's outstanding work first.
const NCCL_SHRINK_ABORT: c_int = 1;

/// ferroccl: creates a communicator spanning the MPI communicator whose Fortran handle is
/// `fcomm` (`MPI_Comm_c2f(comm)` from C; the INTEGER handle or `comm%MPI_VAL` from Fortran).
/// Collective over that communicator; needs no unique id. The MPI communicator is untouched.
#[unsafe(no_mangle)]
pub extern "C" fn ferrocclCommInitMpi(comm: *mut ncclComm_t, fcomm: c_int) -> ncclResult_t {
    boundary("ferrocclCommInitMpi", || init_mpi(comm, fcomm, config::from_environment()))
}

/// ferroccl: as ferrocclCommInitMpi, with a configuration.
#[unsafe(no_mangle)]
pub extern "C" fn ferrocclCommInitMpiConfig(
    comm: *mut ncclComm_t,
    fcomm: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    boundary("ferrocclCommInitMpiConfig", || {
        // SAFETY: config is NULL or a caller-initialised ncclConfig_t.
        let cfg = unsafe { parse_config(config) }?;
        init_mpi(comm, fcomm, cfg)
    })
}

fn init_mpi(out: *mut ncclComm_t, fcomm: c_int, cfg: CommConfig) -> Result<()> {
    non_null(out, "ferrocclCommInitMpi", "comm")?;
    crate::encryption::freeze();
    let (rank, nranks, id) = bootstrap::mpi::exchange_id(fcomm, || Ok(bootstrap::create_unique_id()?.encode()))?;
    let uid = UniqueId::decode(&id)?;
    let comm = Comm::init_rank(&uid, nranks, rank, cfg, current_device(), Interrupt::new())?;
    prepare_device_kernels(crate::cuda::driver::current_context());
    // SAFETY: checked non-null.
    unsafe { out.write(comm::register_handle(comm)) };
    Ok(())
}
