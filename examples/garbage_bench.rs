//! Collective speed with and without a scanner hammering the job's listening ports.
//!
//! Ranks are threads of this process (2 by default); the transport follows the environment
//! (`NCCL_SHM_DISABLE=1 FERROCCL_NODE_COLL=0` for sockets). For each size, all-reduce time is
//! measured (median of `rounds` batches of `iters` calls) in quiet; then while attacker threads
//! open hostile connections (random bytes, huge length fields, silent half-open connections,
//! connect-close scans, resets and slowloris dribbling, one thread per kind and port, pausing
//! `pause_us` between connections) to decoy listeners of the same process that are not the
//! library's (the control: what the attack traffic costs the host); then with the same attack
//! on every listening TCP port of the job. The last ratio is the library's own cost. Results
//! are checked after every batch.
//!
//!   cargo run --release --example garbage_bench [-- nranks iters rounds pause_us]

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
/// Default pause of each attacker thread between two hostile connections (4th argument).
const PACE_US: u64 = 1000;

/// The IPv4 addresses this process listens on (from /proc: its socket inodes in LISTEN state).
fn listening_addrs() -> Vec<SocketAddr> {
    let mut inodes = std::collections::HashSet::new();
    for e in std::fs::read_dir("/proc/self/fd").into_iter().flatten().flatten() {
        if let Ok(t) = std::fs::read_link(e.path()) {
            let t = t.to_string_lossy().into_owned();
            if let Some(i) = t.strip_prefix("socket:[").and_then(|r| r.strip_suffix(']')) {
                inodes.insert(i.to_string());
            }
        }
    }
    let mut addrs = Vec::new();
    let text = std::fs::read_to_string("/proc/self/net/tcp").unwrap_or_default();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]) {
            let Some((ip, port)) = f[1].split_once(':') else { continue };
            let (Ok(ip), Ok(port)) = (u32::from_str_radix(ip, 16), u16::from_str_radix(port, 16)) else { continue };
            // The kernel prints the address as the in-memory (network order) word.
            let ip = Ipv4Addr::from(ip.to_ne_bytes());
            let ip = if ip.is_unspecified() { Ipv4Addr::LOCALHOST } else { ip };
            addrs.push(SocketAddr::new(IpAddr::V4(ip), port));
        }
    }
    addrs.sort_unstable();
    addrs.dedup();
    addrs
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
    let pace_us = args.get(3).map_or(PACE_US, |&p| p as u64);
    let mut id = ncclUniqueId { internal: [0; 128] };
    check(ncclGetUniqueId(&mut id), "unique id");
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
                for phase in 0..3 {
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
    let ports = listening_addrs();
    // Quiet phase: the driver only joins the rank barriers.
    for _ in 0..SIZES.len() * rounds + 1 {
        sync.wait();
    }
    // Control: the same attack against decoy listeners of this process that are not the
    // library's (each accepts and drops at once): what the attack traffic itself costs here.
    let decoys: Vec<std::net::TcpListener> = ports
        .iter()
        .map(|a| std::net::TcpListener::bind(SocketAddr::new(a.ip(), 0)).expect("decoy listener"))
        .collect();
    let decoy_addrs: Vec<SocketAddr> = decoys.iter().map(|l| l.local_addr().unwrap()).collect();
    let decoy_stop = Arc::new(AtomicBool::new(false));
    let decoy_threads: Vec<_> = decoys
        .into_iter()
        .map(|l| {
            let stop = decoy_stop.clone();
            l.set_nonblocking(true).unwrap();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match l.accept() {
                        Ok(c) => drop(c),
                        Err(_) => std::thread::sleep(Duration::from_micros(200)),
                    }
                }
            })
        })
        .collect();
    let mut rates = Vec::new();
    for (phase, targets) in [(1, &decoy_addrs), (2, &ports)] {
        let (stop, made) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let started = Instant::now();
        let mut attackers = Vec::new();
        for &addr in targets.iter() {
            for kind in 0..6 {
                let (stop, made) = (stop.clone(), made.clone());
                attackers.push(std::thread::spawn(move || {
                    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ (addr.port() as u64) << 8 ^ kind as u64;
                    while !stop.load(Ordering::Relaxed) {
                        if attack(kind, addr, &mut seed, &stop).is_ok() {
                            made.fetch_add(1, Ordering::Relaxed);
                        }
                        // A scanner's pace, not a CPU hog: on a small host, attacker threads
                        // that never sleep would measure only the scheduler.
                        std::thread::sleep(Duration::from_micros(pace_us));
                    }
                }));
            }
        }
        std::thread::sleep(Duration::from_millis(200));
        for _ in 0..SIZES.len() * rounds + 1 {
            sync.wait();
        }
        let secs = started.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        for a in attackers {
            let _ = a.join();
        }
        rates.push((phase, made.load(Ordering::Relaxed) as f64 / secs));
    }
    decoy_stop.store(true, Ordering::Relaxed);
    for t in decoy_threads {
        let _ = t.join();
    }
    let results = ranks.into_iter().map(|t| t.join().expect("rank panicked")).next().unwrap_or_default();
    println!("# {n} ranks, {iters} all-reduces x {rounds} batches per cell (median batch), ports {ports:?}");
    println!(
        "# attack: {} attacker threads ({pace_us} us pause each); hostile connections/s: {:.0} at decoys, {:.0} at the job",
        ports.len() * 6,
        rates[0].1,
        rates[1].1
    );
    println!("| bytes | quiet us | decoys attacked us | job attacked us | job attacked / decoys attacked |");
    println!("|---:|---:|---:|---:|---:|");
    for bytes in SIZES {
        let t = |p| results.iter().find(|r| r.0 == p && r.1 == bytes).map_or(f64::NAN, |r| r.2);
        println!("| {bytes} | {:.2} | {:.2} | {:.2} | {:.2} |", t(0), t(1), t(2), t(2) / t(1));
    }
}
