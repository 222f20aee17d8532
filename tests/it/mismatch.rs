//! Calls that do not match across ranks (another count, data type, operator, root or
//! collective) must fail with `ncclInvalidUsage` naming the ranks and the difference, not
//! deliver wrong data or hang. Run in child processes, one per path (the environment is read
//! once per process): the node area, shared memory (node area off) and sockets (shared memory
//! off too). Two thread ranks per child; each case on a fresh pair of communicators, with
//! FERROCCL_TIMEOUT as a safety net so that a missed detection fails instead of hanging.

use std::ffi::{c_void, CStr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferroccl::ffi::coll::{ncclAllGather, ncclAllReduce, ncclBroadcast, ncclReduceScatter};
use ferroccl::ffi::query::ncclGetLastError;
use ferroccl::types::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t};

use crate::common::with_ranks;

const ROLE: &str = "FERROCCL_IT_MISMATCH_ROLE";
const F32: ncclDataType_t = ncclDataType_t(7);
const I32: ncclDataType_t = ncclDataType_t(2);
const SUM: ncclRedOp_t = ncclRedOp_t(0);
const MAX: ncclRedOp_t = ncclRedOp_t(2);

/// One call of rank `rank` in case `case`: what it returned and the last error's text.
fn call(case: &str, rank: usize, comm: ncclComm_t) -> (ncclResult_t, String) {
    let s: *mut c_void = std::ptr::null_mut();
    let big = 1 << 16; // 256 KiB of f32: the node area's direct algorithms
    let mut send = vec![rank as f32 + 1.0; 2 * big];
    let mut recv = vec![0f32; 2 * big];
    let (sp, rp) = (send.as_mut_ptr() as *const c_void, recv.as_mut_ptr() as *mut c_void);
    let r = match (case, rank) {
        ("count-small", 0) => ncclAllReduce(sp, rp, 4, F32, SUM, comm, s),
        ("count-small", _) => ncclAllReduce(sp, rp, 6, F32, SUM, comm, s),
        ("count-large", 0) => ncclAllReduce(sp, rp, big, F32, SUM, comm, s),
        ("count-large", _) => ncclAllReduce(sp, rp, big + 8, F32, SUM, comm, s),
        // Power-of-two counts (the usual sizes) that a count modulo 4096 would not tell apart.
        ("count-pow2", 0) => ncclAllReduce(sp, rp, big / 2, F32, SUM, comm, s),
        ("count-pow2", _) => ncclAllReduce(sp, rp, big, F32, SUM, comm, s),
        // One rank small enough for the one-shot path, the other not: different algorithms.
        ("count-algo", 0) => ncclAllReduce(sp, rp, 4, F32, SUM, comm, s),
        ("count-algo", _) => ncclAllReduce(sp, rp, big, F32, SUM, comm, s),
        ("type", 0) => ncclAllReduce(sp, rp, 1000, F32, SUM, comm, s),
        ("type", _) => ncclAllReduce(sp, rp, 1000, I32, SUM, comm, s),
        ("op-small", 0) => ncclAllReduce(sp, rp, 8, F32, SUM, comm, s),
        ("op-small", _) => ncclAllReduce(sp, rp, 8, F32, MAX, comm, s),
        ("op-large", 0) => ncclAllReduce(sp, rp, big, F32, SUM, comm, s),
        ("op-large", _) => ncclAllReduce(sp, rp, big, F32, MAX, comm, s),
        ("root", r) => ncclBroadcast(sp, rp, big, F32, r as i32, comm, s),
        ("allgather-count", 0) => ncclAllGather(sp, rp, 1000, F32, comm, s),
        ("allgather-count", _) => ncclAllGather(sp, rp, 1001, F32, comm, s),
        ("kind", 0) => ncclAllReduce(sp, rp, 1000, F32, SUM, comm, s),
        ("kind", _) => ncclReduceScatter(sp, rp, 500, F32, SUM, comm, s),
        _ => panic!("no case {case}"),
    };
    // SAFETY: a thread-local NUL-terminated string, copied at once.
    let msg = unsafe { CStr::from_ptr(ncclGetLastError(comm)) }.to_string_lossy().into_owned();
    (r, msg)
}

/// Not a test on its own: runs the cases named in the role variable, one fresh pair of thread
/// ranks each, and prints what every rank's calls returned.
#[test]
fn mismatch_child() {
    let Ok(role) = std::env::var(ROLE) else { return };
    for case in role.split(',') {
        let case = case.to_string();
        let started = Instant::now();
        let results = with_ranks(2, move |rank, comm| {
            let (r, msg) = call(&case, rank, comm.0);
            // A mismatch no rank could see when it happened (both sides only sent) must show up
            // at the next call on the same connections at the latest.
            let next = if r == ncclResult_t::ncclSuccess {
                let s: *mut c_void = std::ptr::null_mut();
                let mut buf = vec![1f32; 64];
                let p = buf.as_mut_ptr() as *mut c_void;
                let r2 = ncclAllReduce(p, p, 64, F32, SUM, comm.0, s);
                // SAFETY: as above.
                let m2 = unsafe { CStr::from_ptr(ncclGetLastError(comm.0)) }.to_string_lossy().into_owned();
                Some((r2, m2))
            } else {
                None
            };
            (rank, r, msg, next)
        });
        for (rank, r, msg, next) in results {
            let next = next.map_or(String::new(), |(r2, m2)| format!(" then {} ({m2})", r2.0));
            println!("MISMATCH {} rank {rank} returned {} ({msg}){next}", role_case(&role, started), r.0);
        }
    }
}

fn role_case(_role: &str, started: Instant) -> String {
    format!("after {:.2}s", started.elapsed().as_secs_f64())
}

/// Runs `cases` in a child under `env` and checks each: no rank succeeded (or, where both
/// ranks only sent, the next call failed), at least one rank got ncclInvalidUsage (5) with a
/// message naming both ranks and `what` differs, and nothing hung.
fn run(env: &[(&str, &str)], transport: &str, cases: &[(&str, &str)]) {
    let names: Vec<&str> = cases.iter().map(|c| c.0).collect();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "mismatch::mismatch_child", "--nocapture", "--test-threads=1"])
        .env(ROLE, names.join(","))
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "INIT,P2P,SHM,NET")
        .env("FERROCCL_BOOTSTRAP_TIMEOUT", "20")
        .env("FERROCCL_TIMEOUT", "20")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(text.contains(transport), "expected {transport:?} in the child's log:\n{text}");
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("MISMATCH ")).collect();
    assert_eq!(lines.len(), 2 * cases.len(), "{text}");
    for (i, (case, what)) in cases.iter().enumerate() {
        let pair = &lines[2 * i..2 * i + 2];
        println!("{transport} {case}:\n  {}\n  {}", pair[0], pair[1]);
        for l in pair {
            assert!(!l.contains(" returned 0 (") || !l.contains(" then 0 ("), "{case}: a rank never saw an error: {l}");
            assert!(!l.contains("timeout"), "{case}: detected only by the timeout: {l}");
        }
        let usage = pair.iter().find(|l| l.contains(" returned 5 (") || l.contains(" then 5 ("));
        let usage = usage.unwrap_or_else(|| panic!("{case}: no ncclInvalidUsage:\n{}\n{}", pair[0], pair[1]));
        assert!(usage.contains("mismatched calls"), "{case}: {usage}");
        assert!(usage.contains("rank 0") && usage.contains("rank 1"), "{case}: ranks not named: {usage}");
        assert!(usage.contains(what), "{case}: expected {what:?} in {usage}");
    }
}

const CASES: &[(&str, &str)] = &[
    ("count-small", "counts differ (12-bit digests, the count itself below 4096: "),
    ("count-large", "counts differ"),
    ("count-pow2", "counts differ"),
    ("type", "data type"),
    ("op-small", "operator"),
    ("op-large", "operator"),
    ("root", "root"),
    ("allgather-count", "counts differ"),
    ("kind", "operation AllReduce on rank"),
];

/// Over the transports, two ranks that each take itself for the root only send: nobody
/// receives, so nothing is compared then, and the next call on those connections reads the
/// broadcast's message and fails, naming it.
fn transport_cases() -> Vec<(&'static str, &'static str)> {
    CASES.iter().map(|&(c, w)| if c == "root" { (c, "Broadcast") } else { (c, w) }).collect()
}

#[test]
fn mismatched_calls_through_the_node_area() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    // AllReduce against ReduceScatter: one rank in the node area, the other on the
    // transports, which nothing can compare (FERROCCL_TIMEOUT ends it); not tried here.
    let mut cases: Vec<(&str, &str)> = CASES.iter().copied().filter(|c| c.0 != "kind").collect();
    cases.push(("count-algo", "counts differ"));
    run(&[], "Node area: 2 ranks", &cases);
}

#[test]
fn mismatched_calls_over_shared_memory() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    run(&[("FERROCCL_NODE_COLL", "0")], "via SHM", &transport_cases());
}

#[test]
fn mismatched_calls_over_sockets() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    run(&[("NCCL_SHM_DISABLE", "1"), ("FERROCCL_NODE_COLL", "0")], "via NET/Socket", &transport_cases());
}

/// The same calls on every rank still succeed under the checks (the signatures agree,
/// whatever the path), with right results.
#[test]
fn matching_calls_pass_the_checks() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    let started = Instant::now();
    let sums = with_ranks(2, |rank, comm| {
        let s: *mut c_void = std::ptr::null_mut();
        let mut got = Vec::new();
        for count in [4usize, 6, 1000, 1 << 16] {
            let send = vec![rank as f32 + 1.0; count];
            let mut recv = vec![0f32; count];
            let r = ncclAllReduce(send.as_ptr().cast(), recv.as_mut_ptr().cast(), count, F32, SUM, comm.0, s);
            assert_eq!(r, ncclResult_t::ncclSuccess);
            got.push(recv.iter().all(|&v| v == 3.0));
        }
        got
    });
    assert!(sums.iter().flatten().all(|&ok| ok), "{sums:?}");
    assert!(started.elapsed() < Duration::from_secs(60));
}
