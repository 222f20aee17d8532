//! `pnccl*`: NCCL exports every function a second time under a `p` prefix, so profilers and
//! tools that interpose on `nccl*` can still reach the library. Each alias forwards to the real
//! export (this file is the alias table; keep it in step with the other files of `ffi`).

use std::ffi::{c_char, c_int, c_void};

use crate::types::*;

/// Profiling alias of `ncclAllReduce`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    super::coll::ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream)
}

/// Profiling alias of `ncclBroadcast`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    super::coll::ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream)
}

/// Profiling alias of `ncclBcast`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    super::coll::ncclBcast(buff, count, datatype, root, comm, stream)
}

/// Profiling alias of `ncclReduce`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    super::coll::ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream)
}

/// Profiling alias of `ncclAllGather`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    super::coll::ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream)
}

/// Profiling alias of `ncclReduceScatter`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    super::coll::ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream)
}

/// Profiling alias of `ncclAlltoAll`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    super::coll::ncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream)
}

/// Profiling alias of `ncclGather`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    super::coll::ncclGather(sendbuff, recvbuff, count, datatype, root, comm, stream)
}

/// Profiling alias of `ncclScatter`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    super::coll::ncclScatter(sendbuff, recvbuff, count, datatype, root, comm, stream)
}

/// Profiling alias of `ncclSend`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    super::coll::ncclSend(sendbuff, count, datatype, peer, comm, stream)
}

/// Profiling alias of `ncclRecv`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    super::coll::ncclRecv(recvbuff, count, datatype, peer, comm, stream)
}

/// Profiling alias of `ncclSetEncryption`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclSetEncryption(config: *const ncclEncryptionConfig_t) -> ncclResult_t {
    super::encryption::ncclSetEncryption(config)
}

/// Profiling alias of `ncclGroupStart`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclGroupStart() -> ncclResult_t {
    super::group::ncclGroupStart()
}

/// Profiling alias of `ncclGroupEnd`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclGroupEnd() -> ncclResult_t {
    super::group::ncclGroupEnd()
}

/// Profiling alias of `ncclGroupSimulateEnd`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t {
    super::group::ncclGroupSimulateEnd(simInfo)
}

/// Profiling alias of `ncclGetUniqueId`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ncclResult_t {
    super::init::ncclGetUniqueId(uniqueId)
}

/// Profiling alias of `ncclCommInitRankConfig`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclCommInitRankConfig(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    super::init::ncclCommInitRankConfig(comm, nranks, commId, rank, config)
}

/// Profiling alias of `ncclCommInitRank`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    super::init::ncclCommInitRank(comm, nranks, commId, rank)
}

/// Profiling alias of `ncclCommInitAll`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclCommInitAll(comm: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> ncclResult_t {
    super::init::ncclCommInitAll(comm, ndev, devlist)
}

/// Profiling alias of `ncclCommInitRankScalable`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclCommInitRankScalable(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    myrank: c_int,
    nId: c_int,
    commIds: *mut ncclUniqueId,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    super::init::ncclCommInitRankScalable(newcomm, nranks, myrank, nId, commIds, config)
}

/// Profiling alias of `ncclCommFinalize`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
    super::init::ncclCommFinalize(comm)
}

/// Profiling alias of `ncclCommDestroy`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
    super::init::ncclCommDestroy(comm)
}

/// Profiling alias of `ncclCommAbort`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
    super::init::ncclCommAbort(comm)
}

/// Profiling alias of `ncclCommSplit`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclCommSplit(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    super::init::ncclCommSplit(comm, color, key, newcomm, config)
}

/// Profiling alias of `ncclCommShrink`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclCommShrink(
    comm: ncclComm_t,
    excludeRanksList: *mut c_int,
    excludeRanksCount: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    shrinkFlags: c_int,
) -> ncclResult_t {
    super::init::ncclCommShrink(comm, excludeRanksList, excludeRanksCount, newcomm, config, shrinkFlags)
}

/// Profiling alias of `ncclMemAlloc`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
    super::mem::ncclMemAlloc(ptr, size)
}

/// Profiling alias of `ncclMemFree`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclMemFree(ptr: *mut c_void) -> ncclResult_t {
    super::mem::ncclMemFree(ptr)
}

/// Profiling alias of `ncclGetVersion`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclGetVersion(version: *mut c_int) -> ncclResult_t {
    super::query::ncclGetVersion(version)
}

/// Profiling alias of `ncclGetErrorString`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclGetErrorString(result: ncclResult_t) -> *const c_char {
    super::query::ncclGetErrorString(result)
}

/// Profiling alias of `ncclGetLastError`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclGetLastError(comm: ncclComm_t) -> *const c_char {
    super::query::ncclGetLastError(comm)
}

/// Profiling alias of `ncclResetDebugInit`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclResetDebugInit() {
    super::query::ncclResetDebugInit()
}

/// Profiling alias of `ncclCommGetAsyncError`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclCommGetAsyncError(comm: ncclComm_t, asyncError: *mut ncclResult_t) -> ncclResult_t {
    super::query::ncclCommGetAsyncError(comm, asyncError)
}

/// Profiling alias of `ncclCommCount`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
    super::query::ncclCommCount(comm, count)
}

/// Profiling alias of `ncclCommCuDevice`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
    super::query::ncclCommCuDevice(comm, device)
}

/// Profiling alias of `ncclCommUserRank`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
    super::query::ncclCommUserRank(comm, rank)
}

/// Profiling alias of `ncclRedOpCreatePreMulSum`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclRedOpCreatePreMulSum(
    op: *mut ncclRedOp_t,
    scalar: *mut c_void,
    datatype: ncclDataType_t,
    residence: ncclScalarResidence_t,
    comm: ncclComm_t,
) -> ncclResult_t {
    super::query::ncclRedOpCreatePreMulSum(op, scalar, datatype, residence, comm)
}

/// Profiling alias of `ncclRedOpDestroy`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
    super::query::ncclRedOpDestroy(op, comm)
}

/// Profiling alias of `ncclCommRegister`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclCommRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> ncclResult_t {
    super::query::ncclCommRegister(comm, buff, size, handle)
}

/// Profiling alias of `ncclCommDeregister`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
    super::query::ncclCommDeregister(comm, handle)
}

/// Profiling alias of `ncclCommWindowRegister`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclCommWindowRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    win: *mut ncclWindow_t,
    winFlags: c_int,
) -> ncclResult_t {
    super::query::ncclCommWindowRegister(comm, buff, size, win, winFlags)
}

/// Profiling alias of `ncclCommWindowDeregister`.
#[unsafe(no_mangle)]
pub extern "C" fn pncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
    super::query::ncclCommWindowDeregister(comm, win)
}
