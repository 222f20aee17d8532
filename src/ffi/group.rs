//! Group calls.

use super::{boundary, boundary_progress};
use std::mem::offset_of;

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

/// Ends a group like ncclGroupEnd, except that the outermost end does not run the group's
/// operations: it drops them and writes their estimated time in microseconds to
/// `simInfo->estimatedTime` (a cost model of the paths they would take, from this project's
/// measurements: it ranks operations by cost rather than predicting a run exactly), left as
/// it was for a group without operations. Creations of communicators in the group do run. A
/// null `simInfo` makes it ncclGroupEnd, as in NCCL. As in NCCL, only the outermost end looks
/// at `simInfo`: one not initialised with NCCL_SIM_INFO_INITIALIZER is ncclInvalidArgument there,
/// and the group is closed with its operations dropped.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t {
    if simInfo.is_null() {
        return ncclGroupEnd();
    }
    boundary_progress("ncclGroupSimulateEnd", || {
        // The caller's struct may be an older, shorter one: `size` says how much of it exists
        // (NCCL reads and writes only that much).
        // SAFETY: non-null; every version of the struct starts with its size.
        let size = unsafe { std::ptr::addr_of!((*simInfo).size).read_unaligned() };
        let has = |field_end: usize| size >= field_end;
        // SAFETY: the magic lies within the caller's `size` bytes (checked first).
        let magic = has(offset_of!(ncclSimInfo_t, magic) + 4)
            .then(|| unsafe { std::ptr::addr_of!((*simInfo).magic).read_unaligned() });
        let (progress, estimate) = group::simulate_end(magic == Some(NCCL_SIM_INFO_MAGIC))?;
        if let Some(us) = estimate.filter(|_| has(offset_of!(ncclSimInfo_t, estimatedTime) + 4)) {
            // SAFETY: the field lies within the caller's `size` bytes.
            unsafe { std::ptr::addr_of_mut!((*simInfo).estimatedTime).write_unaligned(us) };
        }
        Ok(progress)
    })
}
