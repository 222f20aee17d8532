//! Which network the NET tier uses, chosen at run time as NCCL does: InfiniBand first when
//! present and enabled, then sockets; `NCCL_NET` ("IB" / "Socket", any case) names one.
//!
//! There is no IB transport in this build yet: the probe really looks for devices
//! (`/sys/class/infiniband`), and when it finds some it says so and uses sockets, unless
//! `NCCL_NET=IB` asked for IB, which is an `ncclInvalidUsage` error at init. The decision is a
//! pure function of its inputs ([`select`]) so that tests can feed it any probe result.

use std::path::Path;

use crate::error::{Error, Result};

/// Networks this build can carry data over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetKind {
    Socket,
}

impl NetKind {
    pub fn name(self) -> &'static str {
        match self {
            NetKind::Socket => "Socket",
        }
    }
}

/// The settings that choose the network.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetPolicy {
    /// NCCL_NET: the network's name, case-insensitive.
    pub net: Option<String>,
    /// NCCL_IB_DISABLE.
    pub ib_disabled: bool,
}

impl NetPolicy {
    pub fn from_env() -> NetPolicy {
        NetPolicy { net: crate::env::get_str("NCCL_NET"), ib_disabled: crate::env::get_bool("NCCL_IB_DISABLE") }
    }
}

/// Where to look for InfiniBand devices.
pub trait IbProbe {
    /// Names of the IB devices present (empty when none, or when the probe cannot look).
    fn devices(&self) -> Vec<String>;
}

/// The kernel's list: one entry per device under `/sys/class/infiniband` (or another root).
pub struct SysfsIbProbe<'a>(pub &'a Path);

impl SysfsIbProbe<'static> {
    pub fn system() -> SysfsIbProbe<'static> {
        SysfsIbProbe(Path::new("/sys/class/infiniband"))
    }
}

impl IbProbe for SysfsIbProbe<'_> {
    fn devices(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.0)
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        names.sort();
        names
    }
}

/// The network chosen and the NET lines to log, in order (logged whether or not the choice
/// succeeded: they say what the probe found).
#[derive(Debug)]
pub struct Selection {
    pub kind: Result<NetKind>,
    pub log: Vec<String>,
}

/// Chooses the network: IB when present, enabled and built (never yet), else sockets.
/// `NCCL_NET` naming an unknown or unavailable network is `ncclInvalidUsage`.
pub fn select(policy: &NetPolicy, probe: &dyn IbProbe) -> Selection {
    let mut log = Vec::new();
    let kind = decide(policy, probe, &mut log);
    Selection { kind, log }
}

fn decide(policy: &NetPolicy, probe: &dyn IbProbe, log: &mut Vec<String>) -> Result<NetKind> {
    let wanted = policy.net.as_deref().map(str::trim).filter(|s| !s.is_empty());
    let wants_ib = match wanted {
        None => false,
        Some(n) if n.eq_ignore_ascii_case("IB") => true,
        Some(n) if n.eq_ignore_ascii_case("Socket") => {
            // As NCCL: a network not named is not initialized (so not probed).
            return Ok(NetKind::Socket);
        }
        Some(n) => {
            return Err(Error::invalid_usage(format!(
                "NCCL_NET={n}: network {n} not found (this build has IB, Socket)"
            )))
        }
    };
    let why_no_ib = if policy.ib_disabled {
        log.push("NET/IB : disabled by NCCL_IB_DISABLE=1".to_string());
        "disabled by NCCL_IB_DISABLE=1".to_string()
    } else {
        let devices = probe.devices();
        if devices.is_empty() {
            log.push("NET/IB : No device found.".to_string());
            "no InfiniBand device found".to_string()
        } else {
            let line = format!(
                "NET/IB : found {} device(s) ({}) but this build has no IB transport: not supported yet",
                devices.len(),
                devices.join(", ")
            );
            log.push(line);
            format!("{} InfiniBand device(s) found but IB is not supported yet", devices.len())
        }
    };
    if wants_ib {
        let n = wanted.unwrap_or("IB");
        return Err(Error::invalid_usage(format!("NCCL_NET={n}: network IB not available ({why_no_ib})")));
    }
    Ok(NetKind::Socket)
}

/// Checks a communicator's `ncclConfig_t.netName` against the network in use.
pub fn check_config_name(config_name: Option<&str>, in_use: &str) -> Result<()> {
    match config_name.map(str::trim).filter(|s| !s.is_empty()) {
        Some(n) if !n.eq_ignore_ascii_case(in_use) => Err(Error::invalid_usage(format!(
            "ncclConfig_t.netName {n}: network {n} not available (this process uses {in_use})"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ncclResult_t;

    struct Fixed(Vec<&'static str>);
    impl IbProbe for Fixed {
        fn devices(&self) -> Vec<String> {
            self.0.iter().map(|s| s.to_string()).collect()
        }
    }
    /// A probe that fails the test if it is asked.
    struct MustNotLook;
    impl IbProbe for MustNotLook {
        fn devices(&self) -> Vec<String> {
            panic!("the IB probe was consulted")
        }
    }

    fn policy(net: Option<&str>, ib_disabled: bool) -> NetPolicy {
        NetPolicy { net: net.map(String::from), ib_disabled }
    }

    fn usage_error(s: Selection) -> String {
        let e = s.kind.expect_err("expected an error");
        assert_eq!(e.code(), ncclResult_t::ncclInvalidUsage, "{e}");
        e.to_string()
    }

    #[test]
    fn no_ib_device_logs_nccls_line_and_uses_sockets() {
        let s = select(&policy(None, false), &Fixed(vec![]));
        assert_eq!(s.kind.unwrap(), NetKind::Socket);
        assert_eq!(s.log, vec!["NET/IB : No device found.".to_string()]);
    }

    #[test]
    fn ib_devices_present_are_reported_as_unsupported_and_sockets_used() {
        let s = select(&policy(None, false), &Fixed(vec!["mlx5_0", "mlx5_1"]));
        assert_eq!(s.kind.unwrap(), NetKind::Socket);
        assert_eq!(s.log.len(), 1);
        assert!(s.log[0].contains("found 2 device(s) (mlx5_0, mlx5_1)"), "{:?}", s.log);
        assert!(s.log[0].contains("not supported yet"), "{:?}", s.log);
        assert!(!s.log[0].contains("No device found"));
    }

    #[test]
    fn ib_disable_skips_the_probe() {
        let s = select(&policy(None, true), &MustNotLook);
        assert_eq!(s.kind.unwrap(), NetKind::Socket);
        assert_eq!(s.log, vec!["NET/IB : disabled by NCCL_IB_DISABLE=1".to_string()]);
    }

    #[test]
    fn nccl_net_names_a_network_in_any_case() {
        for name in ["Socket", "socket", "SOCKET", " Socket "] {
            let s = select(&policy(Some(name), false), &MustNotLook);
            assert_eq!(s.kind.unwrap(), NetKind::Socket);
            assert!(s.log.is_empty(), "{:?}", s.log);
        }
        for name in ["IB", "ib"] {
            // What the probe found is still logged.
            let s = select(&policy(Some(name), false), &Fixed(vec![]));
            assert_eq!(s.log, vec!["NET/IB : No device found.".to_string()]);
            let msg = usage_error(s);
            assert!(msg.contains(&format!("NCCL_NET={name}")) && msg.contains("no InfiniBand device"), "{msg}");
            let msg = usage_error(select(&policy(Some(name), false), &Fixed(vec!["mlx5_0"])));
            assert!(msg.contains("not supported yet"), "{msg}");
            let msg = usage_error(select(&policy(Some(name), true), &MustNotLook));
            assert!(msg.contains("NCCL_IB_DISABLE"), "{msg}");
        }
        let msg = usage_error(select(&policy(Some("Ucx"), false), &MustNotLook));
        assert!(msg.contains("NCCL_NET=Ucx") && msg.contains("not found"), "{msg}");
        // Empty counts as unset.
        assert_eq!(select(&policy(Some(""), false), &Fixed(vec![])).kind.unwrap(), NetKind::Socket);
    }

    #[test]
    fn sysfs_probe_lists_entries_and_finds_none_where_the_class_is_absent() {
        let dir = Path::new("/tmp").join(format!("ferroccl-ib-probe-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("mlx5_1")).unwrap();
        std::fs::create_dir_all(dir.join("mlx5_0")).unwrap();
        assert_eq!(SysfsIbProbe(&dir).devices(), vec!["mlx5_0".to_string(), "mlx5_1".to_string()]);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(SysfsIbProbe(&dir).devices().is_empty());
    }

    #[test]
    fn config_net_name_must_match_the_network_in_use() {
        assert!(check_config_name(None, "Socket").is_ok());
        assert!(check_config_name(Some("socket"), "Socket").is_ok());
        let e = check_config_name(Some("IB"), "Socket").unwrap_err();
        assert_eq!(e.code(), ncclResult_t::ncclInvalidUsage);
        assert!(e.to_string().contains("netName IB"), "{e}");
    }
}
