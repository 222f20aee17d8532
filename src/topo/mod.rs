//! The machine's topology, from hwloc: packages, NUMA nodes (with memory sizes and the
//! distance matrix), cores, PUs, and the PCI devices ferroccl cares about (NVIDIA GPUs,
//! Ethernet and InfiniBand NICs) with their OS names and where they attach; plus the
//! placement decisions made from it.
//!
//! Owns: the hwloc binding (`sys`: raw declarations of libhwloc 2.x, behind the `hwloc`
//! feature and hidden from cbindgen; `hwloc`: the safe layer), the plain-data model
//! ([`Package`], [`NumaNode`], [`Core`], [`PciDevice`], [`NumaDistances`], [`CpuSet`]), the
//! decisions ([`Topology::cpuset_near`], [`Topology::nic_for`], [`Topology::locality`]),
//! thread binding ([`Topology::bind_current_thread`]), `NCCL_DEBUG_SUBSYS=GRAPH` output
//! ([`Topology::log_graph`]) and the `FERROCCL_TOPO_DUMP` XML dump.
//! Does not own: which threads exist or when they bind (callers decide), transports.
//!
//! Usage at communicator init:
//! ```no_run
//! use ferroccl::topo::{Near, Topology};
//! let topo = Topology::system(); // loaded once per process; never fails (flat fallback)
//! topo.log_graph();
//! let _ = topo.dump_if_requested();
//! if let Some(nic) = topo.device_by_name("eth0") {
//!     let cpus = topo.cpuset_near(Near::Device(nic.id));
//!     let _ = topo.bind_current_thread(&cpus); // in the progress thread itself
//! }
//! ```
//!
//! Invariants: nothing here panics on hwloc's or the XML's behalf: failures are
//! [`Error`] values (`System` for the machine, `InvalidArgument` for bad XML), binding that
//! cannot happen is a logged no-op ([`Binding::Skipped`]), and a machine without PCI
//! information is a topology without devices. [`Topology::devices`] are in bus-id order
//! and `devices()[id.index()].id == id`. The decisions read only the model, never hwloc.
//! Without the `hwloc` feature, [`Topology::load`] gives the flat view (`flat.rs`) and XML,
//! export and binding report `InvalidUsage` / `Skipped`.

mod cpuset;
mod decide;
mod flat;
mod model;

#[cfg(not(feature = "hwloc"))]
mod fallback;
#[cfg(feature = "hwloc")]
mod hwloc;
/// cbindgen:ignore
#[cfg(feature = "hwloc")]
mod sys;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

#[cfg(not(feature = "hwloc"))]
use fallback as backend;
#[cfg(feature = "hwloc")]
use hwloc as backend;

pub use cpuset::CpuSet;
use model::Parts;
pub use model::{
    BusId, Core, DeviceId, DeviceKind, Locality, Near, NicKind, NumaDistances, NumaNode, Package, PciDevice,
    CLASS_DISPLAY_3D, CLASS_DISPLAY_VGA, CLASS_NETWORK_ETHERNET, CLASS_NETWORK_INFINIBAND, VENDOR_NVIDIA,
};

use crate::error::{Error, Result};

/// Where a topology came from.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// This machine, as hwloc discovered it.
    ThisSystem,
    /// This machine, flat: hwloc was unavailable or failed.
    Flat,
    /// An hwloc XML file.
    XmlFile(PathBuf),
    /// hwloc XML text.
    XmlString,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::ThisSystem => f.write_str("this machine (hwloc)"),
            Source::Flat => f.write_str("this machine (flat, without hwloc)"),
            Source::XmlFile(p) => write!(f, "XML file {}", p.display()),
            Source::XmlString => f.write_str("XML text"),
        }
    }
}

/// What [`Topology::bind_current_thread`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Binding {
    /// The thread now runs only on these processors.
    Bound(CpuSet),
    /// Binding was impossible (no hwloc, an XML topology, processors not on this machine,
    /// the OS refused); the thread's binding is unchanged. The text says why.
    Skipped(String),
}

/// A machine's topology: data extracted once, plus (with hwloc) the hwloc topology for
/// export and binding. `Send + Sync`; share it by reference ([`Topology::system`]) or `Arc`.
pub struct Topology {
    source: Source,
    parts: Parts,
    handle: Option<Mutex<backend::Handle>>,
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Topology")
            .field("source", &self.source)
            .field("cpuset", &self.parts.cpuset)
            .field("packages", &self.parts.packages.len())
            .field("numa_nodes", &self.parts.numa_nodes.len())
            .field("devices", &self.parts.devices.len())
            .finish_non_exhaustive()
    }
}

fn no_hwloc(what: &str) -> Error {
    Error::invalid_usage(format!("{what}: this topology has no hwloc handle (flat view, or built without `hwloc`)"))
}

/// How many ranks of this host can poll at the same time without taking turns: the
/// machine's processors that this process's container allows (not its own binding: ranks
/// pinned to one core each by mpirun still have a core each).
pub fn usable_cores() -> usize {
    Topology::system().pu_count().max(1)
}

impl Topology {
    /// This process's topology, loaded on first use and shared. When hwloc is missing or
    /// fails, a WARN explains why and the flat view (one package, one NUMA node, the
    /// processors this process may use, no devices) stands in, so callers need no
    /// error path.
    pub fn system() -> &'static Topology {
        static SYSTEM: OnceLock<Topology> = OnceLock::new();
        SYSTEM.get_or_init(|| match Topology::load() {
            Ok(t) => t,
            Err(e) => {
                log::warn!(target: "GRAPH", "Topology detection failed ({e}); using a flat topology");
                Topology::from_parts(flat::parts(), Source::Flat, None)
            }
        })
    }

    /// Discovers this machine's topology (with hwloc; the flat view without the `hwloc`
    /// feature). Prefer the cached [`Topology::system`].
    pub fn load() -> Result<Topology> {
        let (parts, handle) = backend::load_system()?;
        let source = if handle.is_some() { Source::ThisSystem } else { Source::Flat };
        Ok(Self::from_parts(parts, source, handle))
    }

    /// Reads a topology from an hwloc XML file (as `lstopo file.xml` or
    /// [`Topology::dump_to`] write it). Unreadable files are `System` errors, files hwloc
    /// rejects `InvalidArgument`.
    pub fn from_xml_file(path: impl AsRef<Path>) -> Result<Topology> {
        let path = path.as_ref();
        let xml = std::fs::read(path).map_err(|e| Error::system(format!("topology XML {}", path.display()), e))?;
        let (parts, handle) = backend::load_xml(&xml, &path.display().to_string())?;
        Ok(Self::from_parts(parts, Source::XmlFile(path.to_owned()), handle))
    }

    /// Reads a topology from hwloc XML text.
    pub fn from_xml_str(xml: &str) -> Result<Topology> {
        let (parts, handle) = backend::load_xml(xml.as_bytes(), "(text)")?;
        Ok(Self::from_parts(parts, Source::XmlString, handle))
    }

    /// Puts the devices in bus-id order and numbers them.
    fn from_parts(mut parts: Parts, source: Source, handle: Option<backend::Handle>) -> Topology {
        parts.devices.sort_by_key(|d| d.bus_id);
        for (i, d) in parts.devices.iter_mut().enumerate() {
            d.id = DeviceId(i);
        }
        Topology { source, parts, handle: handle.map(Mutex::new) }
    }

    fn handle(&self) -> Option<MutexGuard<'_, backend::Handle>> {
        self.handle.as_ref().map(|m| m.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Where the topology came from.
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// Whether the topology describes the running machine (XML topologies do not).
    pub fn is_this_system(&self) -> bool {
        match self.source {
            Source::Flat => true,
            _ => self.handle().is_some_and(|h| h.is_this_system()),
        }
    }

    /// All processors of the machine (those this process may use, for this machine).
    pub fn cpuset(&self) -> &CpuSet {
        &self.parts.cpuset
    }

    /// Total memory in bytes (0 when unknown).
    pub fn total_memory(&self) -> u64 {
        self.parts.total_memory
    }

    pub fn packages(&self) -> &[Package] {
        &self.parts.packages
    }

    pub fn numa_nodes(&self) -> &[NumaNode] {
        &self.parts.numa_nodes
    }

    /// The NUMA node with this OS index.
    pub fn numa_node(&self, os_index: u32) -> Option<&NumaNode> {
        self.parts.numa_nodes.iter().find(|n| n.os_index == os_index)
    }

    pub fn cores(&self) -> &[Core] {
        &self.parts.cores
    }

    /// The number of processing units (hardware threads).
    pub fn pu_count(&self) -> usize {
        self.parts.pu_count
    }

    /// GPUs and NICs, in bus-id order.
    pub fn devices(&self) -> &[PciDevice] {
        &self.parts.devices
    }

    /// The device with this id, if it is one of this topology's.
    pub fn device(&self, id: DeviceId) -> Option<&PciDevice> {
        self.parts.devices.get(id.0)
    }

    /// The GPUs, in bus-id order (CUDA's order under `CUDA_DEVICE_ORDER=PCI_BUS_ID`).
    pub fn gpus(&self) -> impl Iterator<Item = &PciDevice> + '_ {
        self.parts.devices.iter().filter(|d| d.is_gpu())
    }

    /// The NICs, in bus-id order.
    pub fn nics(&self) -> impl Iterator<Item = &PciDevice> + '_ {
        self.parts.devices.iter().filter(|d| d.is_nic())
    }

    /// The device with this OS name (`eth0`, `mlx5_0`) or PCI bus id (`0000:03:00.0`).
    pub fn device_by_name(&self, name: &str) -> Option<&PciDevice> {
        self.parts.devices.iter().find(|d| d.answers_to(name))
    }

    /// The device at this PCI address (e.g. from `cudaDeviceGetPCIBusId`).
    pub fn device_by_bus_id(&self, bus_id: BusId) -> Option<&PciDevice> {
        self.parts.devices.iter().find(|d| d.bus_id == bus_id)
    }

    /// hwloc's NUMA latency matrix, when the machine (or file) has one.
    pub fn distances(&self) -> Option<&NumaDistances> {
        self.parts.distances.as_ref()
    }

    /// The NUMA distance between two nodes (OS indices), from the matrix.
    pub fn numa_distance(&self, from: u32, to: u32) -> Option<u64> {
        self.parts.distances.as_ref()?.get(from, to)
    }

    /// Binds the calling thread to `cpus` (restricted to this machine's processors), with
    /// `hwloc_set_cpubind(HWLOC_CPUBIND_THREAD)`. Logs the outcome under INIT. Where
    /// binding is impossible it changes nothing and returns [`Binding::Skipped`]; an empty
    /// `cpus` is `InvalidArgument`; unexpected OS errors are `System`.
    pub fn bind_current_thread(&self, cpus: &CpuSet) -> Result<Binding> {
        if cpus.is_empty() {
            return Err(Error::invalid_argument("bind_current_thread: empty cpuset"));
        }
        let skip = |reason: String| {
            log::info!(target: "INIT", "Not binding this thread to cpus {cpus}: {reason}");
            Ok(Binding::Skipped(reason))
        };
        let usable = cpus.intersection(self.cpuset());
        if usable.is_empty() {
            return skip(format!("none of them is in this topology's cpus {}", self.cpuset()));
        }
        let Some(handle) = self.handle() else {
            return skip("no hwloc (flat topology, or built without the `hwloc` feature)".into());
        };
        if !handle.is_this_system() {
            return skip(format!("the topology is not this machine's ({})", self.source));
        }
        match handle.bind_thread(&usable) {
            Ok(()) => {
                log::info!(target: "INIT", "Bound this thread to cpus {usable}");
                Ok(Binding::Bound(usable))
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EXDEV | libc::EPERM | libc::EINVAL)) => {
                skip(format!("hwloc_set_cpubind: {e}"))
            }
            Err(e) => Err(Error::system(format!("binding this thread to cpus {usable}"), e)),
        }
    }

    /// The processors the calling thread may run on (`hwloc_get_cpubind`), for this
    /// machine's topology only.
    pub fn current_thread_binding(&self) -> Result<CpuSet> {
        let handle = self.handle().ok_or_else(|| no_hwloc("current_thread_binding"))?;
        if !handle.is_this_system() {
            return Err(Error::invalid_usage(format!("current_thread_binding: the topology is {}", self.source)));
        }
        handle.thread_binding().map_err(|e| Error::system("hwloc_get_cpubind", e))
    }

    /// The topology as hwloc v2 XML (what `lstopo --of xml` writes).
    pub fn to_xml(&self) -> Result<String> {
        self.handle().ok_or_else(|| no_hwloc("topology XML export"))?.export_xml()
    }

    /// Writes the topology as hwloc v2 XML to `path`, atomically (a temporary file in the
    /// same directory, then a rename), so concurrent writers never leave a torn file.
    pub fn dump_to(&self, path: &Path) -> Result<()> {
        let handle = self.handle().ok_or_else(|| no_hwloc("topology XML dump"))?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".{}.tmp", std::process::id()));
        let tmp = PathBuf::from(tmp);
        handle.export_xml_file(&tmp)?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::system(format!("topology dump: renaming {} to {}", tmp.display(), path.display()), e)
        })
    }

    /// With `FERROCCL_TOPO_DUMP=<path>` set (and not empty), writes the topology there as
    /// hwloc XML and returns the path; otherwise does nothing. Safe to call from every
    /// rank: each write is atomic and the content is the same.
    pub fn dump_if_requested(&self) -> Result<Option<PathBuf>> {
        self.dump_per(crate::env::get_str("FERROCCL_TOPO_DUMP"))
    }

    /// [`Topology::dump_if_requested`] for a given `FERROCCL_TOPO_DUMP` setting.
    fn dump_per(&self, setting: Option<String>) -> Result<Option<PathBuf>> {
        let Some(path) = setting.filter(|p| !p.is_empty()) else {
            return Ok(None);
        };
        let path = PathBuf::from(path);
        self.dump_to(&path).map_err(|e| e.context("FERROCCL_TOPO_DUMP"))?;
        log::info!(target: "GRAPH", "GRAPH Topology written to {} (FERROCCL_TOPO_DUMP)", path.display());
        Ok(Some(path))
    }

    /// Logs [`Topology::graph_lines`] at INFO under GRAPH (`NCCL_DEBUG=INFO
    /// NCCL_DEBUG_SUBSYS=GRAPH`).
    pub fn log_graph(&self) {
        for line in self.graph_lines() {
            log::info!(target: "GRAPH", "{line}");
        }
    }

    /// One line per object: the machine, packages, NUMA nodes (and distance rows), GPUs,
    /// NICs, then each GPU's NIC choice; e.g. `GRAPH NUMA 0 cpus 0-1 mem 24GB`,
    /// `GRAPH NIC eth0 pci 0000:00:03.0 numa 0 ...`.
    pub fn graph_lines(&self) -> Vec<String> {
        let p = &self.parts;
        let gpus: Vec<&PciDevice> = self.gpus().collect();
        let nic_count = self.nics().count();
        let mut lines = vec![format!(
            "GRAPH Machine cpus {} pus {} cores {} packages {} numa {} mem {} gpus {} nics {} from {}",
            p.cpuset,
            p.pu_count,
            p.cores.len(),
            p.packages.len(),
            p.numa_nodes.len(),
            gigabytes(p.total_memory),
            gpus.len(),
            nic_count,
            self.source
        )];
        for pkg in &p.packages {
            lines.push(format!(
                "GRAPH Package {} cpus {} cores {} numa {}",
                pkg.os_index,
                pkg.cpuset,
                pkg.cores,
                list(&pkg.numa_nodes)
            ));
        }
        for node in &p.numa_nodes {
            lines.push(format!("GRAPH NUMA {} cpus {} mem {}", node.os_index, node.cpuset, gigabytes(node.memory)));
        }
        if let Some(d) = &p.distances {
            let n = d.nodes.len();
            for (i, node) in d.nodes.iter().enumerate() {
                let row: Vec<String> = d.values.iter().skip(i * n).take(n).map(u64::to_string).collect();
                lines.push(format!("GRAPH NUMA {node} distances {}", row.join(" ")));
            }
        }
        let numa = |d: &PciDevice| d.numa().map_or_else(|| "-".to_owned(), |n| n.to_string());
        for (i, gpu) in gpus.iter().enumerate() {
            let names = if gpu.names.is_empty() { String::new() } else { format!(" ({})", gpu.names.join(",")) };
            lines.push(format!(
                "GRAPH GPU {i} pci {}{names} [{:04x}:{:04x}] numa {} cpus {} link {:.1}GB/s",
                gpu.bus_id,
                gpu.vendor_id,
                gpu.device_id,
                numa(gpu),
                gpu.cpuset,
                gpu.link_speed
            ));
        }
        for nic in self.nics() {
            let kind = match nic.kind {
                DeviceKind::Nic(NicKind::InfiniBand) => "IB",
                _ => "Ethernet",
            };
            let names = if nic.names.is_empty() { "-".to_owned() } else { nic.names.join(",") };
            lines.push(format!(
                "GRAPH NIC {names} pci {} numa {} cpus {} {kind} [{:04x}:{:04x}] link {:.1}GB/s",
                nic.bus_id,
                numa(nic),
                nic.cpuset,
                nic.vendor_id,
                nic.device_id,
                nic.link_speed
            ));
        }
        for (i, gpu) in gpus.iter().enumerate() {
            if let Some(nic) = self.nic_for(Near::Device(gpu.id)) {
                let loc = self.locality(gpu.id, nic.id);
                let names = if nic.names.is_empty() { nic.bus_id.to_string() } else { nic.names.join(",") };
                lines.push(format!("GRAPH GPU {i} pci {} uses NIC {names} ({loc})", gpu.bus_id));
            }
        }
        if p.devices.is_empty() {
            lines.push("GRAPH no GPU or NIC found on the PCI bus".to_owned());
        }
        lines
    }
}

/// Bytes as `24GB` (GiB, one decimal below 10), or `512MB` below 1 GiB.
fn gigabytes(bytes: u64) -> String {
    let gib = bytes as f64 / f64::from(1u32 << 30);
    if gib >= 9.95 {
        format!("{gib:.0}GB")
    } else if gib >= 1.0 {
        format!("{gib:.1}GB")
    } else {
        format!("{}MB", bytes >> 20)
    }
}

fn list(v: &[u32]) -> String {
    if v.is_empty() {
        return "-".to_owned();
    }
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests;
