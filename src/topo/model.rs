//! The topology as plain data: what the hwloc binding extracts and what the decisions in
//! `decide.rs` read. No FFI here, so every decision can be tested on hand-built values.

use std::fmt;
use std::str::FromStr;

use super::CpuSet;
use crate::error::{Error, Result};

/// NVIDIA's PCI vendor id.
pub const VENDOR_NVIDIA: u16 = 0x10de;
/// PCI class 0x0300: VGA-compatible display controller.
pub const CLASS_DISPLAY_VGA: u16 = 0x0300;
/// PCI class 0x0302: 3D controller (data-centre GPUs).
pub const CLASS_DISPLAY_3D: u16 = 0x0302;
/// PCI class 0x0200: Ethernet controller.
pub const CLASS_NETWORK_ETHERNET: u16 = 0x0200;
/// PCI class 0x0207: InfiniBand controller.
pub const CLASS_NETWORK_INFINIBAND: u16 = 0x0207;

/// A processor package (socket).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Package {
    /// The OS's number for the package (`physical_package_id`).
    pub os_index: u32,
    /// Its processors.
    pub cpuset: CpuSet,
    /// The NUMA nodes (OS indices) inside it.
    pub numa_nodes: Vec<u32>,
    /// How many cores it has.
    pub cores: usize,
}

/// A NUMA node: a memory bank and the processors local to it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct NumaNode {
    /// The OS's number for the node (`/sys/devices/system/node/nodeN`).
    pub os_index: u32,
    /// The processors local to it (empty for memory-only nodes such as CXL memory).
    pub cpuset: CpuSet,
    /// Its memory in bytes (0 when unknown).
    pub memory: u64,
    /// The package holding it, if it is inside one.
    pub package: Option<u32>,
}

/// A processor core.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Core {
    /// The OS's number for the core (unique within its package only).
    pub os_index: u32,
    /// The package holding it, if known.
    pub package: Option<u32>,
    /// Its hardware threads (PUs).
    pub cpuset: CpuSet,
}

/// A PCI address `domain:bus:device.function`, printed as `0000:03:00.0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BusId {
    pub domain: u32,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

impl fmt::Display for BusId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:02x}:{:02x}.{:x}", self.domain, self.bus, self.device, self.function)
    }
}

impl FromStr for BusId {
    type Err = Error;

    /// Accepts `0000:03:00.0`, NVML's `00000000:03:00.0`, and `03:00.0` (domain 0), in
    /// either case.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::invalid_argument(format!("PCI bus id {s:?}: expected [domain:]bus:device.function"));
        let (rest, function) = s.trim().rsplit_once('.').ok_or_else(bad)?;
        let mut fields: Vec<&str> = rest.split(':').collect();
        let device = fields.pop().ok_or_else(bad)?;
        let bus = fields.pop().ok_or_else(bad)?;
        let domain = match fields.as_slice() {
            [] => "0",
            [d] => d,
            _ => return Err(bad()),
        };
        let hex8 = |t: &str| if t.len() <= 2 { u8::from_str_radix(t, 16).ok() } else { None };
        Ok(BusId {
            domain: if domain.len() <= 8 {
                u32::from_str_radix(domain, 16).map_err(|_| bad())?
            } else {
                return Err(bad());
            },
            bus: hex8(bus).ok_or_else(bad)?,
            device: hex8(device).filter(|d| *d < 32).ok_or_else(bad)?,
            function: hex8(function).filter(|f| *f < 8).ok_or_else(bad)?,
        })
    }
}

/// The index of a device in its [`Topology`](super::Topology)'s [`devices`](super::Topology::devices)
/// (which are in bus-id order). Only meaningful for the topology that issued it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceId(pub(crate) usize);

impl DeviceId {
    /// The position in [`Topology::devices`](super::Topology::devices).
    pub fn index(self) -> usize {
        self.0
    }
}

/// What a PCI device of interest is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeviceKind {
    /// An NVIDIA GPU (class 0x0300 or 0x0302).
    Gpu,
    /// A network adapter.
    Nic(NicKind),
}

/// The link layer of a network adapter, from its PCI class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NicKind {
    /// Class 0x0200 (also RoCE adapters).
    Ethernet,
    /// Class 0x0207.
    InfiniBand,
}

impl DeviceKind {
    /// Classifies a PCI function; `None` for devices the topology does not track.
    pub fn classify(vendor_id: u16, class_id: u16) -> Option<Self> {
        match class_id {
            CLASS_DISPLAY_VGA | CLASS_DISPLAY_3D if vendor_id == VENDOR_NVIDIA => Some(DeviceKind::Gpu),
            CLASS_NETWORK_ETHERNET => Some(DeviceKind::Nic(NicKind::Ethernet)),
            CLASS_NETWORK_INFINIBAND => Some(DeviceKind::Nic(NicKind::InfiniBand)),
            _ => None,
        }
    }
}

/// One PCI bridge on the way from a device up to the CPU: the hwloc object's global
/// index (unique within one topology) and whether it is the host bridge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BridgeHop {
    pub(crate) key: u64,
    pub(crate) host: bool,
}

/// A GPU or NIC on the PCI bus, with where it attaches.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct PciDevice {
    /// Its index in the topology.
    pub id: DeviceId,
    pub kind: DeviceKind,
    pub bus_id: BusId,
    pub vendor_id: u16,
    pub device_id: u16,
    /// PCI class and subclass (`0x0302`).
    pub class_id: u16,
    /// The OS devices on it, in hwloc's order: `mlx5_0` and `ib0`, `eth0`, `cuda0`, `card1`.
    pub names: Vec<String>,
    /// The processors local to it (those of the CPU-side object it hangs from).
    pub cpuset: CpuSet,
    /// The NUMA nodes (OS indices) local to it; one on a NUMA-aware machine.
    pub numa_nodes: Vec<u32>,
    /// PCIe link bandwidth in GB/s as hwloc reports it (0 when unknown).
    pub link_speed: f32,
    /// Bridges from the nearest up to the host bridge.
    pub(crate) path: Vec<BridgeHop>,
}

impl PciDevice {
    /// Whether it is a GPU.
    pub fn is_gpu(&self) -> bool {
        self.kind == DeviceKind::Gpu
    }

    /// Whether it is a network adapter.
    pub fn is_nic(&self) -> bool {
        matches!(self.kind, DeviceKind::Nic(_))
    }

    /// The NUMA node it is attached to, when exactly one is local to it.
    pub fn numa(&self) -> Option<u32> {
        match self.numa_nodes.as_slice() {
            [node] => Some(*node),
            _ => None,
        }
    }

    /// Its first OS device name, else its bus id.
    pub fn name(&self) -> String {
        self.names.first().cloned().unwrap_or_else(|| self.bus_id.to_string())
    }

    /// Whether `name` is one of its OS device names or its bus id.
    pub fn answers_to(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name) || name.parse::<BusId>().is_ok_and(|b| b == self.bus_id)
    }
}

/// The NUMA distance matrix (hwloc's `NUMALatency`, from the ACPI SLIT on Linux): relative
/// latencies, 10 for local access.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NumaDistances {
    /// hwloc's name for the matrix, if any.
    pub name: Option<String>,
    /// The nodes (OS indices) the rows and columns stand for.
    pub nodes: Vec<u32>,
    /// Row-major `nodes.len()` x `nodes.len()` values.
    pub values: Vec<u64>,
}

impl NumaDistances {
    /// The distance from node `from` to node `to` (OS indices), if both are in the matrix.
    pub fn get(&self, from: u32, to: u32) -> Option<u64> {
        let n = self.nodes.len();
        let i = self.nodes.iter().position(|&x| x == from)?;
        let j = self.nodes.iter().position(|&x| x == to)?;
        self.values.get(i * n + j).copied()
    }
}

/// How far apart two devices, or a device and a NUMA node, are. Ordered nearest first;
/// the names are NCCL's path types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Locality {
    /// Through at most one PCIe switch (both sit at most one bridge below a shared switch).
    Pix,
    /// Through several PCIe bridges, without crossing the host bridge.
    Pxb,
    /// Through the PCIe host bridge or the CPU, within one NUMA node.
    Phb,
    /// Across the inter-socket (SMP) interconnect.
    Sys,
}

impl Locality {
    /// NCCL's name: `PIX`, `PXB`, `PHB`, `SYS`.
    pub fn as_str(self) -> &'static str {
        match self {
            Locality::Pix => "PIX",
            Locality::Pxb => "PXB",
            Locality::Phb => "PHB",
            Locality::Sys => "SYS",
        }
    }
}

impl fmt::Display for Locality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a decision is made for: a device, or a NUMA node (by OS index).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Near {
    Device(DeviceId),
    Numa(u32),
}

/// Everything a backend extracts from one hwloc topology; `Topology` sorts the devices and
/// assigns their ids.
#[derive(Clone, Debug, Default)]
pub(crate) struct Parts {
    pub(crate) cpuset: CpuSet,
    pub(crate) total_memory: u64,
    pub(crate) packages: Vec<Package>,
    pub(crate) numa_nodes: Vec<NumaNode>,
    pub(crate) cores: Vec<Core>,
    pub(crate) pu_count: usize,
    pub(crate) devices: Vec<PciDevice>,
    pub(crate) distances: Option<NumaDistances>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_parse_and_print() {
        let b: BusId = "0000:03:00.0".parse().unwrap();
        assert_eq!(b, BusId { domain: 0, bus: 3, device: 0, function: 0 });
        assert_eq!(b.to_string(), "0000:03:00.0");
        assert_eq!("00000000:03:00.0".parse::<BusId>().unwrap(), b);
        assert_eq!("03:00.0".parse::<BusId>().unwrap(), b);
        assert_eq!("0001:AF:1F.7".parse::<BusId>().unwrap().to_string(), "0001:af:1f.7");
        for bad in ["", "eth0", "0000:03:00", "0000:03:20.0", "0000:03:00.8", "0:0:03:00.0", "000000000:03:00.0"] {
            assert!(bad.parse::<BusId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn classification() {
        assert_eq!(DeviceKind::classify(0x10de, 0x0302), Some(DeviceKind::Gpu));
        assert_eq!(DeviceKind::classify(0x10de, 0x0300), Some(DeviceKind::Gpu));
        assert_eq!(DeviceKind::classify(0x1002, 0x0300), None, "only NVIDIA GPUs");
        assert_eq!(DeviceKind::classify(0x15b3, 0x0207), Some(DeviceKind::Nic(NicKind::InfiniBand)));
        assert_eq!(DeviceKind::classify(0x1af4, 0x0200), Some(DeviceKind::Nic(NicKind::Ethernet)));
        assert_eq!(DeviceKind::classify(0x1af4, 0x0180), None);
        assert!(Locality::Pix < Locality::Pxb && Locality::Phb < Locality::Sys);
    }

    #[test]
    fn distance_lookup() {
        let d = NumaDistances { name: None, nodes: vec![0, 2], values: vec![10, 21, 21, 10] };
        assert_eq!((d.get(0, 0), d.get(0, 2), d.get(2, 0), d.get(1, 0)), (Some(10), Some(21), Some(21), None));
    }
}
