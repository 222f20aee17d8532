//! Bad arguments get ncclInvalidArgument with a message and leave the communicator usable.

use std::ffi::{c_void, CStr};

use ferroccl::ffi::coll::*;
use ferroccl::ffi::init::{ncclCommDestroy, ncclCommInitRank, ncclGetUniqueId};
use ferroccl::ffi::query::{ncclCommCount, ncclCommGetAsyncError, ncclGetLastError};
use ferroccl::types::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclUniqueId};

use crate::common::*;

const S: *mut c_void = std::ptr::null_mut();

fn last_error() -> String {
    // SAFETY: ncclGetLastError returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(ncclGetLastError(std::ptr::null_mut())) }.to_string_lossy().into_owned()
}

fn expect_invalid(r: ncclResult_t, needle: &str) {
    assert_eq!(r, ncclResult_t::ncclInvalidArgument, "expected ncclInvalidArgument ({needle})");
    let msg = last_error();
    assert!(msg.contains(needle), "message {msg:?} should mention {needle:?}");
}

#[test]
fn bad_arguments_are_rejected_and_change_nothing() {
    with_ranks(2, |rank, comm| {
        let c = comm.0;
        let buf = [1.0f32; 8];
        let mut out = [0.0f32; 16];
        let f32t = ncclDataType_t(7);
        expect_invalid(
            ncclAllReduce(std::ptr::null(), out.as_mut_ptr().cast(), 8, f32t, ncclRedOp_t(0), c, S),
            "sendbuff is NULL",
        );
        expect_invalid(
            ncclAllReduce(buf.as_ptr().cast(), std::ptr::null_mut(), 8, f32t, ncclRedOp_t(0), c, S),
            "recvbuff is NULL",
        );
        expect_invalid(
            ncclAllReduce(buf.as_ptr().cast(), out.as_mut_ptr().cast(), 8, ncclDataType_t(12), ncclRedOp_t(0), c, S),
            "data type",
        );
        expect_invalid(
            ncclAllReduce(buf.as_ptr().cast(), out.as_mut_ptr().cast(), 8, ncclDataType_t(-3), ncclRedOp_t(0), c, S),
            "data type",
        );
        expect_invalid(
            ncclAllReduce(buf.as_ptr().cast(), out.as_mut_ptr().cast(), 8, f32t, ncclRedOp_t(5), c, S),
            "operator",
        );
        expect_invalid(
            ncclAllReduce(buf.as_ptr().cast(), out.as_mut_ptr().cast(), 8, f32t, ncclRedOp_t(-1), c, S),
            "operator",
        );
        expect_invalid(ncclBroadcast(buf.as_ptr().cast(), out.as_mut_ptr().cast(), 8, f32t, 2, c, S), "root 2");
        expect_invalid(
            ncclReduce(buf.as_ptr().cast(), out.as_mut_ptr().cast(), 8, f32t, ncclRedOp_t(0), -1, c, S),
            "root -1",
        );
        expect_invalid(ncclSend(buf.as_ptr().cast(), 8, f32t, 7, c, S), "peer 7");
        expect_invalid(ncclRecv(out.as_mut_ptr().cast(), 8, f32t, -2, c, S), "peer -2");
        expect_invalid(
            ncclAllReduce(
                buf.as_ptr().cast(),
                out.as_mut_ptr().cast(),
                8,
                f32t,
                ncclRedOp_t(0),
                std::ptr::null_mut(),
                S,
            ),
            "comm is NULL",
        );
        expect_invalid(
            ncclAllGather(buf.as_ptr().cast(), out.as_mut_ptr().cast(), 8, f32t, 0x1234usize as ncclComm_t, S),
            "not a live communicator",
        );
        // Count 0 with NULL buffers is fine.
        check(ncclAllReduce(std::ptr::null(), std::ptr::null_mut(), 0, f32t, ncclRedOp_t(0), c, S), "count 0");
        // The communicator still works.
        let mut r = [0.0f32; 8];
        check(ncclAllReduce(buf.as_ptr().cast(), r.as_mut_ptr().cast(), 8, f32t, ncclRedOp_t(0), c, S), "after errors");
        assert_eq!(r, [2.0f32; 8], "rank {rank}");
        let mut e = ncclResult_t(-1);
        check(ncclCommGetAsyncError(c, &mut e), "ncclCommGetAsyncError");
        assert_eq!(e, ncclResult_t::ncclSuccess);
    });
}

#[test]
fn destroyed_and_null_communicators() {
    let mut id = ncclUniqueId { internal: [0; 128] };
    check(ncclGetUniqueId(&mut id), "id");
    let mut comm: ncclComm_t = std::ptr::null_mut();
    check(ncclCommInitRank(&mut comm, 1, id, 0), "init 1 rank");
    check(ncclCommDestroy(comm), "destroy");
    let mut n = 0;
    expect_invalid(ncclCommCount(comm, &mut n), "not a live communicator");
    expect_invalid(ncclCommDestroy(comm), "not a live communicator");
    expect_invalid(ncclCommCount(std::ptr::null_mut(), &mut n), "comm is NULL");
    expect_invalid(ncclGetUniqueId(std::ptr::null_mut()), "uniqueId is NULL");
    // Bad init arguments.
    let mut c2: ncclComm_t = std::ptr::null_mut();
    expect_invalid(ncclCommInitRank(&mut c2, 0, id, 0), "nranks 0");
    expect_invalid(ncclCommInitRank(&mut c2, 2, id, 2), "rank 2 is out of range");
    expect_invalid(ncclCommInitRank(&mut c2, 2, ncclUniqueId { internal: [7; 128] }, 0), "unique id");
}

/// Ranks that disagree on sizes get an error on both sides, not a hang or a truncation.
#[test]
fn mismatched_sizes_fail_cleanly() {
    let results = with_ranks(2, |rank, comm| {
        let buf = [0u8; 64];
        let mut out = vec![0u8; 64];
        let count = if rank == 0 { 16 } else { 32 };
        if rank == 0 {
            ncclSend(buf.as_ptr().cast(), count, ncclDataType_t(0), 1, comm.0, S)
        } else {
            ncclRecv(out.as_mut_ptr().cast(), count, ncclDataType_t(0), 0, comm.0, S)
        }
    });
    // The sender may complete (its bytes fit in the socket buffer); the receiver must fail.
    assert_eq!(results[1], ncclResult_t::ncclInvalidUsage);
}
