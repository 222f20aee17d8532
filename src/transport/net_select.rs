//! Which network the NET tier uses, chosen at run time as NCCL does: InfiniBand first when
//! present and enabled, then sockets; `NCCL_NET` ("IB" / "Socket", any case) names one.
//!
//! The probe really looks for devices: with the `ib` feature through the verbs library
//! ([`VerbsIbProbe`]: HCAs, their ports' state and link layer), without it in sysfs
//! ([`SysfsIbProbe`]: device names only; such a build cannot use them and says so). A probe
//! that cannot list devices at all (no kernel RDMA support: ENOSYS) counts as no device:
//! `NET/IB : No device found.`, then sockets. IB is skipped without probing under
//! NCCL_IB_DISABLE=1 and under the strict encryption policy (RDMA data cannot be
//! encrypted). `NCCL_NET=IB` without a usable port is an `ncclInvalidUsage` error at init,
//! as in NCCL. The decision is a pure function of its inputs ([`select`]) so that tests can
//! feed it any probe result.

use std::path::Path;

use super::ib::hca::{usable_ports, DeviceInfo, HcaFilter, PortChoice};
use crate::error::{Error, Result};

/// The network chosen.
#[derive(Clone, Debug, PartialEq)]
pub enum NetKind {
    Socket,
    /// InfiniBand / RoCE on these ports (in probe order; the transport uses the first).
    Ib(Vec<PortChoice>),
}

impl NetKind {
    pub fn name(&self) -> &'static str {
        match self {
            NetKind::Socket => "Socket",
            NetKind::Ib(_) => "IB",
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
    /// FERROCCL_ENCRYPTION_POLICY=strict: nothing may bypass TLS, so no RDMA.
    pub strict_encryption: bool,
    /// NCCL_IB_HCA.
    pub ib_hca: Option<String>,
}

impl NetPolicy {
    pub fn from_env() -> NetPolicy {
        NetPolicy {
            net: crate::env::get_str("NCCL_NET"),
            ib_disabled: crate::env::get_bool("NCCL_IB_DISABLE"),
            strict_encryption: crate::encryption::strict(),
            ib_hca: crate::env::get_str("NCCL_IB_HCA"),
        }
    }

    /// NCCL_NET names IB.
    pub fn wants_ib(&self) -> bool {
        self.net.as_deref().map(str::trim).is_some_and(|n| n.eq_ignore_ascii_case("IB"))
    }
}

/// Where to look for InfiniBand devices.
pub trait IbProbe {
    /// Whether this build can carry data over IB (the `ib` feature).
    fn transport_built(&self) -> bool;
    /// The devices present, or why none could be listed (treated as none).
    fn devices(&self) -> std::result::Result<Vec<DeviceInfo>, String>;
}

/// The kernel's list: one entry per device under `/sys/class/infiniband` (or another root),
/// names only. For builds without the `ib` feature.
pub struct SysfsIbProbe<'a>(pub &'a Path);

impl SysfsIbProbe<'static> {
    pub fn system() -> SysfsIbProbe<'static> {
        SysfsIbProbe(Path::new("/sys/class/infiniband"))
    }
}

impl IbProbe for SysfsIbProbe<'_> {
    fn transport_built(&self) -> bool {
        false
    }
    fn devices(&self) -> std::result::Result<Vec<DeviceInfo>, String> {
        let mut names: Vec<String> = std::fs::read_dir(self.0)
            .map_err(|e| format!("{}: {e}", self.0.display()))?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        Ok(names.into_iter().map(|name| DeviceInfo { name, ports: Vec::new(), pci: None, numa: None }).collect())
    }
}

/// The verbs library's list, with every port's attributes.
#[cfg(feature = "ib")]
pub struct VerbsIbProbe;

#[cfg(feature = "ib")]
impl IbProbe for VerbsIbProbe {
    fn transport_built(&self) -> bool {
        true
    }
    fn devices(&self) -> std::result::Result<Vec<DeviceInfo>, String> {
        super::ib::verbs::probe()
    }
}

/// This build's probe.
pub fn system_probe() -> Box<dyn IbProbe> {
    #[cfg(feature = "ib")]
    return Box::new(VerbsIbProbe);
    #[cfg(not(feature = "ib"))]
    Box::new(SysfsIbProbe::system())
}

/// The network chosen and the NET lines to log, in order (logged whether or not the choice
/// succeeded: they say what the probe found), plus TRACE details.
#[derive(Debug)]
pub struct Selection {
    pub kind: Result<NetKind>,
    pub log: Vec<String>,
    pub trace: Vec<String>,
}

/// NCCL's line for a host without a usable HCA.
pub const NO_DEVICE: &str = "NET/IB : No device found.";

/// Chooses the network: IB when a usable port is present, enabled and built, else sockets.
/// `NCCL_NET` naming an unknown or unavailable network is `ncclInvalidUsage`.
pub fn select(policy: &NetPolicy, probe: &dyn IbProbe) -> Selection {
    let mut log = Vec::new();
    let mut trace = Vec::new();
    let kind = decide(policy, probe, &mut log, &mut trace);
    Selection { kind, log, trace }
}

fn decide(policy: &NetPolicy, probe: &dyn IbProbe, log: &mut Vec<String>, trace: &mut Vec<String>) -> Result<NetKind> {
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
    } else if policy.strict_encryption {
        log.push("NET/IB : disabled by FERROCCL_ENCRYPTION_POLICY=strict (RDMA data would bypass TLS)".to_string());
        "disabled by FERROCCL_ENCRYPTION_POLICY=strict".to_string()
    } else {
        match probe.devices() {
            Err(reason) => {
                trace.push(format!("NET/IB : no device list ({reason}); counted as no device"));
                log.push(NO_DEVICE.to_string());
                "no InfiniBand device found".to_string()
            }
            Ok(devices) if devices.is_empty() => {
                log.push(NO_DEVICE.to_string());
                "no InfiniBand device found".to_string()
            }
            Ok(devices) if !probe.transport_built() => {
                let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
                log.push(format!(
                    "NET/IB : found {} device(s) ({}) but this build has no IB transport (built without the `ib` feature)",
                    devices.len(),
                    names.join(", ")
                ));
                format!("{} InfiniBand device(s) found but this build has no IB transport", devices.len())
            }
            Ok(devices) => {
                let filter = HcaFilter::parse(policy.ib_hca.as_deref())?;
                let (chosen, skipped) = usable_ports(&devices, &filter);
                trace.extend(skipped.into_iter().map(|s| format!("NET/IB : not using {s}")));
                if !chosen.is_empty() {
                    return Ok(NetKind::Ib(chosen));
                }
                log.push(NO_DEVICE.to_string());
                let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
                format!("no usable port: none active and allowed by NCCL_IB_HCA on {}", names.join(", "))
            }
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
    use crate::transport::ib::hca::{PortInfo, PORT_ACTIVE};
    use crate::wire::LinkLayer;

    /// A probe with a fixed answer; `built` says whether the build has the transport.
    struct Fixed {
        built: bool,
        devices: std::result::Result<Vec<DeviceInfo>, String>,
    }
    impl IbProbe for Fixed {
        fn transport_built(&self) -> bool {
            self.built
        }
        fn devices(&self) -> std::result::Result<Vec<DeviceInfo>, String> {
            self.devices.clone()
        }
    }
    /// A probe that fails the test if it is asked.
    struct MustNotLook;
    impl IbProbe for MustNotLook {
        fn transport_built(&self) -> bool {
            true
        }
        fn devices(&self) -> std::result::Result<Vec<DeviceInfo>, String> {
            panic!("the IB probe was consulted")
        }
    }

    fn dev(name: &str, ports: &[(u8, u8, Option<LinkLayer>)]) -> DeviceInfo {
        DeviceInfo {
            name: name.into(),
            ports: ports
                .iter()
                .map(|&(port, state, link_layer)| PortInfo {
                    port,
                    state,
                    link_layer,
                    lid: 1,
                    active_mtu: 5,
                    speed_mbps: 200_000,
                })
                .collect(),
            pci: None,
            numa: None,
        }
    }

    fn none() -> Fixed {
        Fixed { built: true, devices: Ok(vec![]) }
    }
    /// The verbs library on a kernel without RDMA support.
    fn enosys() -> Fixed {
        Fixed { built: true, devices: Err("ibv_get_device_list: Function not implemented (os error 38)".into()) }
    }
    fn hcas() -> Fixed {
        Fixed {
            built: true,
            devices: Ok(vec![
                dev("mlx5_0", &[(1, PORT_ACTIVE, Some(LinkLayer::InfiniBand))]),
                dev("mlx5_1", &[(1, PORT_ACTIVE, Some(LinkLayer::Ethernet)), (2, 1, Some(LinkLayer::Ethernet))]),
            ]),
        }
    }

    fn policy(net: Option<&str>, ib_disabled: bool) -> NetPolicy {
        NetPolicy { net: net.map(String::from), ib_disabled, ..Default::default() }
    }

    fn usage_error(s: Selection) -> String {
        let e = s.kind.expect_err("expected an error");
        assert_eq!(e.code(), ncclResult_t::ncclInvalidUsage, "{e}");
        e.to_string()
    }

    #[test]
    fn no_ib_device_logs_nccls_line_and_uses_sockets() {
        for probe in [none(), enosys(), Fixed { built: false, devices: Ok(vec![]) }] {
            let s = select(&policy(None, false), &probe);
            assert_eq!(s.kind.unwrap(), NetKind::Socket);
            assert_eq!(s.log, vec![NO_DEVICE.to_string()]);
        }
        // The reason a device list was unavailable goes to TRACE only.
        let s = select(&policy(None, false), &enosys());
        assert_eq!(s.trace.len(), 1);
        assert!(s.trace[0].contains("os error 38") && s.trace[0].contains("counted as no device"), "{:?}", s.trace);
    }

    #[test]
    fn usable_ports_choose_ib_without_a_no_device_line() {
        let s = select(&policy(None, false), &hcas());
        let NetKind::Ib(ports) = s.kind.unwrap() else { panic!("expected IB") };
        assert_eq!(ports.iter().map(PortChoice::label).collect::<Vec<_>>(), ["mlx5_0:1/IB", "mlx5_1:1/RoCE"]);
        assert!(s.log.is_empty(), "{:?}", s.log);
        assert!(s.trace.iter().any(|t| t.contains("mlx5_1:2: port state 1")), "{:?}", s.trace);
        // NCCL_NET=IB takes the same ports.
        assert!(matches!(select(&policy(Some("ib"), false), &hcas()).kind.unwrap(), NetKind::Ib(_)));
    }

    #[test]
    fn nccl_ib_hca_filters_ports_and_bad_values_fail() {
        let mut p = policy(None, false);
        p.ib_hca = Some("^mlx5_0".into());
        let NetKind::Ib(ports) = select(&p, &hcas()).kind.unwrap() else { panic!("expected IB") };
        assert_eq!(ports.iter().map(PortChoice::label).collect::<Vec<_>>(), ["mlx5_1:1/RoCE"]);
        p.ib_hca = Some("=mlx5_1:2".into()); // the port that is down
        let s = select(&p, &hcas());
        assert_eq!(s.log, vec![NO_DEVICE.to_string()]);
        assert_eq!(s.kind.unwrap(), NetKind::Socket);
        p.net = Some("IB".into());
        let msg = usage_error(select(&p, &hcas()));
        assert!(msg.contains("no usable port") && msg.contains("mlx5_0, mlx5_1"), "{msg}");
        let p = NetPolicy { ib_hca: Some("mlx5_0:x".into()), ..Default::default() };
        assert!(usage_error(select(&p, &hcas())).starts_with("NCCL_IB_HCA=mlx5_0:x"));
        // Without devices the value is never looked at.
        assert_eq!(select(&p, &none()).kind.unwrap(), NetKind::Socket);
    }

    #[test]
    fn devices_in_a_build_without_the_transport_are_reported_and_sockets_used() {
        let probe = Fixed { built: false, devices: Ok(vec![dev("mlx5_0", &[]), dev("mlx5_1", &[])]) };
        let s = select(&policy(None, false), &probe);
        assert_eq!(s.kind.unwrap(), NetKind::Socket);
        assert_eq!(s.log.len(), 1);
        assert!(s.log[0].contains("found 2 device(s) (mlx5_0, mlx5_1)"), "{:?}", s.log);
        assert!(s.log[0].contains("without the `ib` feature"), "{:?}", s.log);
        assert!(!s.log[0].contains("No device found"));
        let msg = usage_error(select(&policy(Some("IB"), false), &probe));
        assert!(msg.contains("no IB transport"), "{msg}");
    }

    #[test]
    fn ib_disable_and_strict_encryption_skip_the_probe() {
        let s = select(&policy(None, true), &MustNotLook);
        assert_eq!(s.kind.unwrap(), NetKind::Socket);
        assert_eq!(s.log, vec!["NET/IB : disabled by NCCL_IB_DISABLE=1".to_string()]);
        let strict = NetPolicy { strict_encryption: true, ..Default::default() };
        let s = select(&strict, &MustNotLook);
        assert_eq!(s.kind.unwrap(), NetKind::Socket);
        assert!(s.log[0].contains("FERROCCL_ENCRYPTION_POLICY=strict"), "{:?}", s.log);
        let msg = usage_error(select(&NetPolicy { net: Some("IB".into()), ..strict }, &MustNotLook));
        assert!(msg.contains("FERROCCL_ENCRYPTION_POLICY=strict"), "{msg}");
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
            let s = select(&policy(Some(name), false), &enosys());
            assert_eq!(s.log, vec![NO_DEVICE.to_string()]);
            let msg = usage_error(s);
            assert!(msg.contains(&format!("NCCL_NET={name}")) && msg.contains("no InfiniBand device"), "{msg}");
            let msg = usage_error(select(&policy(Some(name), true), &MustNotLook));
            assert!(msg.contains("NCCL_IB_DISABLE"), "{msg}");
        }
        assert!(policy(Some(" ib "), false).wants_ib() && !policy(Some("Socket"), false).wants_ib());
        let msg = usage_error(select(&policy(Some("Ucx"), false), &MustNotLook));
        assert!(msg.contains("NCCL_NET=Ucx") && msg.contains("not found"), "{msg}");
        // Empty counts as unset.
        assert_eq!(select(&policy(Some(""), false), &none()).kind.unwrap(), NetKind::Socket);
    }

    #[test]
    fn sysfs_probe_lists_entries_and_fails_where_the_class_is_absent() {
        let dir = Path::new("/tmp").join(format!("ferroccl-ib-probe-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("mlx5_1")).unwrap();
        std::fs::create_dir_all(dir.join("mlx5_0")).unwrap();
        let names: Vec<String> = SysfsIbProbe(&dir).devices().unwrap().into_iter().map(|d| d.name).collect();
        assert_eq!(names, ["mlx5_0", "mlx5_1"]);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(SysfsIbProbe(&dir).devices().is_err());
        assert!(!SysfsIbProbe(&dir).transport_built());
        assert_eq!(system_probe().transport_built(), cfg!(feature = "ib"));
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
