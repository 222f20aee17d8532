//! The staged path of device buffers (issue 14), emulated on the CPU: is the host engine, fed
//! piece by piece, slower than the same engine on whole host buffers?
//!
//! Two ranks are threads of this process; run it with `NCCL_SHM_DISABLE=1 NCCL_P2P_DISABLE=1`
//! for sockets, the transport the staged path serves. For each size, every iteration times
//! (median over iterations, rank 0):
//! - `host`: the all-reduce on host buffers (`run_one`, as a host-buffer call runs it);
//! - `staged`: the same all-reduce through `run_progressive` on staging buffers, while one
//!   thread per rank plays the stream's copies in (each input piece copied from the "device"
//!   buffer at `GBPS` GB/s, then its landed flag set) and another its copies back (each output
//!   piece copied out once its released flag is set), as the GPU's copy engines would.
//!
//! - `landed`: `run_progressive` with every input piece landed before it starts and no copy
//!   back (the executor's piecewise bookkeeping alone, no threads).
//!
//! The copies cost CPU time here where a GPU's copy engines cost none, so only a host with
//! spare cores (the 16-core device machine) shows the engine's own behaviour.
//!
//! `GBPS=0` leaves the copies out altogether (flags only): the engine's own cost of running
//! piece by piece.
//!
//!   cargo run --release --example staged_emul [-- iterations]   (env PIECE, GBPS)

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use ferroccl::coll::progressive::{reached, Pieces, StageProgress, FLAG_WORDS, MAX_PIECES};
use ferroccl::coll::{run_one, run_progressive, staged_orders, CollOp, OpRequest};
use ferroccl::cuda::memory::MemKind;
use ferroccl::cuda::stream::Stream;
use ferroccl::ffi::init::{ncclCommDestroy, ncclCommInitRank, ncclGetUniqueId};
use ferroccl::reduce::Reduction;
use ferroccl::types::{ncclUniqueId, BuiltinOp, DataType};

const RANKS: usize = 2;
const SIZES_MIB: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

/// Copies `len` bytes (unless `GBPS` is 0: then nothing is copied and no time taken, the
/// staging buffers already holding the data) and takes at least as long as a copy engine at
/// `gbps` GB/s would, sleeping (not spinning) for the rest, so that the emulated engine leaves
/// the CPU alone.
fn copy_at_rate(src: usize, dst: usize, len: usize, gbps: f64) {
    if gbps == 0.0 {
        return;
    }
    let start = Instant::now();
    // SAFETY: callers pass ranges inside two distinct live buffers of at least `len` bytes
    // (a "device" buffer and a staging one) that nothing else writes meanwhile.
    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) };
    let want = Duration::from_secs_f64(len as f64 / (gbps * 1e9));
    if let Some(left) = want.checked_sub(start.elapsed()) {
        std::thread::sleep(left);
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One all-reduce of `device_send` into `device_recv` through staging buffers, landed and
/// copied back piece by piece by two threads, as the staged path's stream does.
fn staged_once(
    comm: &Arc<ferroccl::comm::Comm>,
    base: &OpRequest,
    bufs: (&[f32], &mut [f32], &mut [f32], &mut [f32]),
    seq: u32,
    piece: usize,
    gbps: f64,
) {
    let (device_send, staging_send, staging_recv, device_recv) = bufs;
    let bytes = device_send.len() * 4;
    let flags: Vec<AtomicU32> = (0..FLAG_WORDS).map(|_| AtomicU32::new(0)).collect();
    let pieces = Pieces::new(bytes, piece, 4);
    // SAFETY: `flags` holds FLAG_WORDS atomics and outlives every use (the scope below).
    let stage = unsafe { StageProgress::new(flags.as_ptr() as *mut u8, seq, pieces, pieces) };
    stage.reset();
    let req = OpRequest {
        send: staging_send.as_ptr().cast(),
        recv: staging_recv.as_mut_ptr().cast(),
        device_call: true,
        ..*base
    };
    // The stream's orders: input in the order the plan reads it, output as the plan finishes it.
    let (landing, going_back) = staged_orders(comm, &req, pieces, pieces);
    let (from, to) = (device_send.as_ptr() as usize, staging_send.as_mut_ptr() as usize);
    let (back_from, back_to) = (staging_recv.as_ptr() as usize, device_recv.as_mut_ptr() as usize);
    std::thread::scope(|s| {
        let flags = &flags;
        s.spawn(move || {
            for k in landing {
                let (a, b) = pieces.range(k);
                copy_at_rate(from + a, to + a, b - a, gbps);
                flags[k].store(seq, Ordering::Release);
            }
        });
        s.spawn(move || {
            for k in going_back {
                while !reached(flags[MAX_PIECES + k].load(Ordering::Acquire), seq) {
                    // A copy engine notices a released piece within microseconds; a sleep
                    // would take tens (timer slack) and add them to every operation.
                    std::thread::yield_now();
                }
                let (a, b) = pieces.range(k);
                copy_at_rate(back_from + a, back_to + a, b - a, gbps);
            }
        });
        let result = run_progressive(comm, &req, stage);
        // What the stream worker does after the engine, and on failure too: every piece
        // goes back (the copier thread waits for them).
        stage.release_all();
        result.expect("staged all-reduce");
    });
}

/// `run_progressive` with every input piece landed before it starts; nothing copied back.
fn landed_once(
    comm: &Arc<ferroccl::comm::Comm>,
    base: &OpRequest,
    staging_send: &[f32],
    staging_recv: &mut [f32],
    seq: u32,
    piece: usize,
) {
    let flags: Vec<AtomicU32> = (0..FLAG_WORDS).map(|_| AtomicU32::new(0)).collect();
    let pieces = Pieces::new(staging_send.len() * 4, piece, 4);
    // SAFETY: `flags` holds FLAG_WORDS atomics and outlives the call.
    let stage = unsafe { StageProgress::new(flags.as_ptr() as *mut u8, seq, pieces, pieces) };
    stage.reset();
    flags.iter().take(pieces.count()).for_each(|f| f.store(seq, Ordering::Release));
    let req = OpRequest {
        send: staging_send.as_ptr().cast(),
        recv: staging_recv.as_mut_ptr().cast(),
        device_call: true,
        ..*base
    };
    run_progressive(comm, &req, stage).expect("landed all-reduce");
}

fn rank_main(rank: usize, id: ncclUniqueId, barrier: &Barrier, iters: usize, piece: usize, gbps: f64) {
    let mut handle = std::ptr::null_mut();
    assert_eq!(ncclCommInitRank(&mut handle, RANKS as i32, id, rank as i32).0, 0, "ncclCommInitRank");
    let comm = ferroccl::comm::lookup(handle, "staged_emul").expect("communicator");
    for mib in SIZES_MIB {
        let count = (mib << 20) / 4;
        let device_send = vec![1.0f32; count];
        let mut device_recv = vec![0.0f32; count];
        // Filled already, for GBPS=0 (no copies at all).
        let mut staging_send = device_send.clone();
        let mut staging_recv = vec![0.0f32; count];
        let base = OpRequest {
            op: CollOp::AllReduce,
            send: device_send.as_ptr().cast(),
            recv: staging_recv.as_mut_ptr().cast(),
            count,
            dtype: DataType::Float32,
            reduction: Some(Reduction::builtin(DataType::Float32, BuiltinOp::Sum, RANKS)),
            mem: MemKind::Host,
            stream: Stream(0),
            pre_device: None,
            device_call: false,
        };
        let (mut host, mut staged, mut landed) = (Vec::new(), Vec::new(), Vec::new());
        for it in 0..iters + 2 {
            barrier.wait();
            let start = Instant::now();
            run_one(&comm, &base).expect("host all-reduce");
            let host_us = start.elapsed().as_secs_f64() * 1e6;
            barrier.wait();
            device_recv.fill(0.0);
            staging_recv.fill(0.0);
            let start = Instant::now();
            let bufs = (&device_send[..], &mut staging_send[..], &mut staging_recv[..], &mut device_recv[..]);
            staged_once(&comm, &base, bufs, 7 + it as u32, piece, gbps);
            let staged_us = start.elapsed().as_secs_f64() * 1e6;
            // Without copies (GBPS=0) the result stays in the staging buffer.
            let result = if gbps == 0.0 { &staging_recv } else { &device_recv };
            assert!(result.iter().all(|&v| v == RANKS as f32), "wrong staged result");
            barrier.wait();
            let start = Instant::now();
            landed_once(&comm, &base, &staging_send, &mut staging_recv, 1000 + it as u32, piece);
            let landed_us = start.elapsed().as_secs_f64() * 1e6;
            // Checked outside the timed call (a scan of the whole buffer).
            assert!(staging_recv.iter().all(|&v| v == RANKS as f32), "wrong landed result");
            if it >= 2 {
                host.push(host_us);
                staged.push(staged_us);
                landed.push(landed_us);
            }
        }
        if rank == 0 {
            let (h, s, l) = (median(host), median(staged), median(landed));
            println!(
                "{mib:>4} MiB  host {h:>9.0} us  staged {s:>9.0} us  landed {l:>9.0} us  host/staged {:.2}  host/landed {:.2}",
                h / s,
                h / l
            );
        }
    }
    drop(comm);
    assert_eq!(ncclCommDestroy(handle).0, 0, "ncclCommDestroy");
}

fn main() {
    let iters: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(10).max(1);
    let piece: usize = env_or("PIECE", 256 << 10);
    let gbps: f64 = env_or("GBPS", 25.0);
    println!("# 2 rank threads, all-reduce float sum, median of {iters}; piece {piece} B, copies at {gbps} GB/s");
    let mut id = ncclUniqueId { internal: [0; 128] };
    assert_eq!(ncclGetUniqueId(&mut id).0, 0, "ncclGetUniqueId");
    let barrier = Arc::new(Barrier::new(RANKS));
    let threads: Vec<_> = (0..RANKS)
        .map(|rank| {
            let barrier = barrier.clone();
            std::thread::spawn(move || rank_main(rank, id, &barrier, iters, piece, gbps))
        })
        .collect();
    for t in threads {
        t.join().expect("rank thread");
    }
}
