//! Group calls.

use super::{boundary, boundary_progress, non_null};
use crate::error::Error;
use crate::group;
use crate::types::{ncclResult_t, ncclSimInfo_t, NCCL_SIM_INFO_MAGIC};

/// Starts a group: calls until the matching ncclGroupEnd are queued and run together.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupStart() -> ncclResult_t {
    boundary("ncclGroupStart", || {
        group::start();
        Ok(())
    })
}

/// Ends a group; the outermost end runs every queued call and returns when they are complete,
/// except creations of non-blocking communicators, which continue in the background: then it
/// returns ncclInProgress (poll ncclCommGetAsyncError on each new communicator).
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupEnd() -> ncclResult_t {
    boundary_progress("ncclGroupEnd", group::end)
}

/// Not implemented yet (no cost model): checks its argument, then returns ncclInvalidUsage.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t {
    boundary("ncclGroupSimulateEnd", || {
        non_null(simInfo, "ncclGroupSimulateEnd", "simInfo")?;
        // SAFETY: checked non-null; the caller initialised it with NCCL_SIM_INFO_INITIALIZER.
        let magic = unsafe { (*simInfo).magic };
        if magic != NCCL_SIM_INFO_MAGIC {
            return Err(Error::invalid_argument(
                "ncclGroupSimulateEnd: simInfo not initialised with NCCL_SIM_INFO_INITIALIZER",
            ));
        }
        Err(Error::not_implemented("ncclGroupSimulateEnd"))
    })
}
