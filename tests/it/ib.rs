//! InfiniBand selection on a host without a usable HCA (this one: no RDMA hardware and no
//! kernel RDMA support): NCCL's fallback lines, in order, and collectives over sockets. Ranks
//! are threads of a child process (the network is chosen once per process).
//!
//! With the `ib` feature the probe is the verbs library's device list (which fails with
//! ENOSYS here); without it, sysfs. Either way the lines must be NCCL's. On a host that does
//! have HCAs these tests print why they are skipped.

use crate::processes::{ib_line_expected, tier_run};

const NO_DEVICE: &str = "NET/IB : No device found.";

fn in_child() -> bool {
    std::env::var("FERROCCL_IT_ROLE").is_ok() || std::env::var("FERROCCL_IT_TIER_ROLE").is_ok()
}

/// The host has no IB device (the expectations below are for such hosts).
fn no_hca_here() -> bool {
    if ib_line_expected() == NO_DEVICE {
        return true;
    }
    println!("skipped: this host has InfiniBand devices; the fallback is not what happens here");
    false
}

/// Index of the first line containing `needle`.
fn line_of(out: &str, needle: &str) -> Option<usize> {
    out.lines().position(|l| l.contains(needle))
}

#[test]
fn without_a_device_ib_logs_nccls_line_then_sockets_carry_a_correct_all_reduce() {
    if in_child() || !no_hca_here() {
        return;
    }
    // Shared memory and the node area off: the all-reduce must cross the network tier.
    let out = tier_run("all-reduce", &[("NCCL_SHM_DISABLE", "1"), ("FERROCCL_NODE_COLL", "0")]);
    assert_eq!(out.matches("all-reduce OK").count(), 2, "{out}");
    // Exactly NCCL's line, once per process (the network is chosen once), before the choice.
    let lines: Vec<&str> = out.lines().filter(|l| l.contains("NET/IB")).collect();
    assert_eq!(lines.len(), 1, "{out}");
    assert!(lines[0].trim_end().ends_with(NO_DEVICE), "{}", lines[0]);
    let no_device = line_of(&out, NO_DEVICE).unwrap();
    let using = line_of(&out, "Using network Socket").unwrap_or_else(|| panic!("{out}"));
    assert!(no_device < using, "{out}");
    assert!(out.contains("NET/Socket : Using"), "{out}");
    assert!(out.contains("via NET/Socket/0") && !out.contains("NET/IB/0"), "{out}");
    assert!(!out.contains("Using network IB"), "{out}");
}

#[test]
fn nccl_net_ib_without_a_device_fails_init_with_invalid_usage() {
    if in_child() || !no_hca_here() {
        return;
    }
    let out = tier_run("init-fails", &[("NCCL_NET", "IB")]);
    for rank in 0..2 {
        assert!(
            out.contains(&format!(
                "rank {rank} init returned 5: ncclCommInitRank: NCCL_NET=IB: network IB not available (no InfiniBand device found)"
            )),
            "{out}"
        );
    }
    assert_eq!(out.matches(NO_DEVICE).count(), 1, "{out}");
}

#[test]
fn ib_disable_skips_the_probe_and_ib_settings_are_harmless_without_a_device() {
    if in_child() || !no_hca_here() {
        return;
    }
    let env = [("NCCL_IB_DISABLE", "1"), ("NCCL_SHM_DISABLE", "1"), ("FERROCCL_NODE_COLL", "0")];
    let out = tier_run("all-reduce", &env);
    assert_eq!(out.matches("all-reduce OK").count(), 2, "{out}");
    assert!(out.contains("NET/IB : disabled by NCCL_IB_DISABLE=1") && !out.contains(NO_DEVICE), "{out}");
    assert!(out.contains("Using network Socket"), "{out}");
    // NCCL_IB_HCA and the numeric settings only matter once a device is found.
    let env = [
        ("NCCL_IB_HCA", "^=mlx5_0:1,mlx5_1"),
        ("NCCL_IB_GID_INDEX", "3"),
        ("NCCL_IB_TIMEOUT", "22"),
        ("NCCL_IB_RETRY_CNT", "5"),
        ("NCCL_SHM_DISABLE", "1"),
        ("FERROCCL_NODE_COLL", "0"),
    ];
    let out = tier_run("all-reduce", &env);
    assert_eq!(out.matches("all-reduce OK").count(), 2, "{out}");
    assert_eq!(out.matches(NO_DEVICE).count(), 1, "{out}");
}
