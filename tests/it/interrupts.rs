//! Interrupting blocked calls: ncclCommAbort from a second thread must release a thread
//! blocked in a call on the same communicator quickly, and free the communicator. (The
//! FERROCCL_TIMEOUT side, which needs its own process environment, is in `processes`.)

use std::ffi::{c_void, CStr};
use std::time::{Duration, Instant};

use ferroccl::ffi::coll::{ncclAllReduce, ncclRecv};
use ferroccl::ffi::init::{ncclCommAbort, ncclCommDestroy, ncclCommInitAll};
use ferroccl::ffi::query::ncclGetLastError;
use ferroccl::types::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t};

use crate::common::{check, Comm};

/// Rank 0 of two thread ranks enters a call that rank 1 never matches: an all-reduce (the
/// node area: waits on a peer's counter) and a receive (point to point: waits for a peer that
/// never connects). After 0.5 s another thread aborts rank 0's communicator; the blocked
/// call must return ncclInvalidUsage saying so within 2 s (measured from the abort call),
/// the abort must succeed, and the idle rank must still destroy cleanly.
#[test]
fn abort_from_another_thread_releases_a_blocked_call() {
    for what in ["allreduce", "recv"] {
        let mut comms: [ncclComm_t; 2] = [std::ptr::null_mut(); 2];
        check(ncclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()), "ncclCommInitAll");
        let c0 = Comm(comms[0]);
        let blocked = std::thread::spawn(move || {
            let c0 = c0;
            let count = 1024;
            let send = vec![1f32; count];
            let mut recv = vec![0f32; count];
            let s: *mut c_void = std::ptr::null_mut();
            let r = match what {
                "allreduce" => ncclAllReduce(
                    send.as_ptr().cast(),
                    recv.as_mut_ptr().cast(),
                    count,
                    ncclDataType_t(7),
                    ncclRedOp_t(0),
                    c0.0,
                    s,
                ),
                _ => ncclRecv(recv.as_mut_ptr().cast(), count, ncclDataType_t(7), 1, c0.0, s),
            };
            let returned = Instant::now();
            // SAFETY: a thread-local NUL-terminated string, copied at once.
            let msg = unsafe { CStr::from_ptr(ncclGetLastError(std::ptr::null_mut())) }.to_string_lossy().into_owned();
            (r, returned, msg)
        });
        std::thread::sleep(Duration::from_millis(500));
        assert!(!blocked.is_finished(), "{what}: the call returned although its peer never took part");
        // The abort runs in a thread of its own so that an abort stuck behind the blocked
        // call fails this test instead of hanging it.
        let aborting = Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let c0 = c0;
            let _ = tx.send((ncclCommAbort(c0.0), aborting.elapsed()));
        });
        let (r, abort_took) = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{what}: ncclCommAbort did not return within 10 s"));
        let (result, returned, msg) = blocked.join().expect("blocked thread panicked");
        let release = returned.saturating_duration_since(aborting);
        println!(
            "{what}: blocked call released {:.1} ms after ncclCommAbort, which took {:.1} ms; it said: {msg}",
            release.as_secs_f64() * 1e3,
            abort_took.as_secs_f64() * 1e3
        );
        assert_eq!(r, ncclResult_t::ncclSuccess, "{what}: ncclCommAbort");
        assert_eq!(result, ncclResult_t::ncclInvalidUsage, "{what}: the blocked call's result ({msg})");
        assert!(msg.contains("aborted"), "{what}: {msg}");
        assert!(release < Duration::from_secs(2), "{what}: released after {release:?}");
        assert!(abort_took < Duration::from_secs(2), "{what}: abort took {abort_took:?}");
        check(ncclCommDestroy(comms[1]), "destroy the idle rank");
    }
}
