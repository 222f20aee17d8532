//! After a peer fails, the survivors carry on in the same processes: three ranks as processes,
//! rank 2 killed with SIGKILL after a first all-reduce; ranks 0 and 1 see ncclRemoteError,
//! abort the broken communicator, and make a new one from a new unique id (twice), each of
//! which works, with no descriptor or thread left behind by the failed one or by the
//! recreations (counted in /proc/self, from after the first recreation, when everything that
//! lives for the whole process exists). On one host (node area and shared memory), on shared
//! memory alone, and over sockets.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferroccl::ffi::init::{ncclCommAbort, ncclCommDestroy, ncclCommInitRank, ncclGetUniqueId};
use ferroccl::types::{ncclComm_t, ncclResult_t, ncclUniqueId};

use crate::common::{all_reduce_f32, check, unique_id};
use crate::processes::{hex, unhex};

const ROLE: &str = "FERROCCL_IT_RECREATE_ROLE";

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

fn all_reduce(comm: ncclComm_t, rank: usize, nranks: usize) -> (ncclResult_t, bool) {
    let count = 100_000;
    let send: Vec<f32> = (0..count).map(|i| (rank + i % 7) as f32).collect();
    let mut recv = vec![0f32; count];
    let r = all_reduce_f32(&send, &mut recv, comm);
    let ok = recv.iter().enumerate().all(|(i, &v)| v == (0..nranks).map(|q| (q + i % 7) as f32).sum::<f32>());
    (r, ok)
}

/// Waits for `dir/name` (written by another process) and returns its text.
fn await_file(dir: &Path, name: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(t) = std::fs::read_to_string(dir.join(name)) {
            return t;
        }
        assert!(Instant::now() < deadline, "{name} never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn publish(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!("{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(tmp, dir.join(name)).unwrap();
}

/// A new communicator of the two survivors from a new unique id (rank 0 makes it and hands it
/// over through `dir`), one checked all-reduce, then destroy.
fn recreate(dir: &Path, rank: usize, round: usize) {
    let name = format!("id{round}");
    let id = if rank == 0 {
        let mut id = ncclUniqueId { internal: [0; 128] };
        check(ncclGetUniqueId(&mut id), "new unique id");
        publish(dir, &name, &hex(&id));
        id
    } else {
        unhex(await_file(dir, &name).trim())
    };
    let mut comm: ncclComm_t = std::ptr::null_mut();
    check(ncclCommInitRank(&mut comm, 2, id, rank as i32), "init of the new communicator");
    let (r, ok) = all_reduce(comm, rank, 2);
    assert!(r == ncclResult_t::ncclSuccess && ok, "all-reduce on the new communicator: {} {ok}", r.0);
    check(ncclCommDestroy(comm), "destroy the new communicator");
}

/// Not a test on its own: one rank process.
#[test]
fn recreate_child() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let parts: Vec<&str> = role.split(',').collect();
    let (rank, dir) = (parts[0].parse::<usize>().unwrap(), PathBuf::from(parts[1]));
    let id = unhex(&std::fs::read_to_string(dir.join("id0")).unwrap());
    let at_start = (open_fds(), threads());
    let mut comm: ncclComm_t = std::ptr::null_mut();
    check(ncclCommInitRank(&mut comm, 3, id, rank as i32), "init");
    let (r, ok) = all_reduce(comm, rank, 3);
    assert!(r == ncclResult_t::ncclSuccess && ok, "first all-reduce");
    println!("RECREATE {rank} ready");
    if rank == 2 {
        std::thread::sleep(Duration::from_secs(120));
        return;
    }
    await_file(&dir, "killed");
    let started = Instant::now();
    let (r, _) = all_reduce(comm, rank, 3);
    println!(
        "RECREATE {rank} all-reduce after the kill returned {} after {:.2} s",
        r.0,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(r, ncclResult_t::ncclRemoteError);
    // Goal: within 1 s on one host (0.2-0.7 s measured on the 2-core VM under load); the
    // bound leaves room for a loaded machine, not for count-based checks (21 s measured).
    assert!(started.elapsed() < Duration::from_secs(5), "the failure took {:?} to notice", started.elapsed());
    check(ncclCommAbort(comm), "abort the broken communicator");
    recreate(&dir, rank, 1);
    // Everything that lives for the whole process exists by now: count from here.
    let (fds, tasks) = (open_fds(), threads());
    for round in 2..5 {
        recreate(&dir, rank, round);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while (open_fds() > fds || threads() > tasks) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    println!(
        "RECREATE {rank} leak check fds {fds} -> {} threads {tasks} -> {} (before the first communicator: {at_start:?})",
        open_fds(),
        threads()
    );
    // Nothing of the failed communicator either: back to what the process had before it.
    assert!(open_fds() <= at_start.0 && threads() <= at_start.1, "left behind since the start: {at_start:?}");
    assert!(open_fds() <= fds, "descriptors leaked: {fds} -> {}", open_fds());
    assert!(threads() <= tasks, "threads leaked: {tasks} -> {}", threads());
    println!("RECREATE {rank} done");
}

fn spawn(rank: usize, dir: &Path, env: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "recreate::recreate_child", "--nocapture", "--test-threads=1"])
        .env(ROLE, format!("{rank},{}", dir.display()))
        .env("FERROCCL_BOOTSTRAP_TIMEOUT", "30")
        .env("FERROCCL_TIMEOUT", "30")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

fn survivors_recreate(env: &[(&str, &str)], label: &str) {
    let dir = std::env::temp_dir().join(format!("ferroccl-recreate-{}-{label}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    publish(&dir, "id0", &hex(&unique_id()));
    let mut kids: Vec<Child> = (0..3).map(|r| spawn(r, &dir, env)).collect();
    // Wait for rank 2's first all-reduce, then kill it.
    {
        use std::io::Read;
        let mut out = kids[2].stdout.take().unwrap();
        let (mut seen, mut buf) = (String::new(), [0u8; 4096]);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !seen.contains("RECREATE 2 ready") {
            let n = out.read(&mut buf).unwrap();
            assert!(n > 0 && Instant::now() < deadline, "rank 2 never got ready: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }
    // SAFETY: kill(2) on our own, unreaped child.
    unsafe { libc::kill(kids[2].id() as i32, libc::SIGKILL) };
    let _ = kids[2].wait();
    publish(&dir, "killed", "1");
    let mut texts = Vec::new();
    for kid in kids.drain(..2) {
        let out = kid.wait_with_output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "{label}: survivor failed:\n{text}");
        texts.push(text);
    }
    let _ = std::fs::remove_dir_all(&dir);
    for (rank, text) in texts.iter().enumerate() {
        for l in text.lines().filter(|l| l.starts_with("RECREATE")) {
            println!("{label}: {l}");
        }
        assert!(text.contains(&format!("RECREATE {rank} done")), "{label}:\n{text}");
    }
}

#[test]
fn survivors_of_a_killed_rank_make_new_communicators_without_leaks() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    survivors_recreate(&[], "one host");
    survivors_recreate(&[("FERROCCL_NODE_COLL", "0")], "shared memory");
    survivors_recreate(&[("NCCL_SHM_DISABLE", "1"), ("FERROCCL_NODE_COLL", "0")], "sockets");
}
