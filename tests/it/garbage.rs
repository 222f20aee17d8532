//! Hostile input on a live job's listening sockets: random bytes, huge length fields,
//! half-open (silent) connections, port scans (connect then close, or reset) and slowloris
//! dribbling, aimed at the unique id's root while ranks join, and at every listening port of
//! the process (bootstrap listeners and the socket transport's) while collectives and a split
//! run. The job must give right results, in bounded time, and the process must not crash.
//! Runs in a child process (its own ports only; sockets forced).

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferroccl::ffi::init::{ncclCommDestroy, ncclCommInitRank, ncclCommSplit};
use ferroccl::types::{ncclComm_t, ncclResult_t};

use crate::common::{all_reduce_f32, check, unique_id};

const ROLE: &str = "FERROCCL_IT_GARBAGE_ROLE";

/// The TCP ports this process listens on (from /proc: its socket inodes in LISTEN state).
pub fn own_listening_ports() -> Vec<u16> {
    let mut inodes = std::collections::HashSet::new();
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
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
                let port = f[1].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
                ports.extend(port);
            }
        }
    }
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// Kinds of hostile connection, by name.
pub const ATTACKS: [&str; 6] = ["random", "huge-length", "half-open", "scan", "reset", "slowloris"];

/// Deterministic bytes (xorshift).
fn noise(seed: &mut u64, n: usize) -> Vec<u8> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed as u8
        })
        .collect()
}

/// One hostile connection of kind `kind` to `addr`; returns a socket to keep open (half-open
/// and slowloris hold theirs while `stop` is unset).
pub fn attack_once(kind: &str, addr: SocketAddr, seed: &mut u64, stop: &AtomicBool) -> std::io::Result<()> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    match kind {
        "random" => {
            let n = 1 + (*seed % 4096) as usize;
            let _ = s.write_all(&noise(seed, n));
        }
        "huge-length" => {
            // A bootstrap message length and a frame header announcing 2^63 bytes, then junk.
            let mut b = u32::MAX.to_le_bytes().to_vec();
            b.extend_from_slice(&0x4c43_4346u32.to_le_bytes());
            b.extend_from_slice(&[0; 4]);
            b.extend_from_slice(&(1u64 << 63).to_le_bytes());
            b.extend(noise(seed, 64));
            let _ = s.write_all(&b);
        }
        "half-open" => {
            // Connected and silent for a while.
            let until = Instant::now() + Duration::from_millis(3000);
            while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        "scan" => {}
        "reset" => {
            // SO_LINGER 0: close sends a reset.
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
        "slowloris" => {
            // One byte every 100 ms for a few seconds.
            for b in noise(seed, 40) {
                if stop.load(Ordering::Relaxed) || s.write_all(&[b]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        other => panic!("no attack {other}"),
    }
    Ok(())
}

/// Starts attacker threads: for every port, one per attack kind, looping until `stop`.
/// Counts the connections made.
pub fn hammer(
    ports: &[u16],
    ip: std::net::IpAddr,
    stop: &Arc<AtomicBool>,
    made: &Arc<AtomicU64>,
) -> Vec<std::thread::JoinHandle<()>> {
    let mut threads = Vec::new();
    for &port in ports {
        for (k, kind) in ATTACKS.iter().enumerate() {
            let (stop, made) = (stop.clone(), made.clone());
            let addr = SocketAddr::new(ip, port);
            threads.push(std::thread::spawn(move || {
                let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ (port as u64) << 8 ^ k as u64;
                while !stop.load(Ordering::Relaxed) {
                    if attack_once(kind, addr, &mut seed, &stop).is_ok() {
                        made.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }));
        }
    }
    threads
}

fn all_reduce_ok(comm: ncclComm_t, rank: usize, nranks: usize, count: usize) -> bool {
    let send: Vec<f32> = (0..count).map(|i| (rank * 7 + i % 13) as f32).collect();
    let mut recv = vec![0f32; count];
    check(all_reduce_f32(&send, &mut recv, comm), "allreduce");
    recv.iter().enumerate().all(|(i, &v)| v == (0..nranks).map(|r| (r * 7 + i % 13) as f32).sum::<f32>())
}

/// Not a test on its own: the job under attack (see the module docs). Prints one line per
/// phase with its outcome.
#[test]
fn garbage_child() {
    let Ok(_) = std::env::var(ROLE) else { return };
    let nranks = 3;
    let id = unique_id();
    let root = ferroccl::wire::UniqueId::decode(&id.to_bytes()).unwrap().root;
    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicU64::new(0));
    // Phase 1: the root is hammered before and while the ranks join.
    let mut attackers = hammer(&[root.port()], root.ip(), &stop, &made);
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let attack_all = Arc::new(AtomicBool::new(false));
    let ranks: Vec<_> = (0..nranks)
        .map(|rank| {
            let attack_all = attack_all.clone();
            std::thread::spawn(move || {
                let mut comm: ncclComm_t = std::ptr::null_mut();
                check(ncclCommInitRank(&mut comm, nranks as i32, id, rank as i32), "init under attack");
                let mut ok = all_reduce_ok(comm, rank, nranks, 1 << 10);
                // Phase 2 starts once every rank is up (rank 0 flips it after its first call).
                if rank == 0 {
                    attack_all.store(true, Ordering::Release);
                }
                std::thread::sleep(Duration::from_millis(300));
                for i in 0..300 {
                    ok &= all_reduce_ok(comm, rank, nranks, [1, 100, 5000, 70_000][i % 4]);
                }
                // The bootstrap under attack (its listener's backlog is full of strangers).
                let mut child: ncclComm_t = std::ptr::null_mut();
                let r = ncclCommSplit(comm, (rank % 2) as i32, rank as i32, &mut child, std::ptr::null_mut());
                assert_eq!(r, ncclResult_t::ncclSuccess, "split under attack");
                let n_child = (0..nranks).filter(|r| r % 2 == rank % 2).count();
                let child_rank = (0..rank).filter(|r| r % 2 == rank % 2).count();
                ok &= all_reduce_ok(child, child_rank, n_child, 1000);
                check(ncclCommDestroy(child), "destroy split");
                check(ncclCommDestroy(comm), "destroy");
                ok
            })
        })
        .collect();
    while !attack_all.load(Ordering::Acquire) && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let joined = started.elapsed();
    let ports = own_listening_ports();
    println!("GARBAGE joined in {:.2}s under attack; listening ports now {ports:?}", joined.as_secs_f64());
    attackers.extend(hammer(&ports, root.ip(), &stop, &made));
    let results: Vec<bool> = ranks.into_iter().map(|t| t.join().expect("rank panicked")).collect();
    let total = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for t in attackers {
        let _ = t.join();
    }
    println!(
        "GARBAGE results {results:?} in {:.2}s, {} hostile connections, ports attacked {}",
        total.as_secs_f64(),
        made.load(Ordering::Relaxed),
        ports.len()
    );
}

#[test]
fn garbage_on_listening_sockets_is_dropped_without_stalling_the_job() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    for (label, env) in
        [("sockets", vec![("NCCL_SHM_DISABLE", "1"), ("FERROCCL_NODE_COLL", "0")]), ("one host", vec![])]
    {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "garbage::garbage_child", "--nocapture", "--test-threads=1"])
            .env(ROLE, "1")
            .env("FERROCCL_BOOTSTRAP_TIMEOUT", "30")
            .env("FERROCCL_TIMEOUT", "30")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &env {
            cmd.env(k, v);
        }
        let started = Instant::now();
        let out = cmd.output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{label}: the job under attack failed:\n{text}");
        let line = text.lines().find(|l| l.starts_with("GARBAGE results")).unwrap_or_else(|| panic!("{text}"));
        println!("{label}: {line}");
        for l in text.lines().filter(|l| l.starts_with("GARBAGE")) {
            println!("{label}: {l}");
        }
        assert!(line.contains("[true, true, true]"), "{label}: wrong results under attack: {line}");
        let made: u64 = line.split("s, ").nth(1).and_then(|t| t.split(' ').next()).unwrap().parse().unwrap();
        assert!(made > 50, "{label}: the attack hardly ran: {line}");
        // Setup and 300 all-reduces take about a second here; the limit leaves room for a
        // loaded machine but not for per-stranger waits (each would cost seconds).
        assert!(started.elapsed() < Duration::from_secs(45), "{label}: took {:?}: {line}", started.elapsed());
    }
}
