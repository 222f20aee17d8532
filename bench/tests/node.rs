//! Node-level collectives (one shared area for all ranks of a host) end to end, checked by the
//! benchmark's nccl-tests data check: all-reduce with every type and operator, all-gather, and
//! broadcast from a non-zero root, sizes on both sides of each algorithm's threshold, in and out
//! of place, with ncclMemAlloc buffers (mapped by the peers) and plain ones (kernel copies), with
//! the node area on and off.

use std::process::{Command, Output};

const BENCH: &str = env!("CARGO_BIN_EXE_ferroccl-bench");

/// Sizes from 8 B to 1 MiB by 8: all-reduce one-shot (tiny and small slots) and direct,
/// broadcast by tree (< 32 KiB) and through the area; rings and trees with the node area off.
const SWEEPS: &[&[&str]] = &[
    &["all_reduce", "-b", "8", "-e", "1M", "-f", "8", "-o", "all", "-d", "all", "-n", "1", "-w", "0", "-c", "1"],
    &["all_gather", "-b", "8", "-e", "1M", "-f", "8", "-d", "all", "-n", "1", "-w", "0", "-c", "1"],
    &["broadcast", "-b", "8", "-e", "1M", "-f", "8", "-d", "all", "-r", "1", "-n", "1", "-w", "0", "-c", "1"],
];

fn run(mut cmd: Command) -> String {
    cmd.env("NCCL_DEBUG", "INFO").env("NCCL_DEBUG_SUBSYS", "SHM").env("NCCL_SOCKET_IFNAME", "lo");
    let out: Output = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    assert!(text.contains("# Out of bounds values : 0 OK"), "{text}");
    text
}

/// The outputs of every sweep, concatenated.
fn threads(ranks: &str, extra: &[&str], node: bool) -> String {
    let mut text = String::new();
    for sweep in SWEEPS {
        let mut cmd = Command::new(BENCH);
        cmd.args(*sweep).args(["-t", ranks]).args(extra).env("FERROCCL_NODE_COLL", if node { "1" } else { "0" });
        text += &run(cmd);
    }
    text
}

#[test]
fn ranks_as_threads_with_and_without_the_node_area() {
    let on = threads("3", &[], true);
    assert!(on.contains("Node area: 3 ranks"), "{on}");
    let off = threads("3", &["--host-alloc"], false);
    assert!(!off.contains("Node area: 3 ranks") && off.contains("disabled by FERROCCL_NODE_COLL"), "{off}");
}

#[test]
#[cfg(feature = "mpi")]
fn ranks_as_processes_map_ncclmemalloc_buffers_or_copy_plain_ones() {
    if Command::new("mpirun").arg("--version").output().is_err() {
        println!("skipped: no mpirun");
        return;
    }
    for (extra, sweep) in
        [&["--alloc", "nccl"][..], &[][..]].into_iter().flat_map(|e| SWEEPS.iter().map(move |s| (e, s)))
    {
        let mut cmd = Command::new("timeout");
        cmd.args(["300", "mpirun", "-np", "3", "--oversubscribe", "--bind-to", "none", "-x", "NCCL_DEBUG", "-x"])
            .args(["NCCL_DEBUG_SUBSYS", "-x", "NCCL_SOCKET_IFNAME", BENCH])
            .args(*sweep)
            .args(extra)
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        let out = run(cmd);
        assert_eq!(out.matches("Node area: 3 ranks").count(), 3, "{out}");
        if !extra.is_empty() {
            assert!(out.contains("SHM: mapped"), "ncclMemAlloc buffers are mapped by the peers:\n{out}");
        } else {
            assert!(!out.contains("SHM: mapped"), "plain buffers cannot be mapped:\n{out}");
        }
    }
}

/// `--arrays`: every size in send and receive arrays of its own, of the bytes it needs (the
/// benchmark's bounds checks fail on any of its accesses past them), reused in a second cycle
/// and across types, operators and roots, misaligned by one element, checked by the data check
/// for every collective with a distinct layout; one size alone as well.
#[test]
fn each_size_in_arrays_of_its_own_is_exact() {
    for coll in ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "alltoall", "gather"] {
        let mut cmd = Command::new(BENCH);
        cmd.args([coll, "-b", "8", "-e", "2M", "-f", "16", "-n", "1", "-w", "1", "-N", "2", "-u", "1", "-c", "1"])
            .args(["-d", "all", "-o", "all", "-r", "all", "-t", "3", "--arrays"]);
        let out = run(cmd);
        assert!(out.contains("# buffers: each size in arrays of its own"), "{out}");
        let rows = out.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit())).count();
        assert!(rows >= 2 * 5 && rows % (2 * 5) == 0, "two cycles of five sizes per type, operator and root:\n{out}");
    }
    let mut one = Command::new(BENCH);
    one.args(["all_reduce", "-b", "1M", "-e", "1M", "-n", "2", "-w", "1", "-N", "3", "-c", "1", "-t", "2", "--arrays"]);
    let out = run(one);
    assert_eq!(out.lines().filter(|l| l.trim_start().starts_with("1048576")).count(), 3, "{out}");
}

#[test]
fn arrays_refuse_linear_size_steps() {
    let out =
        Command::new(BENCH).args(["all_reduce", "-b", "1M", "-e", "4M", "-i", "1M", "--arrays"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && text.contains("not -i"), "{text}");
}
