//! A peer whose host vanishes without closing its sockets (powered off, unplugged,
//! partitioned): nothing arrives any more, not even a reset. Simulated without a second
//! machine: the job runs in a private network namespace (`unshare -n`, needs
//! CAP_SYS_ADMIN; skipped with a message where it is missing), whose loopback is then made to
//! deliver nothing (its loopback taken down), after one all-reduce over sockets.
//! Rank 0's next all-reduce must fail with ncclRemoteError within 10 s (TCP keepalive and
//! TCP_USER_TIMEOUT, FERROCCL_SOCKET_DEAD_PEER=6 by default), not hang; once the network is
//! back, both ranks abort and make a new communicator from a new unique id in the same
//! process, which works.

use std::ffi::CStr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferroccl::ffi::init::{ncclCommAbort, ncclCommDestroy, ncclCommInitRank};
use ferroccl::ffi::query::ncclGetLastError;
use ferroccl::types::{ncclComm_t, ncclResult_t};

use crate::common::{all_reduce_f32, check, unique_id, Comm};

const ROLE: &str = "FERROCCL_IT_VANISH_ROLE";
/// The network goes: the namespace's only interface is taken down, so nothing is delivered
/// any more and nothing (no reset, no close) reaches either side.
const VANISH: &str = "ip link set lo down";
const RETURN: &str = "ip link set lo up";

fn sh(cmd: &str) -> bool {
    Command::new("sh").args(["-c", cmd]).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

fn all_reduce(comm: ncclComm_t, rank: usize) -> (ncclResult_t, bool, String) {
    let count = 1024;
    let send = vec![rank as f32 + 1.0; count];
    let mut recv = vec![0f32; count];
    let r = all_reduce_f32(&send, &mut recv, comm);
    // SAFETY: a thread-local NUL-terminated string, copied at once.
    let msg = unsafe { CStr::from_ptr(ncclGetLastError(comm)) }.to_string_lossy().into_owned();
    (r, recv.iter().all(|&v| v == 3.0), msg)
}

/// Two thread ranks over sockets in one comm, in one communicator each (ids passed in).
fn init_pair() -> [Comm; 2] {
    let id = unique_id();
    let t: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let mut comm: ncclComm_t = std::ptr::null_mut();
                check(ncclCommInitRank(&mut comm, 2, id, rank), "init");
                Comm(comm)
            })
        })
        .collect();
    let v: Vec<Comm> = t.into_iter().map(|t| t.join().unwrap()).collect();
    [v[0], v[1]]
}

fn both(comms: [Comm; 2]) -> Vec<(ncclResult_t, bool, String)> {
    let t: Vec<_> = (0..2).map(|rank| std::thread::spawn(move || all_reduce(comms[rank].0, rank))).collect();
    t.into_iter().map(|t| t.join().unwrap()).collect()
}

/// Not a test on its own: runs inside the private network namespace.
#[test]
fn vanish_driver() {
    if std::env::var(ROLE).is_err() {
        return;
    }
    assert!(sh("ip link set lo up"), "loopback up");
    let comms = init_pair();
    assert!(both(comms).iter().all(|r| r.0 == ncclResult_t::ncclSuccess && r.1), "first all-reduce");
    println!("VANISH first all-reduce OK");
    // The peer's host vanishes: every packet is lost from now on, in both directions.
    assert!(sh(VANISH), "{VANISH}");
    let started = Instant::now();
    let (r, _, msg) = all_reduce(comms[0].0, 0);
    let took = started.elapsed().as_secs_f64();
    println!("VANISH rank 0 all-reduce returned {} after {took:.2} s: {msg}", r.0);
    // The network comes back; both ranks give up the broken communicator and make another.
    assert!(sh(RETURN), "{RETURN}");
    for c in comms {
        let _ = ncclCommAbort(c.0);
    }
    let again = init_pair();
    let results = both(again);
    println!(
        "VANISH new communicator: {}",
        if results.iter().all(|r| r.0 == ncclResult_t::ncclSuccess && r.1) { "OK" } else { "FAILED" }
    );
    for c in again {
        check(ncclCommDestroy(c.0), "destroy");
    }
}

#[test]
fn vanished_peer_host_is_detected_within_10_seconds() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    if !sh("unshare -n true") || !sh("command -v ip") {
        println!("skipped: needs unshare -n (CAP_SYS_ADMIN) and ip");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("unshare")
        .args(["-n", "--"])
        .arg(exe)
        .args(["--exact", "vanished::vanish_driver", "--nocapture", "--test-threads=1"])
        .env(ROLE, "1")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env("NCCL_SHM_DISABLE", "1")
        .env("FERROCCL_NODE_COLL", "0")
        .env("FERROCCL_BOOTSTRAP_TIMEOUT", "30")
        // Without dead-peer detection the call would end here, as ncclTimeout after 20 s.
        .env("FERROCCL_TIMEOUT", "20")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "driver failed:\n{text}");
    let line = text.lines().find(|l| l.starts_with("VANISH rank 0")).unwrap_or_else(|| panic!("{text}"));
    println!("{line}");
    assert!(line.contains("returned 6 after"), "expected ncclRemoteError (6): {line}");
    let secs: f64 = line.split("after ").nth(1).and_then(|t| t.split(' ').next()).unwrap().parse().unwrap();
    assert!(secs < 10.0, "detected after {secs} s, expected under 10 s: {line}");
    assert!(line.contains("with rank 1"), "the message must name the peer: {line}");
    assert!(text.contains("VANISH new communicator: OK"), "re-creation after the failure:\n{text}");
}

/// Keepalive and the user timeout are set on every connection (the defaults: probes after 2 s
/// idle, 1 s apart, dead after 6 s).
#[test]
fn connections_carry_dead_peer_settings() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    ferroccl::transport::socket::watch_liveness(&c).unwrap();
    use rustix::net::sockopt;
    if ferroccl::transport::socket::dead_peer_limit().is_none() {
        return; // FERROCCL_SOCKET_DEAD_PEER=0 in this environment
    }
    assert!(sockopt::socket_keepalive(&c).unwrap());
    assert_eq!(sockopt::tcp_keepidle(&c).unwrap(), Duration::from_secs(2));
    assert_eq!(sockopt::tcp_keepintvl(&c).unwrap(), Duration::from_secs(1));
    assert_eq!(sockopt::tcp_keepcnt(&c).unwrap(), 4);
    assert_eq!(sockopt::tcp_user_timeout(&c).unwrap(), 6000);
}
