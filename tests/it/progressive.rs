//! Staged buffers arriving and leaving piece by piece (`coll::progressive`), on host memory: the
//! executor rules of the GPU's staged path, without a GPU. Per rank, a lander thread plays the
//! stream's copies in: it writes the real input one piece at a time, a little later each, and
//! sets the piece's landed flag only after; until then the piece holds poison. It lands them in
//! the order the stream would (the plan's), and on odd ranks in the reverse of it, which the
//! executor must survive as well. A copier thread
//! plays the copies back: it copies each output piece out once, as soon as its released flag
//! is set. A step that starts before its input has landed, or a piece released before its
//! last writer, shows as a wrong value. Ranks as threads, over the node area (the default),
//! and over sockets in a child process with `NCCL_SHM_DISABLE=1` (there the executor's plan
//! steps wait for their pieces one by one).

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferroccl::coll::progressive::{reached, Pieces, StageProgress, FLAG_WORDS, MAX_PIECES};
use ferroccl::coll::{run_progressive, staged_orders, CollOp, OpRequest};
use ferroccl::cuda::memory::MemKind;
use ferroccl::cuda::stream::Stream;
use ferroccl::reduce::Reduction;
use ferroccl::types::{BuiltinOp, DataType};

use crate::common::with_ranks;

const POISON: i64 = -0x5a5a_5a5a;
const SEQ: u32 = 41;

/// One rank's staged call: what it sends, how long its output is, and the expected output.
struct Case {
    op: CollOp,
    /// Elements per rank (NCCL's count).
    count: usize,
    send: Vec<i64>,
    expect: Vec<i64>,
}

fn value(rank: usize, i: usize) -> i64 {
    (rank as i64 + 1) * 1_000_003 + i as i64 % 7919
}

fn cases(rank: usize, n: usize) -> Vec<Case> {
    let count = 196_613; // 1.5 MiB of int64 and a bit: 6 pieces, the last one short
    let mine: Vec<i64> = (0..count).map(|i| value(rank, i)).collect();
    let sum: Vec<i64> = (0..count).map(|i| (0..n).map(|r| value(r, i)).sum()).collect();
    let gathered: Vec<i64> = (0..n).flat_map(|r| (0..count).map(move |i| value(r, i))).collect();
    let root = n - 1;
    let all_blocks: Vec<i64> = (0..n * count).map(|j| value(rank, j)).collect();
    let scattered: Vec<i64> = (0..count).map(|i| (0..n).map(|r| value(r, rank * count + i)).sum()).collect();
    vec![
        Case { op: CollOp::AllReduce, count, send: mine.clone(), expect: sum },
        Case { op: CollOp::AllGather, count, send: mine.clone(), expect: gathered },
        Case {
            op: CollOp::Broadcast { root },
            count,
            send: if rank == root { mine } else { Vec::new() },
            expect: (0..count).map(|i| value(root, i)).collect(),
        },
        Case { op: CollOp::ReduceScatter, count, send: all_blocks, expect: scattered },
    ]
}

/// The host request the stream worker would run for `case`, on staging buffers.
fn staged_request(case: &Case, staged_send: &[i64], staged_recv: &mut [i64], nranks: usize) -> OpRequest {
    OpRequest {
        op: case.op,
        send: if case.send.is_empty() { std::ptr::null() } else { staged_send.as_ptr().cast() },
        recv: staged_recv.as_mut_ptr().cast(),
        count: case.count,
        dtype: DataType::Int64,
        reduction: Some(Reduction::builtin(DataType::Int64, BuiltinOp::Sum, nranks)),
        mem: MemKind::Host,
        stream: Stream(0),
        pre_device: None,
        device_call: true,
    }
}

/// Runs one case on this rank through `run_progressive`, with a lander and a copier.
fn run_case(comm: &Arc<ferroccl::comm::Comm>, case: &Case) -> Vec<i64> {
    let piece = 256 << 10;
    let recv_len = case.expect.len();
    let mut staged_send = vec![POISON; case.send.len()];
    let mut staged_recv = vec![POISON; recv_len];
    let mut out = vec![POISON; recv_len];
    let flags: Vec<AtomicU32> = (0..FLAG_WORDS).map(|_| AtomicU32::new(0)).collect();
    let input = Pieces::new(case.send.len() * 8, piece, 8);
    let output = Pieces::new(recv_len * 8, piece, 8);
    // SAFETY: `flags` holds FLAG_WORDS atomics and outlives every use below (the scope).
    let stage = unsafe { StageProgress::new(flags.as_ptr() as *mut u8, SEQ, input, output) };
    stage.reset();
    let req = staged_request(case, &staged_send, &mut staged_recv, comm.nranks);
    let (mut landing, _) = staged_orders(comm, &req, input, output);
    if comm.rank % 2 == 1 {
        landing.reverse();
    }
    let send_at = staged_send.as_mut_ptr() as usize;
    let recv_at = staged_recv.as_ptr() as usize;
    let out_at = out.as_mut_ptr() as usize;
    std::thread::scope(|s| {
        let flags = &flags;
        s.spawn(move || {
            for k in landing {
                std::thread::sleep(Duration::from_micros(400));
                let (a, b) = input.range(k);
                // SAFETY: bytes [a, b) of the staged send buffer (alive for the scope); the
                // executor does not touch them before the landed flag below.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        case.send.as_ptr().cast::<u8>().add(a),
                        (send_at as *mut u8).add(a),
                        b - a,
                    )
                };
                flags[k].store(SEQ, Ordering::Release);
            }
        });
        s.spawn(move || {
            let mut copied = vec![false; output.count()];
            let start = Instant::now();
            while copied.iter().any(|c| !c) && start.elapsed() < Duration::from_secs(60) {
                for (k, done) in copied.iter_mut().enumerate() {
                    if !*done && reached(flags[MAX_PIECES + k].load(Ordering::Acquire), SEQ) {
                        let (a, b) = output.range(k);
                        // SAFETY: bytes [a, b) of the staged output (final once released, and
                        // alive for the scope) into `out`, which only this thread writes.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                (recv_at as *const u8).add(a),
                                (out_at as *mut u8).add(a),
                                b - a,
                            )
                        };
                        *done = true;
                    }
                }
                std::hint::spin_loop();
            }
        });
        run_progressive(comm, &req, stage).expect("run_progressive");
        // What the stream worker does after the engine: every piece goes back.
        stage.release_all();
    });
    out
}

fn check_all(rank: usize, n: usize, comm: &Arc<ferroccl::comm::Comm>) {
    for case in cases(rank, n) {
        let got = run_case(comm, &case);
        let bad = got.iter().zip(&case.expect).position(|(g, e)| g != e);
        assert!(bad.is_none(), "rank {rank}, {:?}: element {bad:?}: got {:?}", case.op, bad.map(|i| got[i]));
    }
}

#[test]
fn piecewise_staged_operations_on_the_node_area() {
    for n in [2, 3] {
        with_ranks(n, move |rank, comm| {
            let c = ferroccl::comm::lookup(comm.0, "test").unwrap();
            check_all(rank, n, &c);
        });
    }
}

#[test]
fn progressive_child() {
    let Ok(n) = std::env::var("FERROCCL_IT_PROGRESSIVE_CHILD") else { return };
    let n: usize = n.parse().unwrap();
    with_ranks(n, move |rank, comm| {
        let c = ferroccl::comm::lookup(comm.0, "test").unwrap();
        check_all(rank, n, &c);
        abandon_case(rank, &c);
    });
    println!("PROGRESSIVE CHILD OK");
}

#[test]
fn piecewise_staged_operations_over_sockets() {
    for n in [2, 3] {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "progressive::progressive_child", "--nocapture", "--test-threads=1"])
            .env("FERROCCL_IT_PROGRESSIVE_CHILD", n.to_string())
            .env("NCCL_SHM_DISABLE", "1")
            .env("FERROCCL_BOOTSTRAP_TIMEOUT", "30")
            .env("FERROCCL_TIMEOUT", "60")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && text.contains("PROGRESSIVE CHILD OK"), "{n} ranks:\n{text}");
    }
}

/// The caller could not queue all of the input (the stream refused a copy): the executor, whose
/// steps wait for pieces that will never land, gives up with an error instead of waiting. Over
/// the node area (a node operation, gated on all of its input) and over sockets (plan steps:
/// receives already posted when it gives up).
#[test]
fn an_abandoned_staged_operation_fails_instead_of_waiting() {
    with_ranks(2, |rank, comm| {
        let comm = ferroccl::comm::lookup(comm.0, "test").unwrap();
        abandon_case(rank, &comm);
    });
}

fn abandon_case(rank: usize, comm: &Arc<ferroccl::comm::Comm>) {
    let case = cases(rank, comm.nranks).swap_remove(0);
    let staged_send = vec![POISON; case.send.len()];
    let mut staged_recv = vec![POISON; case.expect.len()];
    let flags: Vec<AtomicU32> = (0..FLAG_WORDS).map(|_| AtomicU32::new(0)).collect();
    let input = Pieces::new(case.send.len() * 8, 256 << 10, 8);
    let output = Pieces::new(case.expect.len() * 8, 256 << 10, 8);
    // SAFETY: `flags` holds FLAG_WORDS atomics and outlives every use below (the scope).
    let stage = unsafe { StageProgress::new(flags.as_ptr() as *mut u8, SEQ, input, output) };
    stage.reset();
    let req = staged_request(&case, &staged_send, &mut staged_recv, comm.nranks);
    let start = Instant::now();
    let result = std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            stage.abandon();
        });
        run_progressive(comm, &req, stage)
    });
    let err = result.expect_err("an abandoned operation must fail");
    assert!(err.to_string().contains("could not all be queued"), "rank {rank}: {err}");
    assert!(start.elapsed() < Duration::from_secs(20), "rank {rank}: gave up only after {:?}", start.elapsed());
}
