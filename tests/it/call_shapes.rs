//! Repeated calls reuse what an earlier call of the same shape resolved (`coll::fast`): a
//! stream that keeps changing count, type, operator, root and buffers within the few shapes
//! a thread remembers must stay exact, a call that no longer matches its peers' must still be
//! refused after its shape was remembered, and a destroyed handle must still be refused after
//! the lookups of it were memoized. Ranks as threads, through the node area.

use std::ffi::c_void;
use std::sync::{Arc, Barrier};

use ferroccl::ffi::coll::{ncclAllGather, ncclAllReduce, ncclBroadcast};
use ferroccl::ffi::init::{ncclCommDestroy, ncclCommInitRank};
use ferroccl::types::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t};

use crate::common::{check, unique_id, with_ranks};

const I32: ncclDataType_t = ncclDataType_t(2);
const F64: ncclDataType_t = ncclDataType_t(8);
const SUM: ncclRedOp_t = ncclRedOp_t(0);
const PROD: ncclRedOp_t = ncclRedOp_t(1);
const MAX: ncclRedOp_t = ncclRedOp_t(2);

fn null() -> *mut c_void {
    std::ptr::null_mut()
}

/// More shapes than a thread remembers, interleaved, so that entries are both hit and evicted;
/// each call's result is checked against values computed here.
#[test]
fn a_stream_of_changing_shapes_stays_exact() {
    let n = 2;
    with_ranks(n, move |rank, comm| {
        let c = comm.0;
        for k in 0..600usize {
            let v = |r: usize, i: usize| (r * 7 + i * 3 + k) as i32 % 11 + 1;
            let count = [2usize, 12, 3, 2, 100, 12][k % 6];
            match k % 7 {
                0 | 3 => {
                    // Sum and max of the same count and type: the operator tells them apart.
                    let op = if k % 7 == 0 { SUM } else { MAX };
                    let send: Vec<i32> = (0..count).map(|i| v(rank, i)).collect();
                    let mut recv = vec![0i32; count];
                    check(
                        ncclAllReduce(send.as_ptr().cast(), recv.as_mut_ptr().cast(), count, I32, op, c, null()),
                        "sum/max",
                    );
                    for (i, got) in recv.iter().enumerate() {
                        let want = if op == SUM {
                            (0..n).map(|r| v(r, i)).sum()
                        } else {
                            (0..n).map(|r| v(r, i)).max().unwrap()
                        };
                        assert_eq!(*got, want, "call {k} element {i}");
                    }
                }
                1 => {
                    // The same count as f64, in place.
                    let mut buf: Vec<f64> = (0..count).map(|i| f64::from(v(rank, i))).collect();
                    let p = buf.as_mut_ptr() as *mut c_void;
                    check(ncclAllReduce(p, p, count, F64, PROD, c, null()), "prod f64");
                    for (i, got) in buf.iter().enumerate() {
                        assert_eq!(*got, (0..n).map(|r| f64::from(v(r, i))).product::<f64>(), "call {k} element {i}");
                    }
                }
                2 | 5 => {
                    // Broadcasts of one count from either root.
                    let root = (k / 7) % n;
                    let send: Vec<i32> = (0..count).map(|i| v(rank, i)).collect();
                    let mut recv = vec![0i32; count];
                    check(
                        ncclBroadcast(
                            send.as_ptr().cast(),
                            recv.as_mut_ptr().cast(),
                            count,
                            I32,
                            root as i32,
                            c,
                            null(),
                        ),
                        "broadcast",
                    );
                    assert!(recv.iter().enumerate().all(|(i, &x)| x == v(root, i)), "call {k} root {root}: {recv:?}");
                }
                4 => {
                    // An all-gather of the same count and type as the all-reduces.
                    let send: Vec<i32> = (0..count).map(|i| v(rank, i)).collect();
                    let mut recv = vec![0i32; count * n];
                    check(
                        ncclAllGather(send.as_ptr().cast(), recv.as_mut_ptr().cast(), count, I32, c, null()),
                        "all-gather",
                    );
                    for r in 0..n {
                        assert!((0..count).all(|i| recv[r * count + i] == v(r, i)), "call {k} block {r}");
                    }
                }
                _ => {
                    // Send and receive buffers that overlap other than in place: the input is
                    // copied first, whatever shape was remembered for this count.
                    let mut buf: Vec<i32> = (0..count + 1).map(|i| v(rank, i)).collect();
                    let p = buf.as_mut_ptr();
                    // SAFETY: both ranges lie inside `buf` (count + 1 elements).
                    let (s, r) = (p as *const c_void, unsafe { p.add(1) } as *mut c_void);
                    check(ncclAllReduce(s, r, count, I32, SUM, c, null()), "overlapping");
                    for i in 0..count {
                        assert_eq!(buf[i + 1], (0..n).map(|r| v(r, i)).sum::<i32>(), "call {k} element {i}");
                    }
                }
            }
        }
    });
}

/// Calls that disagree across ranks after both ranks made the same call before (so each has
/// remembered its shape) are refused as on a first call.
#[test]
fn mismatches_are_refused_after_a_remembered_shape() {
    let cases: [(&str, &str); 4] =
        [("operator", "operator"), ("count", "count"), ("root", "root"), ("type", "data type")];
    for (case, what) in cases {
        let results = with_ranks(2, move |rank, comm| {
            let c = comm.0;
            let send = vec![rank as i32 + 1; 1 << 14];
            let mut recv = vec![0i32; 1 << 14];
            let (s, r) = (send.as_ptr() as *const c_void, recv.as_mut_ptr() as *mut c_void);
            let big = 1 << 14; // 64 KiB: the broadcast's direct path
                               // The shape rank 0 keeps using, twice, matching.
            let warm = || match case {
                "root" => ncclBroadcast(s, r, big, I32, 0, c, null()),
                _ => ncclAllReduce(s, r, 4, I32, SUM, c, null()),
            };
            for _ in 0..2 {
                check(warm(), "matching call");
            }
            let result = match (case, rank) {
                (_, 0) => warm(),
                ("operator", _) => ncclAllReduce(s, r, 4, I32, MAX, c, null()),
                ("count", _) => ncclAllReduce(s, r, 5, I32, SUM, c, null()),
                ("root", _) => ncclBroadcast(s, r, big, I32, 1, c, null()),
                _ => ncclAllReduce(s, r, 4, ncclDataType_t(3), SUM, c, null()),
            };
            // SAFETY: a thread-local NUL-terminated string, copied at once.
            let msg = unsafe { std::ffi::CStr::from_ptr(ferroccl::ffi::query::ncclGetLastError(c)) }
                .to_string_lossy()
                .into_owned();
            (result, msg)
        });
        let refused: Vec<_> = results.iter().filter(|(r, _)| *r == ncclResult_t::ncclInvalidUsage).collect();
        assert!(!refused.is_empty(), "{case}: no rank refused: {results:?}");
        for (_, msg) in refused {
            assert!(msg.contains("mismatched calls") && msg.contains(what), "{case}: {msg}");
        }
    }
}

/// A handle whose lookups were memoized is refused once destroyed.
#[test]
fn a_destroyed_handle_is_refused_after_memoized_lookups() {
    let n = 2;
    let id = unique_id();
    let barrier = Arc::new(Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|rank| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut c: ncclComm_t = std::ptr::null_mut();
                check(ncclCommInitRank(&mut c, n as i32, id, rank as i32), "ncclCommInitRank");
                let mut buf = [rank as f64; 4];
                let p = buf.as_mut_ptr() as *mut c_void;
                for _ in 0..3 {
                    check(ncclAllReduce(p, p, 4, F64, SUM, c, null()), "all-reduce");
                }
                assert_eq!(buf, [4.0; 4], "in place: 0 + 1, then doubled twice");
                barrier.wait();
                check(ncclCommDestroy(c), "ncclCommDestroy");
                assert_eq!(ncclAllReduce(p, p, 4, F64, SUM, c, null()), ncclResult_t::ncclInvalidArgument);
                assert_eq!(ncclBroadcast(p, p, 4, F64, 0, c, null()), ncclResult_t::ncclInvalidArgument);
            })
        })
        .collect();
    for t in threads {
        t.join().expect("rank thread panicked");
    }
}
