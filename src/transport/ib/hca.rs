//! Which HCA ports the IB transport may use: the devices a probe found ([`DeviceInfo`]),
//! NCCL_IB_HCA ([`HcaFilter`]), and the choice between them ([`usable_ports`]). Also the
//! numeric settings NCCL_IB_GID_INDEX, NCCL_IB_TIMEOUT and NCCL_IB_RETRY_CNT ([`IbSettings`]).
//! All pure: the probe itself is `verbs`' (or a test's).
//!
//! NCCL_IB_HCA, as NCCL reads it: a comma list of `name[:port]` entries (NCCL's optional
//! `:rail:plane` fields after the port are accepted and ignored). A leading `^` makes it an
//! exclude list; a leading `=` (after the `^`, if any) makes names match exactly instead of
//! as prefixes (`mlx5` matches `mlx5_0`; `=mlx5` matches only `mlx5`). An entry without a
//! port matches every port of the device.

use crate::error::{Error, Result};
use crate::wire::LinkLayer;

/// `ibv_port_state`'s ACTIVE.
pub const PORT_ACTIVE: u8 = 4;

/// One port of an HCA, as the probe saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct PortInfo {
    pub port: u8,
    /// `ibv_port_state` (4 = active).
    pub state: u8,
    /// `None` when the link layer is neither InfiniBand nor Ethernet.
    pub link_layer: Option<LinkLayer>,
    pub lid: u16,
    /// `ibv_mtu` of the active MTU.
    pub active_mtu: u8,
    /// Link speed in Mbit/s (lane speed times width), 0 when unknown.
    pub speed_mbps: u32,
}

/// One HCA, as the probe saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceInfo {
    pub name: String,
    pub ports: Vec<PortInfo>,
    /// PCI address (`0000:05:00.0`) from sysfs, when known.
    pub pci: Option<String>,
    /// NUMA node from sysfs, when known (-1 or absent: none).
    pub numa: Option<i32>,
}

/// A port the transport will use.
#[derive(Clone, Debug, PartialEq)]
pub struct PortChoice {
    pub device: String,
    pub port: u8,
    pub link_layer: LinkLayer,
    pub speed_mbps: u32,
    pub pci: Option<String>,
    pub numa: Option<i32>,
}

impl PortChoice {
    /// `mlx5_0:1/IB`, as in NCCL's `NET/IB : Using` line.
    pub fn label(&self) -> String {
        format!("{}:{}/{}", self.device, self.port, self.link_layer.name())
    }
}

/// One NCCL_IB_HCA entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaSpec {
    pub name: String,
    /// `None`: every port.
    pub port: Option<u8>,
}

/// A parsed NCCL_IB_HCA.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HcaFilter {
    /// `^`: the entries name devices not to use.
    pub exclude: bool,
    /// `=`: names match exactly rather than as prefixes.
    pub exact: bool,
    /// Empty: no filter (every device).
    pub entries: Vec<HcaSpec>,
}

impl HcaFilter {
    /// Parses NCCL_IB_HCA; `None` or blank means no filter. A port that is not a number from
    /// 1 to 255, or an entry without a name, is an error naming the variable.
    pub fn parse(value: Option<&str>) -> Result<HcaFilter> {
        let mut rest = value.unwrap_or("").trim();
        let mut filter = HcaFilter::default();
        if let Some(r) = rest.strip_prefix('^') {
            filter.exclude = true;
            rest = r.trim_start();
        }
        if let Some(r) = rest.strip_prefix('=') {
            filter.exact = true;
            rest = r.trim_start();
        }
        let bad = |what: String| Error::invalid_usage(format!("NCCL_IB_HCA={}: {what}", value.unwrap_or("")));
        for entry in rest.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let mut fields = entry.split(':');
            let name = fields.next().unwrap_or("").trim();
            if name.is_empty() {
                return Err(bad(format!("entry '{entry}' has no device name")));
            }
            let port = match fields.next().map(str::trim) {
                None | Some("") => None,
                Some(p) => match p.parse::<u8>() {
                    Ok(n) if n > 0 => Some(n),
                    _ => return Err(bad(format!("port '{p}' of '{entry}' is not a number from 1 to 255"))),
                },
            };
            // NCCL's rail and plane fields: accepted, not used.
            filter.entries.push(HcaSpec { name: name.to_string(), port });
        }
        if filter.entries.is_empty() && (filter.exclude || filter.exact) {
            return Err(bad("no device named".into()));
        }
        Ok(filter)
    }

    fn name_matches(&self, spec: &HcaSpec, device: &str) -> bool {
        if self.exact {
            spec.name == device
        } else {
            device.starts_with(&spec.name)
        }
    }

    /// Whether port `port` of `device` may be used.
    pub fn allows(&self, device: &str, port: u8) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        let listed = self.entries.iter().any(|s| self.name_matches(s, device) && s.port.is_none_or(|p| p == port));
        listed != self.exclude
    }
}

/// Why a port was left out (for TRACE lines), or the ports to use, in probe order.
pub fn usable_ports(devices: &[DeviceInfo], filter: &HcaFilter) -> (Vec<PortChoice>, Vec<String>) {
    let mut chosen = Vec::new();
    let mut skipped = Vec::new();
    for d in devices {
        if d.ports.is_empty() {
            skipped.push(format!("{}: no ports", d.name));
        }
        for p in &d.ports {
            let label = format!("{}:{}", d.name, p.port);
            if !filter.allows(&d.name, p.port) {
                skipped.push(format!("{label}: excluded by NCCL_IB_HCA"));
            } else if p.state != PORT_ACTIVE {
                skipped.push(format!("{label}: port state {} (not active)", p.state));
            } else if let Some(link_layer) = p.link_layer {
                chosen.push(PortChoice {
                    device: d.name.clone(),
                    port: p.port,
                    link_layer,
                    speed_mbps: p.speed_mbps,
                    pci: d.pci.clone(),
                    numa: d.numa,
                });
            } else {
                skipped.push(format!("{label}: link layer neither InfiniBand nor Ethernet"));
            }
        }
    }
    (chosen, skipped)
}

/// Orders `ports` so that those on NUMA node `local` come first (otherwise in probe order):
/// the transport uses the first, and an HCA on the caller's node avoids crossing sockets.
pub fn prefer_numa(mut ports: Vec<PortChoice>, local: Option<i32>) -> Vec<PortChoice> {
    if let Some(node) = local {
        ports.sort_by_key(|p| p.numa != Some(node));
    }
    ports
}

/// One line per port for the log: `mlx5_0:1/IB 200 Gb/s, PCI 0000:05:00.0, NUMA 0`.
pub fn describe_port(p: &PortChoice) -> String {
    let mut s = p.label();
    if p.speed_mbps > 0 {
        s += &format!(" {} Gb/s", p.speed_mbps / 1000);
    }
    if let Some(pci) = &p.pci {
        s += &format!(", PCI {pci}");
    }
    if let Some(numa) = p.numa {
        s += &format!(", NUMA {numa}");
    }
    s
}

/// Link speed in Mbit/s from `ibv_port_attr`'s `active_speed` and `active_width` codes (0 when
/// either is unknown).
pub fn speed_mbps(active_speed: u32, active_width: u8) -> u32 {
    let lane = match active_speed {
        1 => 2_500,
        2 => 5_000,
        4 | 8 => 10_000,
        16 => 14_000,
        32 => 25_000,
        64 => 50_000,
        128 => 100_000,
        256 => 200_000,
        _ => 0,
    };
    let lanes = match active_width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => 0,
    };
    lane * lanes
}

/// NCCL_IB_GID_INDEX, NCCL_IB_TIMEOUT and NCCL_IB_RETRY_CNT, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IbSettings {
    /// GID table index for RoCE; `None` chooses (the first RoCE v2 IPv4-mapped GID, else 0).
    pub gid_index: Option<u8>,
    /// Local ACK timeout exponent: 4.096 us x 2^timeout (1..=31).
    pub timeout: u8,
    /// Transport retries (0..=7).
    pub retry_cnt: u8,
}

impl IbSettings {
    /// From the raw values (`gid_index` -1 or absent = choose). Out-of-range values are
    /// `ncclInvalidUsage` errors naming the variable.
    pub fn new(gid_index: Option<i64>, timeout: i64, retry_cnt: i64) -> Result<IbSettings> {
        let gid_index = match gid_index {
            None | Some(-1) => None,
            Some(g) => Some(u8::try_from(g).map_err(|_| {
                Error::invalid_usage(format!("NCCL_IB_GID_INDEX={g}: must be -1 (choose) or 0 to 255"))
            })?),
        };
        if !(1..=31).contains(&timeout) {
            return Err(Error::invalid_usage(format!("NCCL_IB_TIMEOUT={timeout}: must be 1 to 31")));
        }
        if !(0..=7).contains(&retry_cnt) {
            return Err(Error::invalid_usage(format!("NCCL_IB_RETRY_CNT={retry_cnt}: must be 0 to 7")));
        }
        Ok(IbSettings { gid_index, timeout: timeout as u8, retry_cnt: retry_cnt as u8 })
    }

    pub fn from_env() -> Result<IbSettings> {
        IbSettings::new(
            crate::env::get_int_opt("NCCL_IB_GID_INDEX"),
            crate::env::get_int("NCCL_IB_TIMEOUT"),
            crate::env::get_int("NCCL_IB_RETRY_CNT"),
        )
    }
}

/// Chooses a RoCE GID index when NCCL_IB_GID_INDEX does not: the first entry that is RoCE v2
/// and IPv4-mapped (`::ffff:a.b.c.d`), else the first RoCE v2 entry, else 0. `gids` lists the
/// port's table as (index, GID, is RoCE v2).
pub fn choose_gid_index(gids: &[(u8, [u8; 16], bool)]) -> u8 {
    let v4_mapped = |g: &[u8; 16]| g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff;
    gids.iter()
        .find(|(_, g, v2)| *v2 && v4_mapped(g))
        .or_else(|| gids.iter().find(|(_, g, v2)| *v2 && g.iter().any(|&b| b != 0)))
        .map(|(i, _, _)| *i)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ncclResult_t;

    fn spec(name: &str, port: Option<u8>) -> HcaSpec {
        HcaSpec { name: name.into(), port }
    }

    #[test]
    fn parses_nccl_ib_hca_forms() {
        assert_eq!(HcaFilter::parse(None).unwrap(), HcaFilter::default());
        assert_eq!(HcaFilter::parse(Some("  ")).unwrap(), HcaFilter::default());
        let f = HcaFilter::parse(Some("mlx5_0:1,mlx5_1")).unwrap();
        assert_eq!(
            f,
            HcaFilter { exclude: false, exact: false, entries: vec![spec("mlx5_0", Some(1)), spec("mlx5_1", None)] }
        );
        let f = HcaFilter::parse(Some("^=mlx5_2:2")).unwrap();
        assert!(f.exclude && f.exact);
        assert_eq!(f.entries, vec![spec("mlx5_2", Some(2))]);
        let f = HcaFilter::parse(Some("=mlx5_0:1:0:1, mlx5_3 ,")).unwrap();
        assert!(f.exact && !f.exclude);
        assert_eq!(f.entries, vec![spec("mlx5_0", Some(1)), spec("mlx5_3", None)]);
        let f = HcaFilter::parse(Some("^mlx4")).unwrap();
        assert!(f.exclude && !f.exact);
        // A trailing colon means every port.
        assert_eq!(HcaFilter::parse(Some("mlx5_0:")).unwrap().entries, vec![spec("mlx5_0", None)]);
    }

    #[test]
    fn rejects_bad_ports_and_empty_lists() {
        for bad in ["mlx5_0:x", "mlx5_0:0", "mlx5_0:256", "mlx5_0:-1", ":1", "^", "=", "^=", "^ ,"] {
            let e = HcaFilter::parse(Some(bad)).expect_err(bad);
            assert_eq!(e.code(), ncclResult_t::ncclInvalidUsage);
            assert!(e.to_string().starts_with(&format!("NCCL_IB_HCA={bad}:")), "{e}");
        }
    }

    #[test]
    fn prefix_exact_port_and_exclude_matching() {
        let f = HcaFilter::parse(Some("mlx5")).unwrap();
        assert!(f.allows("mlx5_0", 1) && f.allows("mlx5_10", 2));
        assert!(!f.allows("mlx4_0", 1));
        let f = HcaFilter::parse(Some("=mlx5")).unwrap();
        assert!(!f.allows("mlx5_0", 1), "= asks for exact names");
        assert!(f.allows("mlx5", 1));
        let f = HcaFilter::parse(Some("mlx5_0:2")).unwrap();
        assert!(f.allows("mlx5_0", 2) && !f.allows("mlx5_0", 1));
        let f = HcaFilter::parse(Some("^mlx5_0:1")).unwrap();
        assert!(!f.allows("mlx5_0", 1) && f.allows("mlx5_0", 2) && f.allows("mlx5_1", 1));
        // A prefix exclude also excludes longer names: ^mlx5_1 drops mlx5_10 (as NCCL).
        let f = HcaFilter::parse(Some("^mlx5_1")).unwrap();
        assert!(!f.allows("mlx5_10", 1) && f.allows("mlx5_2", 1));
        let f = HcaFilter::parse(Some("^=mlx5_1")).unwrap();
        assert!(f.allows("mlx5_10", 1) && !f.allows("mlx5_1", 1));
        assert!(HcaFilter::default().allows("anything", 9));
    }

    fn port(port: u8, state: u8, ll: Option<LinkLayer>) -> PortInfo {
        PortInfo { port, state, link_layer: ll, lid: 1, active_mtu: 5, speed_mbps: 100_000 }
    }

    #[test]
    fn usable_ports_need_active_state_a_known_link_layer_and_the_filter() {
        let devices = vec![
            DeviceInfo {
                name: "mlx5_0".into(),
                ports: vec![port(1, PORT_ACTIVE, Some(LinkLayer::InfiniBand)), port(2, 1, Some(LinkLayer::InfiniBand))],
                pci: Some("0000:05:00.0".into()),
                numa: Some(0),
            },
            DeviceInfo {
                name: "mlx5_1".into(),
                ports: vec![port(1, PORT_ACTIVE, Some(LinkLayer::Ethernet))],
                pci: None,
                numa: None,
            },
            DeviceInfo { name: "hfi1_0".into(), ports: vec![port(1, PORT_ACTIVE, None)], pci: None, numa: None },
            DeviceInfo { name: "empty".into(), ports: vec![], pci: None, numa: None },
        ];
        let (chosen, skipped) = usable_ports(&devices, &HcaFilter::default());
        let labels: Vec<String> = chosen.iter().map(PortChoice::label).collect();
        assert_eq!(labels, ["mlx5_0:1/IB", "mlx5_1:1/RoCE"]);
        assert_eq!(chosen[0].pci.as_deref(), Some("0000:05:00.0"));
        assert_eq!(skipped.len(), 3, "{skipped:?}");
        assert!(skipped.iter().any(|s| s.starts_with("mlx5_0:2: port state 1")));
        assert!(skipped.iter().any(|s| s.contains("hfi1_0:1: link layer")));
        let (chosen, skipped) = usable_ports(&devices, &HcaFilter::parse(Some("^mlx5_0")).unwrap());
        assert_eq!(chosen.iter().map(PortChoice::label).collect::<Vec<_>>(), ["mlx5_1:1/RoCE"]);
        assert!(skipped.iter().any(|s| s == "mlx5_0:1: excluded by NCCL_IB_HCA"));
        let (chosen, _) = usable_ports(&devices, &HcaFilter::parse(Some("mlx5_0:2")).unwrap());
        assert!(chosen.is_empty(), "the only port named is down");
        assert!(usable_ports(&[], &HcaFilter::default()).0.is_empty());
    }

    #[test]
    fn ports_on_the_local_numa_node_come_first() {
        let port = |device: &str, numa: Option<i32>| PortChoice {
            device: device.into(),
            port: 1,
            link_layer: LinkLayer::InfiniBand,
            speed_mbps: 400_000,
            pci: Some("0000:05:00.0".into()),
            numa,
        };
        let ports = vec![port("a", Some(0)), port("b", Some(1)), port("c", None), port("d", Some(1))];
        let names = |v: Vec<PortChoice>| v.into_iter().map(|p| p.device).collect::<Vec<_>>();
        assert_eq!(names(prefer_numa(ports.clone(), Some(1))), ["b", "d", "a", "c"]);
        assert_eq!(names(prefer_numa(ports.clone(), None)), ["a", "b", "c", "d"]);
        assert_eq!(names(prefer_numa(ports.clone(), Some(7))), ["a", "b", "c", "d"]);
        assert_eq!(describe_port(&ports[0]), "a:1/IB 400 Gb/s, PCI 0000:05:00.0, NUMA 0");
        assert_eq!(describe_port(&PortChoice { speed_mbps: 0, pci: None, numa: None, ..ports[2].clone() }), "c:1/IB");
    }

    #[test]
    fn speeds_follow_the_verbs_codes() {
        assert_eq!(speed_mbps(128, 2), 400_000, "NDR 4x");
        assert_eq!(speed_mbps(64, 2), 200_000, "HDR 4x");
        assert_eq!(speed_mbps(32, 1), 25_000, "EDR 1x");
        assert_eq!(speed_mbps(1, 8), 30_000, "SDR 12x");
        assert_eq!(speed_mbps(3, 2), 0);
        assert_eq!(speed_mbps(32, 3), 0);
    }

    #[test]
    fn settings_are_range_checked() {
        assert_eq!(IbSettings::new(None, 20, 7).unwrap(), IbSettings { gid_index: None, timeout: 20, retry_cnt: 7 });
        assert_eq!(IbSettings::new(Some(-1), 1, 0).unwrap().gid_index, None);
        assert_eq!(IbSettings::new(Some(3), 31, 0).unwrap().gid_index, Some(3));
        for (g, t, r, name) in [
            (Some(-2), 20, 7, "NCCL_IB_GID_INDEX"),
            (Some(256), 20, 7, "NCCL_IB_GID_INDEX"),
            (None, 0, 7, "NCCL_IB_TIMEOUT"),
            (None, 32, 7, "NCCL_IB_TIMEOUT"),
            (None, 20, 8, "NCCL_IB_RETRY_CNT"),
            (None, 20, -1, "NCCL_IB_RETRY_CNT"),
        ] {
            let e = IbSettings::new(g, t, r).unwrap_err();
            assert_eq!(e.code(), ncclResult_t::ncclInvalidUsage);
            assert!(e.to_string().starts_with(name), "{e}");
        }
    }

    #[test]
    fn gid_choice_prefers_roce_v2_ipv4() {
        let mut v4 = [0u8; 16];
        v4[10] = 0xff;
        v4[11] = 0xff;
        v4[12..].copy_from_slice(&[10, 0, 0, 1]);
        let link_local = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(
            choose_gid_index(&[(0, link_local, false), (1, link_local, true), (2, v4, false), (3, v4, true)]),
            3
        );
        assert_eq!(choose_gid_index(&[(0, link_local, false), (1, link_local, true)]), 1);
        assert_eq!(choose_gid_index(&[(0, link_local, false)]), 0);
        assert_eq!(choose_gid_index(&[(4, [0; 16], true)]), 0, "an empty entry is not chosen");
    }
}
