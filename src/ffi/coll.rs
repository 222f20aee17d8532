//! Collectives and point-to-point calls. Each checks its arguments, then queues the operation
//! (or runs it at once outside a group). On host buffers the call returns when the operation
//! is complete for this rank, so its buffers may be reused immediately.

use std::ffi::{c_int, c_void};

use super::boundary;
use crate::coll::{CollOp, OpRequest};
use crate::comm;
use crate::cuda::memory::MemKind;
use crate::cuda::stream::Stream;
use crate::error::{Error, Result};
use crate::group;
use crate::types::{cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, DataType};

#[allow(clippy::too_many_arguments)]
fn submit(
    function: &'static str,
    op: CollOp,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    redop: Option<ncclRedOp_t>,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<()> {
    let c = comm::lookup(comm, function)?;
    let dtype = DataType::try_from(datatype).map_err(|e| e.context(function))?;
    let mut req = OpRequest {
        op,
        send: sendbuff as *const u8,
        recv: recvbuff as *mut u8,
        count,
        dtype,
        reduction: None,
        mem: MemKind::Host,
        stream: Stream::from_raw(stream),
        pre_device: None,
        device_call: false,
    };
    req.mem = crate::coll::stream::memory_kind(&c, &req, function)?;
    req.device_call = req.mem.is_device();
    if let Some(op) = redop {
        // On a device-buffer call a device-resident PreMulSum scalar is read in stream order
        // when the operation runs; on a host call (and for host-resident scalars) now.
        let (red, at) = c.reduction_for_call(op.0, dtype, req.mem.is_device()).map_err(|e| e.context(function))?;
        req.reduction = Some(red);
        req.pre_device = at;
    }
    crate::coll::validate(&c, &req).map_err(|e| e.context(function))?;
    c.check_usable(function)?;
    group::enqueue(c, req)
}

/// Reduces `count` elements across ranks; every rank gets the result.
#[unsafe(no_mangle)]
pub extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary("ncclAllReduce", || {
        submit("ncclAllReduce", CollOp::AllReduce, sendbuff, recvbuff, count, datatype, Some(op), comm, stream)
    })
}

/// Copies `count` elements from `root` to every rank.
#[unsafe(no_mangle)]
pub extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary("ncclBroadcast", || {
        submit(
            "ncclBroadcast",
            CollOp::Broadcast { root: root_of(root)? },
            sendbuff,
            recvbuff,
            count,
            datatype,
            None,
            comm,
            stream,
        )
    })
}

/// In-place broadcast (deprecated NCCL spelling).
#[unsafe(no_mangle)]
pub extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary("ncclBcast", || {
        submit("ncclBcast", CollOp::Broadcast { root: root_of(root)? }, buff, buff, count, datatype, None, comm, stream)
    })
}

/// Reduces `count` elements onto `root`.
#[unsafe(no_mangle)]
pub extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary("ncclReduce", || {
        submit(
            "ncclReduce",
            CollOp::Reduce { root: root_of(root)? },
            sendbuff,
            recvbuff,
            count,
            datatype,
            Some(op),
            comm,
            stream,
        )
    })
}

/// Gathers `sendcount` elements from every rank into every rank's `recvbuff` (rank order).
#[unsafe(no_mangle)]
pub extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary("ncclAllGather", || {
        submit("ncclAllGather", CollOp::AllGather, sendbuff, recvbuff, sendcount, datatype, None, comm, stream)
    })
}

/// Reduces `nranks * recvcount` elements; rank i keeps block i.
#[unsafe(no_mangle)]
pub extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary("ncclReduceScatter", || {
        submit(
            "ncclReduceScatter",
            CollOp::ReduceScatter,
            sendbuff,
            recvbuff,
            recvcount,
            datatype,
            Some(op),
            comm,
            stream,
        )
    })
}

/// Block j of every rank's `sendbuff` goes to rank j, landing at block (sender) of `recvbuff`.
#[unsafe(no_mangle)]
pub extern "C" fn ncclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary("ncclAlltoAll", || {
        submit("ncclAlltoAll", CollOp::AlltoAll, sendbuff, recvbuff, count, datatype, None, comm, stream)
    })
}

/// Every rank's `count` elements land at block (rank) of `root`'s `recvbuff`.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary("ncclGather", || {
        submit(
            "ncclGather",
            CollOp::Gather { root: root_of(root)? },
            sendbuff,
            recvbuff,
            count,
            datatype,
            None,
            comm,
            stream,
        )
    })
}

/// Block i of `root`'s `sendbuff` goes to rank i.
#[unsafe(no_mangle)]
pub extern "C" fn ncclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    root: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary("ncclScatter", || {
        submit(
            "ncclScatter",
            CollOp::Scatter { root: root_of(root)? },
            sendbuff,
            recvbuff,
            count,
            datatype,
            None,
            comm,
            stream,
        )
    })
}

/// Sends `count` elements to `peer` (which posts a matching ncclRecv).
#[unsafe(no_mangle)]
pub extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary("ncclSend", || {
        let peer = peer_of(peer)?;
        submit("ncclSend", CollOp::Send { peer }, sendbuff, std::ptr::null_mut(), count, datatype, None, comm, stream)
    })
}

/// Receives `count` elements from `peer`.
#[unsafe(no_mangle)]
pub extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    boundary("ncclRecv", || {
        let peer = peer_of(peer)?;
        submit("ncclRecv", CollOp::Recv { peer }, std::ptr::null(), recvbuff, count, datatype, None, comm, stream)
    })
}

fn root_of(root: c_int) -> Result<usize> {
    usize::try_from(root).map_err(|_| Error::invalid_argument(format!("root {root} is negative")))
}

fn peer_of(peer: c_int) -> Result<usize> {
    usize::try_from(peer).map_err(|_| Error::invalid_argument(format!("peer {peer} is negative")))
}
