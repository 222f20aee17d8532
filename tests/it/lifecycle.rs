//! Communicator lifecycle: InitAll driven from one thread, init inside groups, split, many
//! communicators at once from several threads, queries, finalize.

use std::ffi::c_void;

use ferroccl::ffi::coll::ncclAllReduce;
use ferroccl::ffi::group::{ncclGroupEnd, ncclGroupStart};
use ferroccl::ffi::init::*;
use ferroccl::ffi::query::{ncclCommCount, ncclCommCuDevice, ncclCommUserRank};
use ferroccl::types::{ncclComm_t, ncclDataType_t, ncclRedOp_t, NCCL_SPLIT_NOCOLOR};

use crate::common::*;

const S: *mut c_void = std::ptr::null_mut();

#[test]
fn init_all_driven_from_one_thread_with_groups() {
    let n = 4;
    let mut comms = vec![std::ptr::null_mut(); n];
    check(ncclCommInitAll(comms.as_mut_ptr(), n as i32, std::ptr::null()), "ncclCommInitAll");
    for (i, &c) in comms.iter().enumerate() {
        let (mut count, mut rank, mut dev) = (0, 0, -1);
        check(ncclCommCount(c, &mut count), "count");
        check(ncclCommUserRank(c, &mut rank), "rank");
        check(ncclCommCuDevice(c, &mut dev), "dev");
        assert_eq!((count, rank, dev), (n as i32, i as i32, i as i32));
    }
    let count = 100_000;
    let inputs: Vec<Vec<f32>> = (0..n).map(|r| (0..count).map(|i| (r * 3 + i % 7) as f32).collect()).collect();
    let mut outputs = vec![vec![0f32; count]; n];
    check(ncclGroupStart(), "group start");
    for r in 0..n {
        check(
            ncclAllReduce(
                inputs[r].as_ptr().cast(),
                outputs[r].as_mut_ptr().cast(),
                count,
                ncclDataType_t(7),
                ncclRedOp_t(0),
                comms[r],
                S,
            ),
            "allreduce",
        );
    }
    check(ncclGroupEnd(), "group end");
    for out in &outputs {
        for (i, v) in out.iter().enumerate() {
            assert_eq!(*v, (0..n).map(|r| (r * 3 + i % 7) as f32).sum::<f32>());
        }
    }
    // Several all-reduces per communicator in one group, small (one-shot) and large (direct)
    // in place, all driven by this thread: each rank's node operations run in call order.
    let small: Vec<Vec<f32>> = (0..n).map(|r| vec![r as f32; 10]).collect();
    let mut small_out = vec![vec![[0f32; 10]; 2]; n];
    check(ncclGroupStart(), "group start");
    for r in 0..n {
        let (a, b) = small_out[r].split_at_mut(1);
        for (send, recv, len) in [
            (small[r].as_ptr(), a[0].as_mut_ptr(), 10),
            (outputs[r].as_ptr(), outputs[r].as_mut_ptr(), count),
            (small[r].as_ptr(), b[0].as_mut_ptr(), 10),
        ] {
            check(
                ncclAllReduce(send.cast(), recv.cast(), len, ncclDataType_t(7), ncclRedOp_t(0), comms[r], S),
                "allreduce",
            );
        }
    }
    check(ncclGroupEnd(), "group end");
    let sum_ranks = (0..n).map(|r| r as f32).sum::<f32>();
    for r in 0..n {
        assert!(small_out[r].iter().flatten().all(|&v| v == sum_ranks), "{:?}", small_out[r]);
        for (i, v) in outputs[r].iter().enumerate() {
            assert_eq!(*v, n as f32 * (0..n).map(|q| (q * 3 + i % 7) as f32).sum::<f32>());
        }
    }
    for c in comms {
        check(ncclCommFinalize(c), "finalize");
        check(ncclCommDestroy(c), "destroy");
    }
}

#[test]
fn init_rank_config_inside_a_group_from_one_thread() {
    // nccl-tests' pattern: one thread, several ncclCommInitRankConfig calls in one group.
    let n = 3;
    let id = unique_id();
    let mut comms: Vec<ncclComm_t> = vec![std::ptr::null_mut(); n];
    let mut config = ferroccl::config::undef_config();
    check(ncclGroupStart(), "group start");
    for (r, c) in comms.iter_mut().enumerate() {
        check(ncclCommInitRankConfig(c, n as i32, id, r as i32, &mut config), "init in group");
    }
    check(ncclGroupEnd(), "group end");
    for (r, &c) in comms.iter().enumerate() {
        let mut rank = -1;
        check(ncclCommUserRank(c, &mut rank), "rank");
        assert_eq!(rank, r as i32);
        check(ncclCommDestroy(c), "destroy");
    }
}

#[test]
fn split_by_color_and_key() {
    let n = 5;
    let got = with_ranks(n, move |rank, comm| {
        // Colors: even/odd; key reverses the order; rank 4 opts out.
        let color = if rank == 4 { NCCL_SPLIT_NOCOLOR } else { (rank % 2) as i32 };
        let mut child: ncclComm_t = std::ptr::null_mut();
        check(ncclCommSplit(comm.0, color, -(rank as i32), &mut child, std::ptr::null_mut()), "split");
        if rank == 4 {
            assert!(child.is_null());
            return None;
        }
        let (mut crank, mut ccount) = (-1, -1);
        check(ncclCommUserRank(child, &mut crank), "child rank");
        check(ncclCommCount(child, &mut ccount), "child count");
        let v = [rank as f32 + 1.0; 4];
        let mut out = [0f32; 4];
        check(
            ncclAllReduce(v.as_ptr().cast(), out.as_mut_ptr().cast(), 4, ncclDataType_t(7), ncclRedOp_t(0), child, S),
            "child allreduce",
        );
        check(ncclCommDestroy(child), "destroy child");
        Some((crank, ccount, out[0]))
    });
    // Even ranks {0,2} (keys 0,-2: rank 2 first), odd ranks {1,3} (rank 3 first).
    assert_eq!(got[0], Some((1, 2, 4.0)));
    assert_eq!(got[2], Some((0, 2, 4.0)));
    assert_eq!(got[1], Some((1, 2, 6.0)));
    assert_eq!(got[3], Some((0, 2, 6.0)));
    assert_eq!(got[4], None);
}

#[test]
fn many_communicators_from_several_threads() {
    // Three independent 2-rank communicators, all alive and busy at once.
    let handles: Vec<_> = (0..3)
        .map(|k| {
            std::thread::spawn(move || {
                with_ranks(2, move |rank, comm| {
                    for iter in 0..20 {
                        let v = vec![(k * 10 + rank + iter) as f64; 1000];
                        let mut out = vec![0f64; 1000];
                        check(
                            ncclAllReduce(
                                v.as_ptr().cast(),
                                out.as_mut_ptr().cast(),
                                1000,
                                ncclDataType_t(8),
                                ncclRedOp_t(0),
                                comm.0,
                                S,
                            ),
                            "allreduce",
                        );
                        assert_eq!(out[999], (2 * (k * 10 + iter) + 1) as f64);
                    }
                })
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn scalable_init_abort_memory_registration_and_windows() {
    use ferroccl::ffi::mem::{ncclMemAlloc, ncclMemFree};
    use ferroccl::ffi::query::{
        ncclCommDeregister, ncclCommRegister, ncclCommWindowDeregister, ncclCommWindowRegister,
    };
    use ferroccl::types::{ncclResult_t, ncclWindow_t};
    let n = 2;
    let ids = [unique_id(), unique_id()];
    let threads: Vec<_> = (0..n)
        .map(|rank| {
            std::thread::spawn(move || {
                let mut ids = ids;
                let mut comm: ncclComm_t = std::ptr::null_mut();
                check(
                    ncclCommInitRankScalable(&mut comm, n, rank, 2, ids.as_mut_ptr(), std::ptr::null_mut()),
                    "ncclCommInitRankScalable",
                );
                let mut p: *mut c_void = std::ptr::null_mut();
                check(ncclMemAlloc(&mut p, 1 << 20), "ncclMemAlloc");
                assert_eq!(p as usize % 4096, 0);
                let mut handle: *mut c_void = std::ptr::null_mut();
                check(ncclCommRegister(comm, p, 1 << 20, &mut handle), "register");
                // SAFETY: p is a 1 MiB allocation from ncclMemAlloc.
                let buf = unsafe { std::slice::from_raw_parts_mut(p as *mut f32, 1 << 18) };
                buf.fill(rank as f32 + 1.0);
                check(ncclAllReduce(p, p, 1 << 18, ncclDataType_t(7), ncclRedOp_t(0), comm, S), "allreduce");
                assert!(buf.iter().all(|&v| v == 3.0));
                check(ncclCommDeregister(comm, handle), "deregister");
                assert_eq!(ncclCommDeregister(comm, handle), ncclResult_t::ncclInvalidArgument);

                // The same buffer as a symmetric window (nccl-tests -R 2): collectives on it
                // give the same results; handles of one kind are refused by the other's call.
                let mut win: ncclWindow_t = std::ptr::null_mut();
                check(ncclCommWindowRegister(comm, p, 1 << 20, &mut win, 0x01), "window register");
                assert!(!win.is_null());
                buf.fill(rank as f32 + 2.0);
                check(ncclAllReduce(p, p, 1 << 18, ncclDataType_t(7), ncclRedOp_t(0), comm, S), "allreduce");
                assert!(buf.iter().all(|&v| v == 5.0));
                assert_eq!(ncclCommDeregister(comm, win as *mut c_void), ncclResult_t::ncclInvalidArgument);
                check(ncclCommWindowDeregister(comm, win), "window deregister");
                assert_eq!(ncclCommWindowDeregister(comm, win), ncclResult_t::ncclInvalidArgument, "twice");
                check(ncclCommWindowDeregister(comm, std::ptr::null_mut()), "a null window is accepted");
                check(ncclCommRegister(comm, p, 1 << 20, &mut handle), "register again");
                assert_eq!(ncclCommWindowDeregister(comm, handle as ncclWindow_t), ncclResult_t::ncclInvalidArgument);
                check(ncclCommDeregister(comm, handle), "deregister again");
                // Bad arguments change nothing.
                let mut untouched: ncclWindow_t = std::ptr::null_mut();
                let bad = ncclCommWindowRegister(comm, p, 1 << 20, &mut untouched, 0x40);
                assert_eq!(bad, ncclResult_t::ncclInvalidArgument, "unknown flags");
                assert!(untouched.is_null());
                let bad = ncclCommWindowRegister(comm, std::ptr::null_mut(), 1 << 20, &mut untouched, 0);
                assert_eq!(bad, ncclResult_t::ncclInvalidArgument, "null buffer");
                let bad = ncclCommWindowRegister(comm, p, 0, &mut untouched, 0);
                assert_eq!(bad, ncclResult_t::ncclInvalidArgument, "size 0");
                let bad = ncclCommWindowRegister(comm, p, 1 << 20, std::ptr::null_mut(), 0);
                assert_eq!(bad, ncclResult_t::ncclInvalidArgument, "null window pointer");
                let bad = ncclCommWindowRegister(std::ptr::null_mut(), p, 1 << 20, &mut untouched, 0);
                assert_eq!(bad, ncclResult_t::ncclInvalidArgument, "null communicator");
                assert!(untouched.is_null());
                check(ncclMemFree(p), "ncclMemFree");
                assert_eq!(ncclMemFree(p), ncclResult_t::ncclInvalidArgument, "double free is rejected");
                check(ncclCommAbort(comm), "abort");
                assert_eq!(ncclCommDestroy(comm), ncclResult_t::ncclInvalidArgument, "aborted comm is gone");
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn finalized_communicator_refuses_work() {
    use ferroccl::types::ncclResult_t;
    with_ranks(1, |_, comm| {
        let v = [1.0f32; 4];
        let mut out = [0f32; 4];
        check(ncclCommFinalize(comm.0), "finalize");
        let r =
            ncclAllReduce(v.as_ptr().cast(), out.as_mut_ptr().cast(), 4, ncclDataType_t(7), ncclRedOp_t(0), comm.0, S);
        assert_eq!(r, ncclResult_t::ncclInvalidUsage);
    });
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

/// One cycle: two communicators of one process (ncclCommInitAll), one all-reduce in a group,
/// then both aborted (or destroyed).
fn init_reduce_end(abort: bool) {
    let n = 2;
    let mut comms = vec![std::ptr::null_mut(); n];
    check(ncclCommInitAll(comms.as_mut_ptr(), n as i32, std::ptr::null()), "ncclCommInitAll");
    let count = 70_000;
    let input = vec![1.5f32; count];
    let mut outputs = vec![vec![0f32; count]; n];
    check(ncclGroupStart(), "group start");
    for (r, out) in outputs.iter_mut().enumerate() {
        let rc = ncclAllReduce(
            input.as_ptr().cast(),
            out.as_mut_ptr().cast(),
            count,
            ncclDataType_t(7),
            ncclRedOp_t(0),
            comms[r],
            S,
        );
        check(rc, "allreduce");
    }
    check(ncclGroupEnd(), "group end");
    assert!(outputs.iter().all(|o| o.iter().all(|&v| v == 3.0)), "all-reduce result");
    for c in comms {
        check(if abort { ncclCommAbort(c) } else { ncclCommDestroy(c) }, "end communicator");
    }
}

/// Body of the leak check below (runs alone in a child process so that other tests' threads
/// and descriptors do not count; does nothing without the role variable).
#[test]
fn leak_check_child() {
    if std::env::var_os("FERROCCL_IT_LEAK_CHILD").is_none() {
        return;
    }
    // The first cycle creates what lives for the whole process (the network and its
    // listener's acceptor, the topology): counted from after it.
    init_reduce_end(false);
    let (fds, tasks) = (open_fds(), threads());
    for i in 0..12 {
        init_reduce_end(i % 3 != 0);
    }
    // Threads of aborted communicators may take a moment to notice and exit.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while (open_fds() > fds || threads() > tasks) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    println!("LEAK CHECK fds {fds} -> {} threads {tasks} -> {}", open_fds(), threads());
    assert!(open_fds() <= fds, "descriptors leaked: {fds} -> {}", open_fds());
    assert!(threads() <= tasks, "threads leaked: {tasks} -> {}", threads());
}

/// Communicators made again and again in one process, ended by abort or destroy, leave no
/// descriptor and no thread behind.
#[test]
fn communicators_recreated_after_abort_leak_nothing() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "lifecycle::leak_check_child", "--nocapture", "--test-threads=1"])
        .env("FERROCCL_IT_LEAK_CHILD", "1")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("LEAK CHECK"), "child:\n{text}");
    println!("{}", text.lines().find(|l| l.contains("LEAK CHECK")).unwrap_or(""));
}

/// ncclGroupSimulateEnd: the group's operations are estimated, not run; a null simInfo makes
/// it ncclGroupEnd; a bad simInfo closes the group, drops its operations and is refused, as in
/// NCCL; inner levels leave the estimate alone (and do not look at the magic); a struct too
/// short for the estimate is not written past its size; an empty group leaves it alone.
#[test]
fn group_simulate_end_estimates_without_running() {
    use ferroccl::ffi::group::ncclGroupSimulateEnd;
    use ferroccl::types::{ncclResult_t, ncclSimInfo_t, NCCL_SIM_INFO_MAGIC};
    let fresh = || ncclSimInfo_t {
        size: std::mem::size_of::<ncclSimInfo_t>(),
        magic: NCCL_SIM_INFO_MAGIC,
        version: 22707,
        estimatedTime: f32::NAN,
    };
    with_ranks(2, move |rank, comm| {
        let c = comm.0;
        let n = 1 << 20;
        let input = vec![(rank + 1) as f32; n];
        let mut out = vec![0f32; n];
        let all_reduce = |out: &mut [f32], count: usize| {
            check(
                ncclAllReduce(
                    input.as_ptr().cast(),
                    out.as_mut_ptr().cast(),
                    count,
                    ncclDataType_t(7),
                    ncclRedOp_t(0),
                    c,
                    S,
                ),
                "all-reduce",
            )
        };
        let simulate = |count: usize, calls: usize| -> f32 {
            let mut info = fresh();
            let mut out = vec![0f32; n];
            check(ncclGroupStart(), "group start");
            for _ in 0..calls {
                all_reduce(&mut out, count);
            }
            check(ncclGroupSimulateEnd(&mut info), "simulate end");
            assert!(out.iter().all(|&v| v == 0.0), "rank {rank}: a simulated all-reduce wrote its output");
            assert!(info.estimatedTime.is_finite() && info.estimatedTime > 0.0, "estimate {}", info.estimatedTime);
            info.estimatedTime
        };

        let mut info = fresh();
        assert_eq!(ncclGroupSimulateEnd(&mut info), ncclResult_t::ncclInvalidUsage, "outside a group");
        assert!(info.estimatedTime.is_nan());

        // Bigger and more operations cost more.
        let (small, large, twice) = (simulate(256, 1), simulate(n, 1), simulate(n, 2));
        assert!(small < large && large < twice, "{small} {large} {twice}");

        // A bad magic closes the group (NCCL's cleanup): its operation is dropped, and the
        // thread is outside any group afterwards.
        check(ncclGroupStart(), "group start");
        all_reduce(&mut out, n);
        let mut bad = ncclSimInfo_t { magic: 0, ..fresh() };
        assert_eq!(ncclGroupSimulateEnd(&mut bad), ncclResult_t::ncclInvalidArgument);
        assert!(bad.estimatedTime.is_nan());
        assert!(out.iter().all(|&v| v == 0.0), "rank {rank}: the refused group ran");
        assert_eq!(ncclGroupEnd(), ncclResult_t::ncclInvalidUsage, "the group is closed");

        // Nested: the inner end neither looks at its simInfo nor writes it; the outer one does.
        let mut inner = ncclSimInfo_t { magic: 0, ..fresh() };
        let mut outer = fresh();
        check(ncclGroupStart(), "outer start");
        check(ncclGroupStart(), "inner start");
        all_reduce(&mut out, n);
        check(ncclGroupSimulateEnd(&mut inner), "inner simulate end");
        check(ncclGroupSimulateEnd(&mut outer), "outer simulate end");
        assert!(inner.estimatedTime.is_nan() && outer.estimatedTime > 0.0);

        // An empty group: nothing to estimate, the field keeps its value.
        let mut empty = fresh();
        check(ncclGroupStart(), "group start");
        check(ncclGroupSimulateEnd(&mut empty), "simulate end of an empty group");
        assert!(empty.estimatedTime.is_nan());

        // An older, shorter struct (no estimatedTime): accepted, nothing written past its size.
        let mut short = fresh();
        short.size = 16;
        check(ncclGroupStart(), "group start");
        all_reduce(&mut out, n);
        check(ncclGroupSimulateEnd(&mut short), "simulate end with a short struct");
        assert!(short.estimatedTime.is_nan());

        // A null simInfo is ncclGroupEnd: the operations run.
        out.fill(0.0);
        check(ncclGroupStart(), "group start");
        all_reduce(&mut out, n);
        check(ncclGroupSimulateEnd(std::ptr::null_mut()), "simulate end with null");
        assert!(out.iter().all(|&v| v == 3.0), "rank {rank}: null simInfo runs the group");
    });
}
