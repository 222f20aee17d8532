//! Soak: thousands of random collectives over ranks as threads, every result checked, with the
//! process's file descriptors, threads, resident memory and /dev/shm entries reported at the
//! start, after warm-up and at the end (the goal is no growth).
//!
//! Every rank draws the same random sequence, so they agree on each step: the collective
//! (all-reduce, broadcast, reduce, all-gather, reduce-scatter, all-to-all, gather, scatter, a
//! send/receive ring), data type, operator, count, root, in place or not; now and then a
//! group of several, a split (run a few collectives on the halves, then destroy them), or the
//! destruction and re-creation of the communicator from a new unique id. Inputs are small
//! integers, so every type and operator has one exact answer, computed here independently.
//! The transport follows the environment (FERROCCL_NODE_COLL=0, NCCL_SHM_DISABLE=1); `--psk`
//! turns TLS on (a build with the openssl3 feature).
//!
//!   cargo run --release --example soak -- [--ops 10000] [--ranks 4] [--seed 1] [--psk KEY]

use std::ffi::{c_void, CString};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use ferroccl::ffi::coll::{
    ncclAllGather, ncclAllReduce, ncclAlltoAll, ncclBroadcast, ncclGather, ncclRecv, ncclReduce, ncclReduceScatter,
    ncclScatter, ncclSend,
};
use ferroccl::ffi::encryption::ncclSetEncryption;
use ferroccl::ffi::group::{ncclGroupEnd, ncclGroupStart};
use ferroccl::ffi::init::{ncclCommDestroy, ncclCommInitRank, ncclCommSplit, ncclGetUniqueId};
use ferroccl::ffi::query::ncclGetLastError;
use ferroccl::types::{
    ncclComm_t, ncclDataType_t, ncclEncryptionConfig_t, ncclRedOp_t, ncclResult_t, ncclUniqueId, DataType,
    NCCL_API_MAGIC, NCCL_ENCRYPTION_MODE_PSK,
};

/// Every type but the two fp8 ones (DataType::ALL lists them last).
const TYPES: &[DataType] = DataType::ALL.split_at(10).0;
const COUNTS: [usize; 9] = [1, 2, 7, 64, 1000, 4099, 20_000, 70_000, 300_000];
const KINDS: [&str; 9] =
    ["allreduce", "broadcast", "reduce", "allgather", "reducescatter", "alltoall", "gather", "scatter", "sendrecv"];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn check(r: ncclResult_t, what: &str) {
    if r != ncclResult_t::ncclSuccess {
        // SAFETY: a NUL-terminated string valid until the next call on this thread.
        let msg = unsafe { std::ffi::CStr::from_ptr(ncclGetLastError(std::ptr::null_mut())) };
        panic!("{what} failed with {}: {}", r.0, msg.to_string_lossy());
    }
}

fn encode(dt: DataType, v: f64, out: &mut [u8]) {
    match dt {
        DataType::Int8 => out[0] = v as i8 as u8,
        DataType::Uint8 => out[0] = v as u8,
        DataType::Int32 => out.copy_from_slice(&(v as i32).to_ne_bytes()),
        DataType::Uint32 => out.copy_from_slice(&(v as u32).to_ne_bytes()),
        DataType::Int64 => out.copy_from_slice(&(v as i64).to_ne_bytes()),
        DataType::Uint64 => out.copy_from_slice(&(v as u64).to_ne_bytes()),
        DataType::Float16 => out.copy_from_slice(&half::f16::from_f64(v).to_ne_bytes()),
        DataType::Bfloat16 => out.copy_from_slice(&half::bf16::from_f64(v).to_ne_bytes()),
        DataType::Float32 => out.copy_from_slice(&(v as f32).to_ne_bytes()),
        _ => out.copy_from_slice(&v.to_ne_bytes()),
    }
}

fn decode(dt: DataType, b: &[u8]) -> f64 {
    match dt {
        DataType::Int8 => b[0] as i8 as f64,
        DataType::Uint8 => b[0] as f64,
        DataType::Int32 => i32::from_ne_bytes(b.try_into().unwrap()) as f64,
        DataType::Uint32 => u32::from_ne_bytes(b.try_into().unwrap()) as f64,
        DataType::Int64 => i64::from_ne_bytes(b.try_into().unwrap()) as f64,
        DataType::Uint64 => u64::from_ne_bytes(b.try_into().unwrap()) as f64,
        DataType::Float16 => half::f16::from_ne_bytes(b.try_into().unwrap()).to_f64(),
        DataType::Bfloat16 => half::bf16::from_ne_bytes(b.try_into().unwrap()).to_f64(),
        DataType::Float32 => f32::from_ne_bytes(b.try_into().unwrap()) as f64,
        _ => f64::from_ne_bytes(b.try_into().unwrap()),
    }
}

/// One step every rank of a communicator agrees on.
#[derive(Clone, Copy, Debug)]
struct Step {
    kind: usize,
    dt: DataType,
    op: usize, // 0 sum, 1 prod, 2 max, 3 min, 4 avg
    count: usize,
    root: usize,
    in_place: bool,
    salt: usize,
}

fn draw(rng: &mut Rng, n: usize, salt: usize) -> Step {
    let kind = rng.below(KINDS.len());
    let dt = TYPES[rng.below(TYPES.len())];
    let mut op = rng.below(5);
    // Avg is exact only where 1/n is (floats) and truncates alike (integers): powers of two.
    if op == 4 && !n.is_power_of_two() {
        op = 0;
    }
    // Large messages mostly, but not only, small.
    let count = COUNTS[rng.below(COUNTS.len())];
    let count = if dt.size() == 8 { count.min(100_000) } else { count };
    Step { kind, dt, op, count, root: rng.below(n), in_place: rng.below(2) == 0, salt }
}

/// Rank q's input element i: 1 or 2, so that sums, products, averages fit every type exactly.
fn input(s: &Step, q: usize, i: usize) -> f64 {
    (1 + (q + i + s.salt) % 2) as f64
}

fn reduce(s: &Step, n: usize, of_rank: impl Fn(usize) -> f64) -> f64 {
    let vals: Vec<f64> = (0..n).map(&of_rank).collect();
    match s.op {
        0 => vals.iter().sum(),
        1 => vals.iter().product(),
        2 => vals.iter().cloned().fold(f64::MIN, f64::max),
        3 => vals.iter().cloned().fold(f64::MAX, f64::min),
        _ => {
            let sum: f64 = vals.iter().sum();
            if s.dt.name().starts_with('u') || s.dt.name().starts_with("int") {
                (sum / n as f64).trunc()
            } else {
                sum / n as f64
            }
        }
    }
}

/// Runs step `s` as rank `r` of `n` on `comm` (inside a group when `grouped`, then the
/// caller checks with `verify` after the group ends). Returns the buffers to verify.
struct Bufs {
    send: Vec<u8>,
    recv: Vec<u8>,
}

fn issue(s: &Step, r: usize, n: usize, comm: ncclComm_t) -> Bufs {
    let es = s.dt.size();
    let c = s.count;
    let (send_elems, recv_elems) = match KINDS[s.kind] {
        "allreduce" | "broadcast" | "reduce" | "sendrecv" => (c, c),
        "allgather" | "gather" => (c, n * c),
        "reducescatter" | "scatter" => (n * c, c),
        _ => (n * c, n * c),
    };
    let mut send = vec![0u8; send_elems * es];
    for i in 0..send_elems {
        encode(s.dt, input(s, r, i), &mut send[i * es..(i + 1) * es]);
    }
    let mut recv = vec![0xa5u8; recv_elems * es];
    let dt = ncclDataType_t(s.dt as i32);
    let op = ncclRedOp_t(s.op as i32);
    let root = s.root as i32;
    let st: *mut c_void = std::ptr::null_mut();
    let in_place = s.in_place;
    // In-place forms place the input inside the output as NCCL defines them.
    let (sp, rp): (*const c_void, *mut c_void) = match KINDS[s.kind] {
        "allreduce" | "broadcast" | "reduce" if in_place => {
            recv[..send.len()].copy_from_slice(&send);
            (recv.as_ptr().cast(), recv.as_mut_ptr().cast())
        }
        "allgather" if in_place => {
            recv[r * c * es..(r + 1) * c * es].copy_from_slice(&send);
            (recv[r * c * es..].as_ptr().cast(), recv.as_mut_ptr().cast())
        }
        "gather" if in_place && r == s.root => {
            recv[r * c * es..(r + 1) * c * es].copy_from_slice(&send);
            (recv[r * c * es..].as_ptr().cast(), recv.as_mut_ptr().cast())
        }
        "reducescatter" if in_place => {
            let p = send.as_mut_ptr();
            // SAFETY: r*c elements into the send buffer of n*c elements.
            (p.cast(), unsafe { p.add(r * c * es) }.cast())
        }
        "scatter" if in_place && r == s.root => {
            let p = send.as_mut_ptr();
            // SAFETY: as above.
            (p.cast(), unsafe { p.add(r * c * es) }.cast())
        }
        _ => (send.as_ptr().cast(), recv.as_mut_ptr().cast()),
    };
    let rc = match KINDS[s.kind] {
        "allreduce" => ncclAllReduce(sp, rp, c, dt, op, comm, st),
        "broadcast" => ncclBroadcast(sp, rp, c, dt, root, comm, st),
        "reduce" => ncclReduce(sp, rp, c, dt, op, root, comm, st),
        "allgather" => ncclAllGather(sp, rp, c, dt, comm, st),
        "reducescatter" => ncclReduceScatter(sp, rp, c, dt, op, comm, st),
        "alltoall" => ncclAlltoAll(sp, rp, c, dt, comm, st),
        "gather" => ncclGather(sp, rp, c, dt, root, comm, st),
        "scatter" => ncclScatter(sp, rp, c, dt, root, comm, st),
        _ => {
            check(ncclGroupStart(), "group start");
            check(ncclSend(sp, c, dt, ((r + 1) % n) as i32, comm, st), "send");
            check(ncclRecv(rp, c, dt, ((r + n - 1) % n) as i32, comm, st), "recv");
            ncclGroupEnd()
        }
    };
    check(rc, KINDS[s.kind]);
    Bufs { send, recv }
}

/// Checks rank `r`'s output; returns the number of elements checked.
fn verify(s: &Step, r: usize, n: usize, b: &Bufs) -> usize {
    let es = s.dt.size();
    let c = s.count;
    let in_place = s.in_place;
    let out: &[u8] = match KINDS[s.kind] {
        "reducescatter" if in_place => &b.send[r * c * es..(r + 1) * c * es],
        "scatter" if in_place && r == s.root => &b.send[r * c * es..(r + 1) * c * es],
        _ => &b.recv,
    };
    let want = |i: usize| -> Option<f64> {
        match KINDS[s.kind] {
            "allreduce" => Some(reduce(s, n, |q| input(s, q, i))),
            "broadcast" => Some(input(s, s.root, i)),
            "reduce" => (r == s.root).then(|| reduce(s, n, |q| input(s, q, i))),
            "allgather" => Some(input(s, i / c, i % c)),
            "gather" => (r == s.root).then(|| input(s, i / c, i % c)),
            "reducescatter" => Some(reduce(s, n, |q| input(s, q, r * c + i))),
            "alltoall" => Some(input(s, i / c, r * c + i % c)),
            "scatter" => Some(input(s, s.root, r * c + i)),
            _ => Some(input(s, (r + n - 1) % n, i)),
        }
    };
    let elems = match KINDS[s.kind] {
        "allgather" | "alltoall" => n * c,
        "gather" if r == s.root => n * c,
        _ => c,
    };
    let mut checked = 0;
    for i in 0..elems {
        if let Some(w) = want(i) {
            let got = decode(s.dt, &out[i * es..(i + 1) * es]);
            assert!(got == w, "rank {r}/{n}: {s:?}: element {i} is {got}, expected {w}");
            checked += 1;
        }
    }
    checked
}

fn proc_stats() -> String {
    let fds = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0);
    let threads = std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0);
    let rss = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).map(|l| l[6..].trim().to_string()))
        .unwrap_or_default();
    let shm = std::fs::read_dir("/dev/shm").map(|d| d.count()).unwrap_or(0);
    format!("fds {fds}, threads {threads}, RSS {rss}, /dev/shm entries {shm}")
}

/// Unique ids by generation, made by rank 0 and picked up by the others.
type Ids = Arc<(Mutex<Vec<ncclUniqueId>>, Condvar)>;

fn id_for(ids: &Ids, rank: usize, generation: usize) -> ncclUniqueId {
    let (lock, cv) = &**ids;
    let mut v = lock.lock().unwrap();
    if rank == 0 && v.len() == generation {
        let mut id = ncclUniqueId { internal: [0; 128] };
        check(ncclGetUniqueId(&mut id), "ncclGetUniqueId");
        v.push(id);
        cv.notify_all();
    }
    while v.len() <= generation {
        v = cv.wait(v).unwrap();
    }
    v[generation]
}

#[derive(Default, Clone)]
struct Counts {
    single: usize,
    grouped: usize,
    split_ops: usize,
    splits: usize,
    recreations: usize,
    elements: usize,
}

fn rank_main(rank: usize, n: usize, ops: usize, seed: u64, ids: Ids, warm: Arc<std::sync::Barrier>) -> Counts {
    let mut rng = Rng(seed | 1);
    let mut generation = 0;
    let mut comm: ncclComm_t = std::ptr::null_mut();
    check(ncclCommInitRank(&mut comm, n as i32, id_for(&ids, rank, 0), rank as i32), "init");
    let mut k = 0;
    let mut counts = Counts::default();
    let mut warmed = false;
    while k < ops {
        if !warmed && k >= ops / 10 {
            warm.wait();
            warm.wait();
            warmed = true;
        }
        let what = rng.below(1000);
        if what < 5 {
            // Destroy and re-create from a new unique id.
            check(ncclCommDestroy(comm), "destroy");
            generation += 1;
            check(ncclCommInitRank(&mut comm, n as i32, id_for(&ids, rank, generation), rank as i32), "re-create");
            counts.recreations += 1;
        } else if what < 25 {
            // Split in two by a drawn rule, a few collectives on the halves, destroy them.
            let rule = rng.below(2);
            let color = if rule == 0 { rank % 2 } else { usize::from(rank >= n / 2) };
            let descending = rng.below(2) == 1;
            let key = if descending { n - rank } else { rank };
            let mut child: ncclComm_t = std::ptr::null_mut();
            check(ncclCommSplit(comm, color as i32, key as i32, &mut child, std::ptr::null_mut()), "split");
            let members: Vec<usize> =
                (0..n).filter(|&q| if rule == 0 { q % 2 == color } else { usize::from(q >= n / 2) == color }).collect();
            let mut order = members.clone();
            order.sort_by_key(|&q| if descending { n - q } else { q });
            let cn = members.len();
            let cr = order.iter().position(|&q| q == rank).unwrap();
            let inner = 1 + rng.below(3);
            // Both halves draw the same number of steps; each half its own parameters.
            for j in 0..inner {
                let mut crng = Rng((seed ^ (k as u64) << 20 ^ j as u64 ^ (color as u64) << 40) | 1);
                let s = draw(&mut crng, cn, k + j);
                let b = issue(&s, cr, cn, child);
                counts.elements += verify(&s, cr, cn, &b);
                counts.split_ops += 1;
                k += 1;
            }
            check(ncclCommDestroy(child), "destroy split");
            counts.splits += 1;
        } else if what < 100 {
            // A group of several collectives on the communicator.
            let m = 2 + rng.below(3);
            let steps: Vec<Step> = (0..m).map(|j| draw(&mut rng, n, k + j)).collect();
            // Send/receive rings bring their own group; keep groups to collectives.
            let steps: Vec<Step> = steps.into_iter().map(|s| Step { kind: s.kind % 8, ..s }).collect();
            check(ncclGroupStart(), "group start");
            let bufs: Vec<Bufs> = steps.iter().map(|s| issue(s, rank, n, comm)).collect();
            check(ncclGroupEnd(), "group end");
            for (s, b) in steps.iter().zip(&bufs) {
                counts.elements += verify(s, rank, n, b);
            }
            counts.grouped += m;
            k += m;
        } else {
            let s = draw(&mut rng, n, k);
            let b = issue(&s, rank, n, comm);
            counts.elements += verify(&s, rank, n, &b);
            counts.single += 1;
            k += 1;
        }
    }
    if !warmed {
        warm.wait();
        warm.wait();
    }
    check(ncclCommDestroy(comm), "destroy");
    counts
}

fn main() {
    let mut ops = 10_000usize;
    let mut n = 4usize;
    let mut seed = 1u64;
    let mut psk: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().expect("a value after each flag");
        match a.as_str() {
            "--ops" => ops = value().parse().expect("--ops N"),
            "--ranks" => n = value().parse().expect("--ranks N"),
            "--seed" => seed = value().parse().expect("--seed S"),
            "--psk" => psk = Some(value()),
            other => panic!("unknown argument {other}"),
        }
    }
    println!("# soak: {ops} collectives over {n} ranks (threads), seed {seed}, TLS {}", psk.is_some());
    println!("# start:        {}", proc_stats());
    if let Some(psk) = &psk {
        let key = CString::new(psk.as_str()).unwrap();
        let cfg = ncclEncryptionConfig_t {
            size: std::mem::size_of::<ncclEncryptionConfig_t>(),
            magic: NCCL_API_MAGIC,
            version: 23200,
            mode: NCCL_ENCRYPTION_MODE_PSK,
            psk: key.as_ptr(),
        };
        check(ncclSetEncryption(&cfg), "ncclSetEncryption");
    }
    let started = Instant::now();
    let ids: Ids = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
    let warm = Arc::new(std::sync::Barrier::new(n + 1));
    let threads: Vec<_> = (0..n)
        .map(|r| {
            let (ids, warm) = (ids.clone(), warm.clone());
            std::thread::spawn(move || rank_main(r, n, ops, seed, ids, warm))
        })
        .collect();
    warm.wait();
    println!("# after {}: {}", ops / 10, proc_stats());
    warm.wait();
    let counts: Vec<Counts> = threads.into_iter().map(|t| t.join().expect("a rank failed")).collect();
    let secs = started.elapsed().as_secs_f64();
    // Threads of destroyed communicators may take a moment to exit.
    std::thread::sleep(std::time::Duration::from_millis(500));
    println!("# end:          {}", proc_stats());
    let c = &counts[0];
    println!(
        "# rank 0: {} single, {} in groups, {} on {} splits, {} re-creations; {} elements checked over all ranks; {secs:.1} s",
        c.single,
        c.grouped,
        c.split_ops,
        c.splits,
        c.recreations,
        counts.iter().map(|c| c.elements).sum::<usize>()
    );
    println!("# all results correct");
}
