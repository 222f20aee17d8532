//! Collectives on CUDA device buffers, ordered on streams. Skipped, with the reason printed,
//! where there is no CUDA driver or device (CI); they run on the GPU machine.
//!
//! Ranks as threads share one GPU, so their operations take the IPC path (rank 0's kernels
//! read and write every rank's buffers); point-to-point takes the staged path. Ranks as
//! processes (`gpu_processes_*`) cover the IPC path across processes and, with
//! NCCL_P2P_DISABLE=1, the staged path for collectives.

use std::ffi::c_void;
use std::process::{Command, Stdio};

use cudarc::driver::sys;
use ferroccl::ffi::coll::{
    ncclAllGather, ncclAllReduce, ncclBroadcast, ncclRecv, ncclReduce, ncclReduceScatter, ncclSend,
};
use ferroccl::ffi::group::{ncclGroupEnd, ncclGroupStart};
use ferroccl::ffi::init::{ncclCommDestroy, ncclCommInitAll, ncclCommInitRank};
use ferroccl::ffi::mem::{ncclMemAlloc, ncclMemFree};
use ferroccl::ffi::query::{ncclCommGetAsyncError, ncclGetLastError, ncclRedOpCreatePreMulSum, ncclRedOpDestroy};
use ferroccl::types::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclScalarResidence_t};

use crate::common::{check, unique_id, with_prepared_ranks, Comm};

/// Makes device 0's primary context current on this thread; false (with the reason printed
/// once by the caller) where CUDA cannot be used.
pub fn gpu_context() -> bool {
    if !ferroccl::cuda::driver::available() {
        return false;
    }
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: the driver is loaded and initialised (available() said so); out-pointer is live.
    if unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, 0) } != sys::CUresult::CUDA_SUCCESS {
        return false;
    }
    // SAFETY: ctx came from the driver.
    unsafe { sys::cuCtxSetCurrent(ctx) == sys::CUresult::CUDA_SUCCESS }
}

/// Ranks as threads of a CUDA program: each makes the device current before creating its
/// communicator, as NCCL requires (the library builds its kernels then, while no stream waits
/// on it).
fn with_ranks<T: Send + 'static>(n: usize, body: impl Fn(usize, Comm) -> T + Send + Sync + 'static) -> Vec<T> {
    with_prepared_ranks(n, || assert!(gpu_context(), "rank thread could not make the context current"), body)
}

/// Checks a device buffer against the expected values, naming the first difference.
fn expect_eq(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g.to_bits() != w.to_bits()) {
        panic!(
            "{what}: element {i} is {} but should be {} (got[0..4] {:?})",
            got[i],
            want[i],
            &got[..got.len().min(4)]
        );
    }
}

fn skip(test: &str) -> bool {
    if gpu_context() {
        return false;
    }
    println!("skipped {test}: no CUDA driver or device on this machine");
    true
}

fn cu(r: sys::CUresult, what: &str) {
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{what}");
}

/// Device memory holding f32 values.
struct DevBuf {
    ptr: u64,
    len: usize,
}

impl DevBuf {
    fn new(len: usize) -> DevBuf {
        let mut ptr = 0;
        // SAFETY: a context is current; out-pointer is live.
        cu(unsafe { sys::cuMemAlloc_v2(&mut ptr, len.max(1) * 4) }, "cuMemAlloc");
        DevBuf { ptr, len }
    }
    fn from(v: &[f32]) -> DevBuf {
        let b = DevBuf::new(v.len());
        b.upload(v);
        b
    }
    fn upload(&self, v: &[f32]) {
        // SAFETY: the buffer holds len floats; v is a live host slice of that many.
        cu(unsafe { sys::cuMemcpyHtoD_v2(self.ptr, v.as_ptr().cast(), v.len() * 4) }, "cuMemcpyHtoD");
        // From pageable memory that copy may return before its DMA has landed, and the ranks'
        // non-blocking streams do not wait for the legacy stream: wait for it here.
        // SAFETY: the legacy default stream (NULL) always exists in a current context.
        cu(unsafe { sys::cuStreamSynchronize(std::ptr::null_mut()) }, "cuStreamSynchronize(legacy)");
    }
    fn download(&self) -> Vec<f32> {
        let mut v = vec![0f32; self.len];
        // SAFETY: as above, the other way.
        cu(unsafe { sys::cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), self.ptr, self.len * 4) }, "cuMemcpyDtoH");
        v
    }
    fn p(&self) -> *mut c_void {
        self.ptr as *mut c_void
    }
    /// The address of element `i`.
    fn at(&self, i: usize) -> *mut c_void {
        assert!(i <= self.len);
        (self.ptr + 4 * i as u64) as *mut c_void
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc in new.
        unsafe { sys::cuMemFree_v2(self.ptr) };
    }
}

/// Waits for this rank's stream only: ranks that are threads share a context, and waiting for
/// the whole context would wait for another rank's stream, which may wait for this rank.
///
/// Bounded: a stream still busy after 60 s fails the test with the caller's location instead
/// of hanging the suite (one rank thread's panic would otherwise leave the others' streams
/// waiting on its flags forever).
#[track_caller]
fn sync(stream: *mut c_void) {
    let start = std::time::Instant::now();
    loop {
        // SAFETY: the stream is live.
        match unsafe { sys::cuStreamQuery(stream as sys::CUstream) } {
            sys::CUresult::CUDA_SUCCESS => return,
            sys::CUresult::CUDA_ERROR_NOT_READY if start.elapsed() < std::time::Duration::from_secs(60) => {
                std::thread::sleep(std::time::Duration::from_micros(50))
            }
            r => panic!(
                "stream not through after {:.0} s ({r:?}) at {} on thread {:?}",
                start.elapsed().as_secs_f64(),
                std::panic::Location::caller(),
                std::thread::current().name()
            ),
        }
    }
}

/// Waits until every rank reaches this point (a host all-reduce).
fn host_barrier(comm: ncclComm_t) {
    let mut x = 1f32;
    let p = &mut x as *mut f32 as *mut c_void;
    check(ncclAllReduce(p, p, 1, F32, ncclRedOp_t(0), comm, std::ptr::null_mut()), "host barrier");
}

fn new_stream() -> *mut c_void {
    let mut s: sys::CUstream = std::ptr::null_mut();
    // SAFETY: a context is current; out-pointer is live.
    cu(unsafe { sys::cuStreamCreate(&mut s, 1) }, "cuStreamCreate");
    s as *mut c_void
}

const F32: ncclDataType_t = ncclDataType_t(7);

/// The collectives every rank runs on device buffers, checked against values computed here.
fn device_collectives(rank: usize, n: usize, comm: ncclComm_t) {
    assert!(gpu_context(), "rank thread could not make the context current");
    let stream = new_stream();
    let count = 1000 + 3;
    let input: Vec<f32> = (0..count).map(|i| (i % 97) as f32 + rank as f32 * 1000.0).collect();
    let send = DevBuf::from(&input);
    let recv = DevBuf::new(count);
    check(ncclAllReduce(send.p(), recv.p(), count, F32, ncclRedOp_t(0), comm, stream), "allreduce");
    sync(stream);
    let total_rank: f32 = (0..n).map(|r| r as f32 * 1000.0).sum();
    let expect: Vec<f32> = (0..count).map(|i| (i % 97) as f32 * n as f32 + total_rank).collect();
    expect_eq(&recv.download(), &expect, "all-reduce out of place");

    // In place, then max.
    check(ncclAllReduce(recv.p(), recv.p(), count, F32, ncclRedOp_t(2), comm, stream), "allreduce max in place");
    sync(stream);
    expect_eq(&recv.download(), &expect, "max of equal values");

    // All-gather and reduce-scatter.
    let gathered = DevBuf::new(count * n);
    check(ncclAllGather(send.p(), gathered.p(), count, F32, comm, stream), "allgather");
    let scattered = DevBuf::new(count);
    check(ncclReduceScatter(gathered.p(), scattered.p(), count, F32, ncclRedOp_t(0), comm, stream), "reducescatter");
    sync(stream);
    let g = gathered.download();
    for r in 0..n {
        let want: Vec<f32> = (0..count).map(|i| (i % 97) as f32 + r as f32 * 1000.0).collect();
        assert_eq!(&g[r * count..(r + 1) * count], &want[..], "all-gather block {r}");
    }
    let mine = &g[rank * count..(rank + 1) * count];
    expect_eq(&scattered.download(), &mine.iter().map(|v| v * n as f32).collect::<Vec<_>>(), "reduce-scatter");

    // In place: a rank's block of the full buffer is its all-gather input and its
    // reduce-scatter output; then both in one group with an all-reduce.
    let mut start = vec![0.0f32; count * n];
    start[rank * count..][..count].copy_from_slice(&input);
    let full = DevBuf::from(&start);
    check(ncclAllGather(full.at(rank * count), full.p(), count, F32, comm, stream), "allgather in place");
    sync(stream);
    assert_eq!(full.download(), g, "all-gather in place");
    check(ncclReduceScatter(full.p(), full.at(rank * count), count, F32, ncclRedOp_t(0), comm, stream), "rs in place");
    sync(stream);
    expect_eq(&full.download()[rank * count..][..count], &scattered.download(), "reduce-scatter in place");
    let (gathered2, scattered2, reduced) = (DevBuf::new(count * n), DevBuf::new(count), DevBuf::new(count));
    check(ncclGroupStart(), "group start");
    check(ncclAllGather(send.p(), gathered2.p(), count, F32, comm, stream), "grouped allgather");
    check(ncclReduceScatter(gathered.p(), scattered2.p(), count, F32, ncclRedOp_t(0), comm, stream), "grouped rs");
    check(ncclAllReduce(send.p(), reduced.p(), count, F32, ncclRedOp_t(0), comm, stream), "grouped allreduce");
    check(ncclGroupEnd(), "group end");
    sync(stream);
    assert_eq!(gathered2.download(), g, "grouped all-gather");
    expect_eq(&scattered2.download(), &scattered.download(), "grouped reduce-scatter");
    expect_eq(&reduced.download(), &expect, "grouped all-reduce");

    // A group of small all-reduces (their kernels share launches on one GPU, cuda::batch):
    // one in place, the same one twice out of place, and nine independent ones, more than one
    // launch takes. (NCCL does not order the operations of a group, so none reads another's
    // result here; cuda::batch keeps such folds apart all the same, tests/it/cuda_kernels.rs.)
    let (first, again) = (DevBuf::new(count), DevBuf::new(count));
    let in_place = DevBuf::from(&vec![rank as f32 + 1.0; count]);
    let small: Vec<DevBuf> = (0..9).map(|k| DevBuf::new(8 + 16 * k)).collect();
    check(ncclGroupStart(), "group start");
    check(ncclAllReduce(send.p(), first.p(), count, F32, ncclRedOp_t(0), comm, stream), "first");
    check(ncclAllReduce(send.p(), first.p(), count, F32, ncclRedOp_t(0), comm, stream), "the same again");
    check(ncclAllReduce(send.p(), again.p(), count, F32, ncclRedOp_t(0), comm, stream), "another output");
    check(ncclAllReduce(in_place.p(), in_place.p(), count, F32, ncclRedOp_t(0), comm, stream), "in place");
    for (k, out) in small.iter().enumerate() {
        check(ncclAllReduce(send.p(), out.p(), 8 + 16 * k, F32, ncclRedOp_t(0), comm, stream), "small");
    }
    check(ncclGroupEnd(), "group end");
    sync(stream);
    expect_eq(&first.download(), &expect, "grouped: twice into one output");
    expect_eq(&again.download(), &expect, "grouped: another output");
    let total: f32 = (0..n).map(|r| r as f32 + 1.0).sum();
    expect_eq(&in_place.download(), &vec![total; count], "grouped: in place");
    for (k, out) in small.iter().enumerate() {
        expect_eq(&out.download(), &expect[..8 + 16 * k], "grouped: small independent");
    }

    // Broadcast from the last rank, in place.
    let b = DevBuf::from(&vec![rank as f32; count]);
    check(ncclBroadcast(b.p(), b.p(), count, F32, (n - 1) as i32, comm, stream), "broadcast");
    sync(stream);
    expect_eq(&b.download(), &vec![(n - 1) as f32; count], "broadcast in place");

    // PreMulSum with a host scalar of this rank's own.
    let scalar = rank as f32 + 2.0;
    let mut op = ncclRedOp_t(0);
    check(
        ncclRedOpCreatePreMulSum(&mut op, &scalar as *const f32 as *mut c_void, F32, ncclScalarResidence_t(1), comm),
        "premulsum",
    );
    let ones = DevBuf::from(&vec![1.0f32; count]);
    check(ncclAllReduce(ones.p(), recv.p(), count, F32, op, comm, stream), "allreduce premulsum");
    sync(stream);
    let want: f32 = (0..n).map(|r| r as f32 + 2.0).sum();
    expect_eq(&recv.download(), &vec![want; count], "premulsum");

    // Send/recv in a ring (staged, or direct under FERROCCL_PEER_PATH_ON_ONE_GPU).
    let to = (rank + 1) % n;
    let from = (rank + n - 1) % n;
    let got = DevBuf::new(count);
    check(ncclGroupStart(), "group start");
    check(ncclSend(send.p(), count, F32, to as i32, comm, stream), "send");
    check(ncclRecv(got.p(), count, F32, from as i32, comm, stream), "recv");
    check(ncclGroupEnd(), "group end");
    sync(stream);
    let want: Vec<f32> = (0..count).map(|i| (i % 97) as f32 + from as f32 * 1000.0).collect();
    expect_eq(&got.download(), &want, "sendrecv");
}

/// `n` communicators made at once by this thread on the one GPU (`ncclCommInitAll`, device
/// list 0, 0, ...), and a stream for each.
fn every_rank_on_the_gpu(n: usize) -> (Vec<ncclComm_t>, Vec<*mut c_void>) {
    let mut comms: Vec<ncclComm_t> = vec![std::ptr::null_mut(); n];
    check(ncclCommInitAll(comms.as_mut_ptr(), n as i32, vec![0; n].as_ptr()), "ncclCommInitAll");
    assert!(gpu_context());
    (comms, (0..n).map(|_| new_stream()).collect())
}

/// One thread drives every rank (`ncclCommInitAll`, then each call grouped over the
/// communicators, as nccl-tests `-g` and single-process multi-GPU programs do): each
/// communicator's part runs on a thread of its own, so the group neither stages through host
/// memory nor waits for itself. Here all ranks use the one GPU (device list 0, 0, 0).
#[test]
fn one_thread_drives_every_rank_in_groups() {
    if skip("one_thread_drives_every_rank_in_groups") {
        return;
    }
    let n = 3;
    let (comms, streams) = every_rank_on_the_gpu(n);
    let count = 1000 + 3;
    let sends: Vec<DevBuf> = (0..n).map(|r| DevBuf::from(&vec![(r + 1) as f32; count])).collect();
    let recvs: Vec<DevBuf> = (0..n).map(|_| DevBuf::new(count)).collect();
    let gathered: Vec<DevBuf> = (0..n).map(|_| DevBuf::new(count * n)).collect();
    for round in 0..3 {
        check(ncclGroupStart(), "group start");
        for r in 0..n {
            check(
                ncclAllReduce(sends[r].p(), recvs[r].p(), count, F32, ncclRedOp_t(0), comms[r], streams[r]),
                "allreduce",
            );
            check(ncclAllGather(sends[r].p(), gathered[r].p(), count, F32, comms[r], streams[r]), "allgather");
        }
        check(ncclGroupEnd(), "group end");
        for &s in &streams {
            sync(s);
        }
        let want: Vec<f32> = (0..n).flat_map(|r| vec![(r + 1) as f32; count]).collect();
        for r in 0..n {
            assert_eq!(recvs[r].download(), vec![6.0f32; count], "round {round}: rank {r}'s all-reduce");
            assert_eq!(gathered[r].download(), want, "round {round}: rank {r}'s all-gather");
        }
    }
    for c in comms {
        check(ncclCommDestroy(c), "destroy");
    }
}

/// One thread drives every rank's sends and receives (a ring in each group, then an all-to-all
/// pattern), as nccl-tests `-g` does for sendrecv and alltoall: staged on one GPU by default,
/// by address with FERROCCL_PEER_PATH_ON_ONE_GPU=1 (the path of ranks on different GPUs).
#[test]
fn one_thread_drives_every_rank_with_messages() {
    if skip("one_thread_drives_every_rank_with_messages") {
        return;
    }
    let n = 3;
    let (comms, streams) = every_rank_on_the_gpu(n);
    let count = 1000 + 3;
    let value = |from: usize, to: usize, round: usize| (from * 100 + to * 10 + round) as f32;
    for round in 0..3 {
        // A ring: rank r sends to r + 1.
        let sends: Vec<DevBuf> = (0..n).map(|r| DevBuf::from(&vec![value(r, (r + 1) % n, round); count])).collect();
        let recvs: Vec<DevBuf> = (0..n).map(|_| DevBuf::new(count)).collect();
        check(ncclGroupStart(), "group start");
        for r in 0..n {
            let (to, from) = ((r + 1) % n, (r + n - 1) % n);
            check(ncclSend(sends[r].p(), count, F32, to as i32, comms[r], streams[r]), "send");
            check(ncclRecv(recvs[r].p(), count, F32, from as i32, comms[r], streams[r]), "recv");
        }
        check(ncclGroupEnd(), "group end");
        for &s in &streams {
            sync(s);
        }
        for (r, got) in recvs.iter().enumerate() {
            let from = (r + n - 1) % n;
            assert_eq!(got.download(), vec![value(from, r, round); count], "round {round}: rank {r}'s ring message");
        }
        // All to all: every rank sends its block j to rank j (its own block included).
        let blocks: Vec<DevBuf> = (0..n)
            .map(|r| DevBuf::from(&(0..n).flat_map(|j| vec![value(r, j, round); count]).collect::<Vec<f32>>()))
            .collect();
        let gathered: Vec<DevBuf> = (0..n).map(|_| DevBuf::new(count * n)).collect();
        check(ncclGroupStart(), "group start");
        for r in 0..n {
            for j in 0..n {
                check(ncclSend(blocks[r].at(j * count), count, F32, j as i32, comms[r], streams[r]), "a2a send");
                check(ncclRecv(gathered[r].at(j * count), count, F32, j as i32, comms[r], streams[r]), "a2a recv");
            }
        }
        check(ncclGroupEnd(), "group end");
        for &s in &streams {
            sync(s);
        }
        for (r, got) in gathered.iter().enumerate() {
            let want: Vec<f32> = (0..n).flat_map(|j| vec![value(j, r, round); count]).collect();
            assert_eq!(got.download(), want, "round {round}: rank {r}'s all-to-all");
        }
    }
    for c in comms {
        check(ncclCommDestroy(c), "destroy");
    }
}

/// The same on the peer-GPU path (FERROCCL_PEER_PATH_ON_ONE_GPU=1: ranks of one process on
/// "different" GPUs, flags in the host page, each rank copying its own all-gather block; their
/// sends and receives by address, taking turns), in a child process since the switch is read
/// once per process.
#[test]
fn one_thread_drives_every_rank_on_the_peer_path() {
    if skip("one_thread_drives_every_rank_on_the_peer_path") {
        return;
    }
    // And rank threads each making their own calls, on the same path.
    for test in [
        "cuda::one_thread_drives_every_rank_in_groups",
        "cuda::one_thread_drives_every_rank_with_messages",
        "cuda::device_buffers_threads_2_and_3",
        "cuda::device_p2p_threads_2_and_3",
    ] {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env("FERROCCL_PEER_PATH_ON_ONE_GPU", "1")
            .env("FERROCCL_TIMEOUT", "60")
            .env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "P2P")
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && text.contains("1 passed"), "{test}:\n{text}");
        // Every test here but the collectives-only one has sends and receives between threads:
        // they must have gone by address, not through the staged path.
        let messages = !test.ends_with("every_rank_in_groups");
        assert_eq!(text.contains("P2P/direct"), messages, "{test}: the P2P/direct line:\n{text}");
    }
}

#[test]
fn device_buffers_threads_2_and_3() {
    if skip("device_buffers_threads_2_and_3") {
        return;
    }
    for n in [2usize, 3] {
        with_ranks(n, move |rank, comm| device_collectives(rank, n, comm.0));
    }
    println!("device collectives: 2 and 3 thread ranks OK");
}

/// Sends and receives between rank threads of one process on one GPU: staged by default; with
/// FERROCCL_PEER_PATH_ON_ONE_GPU=1 (see the tests that set it) by address, the threads taking
/// turns on the context's hardware queues, as threads on different GPUs do without turns.
#[test]
fn device_p2p_threads_2_and_3() {
    if skip("device_p2p_threads_2_and_3") {
        return;
    }
    for n in [2usize, 3] {
        // Threads sharing the GPU copy directly only with the switch (staged otherwise).
        let direct = std::env::var("FERROCCL_PEER_PATH_ON_ONE_GPU").is_ok_and(|v| v.trim() != "0" && !v.is_empty());
        with_ranks(n, move |rank, comm| device_p2p(rank, n, comm.0, direct));
    }
    println!("device sends and receives: 2 and 3 thread ranks OK");
}

#[test]
fn device_buffers_one_rank() {
    if skip("device_buffers_one_rank") {
        return;
    }
    with_ranks(1, |rank, comm| device_collectives(rank, 1, comm.0));
}

/// The operation runs after the work queued before it on the stream, and work queued after it
/// waits for it: an asynchronous memset feeds it, an asynchronous copy reads its result.
#[test]
fn device_buffers_are_stream_ordered() {
    if skip("device_buffers_are_stream_ordered") {
        return;
    }
    with_ranks(2, |_rank, comm| {
        assert!(gpu_context());
        let stream = new_stream();
        let count = 1 << 20;
        let send = DevBuf::new(count);
        let recv = DevBuf::new(count);
        // Pinned host memory: a copy into pageable memory blocks the calling thread inside the
        // driver, which can keep this process's other threads (the library's workers) out.
        let mut pinned: *mut c_void = std::ptr::null_mut();
        // SAFETY: a context is current; out-pointer is live.
        cu(unsafe { sys::cuMemAllocHost_v2(&mut pinned, count * 4) }, "cuMemAllocHost");
        // SAFETY: count floats of pinned memory, freed at the end of this closure.
        let host = unsafe { std::slice::from_raw_parts_mut(pinned as *mut f32, count) };
        for _ in 0..3 {
            // SAFETY: send holds count floats; stream is live.
            cu(unsafe { sys::cuMemsetD32Async(send.ptr, 2.5f32.to_bits(), count, stream as sys::CUstream) }, "memset");
            check(ncclAllReduce(send.p(), recv.p(), count, F32, ncclRedOp_t(0), comm.0, stream), "allreduce");
            // SAFETY: host holds count floats and outlives the synchronize below.
            cu(unsafe { sys::cuMemcpyDtoHAsync_v2(pinned, recv.ptr, count * 4, stream as sys::CUstream) }, "copy back");
            sync(stream);
            expect_eq(host, &vec![5.0; count], "result ordered on the stream");
            host.fill(0.0);
        }
        // SAFETY: allocated above, no longer used.
        cu(unsafe { sys::cuMemFreeHost(pinned) }, "cuMemFreeHost");
    });
}

/// Host and device buffers in one call are refused and nothing runs; ncclMemAlloc gives device
/// memory in a thread with a context, and ncclMemFree takes it back.
#[test]
fn mixed_memory_is_refused_and_mem_alloc_is_device_memory() {
    if skip("mixed_memory_is_refused_and_mem_alloc_is_device_memory") {
        return;
    }
    with_ranks(1, |_rank, comm| {
        assert!(gpu_context());
        let dev = DevBuf::new(16);
        let mut host = vec![0f32; 16];
        let r = ncclAllReduce(dev.p(), host.as_mut_ptr().cast(), 16, F32, ncclRedOp_t(0), comm.0, std::ptr::null_mut());
        assert_eq!(r, ncclResult_t::ncclInvalidArgument);
        let mut p: *mut c_void = std::ptr::null_mut();
        check(ncclMemAlloc(&mut p, 1 << 20), "ncclMemAlloc");
        assert!(ferroccl::cuda::memory::classify(p as *const u8).is_device(), "ncclMemAlloc gave host memory");
        check(ncclMemFree(p), "ncclMemFree");
    });
}

/// Body of a rank process for the tests below (does nothing without the role variable).
/// A collective where one rank passes device buffers and the other host buffers is refused on
/// both (their paths differ: the device rank's exchanges and the host rank's collective would
/// otherwise be matched against each other), naming the kinds; nothing hangs.
#[test]
fn ranks_passing_different_kinds_of_memory_are_refused() {
    if skip("ranks_passing_different_kinds_of_memory_are_refused") {
        return;
    }
    let texts = with_ranks(2, |rank, comm| {
        let count = 1 << 16;
        let stream = new_stream();
        let r = if rank == 0 {
            let dev = DevBuf::new(count);
            let r = ncclAllReduce(dev.p(), dev.p(), count, F32, ncclRedOp_t(0), comm.0, stream);
            sync(stream);
            r
        } else {
            let mut host = vec![1f32; count];
            let p = host.as_mut_ptr().cast();
            ncclAllReduce(p, p, count, F32, ncclRedOp_t(0), comm.0, std::ptr::null_mut())
        };
        let mut async_err = ncclResult_t::ncclSuccess;
        check(ncclCommGetAsyncError(comm.0, &mut async_err), "ncclCommGetAsyncError");
        // SAFETY: a thread-local NUL-terminated string, copied at once.
        let msg = unsafe { std::ffi::CStr::from_ptr(ncclGetLastError(comm.0)) }.to_string_lossy().into_owned();
        (r, async_err, msg)
    });
    for (rank, (r, async_err, msg)) in texts.iter().enumerate() {
        let refused = *r == ncclResult_t::ncclInvalidUsage || *async_err == ncclResult_t::ncclInvalidUsage;
        assert!(refused, "rank {rank}: returned {r:?}, async {async_err:?}: {msg}");
    }
    let host_rank = &texts[1].2;
    assert!(host_rank.contains("host buffers on") && host_rank.contains("device buffers on"), "{host_rank}");
}

#[test]
fn gpu_child_rank() {
    let Ok(role) = std::env::var("FERROCCL_IT_GPU_ROLE") else { return };
    let parts: Vec<&str> = role.split(',').collect();
    let (rank, n) = (parts[0].parse::<usize>().unwrap(), parts[1].parse::<usize>().unwrap());
    let id = crate::processes::unhex(parts[2]);
    assert!(gpu_context());
    let mut comm: ncclComm_t = std::ptr::null_mut();
    check(ncclCommInitRank(&mut comm, n as i32, id, rank as i32), "init");
    let scenario = std::env::var("FERROCCL_IT_GPU_SCENARIO").unwrap_or_default();
    if scenario.starts_with("abort_") {
        match scenario.as_str() {
            "abort_p2p" => abort_releases_device_send(rank, comm),
            "abort_all_reduce" | "abort_reduce_scatter" => {
                let released = abort_held_collective(rank, comm, scenario == "abort_reduce_scatter", || {
                    // The other process's kernels may still read this one's buffers (rank 0's
                    // run about 300 ms after rank 1's abort): outlive them with a wide margin.
                    std::thread::sleep(std::time::Duration::from_millis(2000))
                });
                println!("rank {rank}: stream released {released:?} after ncclCommAbort");
            }
            other => panic!("unknown scenario {other}"),
        }
        println!("GPU CHILD {rank} OK");
        return;
    }
    device_collectives(rank, n, comm);
    if std::env::var_os("NCCL_P2P_DISABLE").is_none() {
        device_scalar_and_graph(rank, n, comm, false);
    } else {
        large_staged_collectives(rank, n, comm);
        back_to_back_staged(rank, n, comm);
        device_scalar_and_graph(rank, n, comm, false);
        staged_graphs(rank, n, comm);
    }
    mem_alloc_collectives(rank, n, comm);
    device_p2p(rank, n, comm, !std::env::var("NCCL_P2P_DISABLE").is_ok_and(|v| v.trim() != "0" && !v.is_empty()));
    check(ncclCommDestroy(comm), "destroy");
    println!("GPU CHILD {rank} OK");
}

fn gpu_processes(n: usize, extra_env: &[(&str, &str)]) {
    let id = unique_id();
    let children: Vec<_> = (0..n)
        .map(|rank| {
            let mut cmd = Command::new(std::env::current_exe().unwrap());
            cmd.args(["--exact", "cuda::gpu_child_rank", "--nocapture", "--test-threads=1"])
                .env("FERROCCL_IT_GPU_ROLE", format!("{rank},{n},{}", crate::processes::hex(&id)))
                .env("FERROCCL_BOOTSTRAP_TIMEOUT", "30")
                .env("FERROCCL_TIMEOUT", "60")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in extra_env {
                cmd.env(k, v);
            }
            cmd.spawn().unwrap()
        })
        .collect();
    // Every rank's output on a failure: the first rank to fail is often not the one reported.
    let results: Vec<(bool, String)> = children
        .into_iter()
        .enumerate()
        .map(|(rank, c)| {
            let out = c.wait_with_output().unwrap();
            let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            (out.status.success() && text.contains(&format!("GPU CHILD {rank} OK")), text)
        })
        .collect();
    if !results.iter().all(|(ok, _)| *ok) {
        let all: Vec<String> =
            results.iter().enumerate().map(|(r, (ok, t))| format!("rank {r} (ok: {ok}):\n{t}")).collect();
        panic!("{}", all.join("\n"));
    }
}

#[test]
fn gpu_processes_ipc() {
    if skip("gpu_processes_ipc") {
        return;
    }
    gpu_processes(2, &[]);
    gpu_processes(4, &[]);
}

/// Rank threads of one process share its CUDA context's hardware queues: with one queue for
/// all streams, a rank's stream waiting on a flag holds up every stream submitted after it.
/// Ranks submit their waits in turn (coll::local_order), so the one-GPU path and the direct
/// send/receive still complete (before, this stopped every time, round 23). In a child
/// process, as the variable only counts when the context is made; stopped after 90 s.
#[test]
fn rank_threads_with_one_hardware_queue() {
    if skip("rank_threads_with_one_hardware_queue") {
        return;
    }
    let runs: [(&str, &[(&str, &str)]); 3] = [
        ("cuda::device_buffers_threads_2_and_3", &[]),
        ("cuda::device_p2p_threads_2_and_3", &[]),
        ("cuda::device_p2p_threads_2_and_3", &[("FERROCCL_PEER_PATH_ON_ONE_GPU", "1")]),
    ];
    for (test, env) in runs {
        // Output into a file: a pipe left unread until the end could fill and stop the child.
        let log = std::env::temp_dir().join(format!("ferroccl-one-queue-{}.log", std::process::id()));
        let file = std::fs::File::create(&log).unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env("CUDA_DEVICE_MAX_CONNECTIONS", "1")
            .env("FERROCCL_TIMEOUT", "60")
            .env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "P2P")
            .envs(env.iter().copied())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        let start = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > std::time::Duration::from_secs(90) {
                child.kill().ok();
                panic!("{test} {env:?}: rank threads on one hardware queue still running after 90 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let ok = child.wait().unwrap().success();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        std::fs::remove_file(&log).ok();
        assert!(ok && text.contains("1 passed"), "{test} {env:?}:\n{text}");
        // Threads on one GPU copy by address only with the switch (staged otherwise).
        let direct = !env.is_empty();
        assert_eq!(text.contains("P2P/direct"), direct, "{test} {env:?}: the P2P/direct line:\n{text}");
    }
}

/// The path for ranks on different GPUs with peer access, run on one GPU (every rank's
/// "peer" GPU is the same one), so that a one-GPU machine tests it too.
#[test]
fn gpu_processes_peer_path() {
    if skip("gpu_processes_peer_path") {
        return;
    }
    gpu_processes(2, &[("FERROCCL_PEER_PATH_ON_ONE_GPU", "1")]);
    gpu_processes(3, &[("FERROCCL_PEER_PATH_ON_ONE_GPU", "1")]);
}

#[test]
fn gpu_processes_staged() {
    if skip("gpu_processes_staged") {
        return;
    }
    gpu_processes(2, &[("NCCL_P2P_DISABLE", "1")]);
    // Over sockets: the executor's steps wait for the input pieces they read.
    gpu_processes(3, &[("NCCL_P2P_DISABLE", "1"), ("NCCL_SHM_DISABLE", "1")]);
}

/// Sends and receives of processes or rank threads (`direct`: between their device buffers;
/// otherwise staged): two messages of different sizes to one peer in a group with an
/// all-reduce; messages queued back to back with the input rewritten on the stream in between;
/// empty messages; and, last, on the direct path, groups that do not match and a send and
/// receive of different sizes, refused on both sides.
fn device_p2p(rank: usize, n: usize, comm: ncclComm_t, direct: bool) {
    assert!(gpu_context());
    let stream = new_stream();
    let raw = stream as sys::CUstream;
    let (to, from) = ((rank + 1) % n, (rank + n - 1) % n);
    let values =
        |r: usize, c: usize, sign: f32| -> Vec<f32> { (0..c).map(|i| sign * (r * 100_000 + i) as f32).collect() };
    let (c1, c2) = (4099, 17);
    let (a, b) = (DevBuf::from(&values(rank, c1, 1.0)), DevBuf::from(&values(rank, c2, -1.0)));
    let (got_a, got_b) = (DevBuf::new(c1), DevBuf::new(c2));
    let (ar_in, ar_out) = (DevBuf::from(&vec![rank as f32; 64]), DevBuf::new(64));
    check(ncclGroupStart(), "group start");
    check(ncclRecv(got_a.p(), c1, F32, from as i32, comm, stream), "recv a");
    check(ncclSend(a.p(), c1, F32, to as i32, comm, stream), "send a");
    check(ncclAllReduce(ar_in.p(), ar_out.p(), 64, F32, ncclRedOp_t(0), comm, stream), "allreduce in the group");
    check(ncclSend(b.p(), c2, F32, to as i32, comm, stream), "send b");
    check(ncclRecv(got_b.p(), c2, F32, from as i32, comm, stream), "recv b");
    check(ncclGroupEnd(), "group end");
    sync(stream);
    assert_eq!(got_a.download(), values(from, c1, 1.0), "first message");
    assert_eq!(got_b.download(), values(from, c2, -1.0), "second message");
    let sum: f32 = (0..n).map(|r| r as f32).sum();
    assert_eq!(ar_out.download(), vec![sum; 64], "all-reduce grouped with sends and receives");

    // To this rank itself, in a group with messages to the others (as an all-to-all does).
    let to_self = DevBuf::new(c2);
    let again = DevBuf::new(c1);
    check(ncclGroupStart(), "group start");
    check(ncclSend(b.p(), c2, F32, rank as i32, comm, stream), "send to self");
    check(ncclSend(a.p(), c1, F32, to as i32, comm, stream), "send a again");
    check(ncclRecv(to_self.p(), c2, F32, rank as i32, comm, stream), "recv from self");
    check(ncclRecv(again.p(), c1, F32, from as i32, comm, stream), "recv a again");
    check(ncclGroupEnd(), "group end");
    sync(stream);
    assert_eq!(to_self.download(), values(rank, c2, -1.0), "message to itself");
    assert_eq!(again.download(), values(from, c1, 1.0), "message beside the one to itself");

    let input = DevBuf::new(c1);
    let outs: Vec<DevBuf> = (0..4).map(|_| DevBuf::new(c1)).collect();
    for (k, out) in outs.iter().enumerate() {
        let value = (rank * 10 + k) as f32;
        // SAFETY: input holds c1 floats; the stream is live.
        cu(unsafe { sys::cuMemsetD32Async(input.ptr, value.to_bits(), c1, raw) }, "memset input");
        check(ncclGroupStart(), "group start");
        check(ncclSend(input.p(), c1, F32, to as i32, comm, stream), "send");
        check(ncclRecv(out.p(), c1, F32, from as i32, comm, stream), "recv");
        check(ncclGroupEnd(), "group end");
    }
    sync(stream);
    for (k, out) in outs.iter().enumerate() {
        assert_eq!(out.download(), vec![(from * 10 + k) as f32; c1], "message {k} of the back-to-back ones");
    }

    check(ncclGroupStart(), "group start");
    check(ncclSend(a.p(), 0, F32, to as i32, comm, stream), "empty send");
    check(ncclRecv(got_a.p(), 0, F32, from as i32, comm, stream), "empty recv");
    check(ncclGroupEnd(), "group end");
    sync(stream);
    assert_eq!(got_a.download(), values(from, c1, 1.0), "an empty message leaves the buffer alone");

    // Each send and receive is decided on its own: a group whose first call is an all-reduce on
    // another stream still moves its messages directly, matching the peer's.
    let other_stream = new_stream();
    let (moved, reduced2) = (DevBuf::new(c1), DevBuf::new(64));
    check(ncclGroupStart(), "group start");
    check(ncclAllReduce(ar_in.p(), reduced2.p(), 64, F32, ncclRedOp_t(0), comm, stream), "allreduce first");
    check(ncclSend(a.p(), c1, F32, to as i32, comm, other_stream), "send on another stream");
    check(ncclRecv(moved.p(), c1, F32, from as i32, comm, other_stream), "recv on another stream");
    check(ncclGroupEnd(), "group end");
    sync(stream);
    sync(other_stream);
    assert_eq!(moved.download(), values(from, c1, 1.0), "message on a second stream");
    assert_eq!(reduced2.download(), vec![sum; 64], "all-reduce on the first stream");

    // The refusals below are this path's (the staged path is not asked them).
    if !direct {
        return;
    }
    if n == 2 {
        // Groups that do not match (two sends against a receive and a send, messages of equal
        // length): refused on both sides before anything is queued.
        ncclGroupStart();
        if rank == 0 {
            ncclSend(a.p(), c1, F32, 1, comm, stream);
            ncclSend(a.p(), c1, F32, 1, comm, stream);
        } else {
            ncclRecv(got_a.p(), c1, F32, 0, comm, stream);
            ncclSend(a.p(), c1, F32, 0, comm, stream);
        }
        let r = ncclGroupEnd();
        assert_eq!(r, ncclResult_t::ncclInvalidUsage, "mismatched groups");
        sync(stream);
    }
    ncclGroupStart();
    ncclSend(a.p(), c1, F32, to as i32, comm, stream);
    ncclRecv(got_a.p(), c1 - 1, F32, from as i32, comm, stream);
    let r = ncclGroupEnd();
    assert_eq!(r, ncclResult_t::ncclInvalidUsage, "a send matched with a smaller receive");
    sync(stream);
    assert_eq!(got_a.download(), values(from, c1, 1.0), "a refused message leaves the buffer alone");
}

/// PreMulSum with a device-resident scalar, written on the stream just before each call: the
/// operation must read it in stream order (a read at call time would see the old value).
/// Then an all-reduce captured in a CUDA graph and replayed with new inputs each time.
/// `threads_on_one_gpu`: the ranks are threads of this process sharing its GPU, which may not
/// capture (their replays could wait on each other in a shared hardware queue): the capture is
/// refused on every rank and the communicator works on as before.
fn device_scalar_and_graph(rank: usize, n: usize, comm: ncclComm_t, threads_on_one_gpu: bool) {
    assert!(gpu_context(), "rank thread could not make the context current");
    let stream = new_stream();
    let raw = stream as sys::CUstream;
    let count = 4096 + 5;
    let ones = DevBuf::from(&vec![1.0f32; count]);
    let recv = DevBuf::new(count);
    let scalar = DevBuf::from(&[0.0f32]);
    let mut op = ncclRedOp_t(0);
    check(ncclRedOpCreatePreMulSum(&mut op, scalar.p(), F32, ncclScalarResidence_t(0), comm), "premulsum device");
    for round in 0..3 {
        let value = (rank + 1) as f32 * (round + 1) as f32;
        // SAFETY: the scalar buffer holds one float; the stream is live.
        cu(unsafe { sys::cuMemsetD32Async(scalar.ptr, value.to_bits(), 1, raw) }, "memset scalar");
        check(ncclAllReduce(ones.p(), recv.p(), count, F32, op, comm, stream), "allreduce device scalar");
        sync(stream);
        let want: f32 = (0..n).map(|r| (r + 1) as f32 * (round + 1) as f32).sum();
        expect_eq(&recv.download(), &vec![want; count], "premulsum with a device scalar set on the stream");
    }

    // Reduce-scatters queued back to back, the input and the device scalar rewritten on the
    // stream between them: no rank may read another's input or scalar before it is written
    // for its call, or after it is rewritten for the next one.
    let block = 1024 + 3;
    let input = DevBuf::new(block * n);
    let outs: Vec<DevBuf> = (0..4).map(|_| DevBuf::new(block)).collect();
    for (k, out) in outs.iter().enumerate() {
        let value = (rank + 1) as f32 * (k + 1) as f32;
        let factor = (rank + k + 2) as f32;
        // SAFETY: input holds block * n floats and scalar one; the stream is live.
        cu(unsafe { sys::cuMemsetD32Async(input.ptr, value.to_bits(), block * n, raw) }, "memset input");
        // SAFETY: as above.
        cu(unsafe { sys::cuMemsetD32Async(scalar.ptr, factor.to_bits(), 1, raw) }, "memset scalar");
        check(ncclReduceScatter(input.p(), out.p(), block, F32, op, comm, stream), "reduce-scatter device scalar");
    }
    sync(stream);
    for (k, out) in outs.iter().enumerate() {
        let want: f32 = (0..n).map(|r| (r + 1) as f32 * (k + 1) as f32 * (r + k + 2) as f32).sum();
        expect_eq(&out.download(), &vec![want; block], "back-to-back reduce-scatters with device scalars");
    }

    let send = DevBuf::new(count);
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    // SAFETY: the stream is live and not capturing.
    cu(unsafe { sys::cuStreamBeginCapture_v2(raw, mode) }, "cuStreamBeginCapture");
    let r = ncclAllReduce(send.p(), recv.p(), count, F32, ncclRedOp_t(0), comm, stream);
    // SAFETY: capture began above; out-pointer is live.
    cu(unsafe { sys::cuStreamEndCapture(raw, &mut graph) }, "cuStreamEndCapture");
    if threads_on_one_gpu && n > 1 {
        assert_eq!(r, ncclResult_t::ncclInvalidUsage, "rank {rank}: capture by rank threads on one GPU");
        // SAFETY: the (empty) graph came from the capture above and is used no more.
        unsafe { sys::cuGraphDestroy(graph) };
        // Nothing changed: the same all-reduce, outside capture.
        // SAFETY: send holds count floats; the stream is live.
        cu(unsafe { sys::cuMemsetD32Async(send.ptr, (rank as f32).to_bits(), count, raw) }, "memset input");
        check(ncclAllReduce(send.p(), recv.p(), count, F32, ncclRedOp_t(0), comm, stream), "allreduce after refusal");
        sync(stream);
        let want: f32 = (0..n).map(|r| r as f32).sum();
        expect_eq(&recv.download(), &vec![want; count], "all-reduce after a refused capture");
        return;
    }
    check(r, "allreduce under capture");
    let mut exec: sys::CUgraphExec = std::ptr::null_mut();
    // SAFETY: graph came from the capture; out-pointer is live.
    cu(unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }, "cuGraphInstantiate");
    for replay in 0..4 {
        let value = (rank * 10 + replay) as f32;
        // SAFETY: send holds count floats; the stream is live.
        cu(unsafe { sys::cuMemsetD32Async(send.ptr, value.to_bits(), count, raw) }, "memset input");
        // SAFETY: exec is an instantiated graph; the stream is live.
        cu(unsafe { sys::cuGraphLaunch(exec, raw) }, "cuGraphLaunch");
        sync(stream);
        let want: f32 = (0..n).map(|r| (r * 10 + replay) as f32).sum();
        expect_eq(&recv.download(), &vec![want; count], "all-reduce replayed from a CUDA graph");
    }
    // SAFETY: created above, used no more (the stream is synchronised).
    unsafe {
        sys::cuGraphExecDestroy(exec);
        sys::cuGraphDestroy(graph);
    }
}

/// ncclGroupSimulateEnd on device buffers: an estimate comes back, nothing is queued on the
/// stream (the output keeps its marker), and the communicator works on as before.
#[test]
fn simulate_end_with_device_buffers_runs_nothing() {
    if skip("simulate_end_with_device_buffers_runs_nothing") {
        return;
    }
    use ferroccl::ffi::group::ncclGroupSimulateEnd;
    use ferroccl::types::{ncclSimInfo_t, NCCL_SIM_INFO_MAGIC};
    for n in [1usize, 2] {
        with_ranks(n, move |rank, comm| {
            let stream = new_stream();
            let count = (1 << 20) + 1;
            let send = DevBuf::from(&vec![(rank + 1) as f32; count]);
            let recv = DevBuf::from(&vec![-1.0f32; count]);
            let mut info = ncclSimInfo_t {
                size: std::mem::size_of::<ncclSimInfo_t>(),
                magic: NCCL_SIM_INFO_MAGIC,
                version: 22707,
                estimatedTime: f32::NAN,
            };
            check(ncclGroupStart(), "group start");
            check(ncclAllReduce(send.p(), recv.p(), count, F32, ncclRedOp_t(0), comm.0, stream), "simulated allreduce");
            check(ncclGroupSimulateEnd(&mut info), "simulate end");
            sync(stream);
            assert!(info.estimatedTime.is_finite() && info.estimatedTime > 0.0, "estimate {}", info.estimatedTime);
            expect_eq(&recv.download(), &vec![-1.0; count], "output of a simulated all-reduce");
            check(ncclAllReduce(send.p(), recv.p(), count, F32, ncclRedOp_t(0), comm.0, stream), "allreduce");
            sync(stream);
            let want: f32 = (1..=n).map(|r| r as f32).sum();
            expect_eq(&recv.download(), &vec![want; count], "all-reduce after a simulated one");
        });
    }
}

#[test]
fn device_scalar_and_graph_threads_1_2_3() {
    if skip("device_scalar_and_graph_threads_1_2_3") {
        return;
    }
    for n in [1usize, 2, 3] {
        with_ranks(n, move |rank, comm| {
            device_collectives(rank, n, comm.0);
            // device_collectives frees its buffers on return, and cuMemFree waits for every
            // stream of the context, the other rank threads' included: a rank already queuing
            // the next test's operations (its stream waiting for this rank's) would never let
            // it return. Nobody queues device work until everybody is through.
            host_barrier(comm.0);
            device_scalar_and_graph(rank, n, comm.0, true)
        });
    }
}

/// Collectives on ncclMemAlloc buffers (cuMem memory exported as a POSIX descriptor, which
/// other processes import through pidfd_getfd; legacy CUDA IPC cannot open it). ncclMemFree
/// frees them, and refuses device memory it did not allocate.
fn mem_alloc_collectives(rank: usize, n: usize, comm: ncclComm_t) {
    assert!(gpu_context(), "rank thread could not make the context current");
    let stream = new_stream();
    let count = (1 << 20) + 3;
    let alloc = |len: usize| -> DevBuf {
        let mut p: *mut c_void = std::ptr::null_mut();
        check(ncclMemAlloc(&mut p, len * 4), "ncclMemAlloc");
        assert!(ferroccl::cuda::memory::classify(p as *const u8).is_device(), "ncclMemAlloc gave host memory");
        DevBuf { ptr: p as u64, len }
    };
    let input: Vec<f32> = (0..count).map(|i| (i % 31) as f32 + rank as f32).collect();
    let send = alloc(count);
    send.upload(&input);
    let recv = alloc(count);
    let gathered = alloc(count * n);
    check(ncclAllReduce(send.p(), recv.p(), count, F32, ncclRedOp_t(0), comm, stream), "allreduce (ncclMemAlloc)");
    check(ncclAllGather(send.p(), gathered.p(), count, F32, comm, stream), "allgather (ncclMemAlloc)");
    sync(stream);
    let ranks: f32 = (0..n).map(|r| r as f32).sum();
    let want: Vec<f32> = (0..count).map(|i| (i % 31) as f32 * n as f32 + ranks).collect();
    expect_eq(&recv.download(), &want, "all-reduce on ncclMemAlloc buffers");
    let g = gathered.download();
    for r in 0..n {
        let want: Vec<f32> = (0..count).map(|i| (i % 31) as f32 + r as f32).collect();
        expect_eq(&g[r * count..(r + 1) * count], &want, "all-gather on ncclMemAlloc buffers");
    }
    let user = DevBuf::new(16);
    assert_eq!(ncclMemFree(user.p()), ncclResult_t::ncclInvalidArgument, "ncclMemFree of cuMemAlloc memory");
    for b in [send, recv, gathered] {
        check(ncclMemFree(b.p()), "ncclMemFree");
        std::mem::forget(b); // freed by ncclMemFree, not by DevBuf's cuMemFree
    }
}

#[test]
fn mem_alloc_buffers_threads_1_and_2() {
    if skip("mem_alloc_buffers_threads_1_and_2") {
        return;
    }
    for n in [1usize, 2] {
        with_ranks(n, move |rank, comm| mem_alloc_collectives(rank, n, comm.0));
    }
}

/// Large operations on the staged path (NCCL_P2P_DISABLE=1): cut into pieces whose copies
/// overlap the host engine's transfers; exact results for every element, and a device-resident
/// PreMulSum scalar written on the stream just before the call.
fn large_staged_collectives(rank: usize, n: usize, comm: ncclComm_t) {
    assert!(gpu_context(), "rank thread could not make the context current");
    let stream = new_stream();
    let raw = stream as sys::CUstream;
    let count = (5 << 20) + 7; // 16 pieces, the last one short
    let value = |r: usize, i: usize| ((i % 1021) as f32) + (r * 2048) as f32;
    let input: Vec<f32> = (0..count).map(|i| value(rank, i)).collect();
    let send = DevBuf::from(&input);
    let recv = DevBuf::new(count);
    check(ncclAllReduce(send.p(), recv.p(), count, F32, ncclRedOp_t(0), comm, stream), "staged allreduce");
    let gathered = DevBuf::new(count * n);
    check(ncclAllGather(send.p(), gathered.p(), count, F32, comm, stream), "staged allgather");
    let scattered = DevBuf::new(count);
    check(
        ncclReduceScatter(gathered.p(), scattered.p(), count, F32, ncclRedOp_t(0), comm, stream),
        "staged reducescatter",
    );
    sync(stream);
    let want: Vec<f32> = (0..count).map(|i| (0..n).map(|r| value(r, i)).sum()).collect();
    expect_eq(&recv.download(), &want, "staged all-reduce in pieces");
    let g = gathered.download();
    for r in 0..n {
        let want: Vec<f32> = (0..count).map(|i| value(r, i)).collect();
        expect_eq(&g[r * count..(r + 1) * count], &want, "staged all-gather in pieces");
    }
    let mine: Vec<f32> = (0..count).map(|i| value(rank, i) * n as f32).collect();
    expect_eq(&scattered.download(), &mine, "staged reduce-scatter in pieces");

    // In place (the input pieces are all copied in before any output piece goes back), a
    // broadcast, a reduce and a send/receive ring, each staged piece by piece.
    let inplace = DevBuf::from(&input);
    check(ncclAllReduce(inplace.p(), inplace.p(), count, F32, ncclRedOp_t(0), comm, stream), "staged in place");
    let root = n - 1;
    let bcast = DevBuf::from(&vec![rank as f32; count]);
    check(ncclBroadcast(send.p(), bcast.p(), count, F32, root as i32, comm, stream), "staged broadcast");
    let reduced = DevBuf::new(count);
    check(ncclReduce(send.p(), reduced.p(), count, F32, ncclRedOp_t(2), 0, comm, stream), "staged reduce max");
    let got = DevBuf::new(count);
    let (to, from) = ((rank + 1) % n, (rank + n - 1) % n);
    check(ncclGroupStart(), "group start");
    check(ncclSend(send.p(), count, F32, to as i32, comm, stream), "staged send");
    check(ncclRecv(got.p(), count, F32, from as i32, comm, stream), "staged recv");
    check(ncclGroupEnd(), "group end");
    // A lone send and receive, each staged piece by piece.
    let lone = DevBuf::new(count);
    match rank {
        0 => check(ncclSend(send.p(), count, F32, 1, comm, stream), "lone staged send"),
        1 => check(ncclRecv(lone.p(), count, F32, 0, comm, stream), "lone staged recv"),
        _ => {}
    }
    sync(stream);
    if rank == 1 {
        expect_eq(&lone.download(), &(0..count).map(|i| value(0, i)).collect::<Vec<_>>(), "lone staged receive");
    }
    expect_eq(&inplace.download(), &want, "staged all-reduce in place");
    let root_input: Vec<f32> = (0..count).map(|i| value(root, i)).collect();
    expect_eq(&bcast.download(), &root_input, "staged broadcast in pieces");
    if rank == 0 {
        let max: Vec<f32> = (0..count).map(|i| value(n - 1, i)).collect();
        expect_eq(&reduced.download(), &max, "staged reduce in pieces");
    }
    let from_input: Vec<f32> = (0..count).map(|i| value(from, i)).collect();
    expect_eq(&got.download(), &from_input, "staged send/receive");

    let scalar = DevBuf::from(&[0.0f32]);
    let mut op = ncclRedOp_t(0);
    check(ncclRedOpCreatePreMulSum(&mut op, scalar.p(), F32, ncclScalarResidence_t(0), comm), "premulsum device");
    let ones = DevBuf::from(&vec![1.0f32; count]);
    for round in 1..3 {
        let v = (rank + 1) as f32 * round as f32;
        // SAFETY: the scalar buffer holds one float; the stream is live.
        cu(unsafe { sys::cuMemsetD32Async(scalar.ptr, v.to_bits(), 1, raw) }, "memset scalar");
        check(ncclAllReduce(ones.p(), recv.p(), count, F32, op, comm, stream), "staged premulsum");
        sync(stream);
        let want: f32 = (0..n).map(|r| (r + 1) as f32 * round as f32).sum();
        expect_eq(&recv.download(), &vec![want; count], "staged premulsum with a device scalar set on the stream");
    }
}

/// Staged calls queued back to back on one stream before it synchronises (as nccl-tests
/// times them): each finds its own inputs and leaves its own result, although later calls
/// reuse the staging buffers of earlier ones still in flight, and the pinned pool does not
/// grow by a set of buffers per call in flight. One size cut into separate operations, one
/// staged piece by piece.
fn back_to_back_staged(rank: usize, n: usize, comm: ncclComm_t) {
    let stream = new_stream();
    let calls = 4;
    for count in [(8 << 20) + 3, 1 << 20] {
        let value = |r: usize, k: usize, i: usize| ((i % 509) as f32) + (r * 1024 + k * 8192) as f32;
        let sends: Vec<DevBuf> =
            (0..calls).map(|k| DevBuf::from(&(0..count).map(|i| value(rank, k, i)).collect::<Vec<_>>())).collect();
        let recvs: Vec<DevBuf> = (0..calls).map(|_| DevBuf::new(count)).collect();
        // One call alone first: the pool then holds what one call in flight needs.
        check(ncclAllReduce(sends[0].p(), recvs[0].p(), count, F32, ncclRedOp_t(0), comm, stream), "first");
        sync(stream);
        let (_, before) = ferroccl::coll::stream::staging_pool_on_current_thread();
        for k in 0..calls {
            check(ncclAllReduce(sends[k].p(), recvs[k].p(), count, F32, ncclRedOp_t(0), comm, stream), "queued");
        }
        // In place, and a broadcast from the last rank, queued behind them.
        check(ncclAllReduce(sends[1].p(), sends[1].p(), count, F32, ncclRedOp_t(0), comm, stream), "in place");
        check(ncclBroadcast(sends[2].p(), sends[3].p(), count, F32, (n - 1) as i32, comm, stream), "broadcast");
        sync(stream);
        let (_, after) = ferroccl::coll::stream::staging_pool_on_current_thread();
        for (k, recv) in recvs.iter().enumerate() {
            let want: Vec<f32> = (0..count).map(|i| (0..n).map(|r| value(r, k, i)).sum()).collect();
            expect_eq(&recv.download(), &want, &format!("back-to-back staged all-reduce {k} of {count}"));
            if k == 1 {
                expect_eq(&sends[1].download(), &want, "back-to-back staged all-reduce in place");
            }
        }
        let root: Vec<f32> = (0..count).map(|i| value(n - 1, 2, i)).collect();
        expect_eq(&sends[3].download(), &root, "back-to-back staged broadcast");
        // Flag blocks of piecewise calls (a page each) are not reused while in flight.
        assert!(
            after <= before + (calls + 2) * 8192,
            "rank {rank}: staging pool grew from {before} to {after} bytes for {count} floats queued {} deep",
            calls + 2
        );
    }
    // Small calls (page-sized staging) interleaved with piecewise ones, whose flag blocks the
    // host resets at enqueue and are of that size: never one a small call still uses.
    let (small, large) = (256, 1 << 20);
    let value = |r: usize, k: usize, i: usize| ((i % 37) as f32) + (r * 64 + k * 4096) as f32;
    let small_in: Vec<DevBuf> =
        (0..calls).map(|k| DevBuf::from(&(0..small).map(|i| value(rank, k, i)).collect::<Vec<_>>())).collect();
    let small_out: Vec<DevBuf> = (0..calls).map(|_| DevBuf::new(small)).collect();
    let large_in = DevBuf::from(&(0..large).map(|i| value(rank, 0, i)).collect::<Vec<_>>());
    let large_out: Vec<DevBuf> = (0..calls).map(|_| DevBuf::new(large)).collect();
    for k in 0..calls {
        check(ncclAllReduce(small_in[k].p(), small_out[k].p(), small, F32, ncclRedOp_t(0), comm, stream), "small");
        check(ncclAllReduce(large_in.p(), large_out[k].p(), large, F32, ncclRedOp_t(0), comm, stream), "piecewise");
    }
    sync(stream);
    let sum = |k: usize, count: usize| (0..count).map(|i| (0..n).map(|r| value(r, k, i)).sum()).collect::<Vec<f32>>();
    for k in 0..calls {
        expect_eq(&small_out[k].download(), &sum(k, small), "small staged call between piecewise ones");
        expect_eq(&large_out[k].download(), &sum(0, large), "piecewise staged call between small ones");
    }
}

/// Staged operations captured into CUDA graphs (coll::captured): a group of an all-reduce
/// with a device PreMulSum scalar and a broadcast in one graph, a piecewise-sized all-reduce in
/// another; each replay with new inputs and scalar, and a call queued right behind the replay on
/// the same stream, which the worker receives before the replay reaches it (it must run the
/// replay while it waits for that call's inputs). Then the graphs are destroyed (their staging
/// goes back to the worker) and the communicator works on.
fn staged_graphs(rank: usize, n: usize, comm: ncclComm_t) {
    let stream = new_stream();
    let raw = stream as sys::CUstream;
    let (small, large) = (4099, (1 << 20) + 5);
    let a_in = DevBuf::new(small);
    let a_out = DevBuf::new(small);
    let b_buf = DevBuf::new(small);
    let c_in = DevBuf::new(large);
    let c_out = DevBuf::new(large);
    let after_in = DevBuf::new(small);
    let after_out = DevBuf::new(small);
    let scalar = DevBuf::from(&[0.0f32]);
    let mut premul = ncclRedOp_t(0);
    check(ncclRedOpCreatePreMulSum(&mut premul, scalar.p(), F32, ncclScalarResidence_t(0), comm), "premulsum");
    let capture = |body: &dyn Fn()| -> (sys::CUgraph, sys::CUgraphExec) {
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        // SAFETY: the stream is live and not capturing.
        cu(unsafe { sys::cuStreamBeginCapture_v2(raw, mode) }, "cuStreamBeginCapture");
        body();
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: capture began above; out-pointer is live.
        cu(unsafe { sys::cuStreamEndCapture(raw, &mut graph) }, "cuStreamEndCapture");
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: graph came from the capture; out-pointer is live.
        cu(unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }, "cuGraphInstantiate");
        (graph, exec)
    };
    let root = (n - 1) as i32;
    let (g1, e1) = capture(&|| {
        check(ncclGroupStart(), "group start");
        check(ncclAllReduce(a_in.p(), a_out.p(), small, F32, premul, comm, stream), "captured premulsum all-reduce");
        check(ncclBroadcast(b_buf.p(), b_buf.p(), small, F32, root, comm, stream), "captured broadcast");
        check(ncclGroupEnd(), "captured group");
    });
    let (g2, e2) = capture(&|| {
        check(ncclAllReduce(c_in.p(), c_out.p(), large, F32, ncclRedOp_t(0), comm, stream), "captured large")
    });
    let value = |r: usize, k: usize, i: usize| ((i % 101) as f32) + (r * 1000 + k * 10_000) as f32;
    let fill = |b: &DevBuf, v: &dyn Fn(usize) -> f32| b.upload(&(0..b.len).map(v).collect::<Vec<_>>());
    for k in 0..4 {
        fill(&a_in, &|i| value(rank, k, i));
        fill(&b_buf, &|i| value(rank, k + 1, i));
        fill(&c_in, &|i| value(rank, k + 2, i));
        fill(&after_in, &|i| value(rank, k + 3, i));
        let factor = (rank + k + 1) as f32;
        // SAFETY: the scalar buffer holds one float; the stream is live.
        cu(unsafe { sys::cuMemsetD32Async(scalar.ptr, factor.to_bits(), 1, raw) }, "memset scalar");
        // SAFETY: the executables are instantiated graphs; the stream is live.
        cu(unsafe { sys::cuGraphLaunch(e1, raw) }, "launch group graph");
        // SAFETY: as above.
        cu(unsafe { sys::cuGraphLaunch(e2, raw) }, "launch large graph");
        check(ncclAllReduce(after_in.p(), after_out.p(), small, F32, ncclRedOp_t(0), comm, stream), "after replays");
        sync(stream);
        let sum = |count: usize, k: usize, f: &dyn Fn(usize) -> f32| -> Vec<f32> {
            (0..count).map(|i| (0..n).map(|r| f(r) * value(r, k, i)).sum()).collect()
        };
        let want_a = sum(small, k, &|r| (r + k + 1) as f32);
        expect_eq(&a_out.download(), &want_a, &format!("replay {k}: captured PreMulSum all-reduce"));
        let want_b: Vec<f32> = (0..small).map(|i| value(n - 1, k + 1, i)).collect();
        expect_eq(&b_buf.download(), &want_b, &format!("replay {k}: captured broadcast in place"));
        expect_eq(&c_out.download(), &sum(large, k + 2, &|_| 1.0), &format!("replay {k}: captured large all-reduce"));
        expect_eq(&after_out.download(), &sum(small, k + 3, &|_| 1.0), &format!("replay {k}: call queued behind it"));
    }
    // SAFETY: created above, used no more (the stream is synchronised).
    unsafe {
        sys::cuGraphExecDestroy(e1);
        sys::cuGraphDestroy(g1);
        sys::cuGraphExecDestroy(e2);
        sys::cuGraphDestroy(g2);
    }
    fill(&after_in, &|i| value(rank, 9, i));
    check(ncclAllReduce(after_in.p(), after_out.p(), small, F32, ncclRedOp_t(0), comm, stream), "after the graphs");
    sync(stream);
    let want: Vec<f32> = (0..small).map(|i| (0..n).map(|r| value(r, 9, i)).sum()).collect();
    expect_eq(&after_out.download(), &want, "all-reduce after the graphs were destroyed");

    // Two calls captured one after the other on the stream, the second larger: it takes
    // larger buffers in place of the first's. Capture and destroy cycles give the buffers back
    // to the pool (when CUDA runs the graph's destructor, soon after the destroy), so the pool
    // stops growing.
    let mut pool_bytes = Vec::new();
    for cycle in 0..6 {
        let (g, e) = capture(&|| {
            check(ncclAllReduce(after_in.p(), after_out.p(), small, F32, ncclRedOp_t(0), comm, stream), "first of two");
            check(ncclAllReduce(c_in.p(), c_out.p(), large, F32, ncclRedOp_t(0), comm, stream), "second, larger");
        });
        fill(&after_in, &|i| value(rank, 20 + cycle, i));
        fill(&c_in, &|i| value(rank, 40 + cycle, i));
        // SAFETY: e is an instantiated graph; the stream is live.
        cu(unsafe { sys::cuGraphLaunch(e, raw) }, "launch two-call graph");
        sync(stream);
        let sum =
            |count: usize, k: usize| -> Vec<f32> { (0..count).map(|i| (0..n).map(|r| value(r, k, i)).sum()).collect() };
        expect_eq(&after_out.download(), &sum(small, 20 + cycle), &format!("cycle {cycle}: first captured call"));
        expect_eq(&c_out.download(), &sum(large, 40 + cycle), &format!("cycle {cycle}: second captured call"));
        // SAFETY: created above, used no more (the stream is synchronised).
        unsafe {
            sys::cuGraphExecDestroy(e);
            sys::cuGraphDestroy(g);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        pool_bytes.push(ferroccl::coll::stream::staging_pool_on_current_thread().1);
    }
    assert!(
        pool_bytes[5] <= pool_bytes[2],
        "rank {rank}: the staging pool grew over capture and destroy cycles: {pool_bytes:?} bytes"
    );
    check(ncclRedOpDestroy(premul, comm), "premulsum destroy");
}

/// Holds `stream` on a pinned word until it is set to 1 ([`abort_and_release`] sets it).
fn hold_stream(raw: sys::CUstream) -> ferroccl::cuda::memory::Pinned {
    let p = ferroccl::cuda::memory::Pinned::new(4).expect("pinned flag");
    let dev = p.device_ptr().expect("flag address");
    // SAFETY: a live pinned word; the stream waits until it is 1.
    cu(unsafe { sys::cuStreamWaitValue32_v2(raw, dev, 1, 0) }, "cuStreamWaitValue32");
    p
}

/// Aborts `comm`, lifts this rank's own hold (if any), and returns how long its stream took to
/// finish after the abort.
fn abort_and_release(
    comm: ncclComm_t,
    stream: *mut c_void,
    hold: Option<&ferroccl::cuda::memory::Pinned>,
) -> std::time::Duration {
    let t = std::time::Instant::now();
    check(ferroccl::ffi::init::ncclCommAbort(comm), "abort");
    if let Some(p) = hold {
        // SAFETY: the pinned word is live; the GPU only reads it.
        unsafe { (p.as_ptr() as *mut u32).write_volatile(1) };
    }
    sync(stream);
    t.elapsed()
}

/// Two processes: rank 1's stream is held (before its receive) by a flag nobody sets, so rank
/// 0's stream waits in its send for rank 1's buffer; both abort, and both streams must finish
/// within a second. Rank 1 aborts only once rank 0 has looked at its stream: its abort releases
/// rank 0's wait too (as it should), which made rank 0's look find the send finished whenever
/// rank 1 got there first (round 95: 2 of 12 runs, both sides on the direct path, no error).
fn abort_releases_device_send(rank: usize, comm: ncclComm_t) {
    // A file both processes name from the communicator's id: rank 0 makes it once it has looked.
    let role = std::env::var("FERROCCL_IT_GPU_ROLE").expect("a GPU child");
    // (The id is 256 hex digits, longer than a file name may be: name the file by its hash.)
    let id_hash = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        role.rsplit(',').next().unwrap_or("x").hash(&mut h);
        h.finish()
    };
    let looked = std::env::temp_dir().join(format!("ferroccl-it-abort-{id_hash:016x}"));
    let stream = new_stream();
    let raw = stream as sys::CUstream;
    let count = 4096;
    let (mine, theirs) = (DevBuf::from(&vec![rank as f32; count]), DevBuf::new(count));
    let peer = 1 - rank;
    check(ncclGroupStart(), "group start");
    check(ncclSend(mine.p(), count, F32, peer as i32, comm, stream), "warm-up send");
    check(ncclRecv(theirs.p(), count, F32, peer as i32, comm, stream), "warm-up recv");
    check(ncclGroupEnd(), "group end");
    sync(stream);
    let flag = (rank == 1).then(|| hold_stream(raw));
    if rank == 0 {
        check(ncclSend(mine.p(), count, F32, 1, comm, stream), "held send");
    } else {
        check(ncclRecv(theirs.p(), count, F32, 0, comm, stream), "held recv");
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    // SAFETY: the stream is live.
    let pending = unsafe { sys::cuStreamQuery(raw) };
    if pending != sys::CUresult::CUDA_ERROR_NOT_READY {
        // What the library knew, for the report.
        let mut async_err = ncclResult_t::ncclSuccess;
        check(ncclCommGetAsyncError(comm, &mut async_err), "ncclCommGetAsyncError");
        // SAFETY: ncclGetLastError returns a NUL-terminated string that stays valid.
        let last = unsafe { std::ffi::CStr::from_ptr(ncclGetLastError(comm)) }.to_string_lossy().into_owned();
        panic!("rank {rank}: the held send or receive finished ({pending:?}); async error {async_err:?}, last error {last:?}");
    }
    if rank == 0 {
        std::fs::write(&looked, b"").expect("marker file");
    } else {
        let t = std::time::Instant::now();
        while !looked.exists() && t.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let _ = std::fs::remove_file(&looked);
    }
    let released = abort_and_release(comm, stream, flag.as_ref());
    assert!(released < std::time::Duration::from_secs(1), "rank {rank}: stream released after {released:?}");
    println!("rank {rank}: stream released {released:?} after ncclCommAbort");
    // The other process's stream may still copy into this one's buffer: outlive it.
    std::thread::sleep(std::time::Duration::from_millis(500));
}

#[test]
fn gpu_processes_abort_device_send() {
    if skip("gpu_processes_abort_device_send") {
        return;
    }
    gpu_processes(2, &[("FERROCCL_IT_GPU_SCENARIO", "abort_p2p")]);
}

/// ncclCommAbort releases a stream that waits on the library: rank 0's stream is held (before
/// its collective) by a flag nobody sets, so rank 1's stream waits for rank 0's; rank 1 aborts
/// and its stream must finish within a second. Then rank 0 aborts too, its blocker is lifted,
/// and its stream finishes. `reduce_scatter`: the held operation is a reduce-scatter (on peer
/// GPUs each rank folds its own block and waits for every rank's ready flag). Returns how long
/// this rank's stream took after its abort; `through` is called once the stream is finished
/// (the buffers must outlive the other rank's stream, whose kernels read them).
fn abort_held_collective(
    rank: usize,
    comm: ncclComm_t,
    reduce_scatter: bool,
    through: impl FnOnce(),
) -> std::time::Duration {
    let stream = new_stream();
    let raw = stream as sys::CUstream;
    let count = 4096;
    let send = DevBuf::from(&vec![1.0f32; 2 * count]);
    let recv = DevBuf::new(count);
    let collective = |what: &str| {
        let r = if reduce_scatter {
            ncclReduceScatter(send.p(), recv.p(), count, F32, ncclRedOp_t(0), comm, stream)
        } else {
            ncclAllReduce(send.p(), recv.p(), count, F32, ncclRedOp_t(0), comm, stream)
        };
        check(r, what);
    };
    // A warm-up operation sets the communicator's device path up.
    collective("warm-up");
    sync(stream);
    let flag = (rank == 0).then(|| hold_stream(raw));
    collective("held collective");
    std::thread::sleep(std::time::Duration::from_millis(200));
    // SAFETY: the stream is live.
    let pending = unsafe { sys::cuStreamQuery(raw) };
    assert_eq!(pending, sys::CUresult::CUDA_ERROR_NOT_READY, "rank {rank}: the held operation finished");
    if rank == 0 {
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    let released = abort_and_release(comm, stream, flag.as_ref());
    through();
    assert!(released < std::time::Duration::from_secs(1), "rank {rank}: stream released after {released:?}");
    drop(flag);
    released
}

#[test]
fn abort_releases_streams_waiting_on_device_operations() {
    if skip("abort_releases_streams_waiting_on_device_operations") {
        return;
    }
    let id = unique_id();
    // Buffers stay allocated until both streams are through (rank 0's kernel reads rank 1's).
    let through = std::sync::Arc::new(std::sync::Barrier::new(2));
    let threads: Vec<_> = (0..2usize)
        .map(|rank| {
            let through = through.clone();
            std::thread::spawn(move || {
                assert!(gpu_context());
                let mut comm: ncclComm_t = std::ptr::null_mut();
                check(ncclCommInitRank(&mut comm, 2, id, rank as i32), "init");
                abort_held_collective(rank, comm, false, || {
                    through.wait();
                })
            })
        })
        .collect();
    for (rank, t) in threads.into_iter().enumerate() {
        let released = t.join().unwrap_or_else(|_| panic!("rank {rank} thread panicked"));
        println!("rank {rank}: stream released {released:?} after ncclCommAbort");
    }
}

/// The same with a process per rank on the peer-GPU path (run on one GPU with the test switch),
/// whose flags all live in the host page and are released from the host: an all-reduce and a
/// reduce-scatter (every rank waits for every rank there).
#[test]
fn gpu_processes_abort_on_the_peer_path() {
    if skip("gpu_processes_abort_on_the_peer_path") {
        return;
    }
    for scenario in ["abort_all_reduce", "abort_reduce_scatter"] {
        gpu_processes(2, &[("FERROCCL_IT_GPU_SCENARIO", scenario), ("FERROCCL_PEER_PATH_ON_ONE_GPU", "1")]);
    }
}
