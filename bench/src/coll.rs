//! The collectives: nccl-tests' byte counts, in-place layouts, bandwidth factors, and the C ABI
//! call each benchmark iteration makes.

use std::ffi::{c_int, c_void};

use ferroccl::ffi::coll::{
    ncclAllGather, ncclAllReduce, ncclAlltoAll, ncclBroadcast, ncclGather, ncclRecv, ncclReduce, ncclReduceScatter,
    ncclScatter, ncclSend,
};
use ferroccl::ffi::group::{ncclGroupEnd, ncclGroupStart};
use ferroccl::types::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t};

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum Coll {
    AllReduce,
    AllGather,
    Broadcast,
    Reduce,
    ReduceScatter,
    Alltoall,
    Gather,
    Scatter,
    Sendrecv,
}

/// Per-size element counts (nccl-tests' `getCollByteCount`), in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    /// Elements each rank sends.
    pub send: usize,
    /// Elements each rank receives.
    pub recv: usize,
    /// The `count` argument of the NCCL call (the table's count column).
    pub param: usize,
    /// In-place: the send buffer is `recvbuff + send_inplace_offset * rank`.
    pub send_inplace_offset: usize,
    /// In-place: the receive buffer is `recvbuff + recv_inplace_offset * rank`.
    pub recv_inplace_offset: usize,
}

impl Coll {
    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::Alltoall => "alltoall",
            Coll::Gather => "gather",
            Coll::Scatter => "scatter",
            Coll::Sendrecv => "sendrecv",
        }
    }

    /// Takes an operator (table column redop is the operator, else "none").
    pub fn has_op(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::Reduce | Coll::ReduceScatter | Coll::Sendrecv)
    }

    /// Actually reduces (sendrecv loops over -o like nccl-tests but moves data only).
    pub fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::Reduce | Coll::ReduceScatter)
    }

    /// Takes a root (table column root; else -1).
    pub fn has_root(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce | Coll::Gather | Coll::Scatter)
    }

    /// nccl-tests' `getCollByteCount` for `count = size / eltsize` elements.
    pub fn counts(self, count: usize, elt: usize, nranks: usize) -> Counts {
        // nccl-tests rounds per-rank counts down to a multiple of 16 bytes.
        let aligned = (count / nranks) & !(16 / elt - 1);
        match self {
            Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::Sendrecv => {
                Counts { send: count, recv: count, param: count, send_inplace_offset: 0, recv_inplace_offset: 0 }
            }
            Coll::AllGather | Coll::Gather => Counts {
                send: aligned,
                recv: aligned * nranks,
                param: aligned,
                send_inplace_offset: aligned,
                recv_inplace_offset: 0,
            },
            Coll::ReduceScatter | Coll::Scatter => Counts {
                send: aligned * nranks,
                recv: aligned,
                param: aligned,
                send_inplace_offset: 0,
                recv_inplace_offset: aligned,
            },
            Coll::Alltoall => Counts {
                send: aligned * nranks,
                recv: aligned * nranks,
                param: aligned,
                send_inplace_offset: 0,
                recv_inplace_offset: 0,
            },
        }
    }

    /// (algbw, busbw) in GB/s for `param` elements of `elt` bytes in `sec` seconds.
    pub fn bandwidth(self, param: usize, elt: usize, sec: f64, nranks: usize) -> (f64, f64) {
        let n = nranks as f64;
        let bytes = (param * elt) as f64;
        let (base, factor) = match self {
            Coll::AllReduce => (bytes, 2.0 * (n - 1.0) / n),
            Coll::AllGather | Coll::ReduceScatter | Coll::Alltoall | Coll::Gather | Coll::Scatter => {
                (bytes * n, (n - 1.0) / n)
            }
            Coll::Broadcast | Coll::Reduce | Coll::Sendrecv => (bytes, 1.0),
        };
        let algbw = base / 1.0e9 / sec;
        (algbw, algbw * factor)
    }
}

/// One call of the collective on this rank's buffers, exactly as nccl-tests issues it.
///
/// # Safety
/// `send`/`recv` must be valid for the byte ranges the collective touches.
#[allow(clippy::too_many_arguments)]
pub unsafe fn run(
    coll: Coll,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: ncclDataType_t,
    op: ncclRedOp_t,
    root: c_int,
    rank: usize,
    nranks: usize,
    comm: ncclComm_t,
) -> Result<(), (&'static str, ncclResult_t)> {
    let stream = std::ptr::null_mut();
    let chk = |name: &'static str, r: ncclResult_t| if r.0 == 0 { Ok(()) } else { Err((name, r)) };
    match coll {
        Coll::AllReduce => chk("ncclAllReduce", ncclAllReduce(send, recv, count, dtype, op, comm, stream)),
        Coll::AllGather => chk("ncclAllGather", ncclAllGather(send, recv, count, dtype, comm, stream)),
        Coll::Broadcast => chk("ncclBroadcast", ncclBroadcast(send, recv, count, dtype, root, comm, stream)),
        Coll::Reduce => chk("ncclReduce", ncclReduce(send, recv, count, dtype, op, root, comm, stream)),
        Coll::ReduceScatter => chk("ncclReduceScatter", ncclReduceScatter(send, recv, count, dtype, op, comm, stream)),
        Coll::Alltoall => chk("ncclAlltoAll", ncclAlltoAll(send, recv, count, dtype, comm, stream)),
        Coll::Gather => chk("ncclGather", ncclGather(send, recv, count, dtype, root, comm, stream)),
        Coll::Scatter => chk("ncclScatter", ncclScatter(send, recv, count, dtype, root, comm, stream)),
        Coll::Sendrecv => {
            let send_peer = ((rank + 1) % nranks) as c_int;
            let recv_peer = ((rank + nranks - 1) % nranks) as c_int;
            chk("ncclGroupStart", ncclGroupStart())?;
            let s = chk("ncclSend", ncclSend(send, count, dtype, send_peer, comm, stream));
            let r = s.and_then(|_| chk("ncclRecv", ncclRecv(recv, count, dtype, recv_peer, comm, stream)));
            let e = chk("ncclGroupEnd", ncclGroupEnd());
            r.and(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_match_nccl_tests() {
        // all_gather, 8 ranks, 1 MiB of floats: 32768 per rank, 16-byte aligned.
        let c = Coll::AllGather.counts(262144, 4, 8);
        assert_eq!((c.send, c.recv, c.param, c.send_inplace_offset), (32768, 262144, 32768, 32768));
        // reduce_scatter rounds to 16 bytes: 1000 int8 / 3 ranks = 333 -> 320.
        let c = Coll::ReduceScatter.counts(1000, 1, 3);
        assert_eq!((c.send, c.recv, c.param, c.recv_inplace_offset), (960, 320, 320, 320));
        // 8 bytes of float on 2 ranks: nothing left.
        assert_eq!(Coll::AllGather.counts(2, 4, 2).param, 0);
        assert_eq!(Coll::AllReduce.counts(2, 4, 2).param, 2);
    }

    #[test]
    fn busbw_factors() {
        let (a, b) = Coll::AllReduce.bandwidth(1_000_000, 1, 1e-3, 4);
        assert!((a - 1.0).abs() < 1e-12 && (b - 1.5).abs() < 1e-12);
        let (a, b) = Coll::AllGather.bandwidth(250_000, 1, 1e-3, 4);
        assert!((a - 1.0).abs() < 1e-12 && (b - 0.75).abs() < 1e-12);
        let (a, b) = Coll::Broadcast.bandwidth(1_000_000, 1, 1e-3, 4);
        assert!((a - 1.0).abs() < 1e-12 && (b - 1.0).abs() < 1e-12);
    }
}
