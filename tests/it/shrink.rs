//! ncclCommShrink: survivors of a healthy parent (NCCL_SHRINK_DEFAULT) make a communicator
//! without the excluded ranks, which do not call it and keep the parent usable; a non-blocking
//! shrink driven from one thread; bad exclude lists change nothing; and, with ranks as
//! processes, NCCL_SHRINK_ABORT after a rank was killed with SIGKILL (the new root is the
//! lowest survivor: the dead rank was rank 0).

use std::ffi::c_void;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use ferroccl::ffi::coll::ncclAllReduce;
use ferroccl::ffi::init::{ncclCommAbort, ncclCommDestroy, ncclCommInitRank, ncclCommShrink};
use ferroccl::ffi::query::{ncclCommCount, ncclCommUserRank};
use ferroccl::types::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t};

use crate::common::*;
use crate::nonblocking::{create_from_one_thread, expect, group_all_reduce_i64, poll_all};
use crate::processes::{hex, unhex};

const S: *mut c_void = std::ptr::null_mut();
const DEFAULT: i32 = 0; // NCCL_SHRINK_DEFAULT
const ABORT: i32 = 1; // NCCL_SHRINK_ABORT

fn rank_and_count(c: ncclComm_t) -> (i32, i32) {
    let (mut rank, mut count) = (-1, -1);
    check(ncclCommUserRank(c, &mut rank), "ncclCommUserRank");
    check(ncclCommCount(c, &mut count), "ncclCommCount");
    (rank, count)
}

/// Sum all-reduce of `count` i64 whose element i on (parent) rank r is r * 1000 + i; checks
/// the result against the ranks in `members`.
fn all_reduce_checked(comm: ncclComm_t, parent_rank: usize, members: &[usize], what: &str) {
    let count = 4096;
    let send: Vec<i64> = (0..count).map(|i| (parent_rank * 1000 + i) as i64).collect();
    let mut recv = vec![0i64; count];
    let (s, d) = (send.as_ptr().cast(), recv.as_mut_ptr().cast());
    check(ncclAllReduce(s, d, count, ncclDataType_t(4), ncclRedOp_t(0), comm, S), what);
    for (i, v) in recv.iter().enumerate() {
        let want: i64 = members.iter().map(|&r| (r * 1000 + i) as i64).sum();
        assert_eq!(*v, want, "{what}: element {i}");
    }
}

#[test]
fn shrink_a_healthy_parent_then_use_both() {
    with_ranks(4, |rank, comm| {
        // Rank 1 is excluded and does not call ncclCommShrink.
        if rank != 1 {
            let mut excluded = [1];
            let mut child: ncclComm_t = std::ptr::null_mut();
            check(
                ncclCommShrink(comm.0, excluded.as_mut_ptr(), 1, &mut child, std::ptr::null_mut(), DEFAULT),
                "shrink",
            );
            let new_rank = [0, -1, 1, 2][rank];
            assert_eq!(rank_and_count(child), (new_rank, 3));
            all_reduce_checked(child, rank, &[0, 2, 3], "all-reduce on the shrunk communicator");
            check(ncclCommDestroy(child), "destroy child");
        }
        // A default shrink leaves the parent usable by all of its ranks.
        all_reduce_checked(comm.0, rank, &[0, 1, 2, 3], "all-reduce on the parent");
        // Exclude two ranks, listed out of order (the list is not reordered).
        if rank == 1 || rank == 2 {
            let mut excluded = [3, 0];
            let mut child: ncclComm_t = std::ptr::null_mut();
            check(
                ncclCommShrink(comm.0, excluded.as_mut_ptr(), 2, &mut child, std::ptr::null_mut(), DEFAULT),
                "shrink",
            );
            assert_eq!(excluded, [3, 0]);
            assert_eq!(rank_and_count(child), (rank as i32 - 1, 2));
            all_reduce_checked(child, rank, &[1, 2], "all-reduce after excluding two ranks");
            check(ncclCommDestroy(child), "destroy child");
        }
    });
}

#[test]
fn nonblocking_shrink_from_one_thread() {
    let parents = create_from_one_thread(3);
    let mut children: Vec<ncclComm_t> = vec![std::ptr::null_mut(); 2];
    for (r, child) in children.iter_mut().enumerate() {
        let mut excluded = [2];
        let code = ncclCommShrink(parents[r], excluded.as_mut_ptr(), 1, child, std::ptr::null_mut(), DEFAULT);
        assert_eq!(code, ncclResult_t::ncclInProgress);
        assert!(!child.is_null());
    }
    assert_eq!(poll_all(&parents), vec![ncclResult_t::ncclSuccess; 3]);
    assert_eq!(poll_all(&children), vec![ncclResult_t::ncclSuccess; 2]);
    assert_eq!(rank_and_count(children[1]), (1, 2));
    let inputs: Vec<Vec<i64>> = (0..2).map(|r| vec![r as i64 + 5; 64]).collect();
    let outs = group_all_reduce_i64(&children, &inputs);
    assert!(outs.iter().all(|o| o.iter().all(|&v| v == 11)));
    for c in children.into_iter().chain(parents) {
        check(ncclCommDestroy(c), "destroy");
    }
}

#[test]
fn bad_exclude_lists_are_rejected_and_change_nothing() {
    with_ranks(3, |rank, comm| {
        let c = comm.0;
        let other = (rank + 1) as i32 % 3;
        let sentinel = 0x7770 as ncclComm_t;
        let mut child = sentinel;
        let invalid = ncclResult_t::ncclInvalidArgument;
        let null: *mut ferroccl::types::ncclConfig_t = std::ptr::null_mut();
        expect(ncclCommShrink(c, null.cast(), 1, &mut child, null, DEFAULT), invalid, "excludeRanksList is NULL");
        let mut shrink = |list: &mut [i32], count: i32, flags: i32| {
            ncclCommShrink(c, list.as_mut_ptr(), count, &mut child, null, flags)
        };
        expect(shrink(&mut [], 0, DEFAULT), invalid, "excludeRanksCount must be at least 1");
        expect(shrink(&mut [3], 1, DEFAULT), invalid, "excluded rank 3 is out of range");
        expect(shrink(&mut [-1], 1, DEFAULT), invalid, "excluded rank -1 is out of range");
        let mut twice = [other, other];
        expect(shrink(&mut twice, 2, DEFAULT), invalid, &format!("rank {other} is excluded twice"));
        assert_eq!(twice, [other, other]);
        let mut all = [2, 0, 1];
        expect(shrink(&mut all, 3, DEFAULT), invalid, "excluding all 3 ranks");
        assert_eq!(all, [2, 0, 1], "the caller's list is left alone");
        expect(shrink(&mut [rank as i32], 1, DEFAULT), invalid, "is in the exclude list");
        expect(shrink(&mut [other], 1, 2), invalid, "unknown shrinkFlags");
        let mut one = [other];
        expect(ncclCommShrink(c, one.as_mut_ptr(), 1, std::ptr::null_mut(), null, DEFAULT), invalid, "newcomm is NULL");
        assert_eq!(child, sentinel, "newcomm is untouched");
        // The communicator is unchanged and works.
        all_reduce_checked(c, rank, &[0, 1, 2], "all-reduce after bad shrinks");
    });
}

/// Rank 2 stays alive but silent; ranks 0 and 1 each have an all-reduce blocked on the parent
/// in another thread. NCCL_SHRINK_ABORT must end those calls (ncclInvalidUsage: aborted),
/// then make the new communicator; the parent then only accepts abort or destroy.
#[test]
fn shrink_abort_ends_operations_blocked_on_the_parent() {
    // Every wait is bounded, so that a regression fails instead of hanging.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    with_ranks(3, move |rank, comm| {
        if rank == 2 {
            let deadline = Instant::now() + Duration::from_secs(30);
            while done.load(std::sync::atomic::Ordering::Acquire) < 2 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            return;
        }
        let finish = scopeguard(done.clone());
        let blocked = std::thread::spawn(move || {
            let comm = comm; // the whole (Send) wrapper, not its raw field
            let send = vec![1.0f32; 1024];
            let mut recv = vec![0f32; 1024];
            let (s, d) = (send.as_ptr().cast(), recv.as_mut_ptr().cast());
            ncclAllReduce(s, d, 1024, ncclDataType_t(7), ncclRedOp_t(0), comm.0, S)
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(!blocked.is_finished(), "the all-reduce cannot complete without rank 2");
        let mut excluded = [2];
        let mut child: ncclComm_t = std::ptr::null_mut();
        check(ncclCommShrink(comm.0, excluded.as_mut_ptr(), 1, &mut child, std::ptr::null_mut(), ABORT), "shrink");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !blocked.is_finished() {
            assert!(Instant::now() < deadline, "the blocked all-reduce was not released by the shrink");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(blocked.join().unwrap(), ncclResult_t::ncclInvalidUsage, "the blocked call was aborted");
        assert_eq!(rank_and_count(child), (rank as i32, 2));
        all_reduce_checked(child, rank, &[0, 1], "all-reduce on the shrunk communicator");
        check(ncclCommDestroy(child), "destroy child");
        let v = [1.0f32; 4];
        let mut out = [0f32; 4];
        let r =
            ncclAllReduce(v.as_ptr().cast(), out.as_mut_ptr().cast(), 4, ncclDataType_t(7), ncclRedOp_t(0), comm.0, S);
        expect(r, ncclResult_t::ncclInvalidUsage, "aborted");
        drop(finish);
    });
}

/// Counts a rank as done when dropped (also when its body panics).
fn scopeguard(done: std::sync::Arc<std::sync::atomic::AtomicUsize>) -> impl Drop {
    struct Done(std::sync::Arc<std::sync::atomic::AtomicUsize>);
    impl Drop for Done {
        fn drop(&mut self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Release);
        }
    }
    Done(done)
}

const ROLE: &str = "FERROCCL_IT_SHRINK_ROLE";

/// Not a test on its own: one rank of [`shrink_with_abort_after_a_rank_was_killed`].
#[test]
fn child_rank() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let (rank, id) = role.split_once(',').unwrap();
    let (rank, id) = (rank.parse::<usize>().unwrap(), unhex(id));
    let mut comm: ncclComm_t = std::ptr::null_mut();
    check(ncclCommInitRank(&mut comm, 3, id, rank as i32), "init");
    all_reduce_checked(comm, rank, &[0, 1, 2], "first all-reduce");
    println!("CHILD {rank} ready");
    if rank == 0 {
        std::thread::sleep(Duration::from_secs(120)); // killed here
        return;
    }
    // The parent process kills rank 0, then says go.
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    // Outstanding work on the parent: an all-reduce that rank 0 will never join.
    let parent = Comm(comm);
    let blocked = std::thread::spawn(move || {
        let parent = parent; // the whole (Send) wrapper, not its raw field
        let send = vec![1.0f32; 1 << 16];
        let mut recv = vec![0f32; 1 << 16];
        let (s, d) = (send.as_ptr().cast(), recv.as_mut_ptr().cast());
        ncclAllReduce(s, d, 1 << 16, ncclDataType_t(7), ncclRedOp_t(0), parent.0, S)
    });
    std::thread::sleep(Duration::from_millis(300));
    let mut excluded = [0];
    let mut child: ncclComm_t = std::ptr::null_mut();
    let started = Instant::now();
    check(ncclCommShrink(comm, excluded.as_mut_ptr(), 1, &mut child, std::ptr::null_mut(), ABORT), "shrink abort");
    let r = blocked.join().unwrap();
    println!("CHILD {rank} parent all-reduce returned {}", r.0);
    assert_ne!(r, ncclResult_t::ncclSuccess);
    assert_eq!(rank_and_count(child), (rank as i32 - 1, 2));
    all_reduce_checked(child, rank, &[1, 2], "all-reduce on the shrunk communicator");
    println!(
        "CHILD {rank} shrunk to rank {} of 2 in {:.3} s, all-reduce OK",
        rank - 1,
        started.elapsed().as_secs_f64()
    );
    check(ncclCommDestroy(child), "destroy child");
    check(ncclCommAbort(comm), "abort parent");
    println!("CHILD {rank} done");
}

fn spawn(rank: usize, id: &ferroccl::types::ncclUniqueId) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "shrink::child_rank", "--nocapture", "--test-threads=1"])
        .env(ROLE, format!("{rank},{}", hex(id)))
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "INIT")
        .env("FERROCCL_BOOTSTRAP_TIMEOUT", "20")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads `out` until a line containing `needle` (at most a minute); the lines read so far.
fn await_line(out: &mut BufReader<ChildStdout>, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = String::new();
    while !seen.contains(needle) {
        let mut line = String::new();
        let n = out.read_line(&mut line).unwrap();
        assert!(n > 0 && Instant::now() < deadline, "child never printed {needle:?}: {seen}");
        seen.push_str(&line);
    }
    seen
}

#[test]
fn shrink_with_abort_after_a_rank_was_killed() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    let id = unique_id();
    let mut children: Vec<Child> = (0..3).map(|r| spawn(r, &id)).collect();
    let mut outs: Vec<BufReader<ChildStdout>> =
        children.iter_mut().map(|c| BufReader::new(c.stdout.take().unwrap())).collect();
    let mut logs: Vec<String> =
        outs.iter_mut().enumerate().map(|(r, o)| await_line(o, &format!("CHILD {r} ready"))).collect();
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(children[0].id() as i32, libc::SIGKILL) };
    let _ = children[0].wait();
    for c in &mut children[1..] {
        c.stdin.take().unwrap().write_all(b"go\n").unwrap();
    }
    // Collect the survivors' output within a time limit, whatever happens.
    let deadline = Instant::now() + Duration::from_secs(60);
    for r in 1..3 {
        let child = &mut children[r];
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let mut rest = String::new();
                outs[r].read_to_string(&mut rest).unwrap();
                child.stderr.take().unwrap().read_to_string(&mut rest).unwrap();
                logs[r].push_str(&rest);
                assert!(status.success(), "survivor {r} failed:\n{}", logs[r]);
                break;
            }
            if Instant::now() > deadline {
                for c in &mut children[1..] {
                    let _ = c.kill();
                }
                panic!("survivor {r} did not finish within a minute:\n{}", logs[r]);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    for (r, log) in logs.iter().enumerate().skip(1) {
        for line in log.lines().filter(|l| l.contains("parent all-reduce returned") || l.contains("shrunk to")) {
            println!("{line}");
        }
        assert!(log.contains(&format!("CHILD {r} shrunk to rank {} of 2", r - 1)), "{log}");
        assert!(log.contains(&format!("CHILD {r} done")), "{log}");
        assert!(log.contains("becomes rank") && log.contains("root at rank 1"), "{log}");
    }
}
