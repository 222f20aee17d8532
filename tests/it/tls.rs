//! Encrypted sockets (issue 4 §7): each scenario runs in a child process of this test
//! binary (re-executed with the scenario in FERROCCL_IT_TLS), because the encryption setting
//! is process-global and frozen at first use; this process never configures a key, so the
//! other tests stay plaintext.
//!
//! (a) marker capture: tests/tls/capture.sh (run from here when tcpdump can capture);
//! (b) wrong key / peer without a key; (c) short key; (d) plaintext clients at the encrypted
//! root and data listener; (e) setting a key after a unique id or communicator exists;
//! (f) a build without TLS; (g) key rotation mid-run; (h) the coverage report.

use std::ffi::{c_char, c_void, CStr, CString};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ferroccl::ffi::coll::{ncclAllGather, ncclAllReduce, ncclBroadcast, ncclRecv, ncclSend};
use ferroccl::ffi::coverage::ferrocclCommEncryptionReport;
use ferroccl::ffi::encryption::ncclSetEncryption;
use ferroccl::ffi::group::{ncclGroupEnd, ncclGroupStart};
use ferroccl::ffi::init::{ncclCommDestroy, ncclCommInitRank, ncclGetUniqueId};
use ferroccl::ffi::query::ncclGetLastError;
use ferroccl::types::{
    ncclComm_t, ncclDataType_t, ncclEncryptionConfig_t, ncclRedOp_t, ncclResult_t, ncclUniqueId, NCCL_API_MAGIC,
    NCCL_ENCRYPTION_MODE_NONE, NCCL_ENCRYPTION_MODE_PSK,
};

use crate::common::{check, Comm};

const SCENARIO: &str = "FERROCCL_IT_TLS";
const PSK_VAR: &str = "FERROCCL_IT_TLS_PSK";
const PSK: &str = "it-tls-key-0123456789abcdef0123456789abcdef";
const FLOAT: ncclDataType_t = ncclDataType_t(7);
const UINT8: ncclDataType_t = ncclDataType_t(1);
const SUM: ncclRedOp_t = ncclRedOp_t(0);

fn last_error() -> String {
    // SAFETY: ncclGetLastError returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(ncclGetLastError(std::ptr::null_mut())) }.to_string_lossy().into_owned()
}

fn config(mode: i32, psk: *const c_char) -> ncclEncryptionConfig_t {
    ncclEncryptionConfig_t {
        size: std::mem::size_of::<ncclEncryptionConfig_t>(),
        magic: NCCL_API_MAGIC,
        version: 23200,
        mode,
        psk,
    }
}

fn set_psk(key: &str) -> ncclResult_t {
    let k = CString::new(key).unwrap();
    ncclSetEncryption(&config(NCCL_ENCRYPTION_MODE_PSK, k.as_ptr()))
}

// ---------------------------------------------------------------------------------------
// Parent side.

/// Runs `scenario` in a child; returns its output (stdout + stderr) and whether it exited 0.
fn run_child(scenario: &str, env: &[(&str, &str)], limit: Duration) -> (String, bool) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "tls::child", "--nocapture", "--test-threads=1"])
        .env(SCENARIO, scenario)
        .env("FERROCCL_BOOTSTRAP_TIMEOUT", "10")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().unwrap();
    let (out, ok) = wait_limited(child, limit);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (text, ok)
}

fn wait_limited(mut child: std::process::Child, limit: Duration) -> (Output, bool) {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            let ok = out.status.success();
            return (out, ok);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "child ran past {limit:?}:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn in_child() -> bool {
    std::env::var(SCENARIO).is_ok()
}

/// The report lines ("REPORT <rank> <json>") a child printed.
fn reports(text: &str) -> Vec<String> {
    text.lines().filter_map(|l| l.split_once("REPORT ").map(|(_, r)| r.to_string())).collect()
}

/// The number after `"key":` in the first object following `section` in `json`.
fn number_after(json: &str, section: &str, key: &str) -> u64 {
    let rest = &json[json.find(section).unwrap_or_else(|| panic!("{section} missing in {json}"))..];
    let at = rest.find(&format!("\"{key}\":")).unwrap_or_else(|| panic!("{key} missing after {section} in {json}"));
    rest[at + key.len() + 3..].chars().take_while(|c| c.is_ascii_digit()).collect::<String>().parse().unwrap()
}

#[test]
fn short_null_and_malformed_keys_are_invalid_arguments() {
    // None of these change the process's setting, so they can run here.
    let r = set_psk("only-31-bytes-long-0123456789ab");
    assert_eq!(r, ncclResult_t::ncclInvalidArgument);
    assert!(last_error().contains("at least 32"), "{}", last_error());
    let r = ncclSetEncryption(&config(NCCL_ENCRYPTION_MODE_PSK, std::ptr::null()));
    assert_eq!(r, ncclResult_t::ncclInvalidArgument);
    assert!(last_error().contains("NULL psk"), "{}", last_error());
    let k = CString::new(PSK).unwrap();
    let mut bad = config(NCCL_ENCRYPTION_MODE_PSK, k.as_ptr());
    bad.magic = 0;
    assert_eq!(ncclSetEncryption(&bad), ncclResult_t::ncclInvalidArgument);
    let bad = config(7, k.as_ptr());
    assert_eq!(ncclSetEncryption(&bad), ncclResult_t::ncclInvalidArgument);
}

#[cfg(not(feature = "openssl3"))]
#[test]
fn a_build_without_tls_refuses_a_key() {
    // Refused before any state changes (the build check comes first), so safe in-process.
    assert_eq!(set_psk(PSK), ncclResult_t::ncclInvalidUsage);
    assert!(last_error().contains("without TLS support"), "{}", last_error());
}

#[test]
fn plaintext_run_reports_plaintext_connections() {
    if in_child() {
        return;
    }
    let (text, ok) = run_child("threads", &[("NCCL_SHM_DISABLE", "1")], Duration::from_secs(60));
    assert!(ok, "{text}");
    let r = reports(&text);
    assert_eq!(r.len(), 2, "{text}");
    for json in &r {
        assert!(json.contains("\"encryption\":\"none\""), "{json}");
        assert_eq!(number_after(json, "\"net\"", "count"), 2, "{json}");
        assert!(json.contains("\"security\":\"plaintext\""), "{json}");
        // Bootstrap (>= 3) and both data sockets, all counted as plaintext.
        assert!(number_after(json, "\"shm\"", "plaintext") >= 5, "{json}");
    }
}

#[cfg(feature = "openssl3")]
mod encrypted {
    use super::*;

    const TLS: &str = "TLS1.3/TLS_AES_128_GCM_SHA256";

    #[test]
    fn collectives_are_exact_and_the_report_matches_the_transports() {
        if in_child() {
            return;
        }
        // Sockets only: every connection must be TLS.
        let env = [(PSK_VAR, PSK), ("NCCL_SHM_DISABLE", "1"), ("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "INIT")];
        let (text, ok) = run_child("threads", &env, Duration::from_secs(60));
        assert!(ok, "{text}");
        let r = reports(&text);
        assert_eq!(r.len(), 2, "{text}");
        for json in &r {
            assert!(json.contains("\"encryption\":\"psk\""), "{json}");
            // Rendezvous, ring out and ring in at least; every one TLS.
            assert!(number_after(json, "\"bootstrap\"", "count") >= 3, "{json}");
            assert!(json.contains("\"bootstrap\":[{\"count\":"), "{json}");
            assert!(!json.contains("\"security\":\"plaintext\""), "{json}");
            assert!(json.contains(&format!("\"security\":\"{TLS}\"")), "{json}");
            assert!(json.contains("\"key_exchange\":\"psk_dhe_ke/"), "{json}");
            assert_eq!(number_after(json, "\"net\"", "count"), 2, "one send + one receive socket: {json}");
            assert_eq!(number_after(json, "\"shm\"", "count"), 0, "{json}");
            assert!(json.contains("\"plaintext\":0,"), "{json}");
        }
        // One line per report call and one per communicator at teardown.
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("Encryption coverage:")).collect();
        assert_eq!(lines.len(), 4, "{text}");
        for l in lines {
            assert!(l.contains(&format!("NET/Socket 2 {TLS}")), "{l}");
            assert!(l.contains("SHM 0 (outside TLS boundary)"), "{l}");
            assert!(l.contains("plaintext 0"), "{l}");
        }
        // With shared memory allowed, the data moves outside the TLS boundary and the report
        // says so.
        let env = [(PSK_VAR, PSK)];
        let (text, ok) = run_child("threads", &env, Duration::from_secs(60));
        assert!(ok, "{text}");
        for json in reports(&text) {
            assert_eq!(number_after(&json, "\"shm\"", "count"), 2, "{json}");
            assert_eq!(number_after(&json, "\"net\"", "count"), 0, "{json}");
            assert_eq!(number_after(&json, "\"node_area\"", "ranks"), 2, "{json}");
            assert!(json.contains("\"note\":\"outside TLS boundary\""), "{json}");
        }
    }

    #[test]
    fn strict_policy_keeps_data_off_infiniband_without_probing() {
        if in_child() {
            return;
        }
        let env = [
            (PSK_VAR, PSK),
            ("FERROCCL_ENCRYPTION_POLICY", "strict"),
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_DEBUG_SUBSYS", "INIT,NET"),
        ];
        let (text, ok) = run_child("threads", &env, Duration::from_secs(60));
        assert!(ok, "{text}");
        assert!(
            text.contains("NET/IB : disabled by FERROCCL_ENCRYPTION_POLICY=strict (RDMA data would bypass TLS)"),
            "{text}"
        );
        assert!(!text.contains("NET/IB : No device found."), "the probe ran: {text}");
        assert!(text.contains("Using network Socket"), "{text}");
        for json in reports(&text) {
            assert!(json.contains("\"transport\":\"NET/Socket\""), "{json}");
            assert!(json.contains("\"plaintext\":0,"), "{json}");
        }
    }

    #[test]
    fn key_rotation_mid_run_keeps_results_exact() {
        if in_child() {
            return;
        }
        let env =
            [(PSK_VAR, PSK), ("NCCL_SHM_DISABLE", "1"), ("FERROCCL_TLS_REKEY_BYTES", "64K"), ("IT_COUNT", "1048576")];
        let (text, ok) = run_child("threads", &env, Duration::from_secs(60));
        assert!(ok, "{text}");
        let rekeys: u64 = text
            .lines()
            .find_map(|l| l.split_once("REKEYS ").map(|(_, r)| r))
            .unwrap_or_else(|| panic!("{text}"))
            .trim()
            .parse()
            .unwrap();
        // 4 MiB all-reduces (x3) and 1 MiB moves: each data socket carries > 12 MiB, so at
        // 64 KiB per key well over a hundred updates per socket.
        assert!(rekeys >= 100, "only {rekeys} key updates:\n{text}");
        for json in reports(&text) {
            assert!(number_after(&json, "\"rekeys\"", "rekeys") >= 50, "{json}");
        }
    }

    /// Runs the two ranks as processes meeting at NCCL_COMM_ID, rank 0 with `key0`, rank 1
    /// with `key1` (None: no key); returns both outputs and how long the slower one took.
    fn two_processes(key0: Option<&str>, key1: Option<&str>) -> (String, String, Duration) {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let spec = format!("127.0.0.1:{port}");
        let spawn = |rank: &str, key: Option<&str>| {
            let mut cmd = Command::new(std::env::current_exe().unwrap());
            cmd.args(["--exact", "tls::child", "--nocapture", "--test-threads=1"])
                .env(SCENARIO, "rank")
                .env("IT_RANK", rank)
                .env("NCCL_COMM_ID", &spec)
                .env("NCCL_SHM_DISABLE", "1")
                .env("FERROCCL_BOOTSTRAP_TIMEOUT", "4")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if let Some(k) = key {
                cmd.env(PSK_VAR, k);
            }
            cmd.spawn().unwrap()
        };
        let started = Instant::now();
        let (a, b) = (spawn("0", key0), spawn("1", key1));
        let (a, _) = wait_limited(a, Duration::from_secs(30));
        let (b, _) = wait_limited(b, Duration::from_secs(30));
        let text = |o: &Output| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        (text(&a), text(&b), started.elapsed())
    }

    fn result_code(text: &str) -> i32 {
        let line = text.lines().find_map(|l| l.split_once("RESULT ")).unwrap_or_else(|| panic!("no RESULT in {text}"));
        line.1.split_whitespace().next().unwrap().parse().unwrap()
    }

    #[test]
    fn wrong_key_fails_every_rank_in_bounded_time() {
        if in_child() {
            return;
        }
        let other = "it-tls-key-OTHER-456789abcdef0123456789abcdef";
        let (a, b, took) = two_processes(Some(PSK), Some(other));
        assert_ne!(result_code(&a), 0, "rank 0 must fail:\n{a}");
        assert_ne!(result_code(&b), 0, "rank 1 must fail:\n{b}");
        assert!(b.contains("TLS handshake"), "rank 1 should name the handshake:\n{b}");
        // Within the bootstrap timeout (4 s) plus process start-up and slack.
        assert!(took < Duration::from_secs(12), "took {took:?}\n{a}\n{b}");
    }

    #[test]
    fn a_peer_without_a_key_cannot_join_an_encrypted_job() {
        if in_child() {
            return;
        }
        let (a, b, took) = two_processes(Some(PSK), None);
        assert_ne!(result_code(&a), 0, "rank 0 must fail:\n{a}");
        assert_ne!(result_code(&b), 0, "rank 1 must fail:\n{b}");
        assert!(took < Duration::from_secs(12), "took {took:?}\n{a}\n{b}");
        // And the same ranks with the same key succeed (the test is not vacuous).
        let (a, b, _) = two_processes(Some(PSK), Some(PSK));
        assert_eq!(result_code(&a), 0, "{a}");
        assert_eq!(result_code(&b), 0, "{b}");
    }

    #[test]
    fn setting_a_key_after_an_id_or_communicator_exists_is_invalid_usage() {
        if in_child() {
            return;
        }
        let (text, ok) = run_child("set_after", &[("NCCL_SHM_DISABLE", "1")], Duration::from_secs(60));
        assert!(ok, "{text}");
        assert!(text.contains("SET-AFTER OK"), "{text}");
    }

    #[test]
    fn plaintext_and_garbage_clients_are_dropped_by_the_encrypted_root() {
        if in_child() {
            return;
        }
        let (text, ok) = run_child("plain_root", &[(PSK_VAR, PSK), ("NCCL_SHM_DISABLE", "1")], Duration::from_secs(60));
        assert!(ok, "{text}");
        assert!(text.contains("PLAIN-ROOT OK"), "{text}");
    }

    #[test]
    fn plaintext_garbage_and_silent_clients_do_not_stop_the_data_listener() {
        if in_child() {
            return;
        }
        let (text, ok) = run_child("plain_data", &[(PSK_VAR, PSK)], Duration::from_secs(60));
        assert!(ok, "{text}");
        assert!(text.contains("PLAIN-DATA OK"), "{text}");
    }

    /// A peer's TLS handshake accepted during one wait of the listener is not timed out by the
    /// time the listener spends away before its next wait (the peer answered at once).
    #[test]
    fn a_handshake_is_not_timed_out_while_the_listener_is_away() {
        if in_child() {
            return;
        }
        let (text, ok) = run_child("handshake_gap", &[(PSK_VAR, PSK)], Duration::from_secs(90));
        assert!(ok, "{text}");
        assert!(text.contains("HANDSHAKE-GAP OK"), "{text}");
    }

    #[test]
    fn strict_policy_without_a_key_refuses_plaintext() {
        if in_child() {
            return;
        }
        let (text, ok) =
            run_child("strict_nokey", &[("FERROCCL_ENCRYPTION_POLICY", "strict")], Duration::from_secs(60));
        assert!(ok, "{text}");
        assert!(text.contains("STRICT OK"), "{text}");
    }

    #[test]
    fn capture_shows_the_marker_only_without_encryption() {
        if in_child() {
            return;
        }
        let exe = std::env::current_exe().unwrap();
        let example = exe.parent().unwrap().parent().unwrap().join("examples/tls_marker");
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tls/capture.sh");
        if !example.exists() {
            println!("skipped: {} not built", example.display());
            return;
        }
        let out = Command::new("bash").arg(&script).arg(&example).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        println!("{text}");
        match out.status.code() {
            Some(0) => assert!(text.contains(" passed, 0 failed"), "{text}"),
            Some(77) => println!("skipped: {text}"),
            _ => panic!("capture test failed:\n{text}"),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Child side.

/// Not a test on its own: runs the scenario named by FERROCCL_IT_TLS (nothing without it).
#[test]
fn child() {
    let Ok(scenario) = std::env::var(SCENARIO) else { return };
    println!(); // libtest's "test tls::child ... " has no newline: start our lines cleanly
    if let Ok(k) = std::env::var(PSK_VAR) {
        check(set_psk(&k), "ncclSetEncryption");
    }
    match scenario.as_str() {
        "threads" => child_threads(),
        "rank" => child_rank(),
        "set_after" => child_set_after(),
        #[cfg(feature = "openssl3")]
        "plain_root" => child_plain_root(),
        #[cfg(feature = "openssl3")]
        "plain_data" => child_plain_data(),
        "strict_nokey" => child_strict_nokey(),
        #[cfg(feature = "openssl3")]
        "handshake_gap" => child_handshake_gap(),
        other => panic!("unknown scenario {other}"),
    }
}

fn unique_id() -> ncclUniqueId {
    let mut id = ncclUniqueId { internal: [0; 128] };
    check(ncclGetUniqueId(&mut id), "ncclGetUniqueId");
    id
}

/// Two ranks as threads on `id`: all-reduce (exact), all-gather and broadcast, then each
/// rank prints its coverage report and INFO line.
fn ranks_on(id: ncclUniqueId) {
    let count: usize = std::env::var("IT_COUNT").ok().and_then(|v| v.parse().ok()).unwrap_or(1 << 16);
    let threads: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let mut c: ncclComm_t = std::ptr::null_mut();
                check(ncclCommInitRank(&mut c, 2, id, rank), "ncclCommInitRank");
                let comm = Comm(c);
                let s: *mut c_void = std::ptr::null_mut();
                let send: Vec<f32> = (0..count).map(|i| (i % 1000) as f32 + rank as f32).collect();
                let mut recv = vec![0f32; count];
                for _ in 0..3 {
                    check(
                        ncclAllReduce(send.as_ptr().cast(), recv.as_mut_ptr().cast(), count, FLOAT, SUM, comm.0, s),
                        "ncclAllReduce",
                    );
                    assert!(recv.iter().enumerate().all(|(i, &v)| v == 2.0 * (i % 1000) as f32 + 1.0));
                }
                let bytes = count;
                let mine: Vec<u8> = (0..bytes).map(|i| (i * 7 + rank as usize) as u8).collect();
                let mut all = vec![0u8; 2 * bytes];
                check(
                    ncclAllGather(mine.as_ptr().cast(), all.as_mut_ptr().cast(), bytes, UINT8, comm.0, s),
                    "ncclAllGather",
                );
                for r in 0..2 {
                    assert!(all[r * bytes..(r + 1) * bytes].iter().enumerate().all(|(i, &v)| v == (i * 7 + r) as u8));
                }
                let mut b = if rank == 0 { mine.clone() } else { vec![0u8; bytes] };
                check(ncclBroadcast(b.as_ptr().cast(), b.as_mut_ptr().cast(), bytes, UINT8, 0, comm.0, s), "bcast");
                assert!(b.iter().enumerate().all(|(i, &v)| v == (i * 7) as u8));
                // A send and a receive each way go point to point (never through a node area),
                // so each rank has a send and a receive connection whatever the transport.
                let peer = 1 - rank;
                let mut got = vec![0u8; 100];
                check(ncclGroupStart(), "ncclGroupStart");
                check(ncclSend(mine.as_ptr().cast(), 100, UINT8, peer, comm.0, s), "ncclSend");
                check(ncclRecv(got.as_mut_ptr().cast(), 100, UINT8, peer, comm.0, s), "ncclRecv");
                check(ncclGroupEnd(), "ncclGroupEnd");
                assert!(got.iter().enumerate().all(|(i, &v)| v == (i * 7 + peer as usize) as u8));
                let mut buf = vec![0 as c_char; 4096];
                check(ferrocclCommEncryptionReport(comm.0, buf.as_mut_ptr(), buf.len()), "report");
                // SAFETY: the report is NUL-terminated inside buf.
                let json = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
                // Too small a buffer is an invalid argument naming the size needed.
                assert_eq!(
                    ferrocclCommEncryptionReport(comm.0, buf.as_mut_ptr(), 8),
                    ncclResult_t::ncclInvalidArgument
                );
                let handle = ferroccl::comm::lookup(comm.0, "test").unwrap();
                ferroccl::coverage::Coverage::log(&handle);
                drop(handle);
                println!("REPORT {rank} {json}");
                check(ncclCommDestroy(comm.0), "ncclCommDestroy");
            })
        })
        .collect();
    for t in threads {
        t.join().expect("rank thread panicked");
    }
    println!("REKEYS {}", ferroccl::tls::rekeys_total());
}

fn child_threads() {
    ranks_on(unique_id());
}

/// One rank of a two-process job at NCCL_COMM_ID; prints `RESULT <code> <ms> <error>`.
fn child_rank() {
    let rank: i32 = std::env::var("IT_RANK").unwrap().parse().unwrap();
    let started = Instant::now();
    let mut id = ncclUniqueId { internal: [0; 128] };
    let mut r = ncclGetUniqueId(&mut id);
    let mut comm: ncclComm_t = std::ptr::null_mut();
    if r == ncclResult_t::ncclSuccess {
        r = ncclCommInitRank(&mut comm, 2, id, rank);
    }
    if r == ncclResult_t::ncclSuccess {
        let send = [1f32; 1024];
        let mut recv = [0f32; 1024];
        r = ncclAllReduce(send.as_ptr().cast(), recv.as_mut_ptr().cast(), 1024, FLOAT, SUM, comm, std::ptr::null_mut());
        if r == ncclResult_t::ncclSuccess {
            assert!(recv.iter().all(|&v| v == 2.0));
        }
    }
    let err = if r == ncclResult_t::ncclSuccess { String::new() } else { last_error() };
    println!("RESULT {} {} {err}", r.0, started.elapsed().as_millis());
    if !comm.is_null() {
        let _ = ncclCommDestroy(comm);
    }
}

fn child_set_after() {
    // A unique id freezes the (plaintext) setting: a key is refused...
    let id = unique_id();
    assert_eq!(set_psk(PSK), ncclResult_t::ncclInvalidUsage);
    assert!(last_error().contains("cannot change"), "{}", last_error());
    // ... and so it is once a communicator exists; re-stating plaintext is fine.
    ranks_on(id);
    assert_eq!(set_psk(PSK), ncclResult_t::ncclInvalidUsage);
    assert_eq!(ncclSetEncryption(std::ptr::null()), ncclResult_t::ncclSuccess);
    assert_eq!(ncclSetEncryption(&config(NCCL_ENCRYPTION_MODE_NONE, std::ptr::null())), ncclResult_t::ncclSuccess);
    println!("SET-AFTER OK");
}

fn child_strict_nokey() {
    // Strict policy and no key: nothing may go out in plaintext, so joining fails cleanly.
    let id = unique_id();
    let mut c: ncclComm_t = std::ptr::null_mut();
    let r = ncclCommInitRank(&mut c, 1, id, 0);
    if r == ncclResult_t::ncclSuccess {
        // A single rank may need no connection at all; two ranks must fail.
        check(ncclCommDestroy(c), "destroy");
    }
    let id = unique_id();
    let threads: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let mut c: ncclComm_t = std::ptr::null_mut();
                let r = ncclCommInitRank(&mut c, 2, id, rank);
                (r, last_error())
            })
        })
        .collect();
    for t in threads {
        let (r, msg) = t.join().unwrap();
        assert_eq!(r, ncclResult_t::ncclInvalidUsage, "{msg}");
        assert!(msg.contains("strict"), "{msg}");
    }
    println!("STRICT OK");
}

#[cfg(feature = "openssl3")]
fn child_plain_root() {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use ferroccl::bootstrap::UniqueId;
    use ferroccl::transport::socket::{ConnKind, Hello};

    let id = unique_id();
    let uid = UniqueId::decode(&id.to_bytes()).unwrap();
    // A silent client (connects, never starts its handshake), a plaintext rank (correct
    // magic, no TLS), a client that stops half-way through a TLS record header (0x16:
    // handshake, then nothing), and garbage.
    let _silent = TcpStream::connect(uid.root).unwrap();
    let mut plain = TcpStream::connect(uid.root).unwrap();
    plain.write_all(&Hello { magic: uid.magic, kind: ConnKind::Root, rank: 0, extra: 0 }.encode()).unwrap();
    let mut stalled = TcpStream::connect(uid.root).unwrap();
    stalled.write_all(&[0x16, 0x03, 0x01]).unwrap();
    let mut garbage = TcpStream::connect(uid.root).unwrap();
    garbage.write_all(b"GET / HTTP/1.0\r\n\r\n garbage garbage garbage").unwrap();
    // The real ranks still get through, without waiting for the strangers' handshakes to time
    // out (10 s each, when the root served handshakes one at a time).
    let t = std::time::Instant::now();
    ranks_on(id);
    assert!(t.elapsed() < Duration::from_secs(8), "the ranks waited {:?} behind stalled handshakes", t.elapsed());
    for (what, s) in [("plaintext", &mut plain), ("garbage", &mut garbage)] {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 64];
        match s.read(&mut b) {
            Ok(0) | Err(_) => {}
            Ok(n) => {
                // A TLS alert may come back; never plaintext bootstrap data.
                assert_eq!(b[0], 0x15, "{what} client got {n} bytes that are not a TLS alert");
            }
        }
    }
    println!("PLAIN-ROOT OK");
}

#[cfg(feature = "openssl3")]
fn child_plain_data() {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use ferroccl::transport::socket::{decode_addr, ConnKind, Hello};
    use ferroccl::transport::socket_net::SocketNet;
    use ferroccl::transport::{netif, ConnectorId, MemRegion, Net, OpSig};

    ferroccl::encryption::freeze();
    let net = SocketNet::new(netif::pick().unwrap(), None);
    let magic = 0x5eed_0000_1234_5678u64;
    let (handle, mut listener) = net.listen(magic).unwrap();
    let addr = decode_addr(&handle).unwrap();
    let mut plain = TcpStream::connect(addr).unwrap();
    plain.write_all(&Hello { magic, kind: ConnKind::Data, rank: 7, extra: 0 }.encode()).unwrap();
    let mut garbage = TcpStream::connect(addr).unwrap();
    garbage.write_all(&[0x16, 3, 1, 0xff, 0xff, 1, 2, 3, 4, 5]).unwrap(); // a bogus TLS record
    let _silent = TcpStream::connect(addr).unwrap(); // never sends a byte
    std::thread::sleep(Duration::from_millis(100));

    // A real (TLS) connection is accepted despite them, and moves data.
    let me = ConnectorId { comm_magic: magic, rank: 1, channel: 0 };
    let mut send = net.connect(&handle, me).unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    // SAFETY: `data` outlives the request, unmodified.
    let sreq =
        send.isend(unsafe { MemRegion::new(data.as_ptr() as *mut u8, data.len()) }, OpSig::NONE).unwrap().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    // (The send may complete before the receive is posted: the socket buffers it.)
    let mut sent = false;
    let (id, mut recv) = loop {
        if let Some(x) = listener.accept().unwrap() {
            break x;
        }
        sent |= send.test(sreq).unwrap().is_some();
        assert!(Instant::now() < deadline, "the TLS connection was never accepted");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(id, me, "only the TLS client may come through");
    let mut got = vec![0u8; data.len()];
    // SAFETY: `got` outlives the request and nobody else touches it.
    let rreq = recv.irecv(unsafe { MemRegion::new(got.as_mut_ptr(), got.len()) }, OpSig::NONE).unwrap().unwrap();
    let mut received = false;
    while !(sent && received) {
        sent |= send.test(sreq).unwrap().is_some();
        received |= recv.test(rreq).unwrap().is_some();
        assert!(Instant::now() < deadline, "transfer stalled");
    }
    assert_eq!(got, data);
    assert!(listener.accept().unwrap().is_none(), "nothing else may be accepted");
    // The plaintext and garbage clients were dropped (EOF or reset, perhaps after an alert).
    for (what, s) in [("plaintext", &mut plain), ("garbage", &mut garbage)] {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 256];
        loop {
            match s.read(&mut b) {
                Ok(0) | Err(_) => break,
                Ok(_) => assert_eq!(b[0], 0x15, "{what}: only a TLS alert may come back"),
            }
        }
    }
    drop(listener); // stops its acceptor promptly, silent client and all
    println!("PLAIN-DATA OK");
}

/// Client A connects, but starts its TLS handshake only after the listener's first wait has
/// returned client B; the listener is then away for longer than the handshake limit (10 s)
/// before waiting again, and must still take A.
#[cfg(feature = "openssl3")]
fn child_handshake_gap() {
    use std::net::{TcpListener, TcpStream};

    use ferroccl::transport::socket::{ConnKind, Hello, HelloQueue, Role, Stream};

    ferroccl::encryption::freeze();
    let magic = 0x1234_5678_9abc_def0u64;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut queue = HelloQueue::default();
    let a_tcp = TcpStream::connect(addr).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let b = std::thread::spawn(move || {
        let tcp = TcpStream::connect(addr).unwrap();
        let mut s = Stream::establish(tcp, Role::Client, Instant::now() + Duration::from_secs(30)).unwrap();
        s.send_hello(&Hello { magic, kind: ConnKind::Root, rank: 1, extra: 0 }).unwrap();
        s
    });
    let (_b_stream, hello) = queue.next(&listener, magic, Instant::now() + Duration::from_secs(20), None).unwrap();
    assert_eq!(hello.rank, 1);
    let _b_client = b.join().unwrap();
    let a = std::thread::spawn(move || {
        let mut s = Stream::establish(a_tcp, Role::Client, Instant::now() + Duration::from_secs(40)).unwrap();
        s.send_hello(&Hello { magic, kind: ConnKind::Root, rank: 2, extra: 0 }).unwrap();
        s
    });
    std::thread::sleep(Duration::from_secs(11));
    let (_a_stream, hello) = queue.next(&listener, magic, Instant::now() + Duration::from_secs(5), None).unwrap();
    assert_eq!(hello.rank, 2);
    let _a_client = a.join().unwrap();
    println!("HANDSHAKE-GAP OK");
}
