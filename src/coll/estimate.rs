//! The cost model behind `ncclGroupSimulateEnd`: how long a group's operations would take on
//! the path each would take, without running them.
//!
//! Each operation costs `steps * latency + bytes / bandwidth`, where `steps` and `bytes` are
//! those of a ring schedule for the collective (the bytes each rank sends and receives, as in
//! nccl-tests' bus bandwidth) and `latency` and `bandwidth` are those of the path: the node's
//! shared memory, sockets (with TLS when a key is set), the GPU one-GPU path, or device buffers
//! staged through host memory over sockets. The figures are this project's own measurements
//! (`bench/results/`), rounded; they describe those machines, not this one, so the estimate
//! orders operations and groups by cost rather than predicting a run to the microsecond, which
//! is also how NCCL's own model (its tuning tables) is meant to be used. Operations of a group
//! are added up (the engine runs them one after another on each rank), where NCCL reports its
//! last aggregated collective's time.

use std::sync::Arc;

use super::{device_p2p, one_gpu, CollOp, OpRequest};
use crate::comm::Comm;

/// Latency of one step (microseconds) and bandwidth (bytes per microsecond) of a path.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Fabric {
    step_us: f64,
    bytes_per_us: f64,
}

/// One rank alone: a memory copy (about 10 GB/s on the 2-core VM's memcpy).
const ALONE: Fabric = Fabric { step_us: 0.1, bytes_per_us: 10_000.0 };
/// The node's shared memory between processes: 8-byte all-reduce 0.2 us at 2 ranks, 6-28 GB/s
/// bus bandwidth per rank from 256 KiB on malloc'd buffers (`estimate-2core-2026-12-05.md`,
/// `malloc-vs-memalloc-2core-2026-12-04.md`).
const NODE: Fabric = Fabric { step_us: 0.12, bytes_per_us: 12_000.0 };
/// TCP sockets: about 6 us a step and 3 GB/s on loopback (`estimate-2core-2026-12-05.md`: 5-12
/// us for a small call of 1-2 steps; `gpu-staged-pieces-2026-12-05.md`: 3-4 GB/s busbw).
const SOCKETS: Fabric = Fabric { step_us: 6.0, bytes_per_us: 3_000.0 };
/// What TLS keeps of the sockets' bandwidth (0.39-0.89 in `tls-canary-2026-12-03b.md`).
const TLS_SHARE: f64 = 0.6;
/// Device buffers on one GPU (or peer GPUs) of a host: 8.9 us for 2 ranks and 17.9 us for 4,
/// about 4.5 us per rank; every input byte read and every output byte written once at the
/// device copy's 4.2 TB/s read plus written (`gpu-h200-2026-12-04e.md`, `-04h.md`).
const GPU_PER_RANK_US: f64 = 4.5;
const GPU_BYTES_PER_US: f64 = 4_000_000.0;
/// Device sends and receives copied directly between a host's GPUs: 8 B in 18.5 us, 512 MiB
/// at about 1 TB/s between two processes on one H200 (`gpu-h200-2026-12-04n.md`).
const DEVICE_P2P: Fabric = Fabric { step_us: 18.0, bytes_per_us: 1_000_000.0 };
/// Device buffers staged through pinned host memory: a device-to-host and a host-to-device
/// copy (about 25 GB/s each) on top of the sockets.
const STAGING_BYTES_PER_US: f64 = 25_000.0;

/// The estimated time, in microseconds, of running `ops` (one thread's group) as queued,
/// taking the paths the engine would take for the group as a whole (`coll::stream::submit`):
/// direct device sends and receives first, then the one-GPU path for a group it accepts, else
/// each operation on its own (host buffers, or device buffers staged through host memory).
pub fn group_time_us(ops: &[(Arc<Comm>, OpRequest)]) -> f32 {
    // Deciding never fails but for a CUDA query; then everything counts as not direct.
    let (direct, rest) = device_p2p::split(Vec::from(ops)).unwrap_or_else(|_| (Vec::new(), Vec::from(ops)));
    let mut us: f64 = direct
        .iter()
        .map(|(_, r)| DEVICE_P2P.step_us + (r.count * r.dtype.size()) as f64 / DEVICE_P2P.bytes_per_us)
        .sum();
    let gpu_groups = if rest.is_empty() || rest.iter().any(|(_, r)| !r.mem.is_device()) {
        None
    } else if one_gpu::applies(&rest) {
        Some(vec![(rest[0].0.clone(), rest.iter().map(|(_, r)| *r).collect::<Vec<_>>())])
    } else {
        one_gpu::applies_per_communicator(&rest)
    };
    match gpu_groups {
        // One flag handshake per communicator's group, then kernels touching every byte once.
        Some(groups) => {
            for (comm, reqs) in groups {
                us += GPU_PER_RANK_US * comm.nranks as f64;
                us += reqs.iter().map(|r| touched(comm.nranks, r) / GPU_BYTES_PER_US).sum::<f64>();
            }
        }
        None => us += rest.iter().map(|(comm, req)| op_time_us(comm, req)).sum::<f64>(),
    }
    us as f32
}

fn touched(n: usize, req: &OpRequest) -> f64 {
    schedule(req.op, n, (req.count * req.dtype.size()) as f64).2
}

/// One operation on its own path: host buffers, a lone rank's device copy, or device buffers
/// staged through host memory.
fn op_time_us(comm: &Comm, req: &OpRequest) -> f64 {
    let n = comm.nranks;
    let (steps, moved, touched) = schedule(req.op, n, (req.count * req.dtype.size()) as f64);
    if req.mem.is_device() && n == 1 {
        return GPU_PER_RANK_US + touched / GPU_BYTES_PER_US;
    }
    let fabric = host_fabric(comm);
    let host = steps * fabric.step_us + moved / fabric.bytes_per_us;
    if req.mem.is_device() {
        // Staged: this rank's share of the buffers goes to the host and back once.
        return host + touched / n as f64 / STAGING_BYTES_PER_US;
    }
    host
}

/// The path of host buffers (and of staged device buffers) on `comm`.
fn host_fabric(comm: &Comm) -> Fabric {
    if comm.nranks == 1 {
        ALONE
    } else if comm.node_area {
        NODE
    } else if crate::encryption::enabled() {
        Fabric { bytes_per_us: SOCKETS.bytes_per_us * TLS_SHARE, ..SOCKETS }
    } else {
        SOCKETS
    }
}

/// For `op` on `n` ranks with `bytes` per rank buffer (the count's bytes): latency steps of a
/// ring schedule, bytes each rank moves (sends and receives, as busbw counts them), and bytes
/// read plus written by all ranks together (what a one-GPU kernel touches).
fn schedule(op: CollOp, n: usize, bytes: f64) -> (f64, f64, f64) {
    let nf = n as f64;
    if n == 1 {
        // A copy from the send buffer to the receive buffer (nothing for a lone send).
        return (1.0, bytes, 2.0 * bytes);
    }
    let share = (nf - 1.0) / nf;
    match op {
        // Reduce-scatter then all-gather: 2(n-1) steps, 2(n-1)/n of the buffer each way.
        CollOp::AllReduce => (2.0 * (nf - 1.0), 2.0 * share * bytes, 2.0 * nf * bytes),
        // `bytes` is each rank's block: the whole buffer is n blocks.
        CollOp::AllGather => (nf - 1.0, share * nf * bytes, nf * bytes + nf * nf * bytes),
        // `bytes` is each rank's received block; the input is n blocks.
        CollOp::ReduceScatter => (nf - 1.0, share * nf * bytes, nf * nf * bytes + nf * bytes),
        // Pipelined along a chain: the buffer once, plus the chain's fill.
        CollOp::Broadcast { .. } | CollOp::Reduce { .. } => (nf - 1.0, bytes, (nf + 1.0) * bytes),
        // `bytes` is what each rank exchanges with each other rank.
        CollOp::AlltoAll => (nf - 1.0, (nf - 1.0) * bytes, 2.0 * nf * nf * bytes),
        CollOp::Gather { .. } | CollOp::Scatter { .. } => (nf - 1.0, (nf - 1.0) * bytes, 2.0 * nf * bytes),
        CollOp::Send { .. } | CollOp::Recv { .. } => (1.0, bytes, 2.0 * bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_grow_with_bytes_and_ranks() {
        let ar = |n, b| schedule(CollOp::AllReduce, n, b);
        assert!(ar(2, 1e6).1 < ar(2, 2e6).1);
        assert!(ar(2, 8.0).0 < ar(8, 8.0).0, "more ranks, more steps");
        // A ring all-reduce moves 2(n-1)/n of the buffer: towards twice it for many ranks.
        assert_eq!(ar(2, 1e6).1, 1e6);
        assert_eq!(ar(4, 1e6).1, 1.5e6);
        // An all-gather of blocks b moves (n-1) b per rank; a reduce-scatter the same.
        assert_eq!(schedule(CollOp::AllGather, 4, 1e3).1, 3e3);
        assert_eq!(schedule(CollOp::ReduceScatter, 4, 1e3).1, 3e3);
        // Alone: one copy.
        assert_eq!(schedule(CollOp::AllReduce, 1, 1e3), (1.0, 1e3, 2e3));
    }

    #[test]
    fn slower_paths_cost_more() {
        let time = |f: Fabric, (steps, moved, _): (f64, f64, f64)| steps * f.step_us + moved / f.bytes_per_us;
        for bytes in [8.0, 1e6, 1e8] {
            let s = schedule(CollOp::AllReduce, 4, bytes);
            assert!(time(NODE, s) < time(SOCKETS, s));
            let tls = Fabric { bytes_per_us: SOCKETS.bytes_per_us * TLS_SHARE, ..SOCKETS };
            assert!(time(SOCKETS, s) <= time(tls, s));
        }
    }
}
