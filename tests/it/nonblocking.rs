//! Non-blocking communicators (config.blocking = 0, NCCL_COMM_BLOCKING=0): one thread creates
//! every rank of a communicator and polls ncclCommGetAsyncError (a blocking init would wait
//! for the others for ever); calls on a communicator still being created are refused as NCCL
//! refuses them; split from one thread; finalize and destroy; abort of a creation that cannot
//! finish; a creation that fails; NCCL_COMM_BLOCKING in a child process (the environment is
//! read once per process).

use std::ffi::{c_void, CStr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferroccl::config::undef_config;
use ferroccl::ffi::coll::ncclAllReduce;
use ferroccl::ffi::group::{ncclGroupEnd, ncclGroupStart};
use ferroccl::ffi::init::*;
use ferroccl::ffi::query::{ncclCommCount, ncclCommGetAsyncError, ncclCommUserRank, ncclGetLastError};
use ferroccl::types::{ncclComm_t, ncclConfig_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, NCCL_SPLIT_NOCOLOR};

use crate::common::*;

const S: *mut c_void = std::ptr::null_mut();
const IN_PROGRESS: ncclResult_t = ncclResult_t::ncclInProgress;
const INVALID: ncclResult_t = ncclResult_t::ncclInvalidArgument;

pub fn nonblocking_config() -> ncclConfig_t {
    let mut c = undef_config();
    c.blocking = 0;
    c
}

pub fn last_error() -> String {
    // SAFETY: a NUL-terminated string valid until this thread's next call.
    unsafe { CStr::from_ptr(ncclGetLastError(std::ptr::null_mut())) }.to_string_lossy().into_owned()
}

/// `r` is `want`, and the last error mentions `needle`.
pub fn expect(r: ncclResult_t, want: ncclResult_t, needle: &str) {
    assert_eq!(r, want, "expected {want:?} ({needle}); last error: {}", last_error());
    let msg = last_error();
    assert!(msg.contains(needle), "message {msg:?} should mention {needle:?}");
}

pub fn async_state(comm: ncclComm_t) -> ncclResult_t {
    let mut state = ncclResult_t(-1);
    check(ncclCommGetAsyncError(comm, &mut state), "ncclCommGetAsyncError");
    state
}

/// Polls until no handle reports ncclInProgress (at most 30 s); the final states.
pub fn poll_all(comms: &[ncclComm_t]) -> Vec<ncclResult_t> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let states: Vec<ncclResult_t> = comms.iter().map(|&c| async_state(c)).collect();
        if !states.contains(&IN_PROGRESS) {
            return states;
        }
        assert!(Instant::now() < deadline, "still in progress after 30 s: {states:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// One thread creates the `n` ranks of a non-blocking communicator, then polls them ready.
pub fn create_from_one_thread(n: usize) -> Vec<ncclComm_t> {
    let id = unique_id();
    let mut config = nonblocking_config();
    let comms: Vec<ncclComm_t> = (0..n)
        .map(|r| {
            let mut c: ncclComm_t = std::ptr::null_mut();
            assert_eq!(ncclCommInitRankConfig(&mut c, n as i32, id, r as i32, &mut config), IN_PROGRESS);
            assert!(!c.is_null(), "the handle exists at once");
            c
        })
        .collect();
    assert!(poll_all(&comms).iter().all(|&s| s == ncclResult_t::ncclSuccess));
    comms
}

/// All-reduces (sum) `inputs[r]` on `comms[r]` in one group driven by this thread.
pub fn group_all_reduce_i64(comms: &[ncclComm_t], inputs: &[Vec<i64>]) -> Vec<Vec<i64>> {
    let mut outputs: Vec<Vec<i64>> = inputs.iter().map(|v| vec![0; v.len()]).collect();
    check(ncclGroupStart(), "group start");
    for (r, &c) in comms.iter().enumerate() {
        let (send, recv) = (inputs[r].as_ptr().cast(), outputs[r].as_mut_ptr().cast());
        check(ncclAllReduce(send, recv, inputs[r].len(), ncclDataType_t(4), ncclRedOp_t(0), c, S), "allreduce");
    }
    // Operations complete before the group ends, also on non-blocking communicators.
    check(ncclGroupEnd(), "group end");
    outputs
}

fn rank_and_count(c: ncclComm_t) -> (i32, i32) {
    let (mut rank, mut count) = (-1, -1);
    check(ncclCommUserRank(c, &mut rank), "ncclCommUserRank");
    check(ncclCommCount(c, &mut count), "ncclCommCount");
    (rank, count)
}

#[test]
fn one_thread_creates_four_nonblocking_communicators_then_polls() {
    let n = 4;
    let id = unique_id();
    let mut config = nonblocking_config();
    let mut comms: Vec<ncclComm_t> = vec![std::ptr::null_mut(); n];
    assert_eq!(ncclCommInitRankConfig(&mut comms[0], n as i32, id, 0, &mut config), IN_PROGRESS);
    // Rank 0 cannot finish before the others exist: every call but ncclCommGetAsyncError and
    // ncclCommAbort is refused with ncclInvalidArgument, as NCCL's ncclCommEnsureReady does.
    assert_eq!(async_state(comms[0]), IN_PROGRESS);
    let mut count = 0;
    expect(ncclCommCount(comms[0], &mut count), INVALID, "still being created");
    let (v, mut out) = ([1.0f32; 4], [0.0f32; 4]);
    let (send, recv) = (v.as_ptr().cast(), out.as_mut_ptr().cast());
    expect(
        ncclAllReduce(send, recv, 4, ncclDataType_t(7), ncclRedOp_t(0), comms[0], S),
        INVALID,
        "poll ncclCommGetAsyncError",
    );
    expect(ncclCommFinalize(comms[0]), INVALID, "still being created");
    expect(ncclCommDestroy(comms[0]), INVALID, "still being created");
    for (r, c) in comms.iter_mut().enumerate().skip(1) {
        assert_eq!(ncclCommInitRankConfig(c, n as i32, id, r as i32, &mut config), IN_PROGRESS);
    }
    assert_eq!(poll_all(&comms), vec![ncclResult_t::ncclSuccess; n]);
    for (r, &c) in comms.iter().enumerate() {
        assert_eq!(rank_and_count(c), (r as i32, n as i32));
    }

    // Collectives on host buffers from one thread per rank.
    let count = 10_000;
    let handles: Vec<Comm> = comms.iter().map(|&c| Comm(c)).collect();
    let threads: Vec<_> = handles
        .into_iter()
        .enumerate()
        .map(|(r, c)| {
            std::thread::spawn(move || {
                let c = c; // the whole (Send) wrapper, not its raw field
                let send: Vec<f64> = (0..count).map(|i| (r * 1000 + i) as f64).collect();
                let mut recv = vec![0f64; count];
                let (s, d) = (send.as_ptr().cast(), recv.as_mut_ptr().cast());
                check(ncclAllReduce(s, d, count, ncclDataType_t(8), ncclRedOp_t(0), c.0, S), "allreduce");
                recv
            })
        })
        .collect();
    for t in threads {
        let got = t.join().unwrap();
        for (i, v) in got.iter().enumerate() {
            assert_eq!(*v, (6000 + 4 * i) as f64, "element {i}");
        }
    }
    // And in a group from this one thread.
    let inputs: Vec<Vec<i64>> = (0..n).map(|r| (0..1000).map(|i| (r as i64 + 1) << 40 | i).collect()).collect();
    for out in group_all_reduce_i64(&comms, &inputs) {
        assert!(out.iter().enumerate().all(|(i, &v)| v == (10i64 << 40) + 4 * i as i64));
    }

    // Finalize may answer ncclInProgress (not here: nothing is in flight); then destroy.
    for &c in &comms {
        let r = ncclCommFinalize(c);
        assert!(r == ncclResult_t::ncclSuccess || r == IN_PROGRESS, "finalize returned {r:?}");
    }
    assert_eq!(poll_all(&comms), vec![ncclResult_t::ncclSuccess; n]);
    for c in comms {
        check(ncclCommDestroy(c), "destroy");
    }
}

#[test]
fn a_group_of_nonblocking_inits_ends_in_progress() {
    // nccl-tests' pattern with non-blocking communicators: the calls inside the group return
    // ncclSuccess (queued, handles valid), the group end ncclInProgress.
    let n = 3;
    let id = unique_id();
    let mut config = nonblocking_config();
    let mut comms: Vec<ncclComm_t> = vec![std::ptr::null_mut(); n];
    check(ncclGroupStart(), "group start");
    for (r, c) in comms.iter_mut().enumerate() {
        check(ncclCommInitRankConfig(c, n as i32, id, r as i32, &mut config), "init inside a group");
        assert!(!c.is_null());
    }
    assert_eq!(async_state(comms[0]), IN_PROGRESS, "queued, not started");
    assert_eq!(ncclGroupEnd(), IN_PROGRESS);
    assert_eq!(poll_all(&comms), vec![ncclResult_t::ncclSuccess; n]);
    let inputs: Vec<Vec<i64>> = (0..n).map(|r| vec![1 << r; 10]).collect();
    assert!(group_all_reduce_i64(&comms, &inputs).iter().all(|o| o.iter().all(|&v| v == 7)));
    for c in comms {
        check(ncclCommDestroy(c), "destroy");
    }
}

#[test]
fn nonblocking_split_from_one_thread() {
    let n = 4;
    let parents = create_from_one_thread(n);
    let mut children: Vec<ncclComm_t> = vec![std::ptr::null_mut(); n];
    // Rank 0 splits first: its split waits for the other ranks, so its parent is busy (NCCL
    // programs poll the parent) and its child is not ready.
    assert_eq!(ncclCommSplit(parents[0], 0, 0, &mut children[0], std::ptr::null_mut()), IN_PROGRESS);
    assert!(!children[0].is_null());
    assert_eq!(async_state(parents[0]), IN_PROGRESS);
    assert_eq!(async_state(children[0]), IN_PROGRESS);
    let (v, mut out) = ([1.0f32; 4], [0.0f32; 4]);
    let (send, recv) = (v.as_ptr().cast(), out.as_mut_ptr().cast());
    expect(
        ncclAllReduce(send, recv, 4, ncclDataType_t(7), ncclRedOp_t(0), parents[0], S),
        INVALID,
        "previous non-blocking call",
    );
    expect(ncclCommDestroy(parents[0]), INVALID, "still in progress");
    // Colors: even ranks, odd ranks; rank 3 opts out; keys reverse the order.
    for (r, child) in children.iter_mut().enumerate().skip(1) {
        let color = if r == 3 { NCCL_SPLIT_NOCOLOR } else { (r % 2) as i32 };
        assert_eq!(ncclCommSplit(parents[r], color, -(r as i32), child, std::ptr::null_mut()), IN_PROGRESS);
    }
    assert!(children[3].is_null(), "NCCL_SPLIT_NOCOLOR gets no communicator");
    assert_eq!(poll_all(&parents), vec![ncclResult_t::ncclSuccess; n]);
    let made: Vec<ncclComm_t> = children[..3].to_vec();
    assert_eq!(poll_all(&made), vec![ncclResult_t::ncclSuccess; 3]);
    // Even: {2, 0} (key -2 first); odd: {1} alone.
    assert_eq!(rank_and_count(made[0]), (1, 2));
    assert_eq!(rank_and_count(made[1]), (0, 1));
    assert_eq!(rank_and_count(made[2]), (0, 2));
    let inputs: Vec<Vec<i64>> = (0..3).map(|r| vec![r as i64 + 1; 100]).collect();
    let outs = group_all_reduce_i64(&made, &inputs);
    assert_eq!((outs[0][0], outs[1][0], outs[2][0]), (4, 2, 4));
    // The children inherited the parent's non-blocking config: their own split returns
    // ncclInProgress too (here a one-rank one, from child 1).
    let mut grandchild: ncclComm_t = std::ptr::null_mut();
    assert_eq!(ncclCommSplit(made[1], 0, 0, &mut grandchild, std::ptr::null_mut()), IN_PROGRESS);
    assert_eq!(poll_all(&[grandchild, made[1]]), vec![ncclResult_t::ncclSuccess; 2]);
    check(ncclCommDestroy(grandchild), "destroy grandchild");
    for c in made.into_iter().chain(parents) {
        check(ncclCommDestroy(c), "destroy");
    }
}

#[test]
fn abort_stops_a_creation_that_cannot_finish() {
    // Rank 1 of this two-rank communicator never comes: the creation waits at the root.
    let id = unique_id();
    let mut config = nonblocking_config();
    let mut c: ncclComm_t = std::ptr::null_mut();
    assert_eq!(ncclCommInitRankConfig(&mut c, 2, id, 0, &mut config), IN_PROGRESS);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(async_state(c), IN_PROGRESS);
    // Bounded, so that a hanging abort fails the test.
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = Comm(c);
    std::thread::spawn(move || {
        let handle = handle; // the whole (Send) wrapper, not its raw field
        let started = Instant::now();
        let _ = tx.send((ncclCommAbort(handle.0), started.elapsed()));
    });
    let (code, took) = rx.recv_timeout(Duration::from_secs(10)).expect("ncclCommAbort hangs on a creation in progress");
    check(code, "abort during init");
    assert!(took < Duration::from_secs(2), "abort took {took:?}");
    // The handle is gone.
    let mut state = ncclResult_t(-1);
    expect(ncclCommGetAsyncError(c, &mut state), INVALID, "not a live communicator");
    expect(ncclCommAbort(c), INVALID, "not a live communicator");
}

#[test]
fn a_failed_creation_reports_its_error_and_can_be_destroyed() {
    // Two ranks disagree on the size: the root refuses the later one, whose creation fails;
    // the other waits for a second rank that never comes.
    let id = unique_id();
    let mut config = nonblocking_config();
    let (mut a, mut b): (ncclComm_t, ncclComm_t) = (std::ptr::null_mut(), std::ptr::null_mut());
    assert_eq!(ncclCommInitRankConfig(&mut a, 2, id, 0, &mut config), IN_PROGRESS);
    assert_eq!(ncclCommInitRankConfig(&mut b, 3, id, 1, &mut config), IN_PROGRESS);
    let deadline = Instant::now() + Duration::from_secs(30);
    let (failed, waiting) = loop {
        match (async_state(a), async_state(b)) {
            (IN_PROGRESS, IN_PROGRESS) => {}
            (IN_PROGRESS, s) => break ((b, s), a),
            (s, IN_PROGRESS) => break ((a, s), b),
            other => panic!("only one creation can fail: {other:?}"),
        }
        assert!(Instant::now() < deadline, "neither creation failed");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(failed.1, INVALID, "the root refuses a rank that disagrees on nranks");
    // Other calls get the failure, as NCCL's ncclCommEnsureReady gives it.
    let mut n = 0;
    expect(ncclCommCount(failed.0, &mut n), INVALID, "failed to initialise");
    check(ncclCommDestroy(failed.0), "destroy a failed creation");
    check(ncclCommAbort(waiting), "abort the waiting one");
}

const ENV_ROLE: &str = "FERROCCL_IT_NONBLOCKING_ROLE";

/// Not a test on its own: runs in a child process with NCCL_COMM_BLOCKING set (see
/// [`nccl_comm_blocking_overrides_the_config`]) and prints what each call returned.
#[test]
fn env_child() {
    let Ok(role) = std::env::var(ENV_ROLE) else { return };
    let from_one_thread = |blocking: i32| {
        let id = unique_id();
        let mut config = undef_config();
        config.blocking = blocking;
        let mut comms = [std::ptr::null_mut(); 2];
        let codes: Vec<i32> =
            (0..2).map(|r| ncclCommInitRankConfig(&mut comms[r], 2, id, r as i32, &mut config).0).collect();
        println!("ENV CHILD config.blocking={blocking}: init returned {codes:?}");
        assert_eq!(poll_all(&comms), vec![ncclResult_t::ncclSuccess; 2]);
        for c in comms {
            check(ncclCommDestroy(c), "destroy");
        }
    };
    match role.as_str() {
        "0" => {
            from_one_thread(i32::MIN); // NCCL_CONFIG_UNDEF_INT: the environment decides
            from_one_thread(1); // a set NCCL_COMM_BLOCKING overrides the config, as in NCCL
                                // ncclCommInitRank is not wrapped in a group in NCCL: it returns once done, but the
                                // communicator is non-blocking, so its split from one thread returns ncclInProgress.
            let id = unique_id();
            let comms: Vec<ncclComm_t> = (0..2)
                .map(|r| {
                    std::thread::spawn(move || {
                        let mut c: ncclComm_t = std::ptr::null_mut();
                        check(ncclCommInitRank(&mut c, 2, id, r), "ncclCommInitRank");
                        Comm(c)
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|t| t.join().unwrap().0)
                .collect();
            println!("ENV CHILD ncclCommInitRank returned 0");
            let mut children = [std::ptr::null_mut(); 2];
            let codes: Vec<i32> =
                (0..2).map(|r| ncclCommSplit(comms[r], 0, 0, &mut children[r], std::ptr::null_mut()).0).collect();
            println!("ENV CHILD split returned {codes:?}");
            assert_eq!(poll_all(&children), vec![ncclResult_t::ncclSuccess; 2]);
            for c in children.into_iter().chain(comms) {
                check(ncclCommDestroy(c), "destroy");
            }
        }
        _ => {
            // NCCL_COMM_BLOCKING=1: config.blocking = 0 is overridden, init blocks (so the
            // ranks need threads of their own).
            let id = unique_id();
            let codes: Vec<i32> = (0..2)
                .map(|r| {
                    std::thread::spawn(move || {
                        let mut config = nonblocking_config();
                        let mut c: ncclComm_t = std::ptr::null_mut();
                        let code = ncclCommInitRankConfig(&mut c, 2, id, r, &mut config);
                        check(ncclCommDestroy(c), "destroy");
                        code.0
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|t| t.join().unwrap())
                .collect();
            println!("ENV CHILD config.blocking=0: init returned {codes:?}");
        }
    }
    println!("ENV CHILD done");
}

fn run_env_child(value: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "nonblocking::env_child", "--nocapture", "--test-threads=1"])
        .env(ENV_ROLE, value)
        .env("NCCL_COMM_BLOCKING", value)
        .env("FERROCCL_BOOTSTRAP_TIMEOUT", "20")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("ENV CHILD done"), "child failed:\n{text}");
    text
}

#[test]
fn nccl_comm_blocking_overrides_the_config() {
    if std::env::var(ENV_ROLE).is_ok() {
        return;
    }
    let out = run_env_child("0");
    assert!(out.contains(&format!("config.blocking={}: init returned [7, 7]", i32::MIN)), "{out}");
    assert!(out.contains("config.blocking=1: init returned [7, 7]"), "{out}");
    assert!(out.contains("ncclCommInitRank returned 0"), "{out}");
    assert!(out.contains("split returned [7, 7]"), "{out}");
    let out = run_env_child("1");
    assert!(out.contains("config.blocking=0: init returned [0, 0]"), "{out}");
}
