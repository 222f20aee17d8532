//! Collective speed with and without a scanner hammering the job's listening ports.
//!
//! Ranks are threads of this process (2 by default); the transport follows the environment
//! (`NCCL_SHM_DISABLE=1 FERROCCL_NODE_COLL=0` for sockets). For each size, all-reduce time is
//! measured (median of `rounds` batches of `iters` calls) first in quiet, then while attacker
//! threads open hostile connections to every listening TCP port of the process as fast as
//! they can (random bytes, huge length fields, silent half-open connections, connect-close
//! scans, resets and slowloris dribbling), and the ratio is printed with the attack's
//! connection rate. Results are checked after every batch.
//!
//!   cargo run --release --example garbage_bench [-- nranks iters rounds]

use std::ffi::c_void;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use ferroccl::ffi::coll::ncclAllReduce;
use ferroccl::ffi::init::{ncclCommDestroy, ncclCommInitRank, ncclGetUniqueId};
use ferroccl::types::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclUniqueId};

const SIZES: [usize; 4] = [8, 4096, 256 << 10, 4 << 20];

fn listening_ports() -> Vec<u16> {
    let mut inodes = std::collections::HashSet::new();
    for e in std::fs::read_dir("/proc/self/fd").into_iter().flatten().flatten() {
        if let Ok(t) = std::fs::read_link(e.path()) {
            let t = t.to_string_lossy().into_owned();
            if let Some(i) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                inodes.insert(i.to_string());
            }
        }
    }
    let mut ports = Vec::new();
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]) {
                ports.extend(f[1].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok()));
            }
        }
    }
    ports.sort_unstable();
    ports.dedup();
    ports
}

fn attack(kind: usize, addr: SocketAddr, seed: &mut u64, stop: &AtomicBool) -> std::io::Result<()> {
    let mut next = || {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    };
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    match kind {
        0 => {
            let junk: Vec<u8> = (0..1 + next() % 4096).map(|_| next() as u8).collect();
            let _ = s.write_all(&junk);
        }
        1 => {
            let mut b = u32::MAX.to_le_bytes().to_vec();
            b.extend_from_slice(&0x4c43_4346u32.to_le_bytes());
            b.extend_from_slice(&[0; 4]);
            b.extend_from_slice(&(1u64 << 63).to_le_bytes());
            let _ = s.write_all(&b);
        }
        2 => {
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        3 => {}
        4 => {
            let l = libc::linger { l_onoff: 1, l_linger: 0 };
            // SAFETY: setsockopt on our own socket with a properly sized linger struct.
            unsafe {
                libc::setsockopt(
                    std::os::fd::AsRawFd::as_raw_fd(&s),
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    (&l as *const libc::linger).cast(),
                    std::mem::size_of::<libc::linger>() as libc::socklen_t,
                );
            }
        }
        _ => {
            for _ in 0..40 {
                if stop.load(Ordering::Relaxed) || s.write_all(&[next() as u8]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    Ok(())
}

fn check(r: ncclResult_t, what: &str) {
    assert_eq!(r, ncclResult_t::ncclSuccess, "{what}");
}

/// Median microseconds per all-reduce of `bytes` over `rounds` batches, per rank 0.
fn measure(comm: ncclComm_t, rank: usize, n: usize, bytes: usize, iters: usize, rounds: usize, sync: &Barrier) -> f64 {
    let count = bytes / 4;
    let send: Vec<f32> = (0..count).map(|i| (rank + i % 5) as f32).collect();
    let mut recv = vec![0f32; count];
    let s: *mut c_void = std::ptr::null_mut();
    let mut times = Vec::new();
    for _ in 0..rounds {
        sync.wait();
        let t = Instant::now();
        for _ in 0..iters {
            check(
                ncclAllReduce(
                    send.as_ptr().cast(),
                    recv.as_mut_ptr().cast(),
                    count,
                    ncclDataType_t(7),
                    ncclRedOp_t(0),
                    comm,
                    s,
                ),
                "all-reduce",
            );
        }
        times.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
        let want = |i: usize| (0..n).map(|r| (r + i % 5) as f32).sum::<f32>();
        assert!(recv.iter().enumerate().all(|(i, &v)| v == want(i)), "wrong result");
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let n = args.first().copied().unwrap_or(2);
    let iters = args.get(1).copied().unwrap_or(200);
    let rounds = args.get(2).copied().unwrap_or(7);
    let mut id = ncclUniqueId { internal: [0; 128] };
    check(ncclGetUniqueId(&mut id), "unique id");
    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicU64::new(0));
    let sync = Arc::new(Barrier::new(n + 1));
    let ranks: Vec<_> = (0..n)
        .map(|rank| {
            let sync = sync.clone();
            std::thread::spawn(move || {
                let mut comm: ncclComm_t = std::ptr::null_mut();
                check(ncclCommInitRank(&mut comm, n as i32, id, rank as i32), "init");
                // Connections are made on first use: one call before the ports are read.
                measure(comm, rank, n, 8, 1, 1, &Barrier::new(1));
                sync.wait();
                let mut out = Vec::new();
                for phase in 0..2 {
                    for bytes in SIZES {
                        out.push((phase, bytes, measure(comm, rank, n, bytes, iters, rounds, &sync)));
                    }
                    sync.wait();
                }
                check(ncclCommDestroy(comm), "destroy");
                out
            })
        })
        .collect();
    sync.wait();
    let ports = listening_ports();
    // Quiet phase: the driver only joins the rank barriers.
    for _ in 0..SIZES.len() * rounds + 1 {
        sync.wait();
    }
    let started = Instant::now();
    let mut attackers = Vec::new();
    for &port in &ports {
        for kind in 0..6 {
            let (stop, made) = (stop.clone(), made.clone());
            let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
            attackers.push(std::thread::spawn(move || {
                let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ (port as u64) << 8 ^ kind as u64;
                while !stop.load(Ordering::Relaxed) {
                    if attack(kind, addr, &mut seed, &stop).is_ok() {
                        made.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..SIZES.len() * rounds + 1 {
        sync.wait();
    }
    let attacked_for = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let results = ranks.into_iter().map(|t| t.join().expect("rank panicked")).next().unwrap_or_default();
    for a in attackers {
        let _ = a.join();
    }
    let rate = made.load(Ordering::Relaxed) as f64 / attacked_for;
    println!("# {n} ranks, {iters} all-reduces x {rounds} batches per cell (median batch), ports {ports:?}");
    println!("# attack: {} attacker threads, {rate:.0} hostile connections/s", ports.len() * 6);
    println!("| bytes | quiet us | under attack us | attack/quiet |");
    println!("|---:|---:|---:|---:|");
    for bytes in SIZES {
        let t = |p| results.iter().find(|r| r.0 == p && r.1 == bytes).map_or(f64::NAN, |r| r.2);
        println!("| {bytes} | {:.2} | {:.2} | {:.2} |", t(0), t(1), t(1) / t(0));
    }
}
