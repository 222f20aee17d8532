//! The safe layer over libhwloc (feature `hwloc`): one owned topology handle, loading from
//! this machine or from XML, extraction into [`Parts`], XML export and thread binding.
//!
//! Invariants: a [`Handle`] holds a loaded topology that nothing modifies after
//! `hwloc_topology_load`, so object pointers obtained from it stay valid, and are only
//! dereferenced, while the handle is borrowed. Every hwloc failure becomes an [`Error`];
//! no path here panics on what hwloc returns (null pointers and bad values are skipped).

use std::ffi::{c_char, c_int, CStr, CString};
use std::io;
use std::path::Path;
use std::ptr::{self, NonNull};

use super::model::{BridgeHop, BusId, Core, DeviceId, DeviceKind, NumaDistances, NumaNode, Package, Parts, PciDevice};
use super::sys;
use super::CpuSet;
use crate::error::{Error, Result};

/// Upper bound on the bits read from one hwloc bitmap (guards against infinite sets).
const MAX_BITMAP_BITS: usize = 1 << 16;

/// Loads this machine's topology.
pub(crate) fn load_system() -> Result<(Parts, Option<Handle>)> {
    let handle = Handle::load_system()?;
    let parts = handle.parts();
    Ok((parts, Some(handle)))
}

/// Loads a topology from hwloc XML; `what` names the source in errors.
pub(crate) fn load_xml(xml: &[u8], what: &str) -> Result<(Parts, Option<Handle>)> {
    let handle = Handle::load_xml(xml, what)?;
    let parts = handle.parts();
    Ok((parts, Some(handle)))
}

/// An owned, loaded `hwloc_topology_t`.
pub(crate) struct Handle {
    raw: NonNull<sys::hwloc_topology>,
}

// SAFETY: an hwloc topology has no thread affinity (it is plain heap data owned by this
// handle), so it may move to another thread; `Topology` keeps the handle behind a Mutex, so
// it is never used from two threads at once.
unsafe impl Send for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: `raw` came from a successful hwloc_topology_init and is destroyed once.
        unsafe { sys::hwloc_topology_destroy(self.raw.as_ptr()) };
    }
}

/// `errno` of the hwloc call that just failed, or a generic error when it left none.
fn last_error() -> io::Error {
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(0) | None => io::Error::other("failed without an error code"),
        _ => e,
    }
}

impl Handle {
    /// An initialised, not yet loaded topology, after checking the library's ABI.
    fn init() -> Result<Self> {
        // SAFETY: no arguments, no preconditions.
        let version = unsafe { sys::hwloc_get_api_version() };
        if version >> 16 != 2 {
            let msg =
                format!("libhwloc ABI {}.{} found; ferroccl needs hwloc 2.x", version >> 16, (version >> 8) & 0xff);
            return Err(Error::system("topology: libhwloc", io::Error::new(io::ErrorKind::Unsupported, msg)));
        }
        let mut raw: sys::hwloc_topology_t = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer for the call.
        let rc = unsafe { sys::hwloc_topology_init(&raw mut raw) };
        match NonNull::new(raw) {
            Some(raw) if rc == 0 => Ok(Handle { raw }),
            _ => Err(Error::system("topology: hwloc_topology_init", last_error())),
        }
    }

    fn raw(&self) -> sys::hwloc_topology_t {
        self.raw.as_ptr()
    }

    fn set_io_filter(&self, filter: c_int) -> Result<()> {
        // SAFETY: the topology is initialised and not loaded yet, as the call requires.
        let rc = unsafe { sys::hwloc_topology_set_io_types_filter(self.raw(), filter) };
        if rc != 0 {
            return Err(Error::system("topology: hwloc_topology_set_io_types_filter", last_error()));
        }
        Ok(())
    }

    /// This machine, with the PCI devices and bridges hwloc deems important (GPUs, NICs,
    /// storage and the bridges above them).
    fn load_system() -> Result<Self> {
        let handle = Self::init()?;
        handle.set_io_filter(sys::HWLOC_TYPE_FILTER_KEEP_IMPORTANT)?;
        // SAFETY: the topology is initialised and configured.
        if unsafe { sys::hwloc_topology_load(handle.raw()) } != 0 {
            return Err(Error::system("topology: hwloc_topology_load", last_error()));
        }
        Ok(handle)
    }

    /// A topology from hwloc XML, keeping every I/O object the file has.
    fn load_xml(xml: &[u8], what: &str) -> Result<Self> {
        let bad = |why: String| Error::invalid_argument(format!("topology XML {what}: {why}"));
        let text = CString::new(xml).map_err(|_| bad("contains a NUL byte".into()))?;
        // hwloc's buffer length counts the terminating NUL, as its exporter reports it.
        let size = c_int::try_from(xml.len() + 1).map_err(|_| bad("too large".into()))?;
        let handle = Self::init()?;
        handle.set_io_filter(sys::HWLOC_TYPE_FILTER_KEEP_ALL)?;
        // SAFETY: `text` is NUL-terminated, `size` bytes long, and outlives the load below,
        // which is when hwloc reads it.
        if unsafe { sys::hwloc_topology_set_xmlbuffer(handle.raw(), text.as_ptr(), size) } != 0 {
            return Err(bad(format!("hwloc cannot read it ({})", last_error())));
        }
        // SAFETY: initialised and configured; `text` is still alive.
        if unsafe { sys::hwloc_topology_load(handle.raw()) } != 0 {
            return Err(bad(format!("hwloc cannot load it ({})", last_error())));
        }
        Ok(handle)
    }

    /// Whether hwloc considers the topology to be the running machine's (false for XML).
    pub(crate) fn is_this_system(&self) -> bool {
        // SAFETY: the topology is loaded.
        unsafe { sys::hwloc_topology_is_thissystem(self.raw()) == 1 }
    }

    /// The topology as hwloc v2 XML text.
    pub(crate) fn export_xml(&self) -> Result<String> {
        let mut buf: *mut c_char = ptr::null_mut();
        let mut len: c_int = 0;
        // SAFETY: the topology is loaded; both out-pointers are valid for the call.
        let rc = unsafe { sys::hwloc_topology_export_xmlbuffer(self.raw(), &raw mut buf, &raw mut len, 0) };
        if rc != 0 || buf.is_null() {
            return Err(Error::system("topology: hwloc_topology_export_xmlbuffer", last_error()));
        }
        // SAFETY: on success hwloc returns a NUL-terminated buffer it allocated; we copy it
        // out and free it exactly once, with the matching hwloc function.
        let xml = unsafe {
            let xml = CStr::from_ptr(buf).to_string_lossy().into_owned();
            sys::hwloc_free_xmlbuffer(self.raw(), buf);
            xml
        };
        Ok(xml)
    }

    /// Writes the topology as hwloc v2 XML to `path`.
    pub(crate) fn export_xml_file(&self, path: &Path) -> Result<()> {
        let shown = path.display();
        let c_path = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::invalid_argument(format!("topology dump path {shown}: contains a NUL byte")))?;
        // SAFETY: the topology is loaded; `c_path` is a NUL-terminated path alive for the call.
        if unsafe { sys::hwloc_topology_export_xml(self.raw(), c_path.as_ptr(), 0) } != 0 {
            return Err(Error::system(format!("topology: hwloc_topology_export_xml({shown})"), last_error()));
        }
        Ok(())
    }

    /// Binds the calling thread to `set` (`hwloc_set_cpubind` with `HWLOC_CPUBIND_THREAD`).
    pub(crate) fn bind_thread(&self, set: &CpuSet) -> io::Result<()> {
        let bitmap = Bitmap::from_set(set)?;
        // SAFETY: the topology is loaded and the bitmap is a valid hwloc bitmap.
        if unsafe { sys::hwloc_set_cpubind(self.raw(), bitmap.raw(), sys::HWLOC_CPUBIND_THREAD) } != 0 {
            return Err(last_error());
        }
        Ok(())
    }

    /// The processors the calling thread may run on.
    pub(crate) fn thread_binding(&self) -> io::Result<CpuSet> {
        let bitmap = Bitmap::new()?;
        // SAFETY: the topology is loaded and the bitmap is a valid, writable hwloc bitmap.
        if unsafe { sys::hwloc_get_cpubind(self.raw(), bitmap.raw(), sys::HWLOC_CPUBIND_THREAD) } != 0 {
            return Err(last_error());
        }
        // SAFETY: the bitmap is valid and alive.
        Ok(unsafe { bitmap_to_set(bitmap.raw()) })
    }

    /// The depth of a normal object type, if the topology has one level of it.
    fn depth_of(&self, type_: c_int) -> Option<c_int> {
        // SAFETY: the topology is loaded.
        let depth = unsafe { sys::hwloc_get_type_depth(self.raw(), type_) };
        (depth != sys::HWLOC_TYPE_DEPTH_UNKNOWN && depth != sys::HWLOC_TYPE_DEPTH_MULTIPLE).then_some(depth)
    }

    /// The objects at `depth` (normal or virtual), in logical order.
    fn objects(&self, depth: c_int) -> Vec<&sys::hwloc_obj> {
        // SAFETY: the topology is loaded; any depth is accepted (unknown ones have 0 objects).
        let n = unsafe { sys::hwloc_get_nbobjs_by_depth(self.raw(), depth) };
        (0..n)
            // SAFETY: `i` is below the count at this depth; the object lives as long as
            // `self` and is not modified, so a shared reference bounded by `&self` is sound.
            .filter_map(|i| unsafe { sys::hwloc_get_obj_by_depth(self.raw(), depth, i).as_ref() })
            .collect()
    }

    /// Everything ferroccl reads from the topology.
    fn parts(&self) -> Parts {
        let root = self.objects(0).into_iter().next();
        let mut packages: Vec<Package> = match self.depth_of(sys::HWLOC_OBJ_PACKAGE) {
            Some(d) => self
                .objects(d)
                .into_iter()
                .map(|p| Package { os_index: p.os_index, cpuset: cpuset(p), numa_nodes: Vec::new(), cores: 0 })
                .collect(),
            None => Vec::new(),
        };
        let package_of = |o: &sys::hwloc_obj| ancestor(o, sys::HWLOC_OBJ_PACKAGE).map(|p| p.os_index);
        let numa_nodes: Vec<NumaNode> = self
            .objects(sys::HWLOC_TYPE_DEPTH_NUMANODE)
            .into_iter()
            .map(|n| {
                // SAFETY: a NUMA node's `attr` is null or points at the attribute union,
                // whose `numanode` member starts at offset 0.
                let memory =
                    unsafe { n.attr.cast::<sys::hwloc_numanode_attr_s>().as_ref() }.map_or(0, |a| a.local_memory);
                NumaNode { os_index: n.os_index, cpuset: cpuset(n), memory, package: package_of(n) }
            })
            .collect();
        let cores: Vec<Core> = match self.depth_of(sys::HWLOC_OBJ_CORE) {
            Some(d) => self
                .objects(d)
                .into_iter()
                .map(|c| Core { os_index: c.os_index, package: package_of(c), cpuset: cpuset(c) })
                .collect(),
            None => Vec::new(),
        };
        for pkg in &mut packages {
            pkg.numa_nodes =
                numa_nodes.iter().filter(|n| n.package == Some(pkg.os_index)).map(|n| n.os_index).collect();
            pkg.cores = cores.iter().filter(|c| c.package == Some(pkg.os_index)).count();
        }
        let pu_count = self.depth_of(sys::HWLOC_OBJ_PU).map_or(0, |d| self.objects(d).len());
        let devices = self.objects(sys::HWLOC_TYPE_DEPTH_PCI_DEVICE).into_iter().filter_map(pci_device).collect();
        Parts {
            cpuset: root.map(cpuset).unwrap_or_default(),
            total_memory: root.map_or(0, |r| r.total_memory),
            packages,
            numa_nodes,
            cores,
            pu_count,
            devices,
            distances: self.numa_distances(),
        }
    }

    /// hwloc's first NUMA latency matrix, if the topology has one.
    fn numa_distances(&self) -> Option<NumaDistances> {
        let mut nr: std::ffi::c_uint = 1;
        let mut dist: *mut sys::hwloc_distances_s = ptr::null_mut();
        // SAFETY: the topology is loaded; `nr` = 1 says `dist` has room for one pointer.
        let rc = unsafe {
            sys::hwloc_distances_get_by_depth(
                self.raw(),
                sys::HWLOC_TYPE_DEPTH_NUMANODE,
                &raw mut nr,
                &raw mut dist,
                sys::HWLOC_DISTANCES_KIND_MEANS_LATENCY,
                0,
            )
        };
        if rc != 0 || nr == 0 || dist.is_null() {
            return None;
        }
        // SAFETY: on success `dist` points at a matrix of `nbobjs` objects and
        // `nbobjs * nbobjs` values, valid until released; we copy what we need, then
        // release it exactly once.
        unsafe {
            let d = &*dist;
            let n = d.nbobjs as usize;
            let copied = if n == 0 || d.objs.is_null() || d.values.is_null() {
                None
            } else {
                let objs = std::slice::from_raw_parts(d.objs, n);
                let nodes: Option<Vec<u32>> = objs.iter().map(|o| o.as_ref().map(|o| o.os_index)).collect();
                let values = std::slice::from_raw_parts(d.values, n * n).to_vec();
                let name = sys::hwloc_distances_get_name(self.raw(), dist);
                let name = (!name.is_null()).then(|| CStr::from_ptr(name).to_string_lossy().into_owned());
                nodes.map(|nodes| NumaDistances { name, nodes, values })
            };
            sys::hwloc_distances_release(self.raw(), dist);
            copied
        }
    }
}

/// A GPU or NIC from a PCI device object; `None` for other devices.
fn pci_device(o: &sys::hwloc_obj) -> Option<PciDevice> {
    // SAFETY: a PCI device's `attr` is null or points at the attribute union, whose
    // `pcidev` member starts at offset 0.
    let pci = unsafe { o.attr.cast::<sys::hwloc_pcidev_attr_s>().as_ref() }?;
    let kind = DeviceKind::classify(pci.vendor_id, pci.class_id)?;
    let mut names = Vec::new();
    let mut child = o.io_first_child;
    // SAFETY: I/O children form a null-terminated sibling list of live objects.
    while let Some(c) = unsafe { child.as_ref() } {
        if c.type_ == sys::HWLOC_OBJ_OS_DEVICE && !c.name.is_null() {
            // SAFETY: an object's non-null name is a NUL-terminated string it owns.
            names.push(unsafe { CStr::from_ptr(c.name) }.to_string_lossy().into_owned());
        }
        child = c.next_sibling;
    }
    // Up through the I/O tree (bridges) to the first object with a cpuset: the CPU side.
    let mut path = Vec::new();
    let mut up = o.parent;
    let mut anchor = None;
    // SAFETY: parent pointers lead to live objects and end at the root (null parent).
    while let Some(p) = unsafe { up.as_ref() } {
        if !p.cpuset.is_null() {
            anchor = Some(p);
            break;
        }
        if p.type_ == sys::HWLOC_OBJ_BRIDGE {
            // SAFETY: a bridge's `attr` is null or points at the union, whose `bridge`
            // member starts at offset 0.
            let host = unsafe { p.attr.cast::<sys::hwloc_bridge_attr_s>().as_ref() }
                .is_none_or(|b| b.upstream_type == sys::HWLOC_OBJ_BRIDGE_HOST);
            path.push(BridgeHop { key: p.gp_index, host });
        }
        up = p.parent;
    }
    Some(PciDevice {
        id: DeviceId(0),
        kind,
        bus_id: BusId { domain: u32::from(pci.domain), bus: pci.bus, device: pci.dev, function: pci.func },
        vendor_id: pci.vendor_id,
        device_id: pci.device_id,
        class_id: pci.class_id,
        names,
        cpuset: anchor.map(cpuset).unwrap_or_default(),
        // SAFETY: the anchor's nodeset is null or a valid bitmap owned by it.
        numa_nodes: anchor.map(|a| unsafe { bitmap_to_set(a.nodeset) }.iter().collect()).unwrap_or_default(),
        link_speed: pci.linkspeed,
        path,
    })
}

/// The nearest ancestor of type `type_`.
fn ancestor(o: &sys::hwloc_obj, type_: c_int) -> Option<&sys::hwloc_obj> {
    let mut up = o.parent;
    // SAFETY: parent pointers lead to live objects and end at the root (null parent).
    while let Some(p) = unsafe { up.as_ref() } {
        if p.type_ == type_ {
            return Some(p);
        }
        up = p.parent;
    }
    None
}

fn cpuset(o: &sys::hwloc_obj) -> CpuSet {
    // SAFETY: an object's cpuset is null (I/O objects) or a valid bitmap owned by it.
    unsafe { bitmap_to_set(o.cpuset) }
}

/// The bits of an hwloc bitmap (at most [`MAX_BITMAP_BITS`]).
///
/// # Safety
/// `b` is null or a valid hwloc bitmap that stays alive and unmodified during the call.
unsafe fn bitmap_to_set(b: sys::hwloc_const_bitmap_t) -> CpuSet {
    if b.is_null() {
        return CpuSet::new();
    }
    let mut bits = Vec::new();
    // SAFETY: `b` is a valid bitmap (caller's contract).
    let mut i = unsafe { sys::hwloc_bitmap_first(b) };
    while let Ok(bit) = u32::try_from(i) {
        bits.push(bit);
        if bits.len() >= MAX_BITMAP_BITS {
            break;
        }
        // SAFETY: as above.
        i = unsafe { sys::hwloc_bitmap_next(b, i) };
    }
    bits.into_iter().collect()
}

/// An owned hwloc bitmap.
struct Bitmap(NonNull<sys::hwloc_bitmap_s>);

impl Bitmap {
    fn new() -> io::Result<Self> {
        // SAFETY: no preconditions; null means out of memory.
        NonNull::new(unsafe { sys::hwloc_bitmap_alloc() })
            .map(Bitmap)
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))
    }

    fn from_set(set: &CpuSet) -> io::Result<Self> {
        let bitmap = Self::new()?;
        for cpu in set.iter() {
            // SAFETY: the bitmap is valid and owned by us.
            if unsafe { sys::hwloc_bitmap_set(bitmap.0.as_ptr(), cpu) } != 0 {
                return Err(io::Error::from(io::ErrorKind::OutOfMemory));
            }
        }
        Ok(bitmap)
    }

    fn raw(&self) -> sys::hwloc_bitmap_t {
        self.0.as_ptr()
    }
}

impl Drop for Bitmap {
    fn drop(&mut self) {
        // SAFETY: allocated by hwloc_bitmap_alloc and freed once.
        unsafe { sys::hwloc_bitmap_free(self.0.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmaps_round_trip() {
        let set = CpuSet::parse_list("0-2,64,130").unwrap();
        let bitmap = Bitmap::from_set(&set).unwrap();
        // SAFETY: the bitmap is valid and alive.
        assert_eq!(unsafe { bitmap_to_set(bitmap.raw()) }, set);
        // SAFETY: null is allowed.
        assert!(unsafe { bitmap_to_set(ptr::null()) }.is_empty());
    }
}
