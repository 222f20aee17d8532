//! Back-to-back broadcasts whose roots return before their receivers have copied (the node
//! area's one-shot broadcast): long stretches from one root, rotating roots, every size path
//! (tiny, ring and data slots, the tree, the receiver's pull, the shared copy), in and out of
//! place, mixed with all-reduces and groups. A root rewrites its send buffer as soon as its
//! call returns, so a peer reading it late, or a slot reused before its readers are done,
//! shows as a wrong value. Ranks as threads here; `processes` runs the same stream with
//! ranks as processes.

use std::ffi::c_void;

use ferroccl::ffi::coll::{ncclAllReduce, ncclBroadcast};
use ferroccl::ffi::group::{ncclGroupEnd, ncclGroupStart};
use ferroccl::types::{ncclComm_t, ncclDataType_t, ncclRedOp_t};

use crate::common::{check, with_ranks};

const INT32: ncclDataType_t = ncclDataType_t(2);
const SUM: ncclRedOp_t = ncclRedOp_t(0);

/// Calls of the stream: (elements of int32, what).
#[derive(Clone, Copy, Debug)]
enum Call {
    Broadcast {
        root: usize,
        in_place: bool,
    },
    AllReduce,
    /// A group of a broadcast from `root`, one from the next rank and an all-reduce.
    Group {
        root: usize,
    },
}

fn calls(nranks: usize) -> Vec<(usize, Call)> {
    // Bytes / 4: tiny (8, 48, 56, 112 B: one or both lines), ring (116 B, 800 B, 4 KiB),
    // data slot (4100 B, 16 KiB), the tree (20 KB at 2 ranks), the pull (40 KB) and the shared
    // copy (600 KB at 2 processes).
    let small = [2usize, 12, 14, 28, 29, 200, 1024, 1, 3, 64, 512];
    let all = [2usize, 12, 14, 28, 29, 200, 1024, 1025, 4096, 5000, 10_000, 150_000, 3];
    let mut calls = Vec::new();
    for k in 0..1200 {
        let stretch = k / 200;
        let call = if stretch % 2 == 0 {
            // One root for 200 calls, sizes that go round the tiny and ring slots: it may run
            // as far ahead as they let it (the two data slots would hold it back).
            let count = small[k % small.len()];
            (count, Call::Broadcast { root: stretch / 2 % nranks, in_place: k % 3 == 1 })
        } else {
            let count = all[k % all.len()];
            let root = (k / 2) % nranks;
            match k % 9 {
                4 => (count, Call::AllReduce),
                7 => (count.min(4096), Call::Group { root }),
                _ => (count, Call::Broadcast { root, in_place: k % 3 == 1 }),
            }
        };
        calls.push(call);
    }
    calls
}

fn value(root: usize, k: usize, i: usize) -> i32 {
    ((k * 7919 + i * 31) % 1_000_003) as i32 * 16 + root as i32
}

/// Runs the stream on this rank; panics naming the first wrong value.
pub fn run_stream(rank: usize, nranks: usize, comm: ncclComm_t) {
    let s: *mut c_void = std::ptr::null_mut();
    for (k, &(count, call)) in calls(nranks).iter().enumerate() {
        let src = |root: usize| -> Vec<i32> { (0..count).map(|i| value(root, k, i)).collect() };
        let sum: Vec<i32> =
            (0..count).map(|i| (0..nranks).map(|r| value(r, k, i)).fold(0i32, i32::wrapping_add)).collect();
        match call {
            Call::Broadcast { root, .. } if rank != root && k % 200 < 100 && k % 25 == 0 => {
                // Now and then a receiver dawdles, so that the root runs as far ahead as
                // its slots let it.
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            _ => {}
        }
        match call {
            Call::Broadcast { root, in_place } => {
                let mut send = src(root);
                let mut buf = if rank == root && in_place { send.clone() } else { vec![-1i32; count] };
                let sp: *const c_void =
                    if in_place || rank != root { buf.as_ptr().cast() } else { send.as_ptr().cast() };
                check(ncclBroadcast(sp, buf.as_mut_ptr().cast(), count, INT32, root as i32, comm, s), "broadcast");
                // The root may reuse its input at once.
                send.iter_mut().for_each(|v| *v = -7);
                let bad = (0..count).find(|&i| buf[i] != value(root, k, i));
                assert!(bad.is_none(), "rank {rank}, call {k}: broadcast of {count} from {root}: element {bad:?}");
            }
            Call::AllReduce => {
                let mut mine: Vec<i32> = (0..count).map(|i| value(rank, k, i)).collect();
                let mut out = vec![-1i32; count];
                check(ncclAllReduce(mine.as_ptr().cast(), out.as_mut_ptr().cast(), count, INT32, SUM, comm, s), "ar");
                mine.iter_mut().for_each(|v| *v = -7);
                assert!(out == sum, "rank {rank}, call {k}: all-reduce of {count}");
            }
            Call::Group { root } => {
                let other = (root + 1) % nranks;
                let (mut a_send, mut b_send) = (src(root), src(other));
                let (mut a, mut b) = (vec![-1i32; count], vec![-1i32; count]);
                let mine: Vec<i32> = (0..count).map(|i| value(rank, k, i)).collect();
                let mut out = vec![-1i32; count];
                check(ncclGroupStart(), "group start");
                check(
                    ncclBroadcast(a_send.as_ptr().cast(), a.as_mut_ptr().cast(), count, INT32, root as i32, comm, s),
                    "grouped broadcast",
                );
                check(
                    ncclBroadcast(b_send.as_ptr().cast(), b.as_mut_ptr().cast(), count, INT32, other as i32, comm, s),
                    "grouped broadcast",
                );
                check(ncclAllReduce(mine.as_ptr().cast(), out.as_mut_ptr().cast(), count, INT32, SUM, comm, s), "ar");
                check(ncclGroupEnd(), "group end");
                a_send.iter_mut().chain(b_send.iter_mut()).for_each(|v| *v = -7);
                assert!(a == src(root) && b == src(other), "rank {rank}, call {k}: grouped broadcasts of {count}");
                assert!(out == sum, "rank {rank}, call {k}: grouped all-reduce of {count}");
            }
        }
    }
}

#[test]
fn back_to_back_broadcasts_from_threads_are_exact() {
    for n in [2, 3] {
        with_ranks(n, move |rank, comm| run_stream(rank, n, comm.0));
    }
}
