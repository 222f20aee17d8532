//! Network interface selection with NCCL's rules (NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY).
//!
//! `NCCL_SOCKET_IFNAME` is a comma list of name prefixes; a leading `^` turns it into an
//! exclude list; a leading `=` (after any `^`) makes the names exact. Without it, interfaces
//! named `lo` and `docker*` are avoided unless nothing else is up, and `ib*` are preferred.

use std::net::IpAddr;

use nix::net::if_::InterfaceFlags;

use crate::error::{Error, Result};

/// One usable interface address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub addr: IpAddr,
    /// IPv6 scope (needed to connect to link-local addresses).
    pub scope_id: u32,
}

/// A parsed `NCCL_SOCKET_IFNAME` filter.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct IfFilter {
    pub exclude: bool,
    pub exact: bool,
    pub names: Vec<String>,
}

impl IfFilter {
    pub fn parse(spec: &str) -> IfFilter {
        let mut rest = spec.trim();
        let exclude = rest.starts_with('^');
        if exclude {
            rest = &rest[1..];
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = &rest[1..];
        }
        let names = rest.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        IfFilter { exclude, exact, names }
    }

    pub fn matches(&self, name: &str) -> bool {
        let hit = self.names.iter().any(|n| if self.exact { name == n } else { name.starts_with(n.as_str()) });
        hit != self.exclude
    }
}

/// Address family restriction from `NCCL_SOCKET_FAMILY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Any,
    V4,
    V6,
}

impl Family {
    pub fn parse(spec: Option<&str>) -> Result<Family> {
        match spec.map(|s| s.trim().to_ascii_uppercase()) {
            None => Ok(Family::Any),
            Some(s) if s.is_empty() => Ok(Family::Any),
            Some(s) if s == "AF_INET" || s == "4" || s == "IPV4" => Ok(Family::V4),
            Some(s) if s == "AF_INET6" || s == "6" || s == "IPV6" => Ok(Family::V6),
            Some(s) => Err(Error::invalid_argument(format!("NCCL_SOCKET_FAMILY: unknown family {s}"))),
        }
    }
    fn allows(self, addr: &IpAddr) -> bool {
        match self {
            Family::Any => true,
            Family::V4 => addr.is_ipv4(),
            Family::V6 => addr.is_ipv6(),
        }
    }
}

/// Choose interfaces from `all` (in system order) the way NCCL does.
pub fn choose(all: &[Interface], filter: Option<&IfFilter>, family: Family) -> Vec<Interface> {
    let usable: Vec<&Interface> = all.iter().filter(|i| family.allows(&i.addr)).collect();
    let picked: Vec<Interface> = match filter {
        Some(f) => usable.iter().filter(|i| f.matches(&i.name)).map(|i| (*i).clone()).collect(),
        None => {
            let ib: Vec<Interface> = usable.iter().filter(|i| i.name.starts_with("ib")).map(|i| (*i).clone()).collect();
            if !ib.is_empty() {
                ib
            } else {
                let avoid = |n: &str| n == "lo" || n.starts_with("docker");
                let others: Vec<Interface> = usable.iter().filter(|i| !avoid(&i.name)).map(|i| (*i).clone()).collect();
                if others.is_empty() {
                    usable.iter().filter(|i| i.name == "lo").map(|i| (*i).clone()).collect()
                } else {
                    others
                }
            }
        }
    };
    // IPv4 first within the choice, as NCCL prefers it when the family is unspecified.
    let mut v4: Vec<Interface> = picked.iter().filter(|i| i.addr.is_ipv4()).cloned().collect();
    let v6 = picked.into_iter().filter(|i| i.addr.is_ipv6() && !is_link_local(&i.addr));
    v4.extend(v6);
    v4
}

fn is_link_local(addr: &IpAddr) -> bool {
    match addr {
        IpAddr::V6(a) => (a.segments()[0] & 0xffc0) == 0xfe80,
        IpAddr::V4(_) => false,
    }
}

/// The interfaces that are up, with their addresses, from `getifaddrs`.
pub fn system_interfaces() -> Result<Vec<Interface>> {
    let list = nix::ifaddrs::getifaddrs().map_err(|e| Error::system("getifaddrs", e.into()))?;
    let mut out = Vec::new();
    for ifa in list {
        let Some(addr) = ifa.address.filter(|_| ifa.flags.contains(InterfaceFlags::IFF_UP)) else { continue };
        let name = ifa.interface_name;
        if let Some(sin) = addr.as_sockaddr_in() {
            out.push(Interface { name, addr: IpAddr::V4(sin.ip()), scope_id: 0 });
        } else if let Some(sin6) = addr.as_sockaddr_in6() {
            out.push(Interface { name, addr: IpAddr::V6(sin6.ip()), scope_id: sin6.scope_id() });
        }
    }
    Ok(out)
}

/// The interface this process uses for bootstrap and the socket transport.
pub fn pick() -> Result<Interface> {
    let all = system_interfaces()?;
    let filter = crate::env::get_str("NCCL_SOCKET_IFNAME").map(|s| IfFilter::parse(&s));
    let family = Family::parse(crate::env::get_str("NCCL_SOCKET_FAMILY").as_deref())?;
    let candidates = choose(&all, filter.as_ref(), family);
    nearest(&candidates).or_else(|| candidates.into_iter().next()).ok_or_else(|| {
        Error::invalid_usage(format!(
            "no usable network interface (NCCL_SOCKET_IFNAME={}, NCCL_SOCKET_FAMILY={:?})",
            crate::env::get_str("NCCL_SOCKET_IFNAME").unwrap_or_default(),
            family
        ))
    })
}

/// Among several candidate interfaces, the one whose NIC is closest (by hwloc topology) to
/// the NUMA node this thread runs on; `None` when the topology cannot tell them apart.
fn nearest(candidates: &[Interface]) -> Option<Interface> {
    if candidates.len() < 2 {
        return None;
    }
    let topo = crate::topo::Topology::system();
    let cpu = rustix::thread::sched_getcpu();
    let node = topo.numa_nodes().iter().find(|n| n.cpuset.contains(cpu as u32))?.os_index;
    let ids: Vec<_> = candidates.iter().filter_map(|i| topo.device_by_name(&i.name).map(|d| d.id)).collect();
    let nic = topo.nic_for_among(crate::topo::Near::Numa(node), &ids)?;
    candidates.iter().find(|i| nic.names.iter().any(|n| n == &i.name)).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, addr: &str) -> Interface {
        Interface { name: name.into(), addr: addr.parse().unwrap(), scope_id: 0 }
    }

    fn sample() -> Vec<Interface> {
        vec![
            iface("lo", "127.0.0.1"),
            iface("docker0", "172.17.0.1"),
            iface("eth0", "192.0.2.2"),
            iface("eth0", "fd00::2"),
            iface("eth1", "198.51.100.1"),
        ]
    }

    fn names(v: &[Interface]) -> Vec<String> {
        v.iter().map(|i| format!("{}:{}", i.name, i.addr)).collect()
    }

    #[test]
    fn default_avoids_lo_and_docker() {
        let got = choose(&sample(), None, Family::Any);
        assert_eq!(names(&got), ["eth0:192.0.2.2", "eth1:198.51.100.1", "eth0:fd00::2"]);
        let only_lo = vec![iface("lo", "127.0.0.1")];
        assert_eq!(names(&choose(&only_lo, None, Family::Any)), ["lo:127.0.0.1"]);
        let with_ib = vec![iface("eth0", "192.0.2.2"), iface("ib0", "10.1.0.1")];
        assert_eq!(names(&choose(&with_ib, None, Family::Any)), ["ib0:10.1.0.1"]);
    }

    #[test]
    fn prefix_exclude_and_exact_filters() {
        let f = IfFilter::parse("eth");
        assert_eq!(choose(&sample(), Some(&f), Family::V4).len(), 2);
        let f = IfFilter::parse("^eth,docker");
        assert_eq!(names(&choose(&sample(), Some(&f), Family::Any)), ["lo:127.0.0.1"]);
        let f = IfFilter::parse("=eth");
        assert!(choose(&sample(), Some(&f), Family::Any).is_empty());
        let f = IfFilter::parse("^=eth0");
        assert!(f.matches("eth01") && !f.matches("eth0"));
        let f = IfFilter::parse("eth0");
        assert_eq!(names(&choose(&sample(), Some(&f), Family::V6)), ["eth0:fd00::2"]);
    }

    #[test]
    fn family_parsing() {
        assert_eq!(Family::parse(Some("AF_INET6")).unwrap(), Family::V6);
        assert_eq!(Family::parse(None).unwrap(), Family::Any);
        assert!(Family::parse(Some("AF_UNIX")).is_err());
    }
}
