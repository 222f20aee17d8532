//! Raw declarations for the part of libhwloc 2.x's C API that ferroccl uses (a thin
//! hand-written binding: no bindgen, no crate). Types mirror `hwloc.h` of hwloc 2.x on
//! LP64 targets; the layout assertions at the bottom pin the offsets measured with the C
//! compiler against Debian 12's libhwloc-dev 2.9.0 (`offsetof`), and `hwloc.rs` refuses
//! a library whose ABI major version is not 2 (`hwloc_get_api_version() >> 16`).
//!
//! Caveat: hwloc built with `--enable-32bits-pci-domain` widens `domain` in
//! `hwloc_pcidev_attr_s`; distributions (Debian, Ubuntu, RHEL) do not enable it.
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_ulong, c_void};

/// `struct hwloc_topology` (opaque).
#[repr(C)]
pub struct hwloc_topology {
    _private: [u8; 0],
}
pub type hwloc_topology_t = *mut hwloc_topology;
/// `struct hwloc_bitmap_s` (opaque).
#[repr(C)]
pub struct hwloc_bitmap_s {
    _private: [u8; 0],
}
pub type hwloc_bitmap_t = *mut hwloc_bitmap_s;
pub type hwloc_const_bitmap_t = *const hwloc_bitmap_s;
pub type hwloc_obj_t = *mut hwloc_obj;

// enum hwloc_obj_type_t
pub const HWLOC_OBJ_PACKAGE: c_int = 1;
pub const HWLOC_OBJ_CORE: c_int = 2;
pub const HWLOC_OBJ_PU: c_int = 3;
pub const HWLOC_OBJ_BRIDGE: c_int = 14;
pub const HWLOC_OBJ_OS_DEVICE: c_int = 16;
// enum hwloc_obj_bridge_type_e
pub const HWLOC_OBJ_BRIDGE_HOST: c_int = 0;
// enum hwloc_get_type_depth_e
pub const HWLOC_TYPE_DEPTH_UNKNOWN: c_int = -1;
pub const HWLOC_TYPE_DEPTH_MULTIPLE: c_int = -2;
pub const HWLOC_TYPE_DEPTH_NUMANODE: c_int = -3;
pub const HWLOC_TYPE_DEPTH_PCI_DEVICE: c_int = -5;
// enum hwloc_type_filter_e
pub const HWLOC_TYPE_FILTER_KEEP_ALL: c_int = 0;
pub const HWLOC_TYPE_FILTER_KEEP_IMPORTANT: c_int = 3;
// enum hwloc_cpubind_flags_t
pub const HWLOC_CPUBIND_THREAD: c_int = 1 << 1;
// enum hwloc_distances_kind_e
pub const HWLOC_DISTANCES_KIND_MEANS_LATENCY: c_ulong = 1 << 2;

/// `struct hwloc_obj` (hwloc 2.x).
#[repr(C)]
pub struct hwloc_obj {
    pub type_: c_int,
    pub subtype: *mut c_char,
    pub os_index: c_uint,
    pub name: *mut c_char,
    pub total_memory: u64,
    pub attr: *mut c_void,
    pub depth: c_int,
    pub logical_index: c_uint,
    pub next_cousin: hwloc_obj_t,
    pub prev_cousin: hwloc_obj_t,
    pub parent: hwloc_obj_t,
    pub sibling_rank: c_uint,
    pub next_sibling: hwloc_obj_t,
    pub prev_sibling: hwloc_obj_t,
    pub arity: c_uint,
    pub children: *mut hwloc_obj_t,
    pub first_child: hwloc_obj_t,
    pub last_child: hwloc_obj_t,
    pub symmetric_subtree: c_int,
    pub memory_arity: c_uint,
    pub memory_first_child: hwloc_obj_t,
    pub io_arity: c_uint,
    pub io_first_child: hwloc_obj_t,
    pub misc_arity: c_uint,
    pub misc_first_child: hwloc_obj_t,
    pub cpuset: hwloc_bitmap_t,
    pub complete_cpuset: hwloc_bitmap_t,
    pub nodeset: hwloc_bitmap_t,
    pub complete_nodeset: hwloc_bitmap_t,
    pub infos: *mut c_void,
    pub infos_count: c_uint,
    pub userdata: *mut c_void,
    pub gp_index: u64,
}

/// `union hwloc_obj_attr_u`'s `numanode` member (all members start at offset 0).
#[repr(C)]
pub struct hwloc_numanode_attr_s {
    pub local_memory: u64,
    pub page_types_len: c_uint,
    pub page_types: *mut c_void,
}

/// `struct hwloc_pcidev_attr_s`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct hwloc_pcidev_attr_s {
    pub domain: u16,
    pub bus: u8,
    pub dev: u8,
    pub func: u8,
    pub class_id: u16,
    pub vendor_id: u16,
    pub device_id: u16,
    pub subvendor_id: u16,
    pub subdevice_id: u16,
    pub revision: u8,
    pub linkspeed: f32,
}

/// `struct hwloc_bridge_attr_s` (the unions reduced to their only, PCI, member).
#[repr(C)]
pub struct hwloc_bridge_attr_s {
    pub upstream_pci: hwloc_pcidev_attr_s,
    pub upstream_type: c_int,
    pub downstream_domain: u16,
    pub downstream_secondary_bus: u8,
    pub downstream_subordinate_bus: u8,
    pub downstream_type: c_int,
    pub depth: c_uint,
}

/// `struct hwloc_distances_s`.
#[repr(C)]
pub struct hwloc_distances_s {
    pub nbobjs: c_uint,
    pub objs: *mut hwloc_obj_t,
    pub kind: c_ulong,
    pub values: *mut u64,
}

#[link(name = "hwloc")]
extern "C" {
    pub fn hwloc_get_api_version() -> c_uint;
    pub fn hwloc_topology_init(topologyp: *mut hwloc_topology_t) -> c_int;
    pub fn hwloc_topology_load(topology: hwloc_topology_t) -> c_int;
    pub fn hwloc_topology_destroy(topology: hwloc_topology_t);
    pub fn hwloc_topology_set_io_types_filter(topology: hwloc_topology_t, filter: c_int) -> c_int;
    pub fn hwloc_topology_set_xmlbuffer(topology: hwloc_topology_t, buffer: *const c_char, size: c_int) -> c_int;
    pub fn hwloc_topology_is_thissystem(topology: hwloc_topology_t) -> c_int;
    pub fn hwloc_topology_export_xml(topology: hwloc_topology_t, xmlpath: *const c_char, flags: c_ulong) -> c_int;
    pub fn hwloc_topology_export_xmlbuffer(
        topology: hwloc_topology_t,
        xmlbuffer: *mut *mut c_char,
        buflen: *mut c_int,
        flags: c_ulong,
    ) -> c_int;
    pub fn hwloc_free_xmlbuffer(topology: hwloc_topology_t, xmlbuffer: *mut c_char);
    pub fn hwloc_get_type_depth(topology: hwloc_topology_t, type_: c_int) -> c_int;
    pub fn hwloc_get_nbobjs_by_depth(topology: hwloc_topology_t, depth: c_int) -> c_uint;
    pub fn hwloc_get_obj_by_depth(topology: hwloc_topology_t, depth: c_int, idx: c_uint) -> hwloc_obj_t;
    pub fn hwloc_distances_get_by_depth(
        topology: hwloc_topology_t,
        depth: c_int,
        nr: *mut c_uint,
        distances: *mut *mut hwloc_distances_s,
        kind: c_ulong,
        flags: c_ulong,
    ) -> c_int;
    pub fn hwloc_distances_get_name(topology: hwloc_topology_t, distances: *mut hwloc_distances_s) -> *const c_char;
    pub fn hwloc_distances_release(topology: hwloc_topology_t, distances: *mut hwloc_distances_s);
    pub fn hwloc_set_cpubind(topology: hwloc_topology_t, set: hwloc_const_bitmap_t, flags: c_int) -> c_int;
    pub fn hwloc_get_cpubind(topology: hwloc_topology_t, set: hwloc_bitmap_t, flags: c_int) -> c_int;
    pub fn hwloc_bitmap_alloc() -> hwloc_bitmap_t;
    pub fn hwloc_bitmap_free(bitmap: hwloc_bitmap_t);
    pub fn hwloc_bitmap_set(bitmap: hwloc_bitmap_t, id: c_uint) -> c_int;
    pub fn hwloc_bitmap_first(bitmap: hwloc_const_bitmap_t) -> c_int;
    pub fn hwloc_bitmap_next(bitmap: hwloc_const_bitmap_t, prev: c_int) -> c_int;
}

// Offsets measured with `offsetof` against hwloc 2.9.0's headers on x86_64.
#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<hwloc_obj>() == 248);
    assert!(offset_of!(hwloc_obj, os_index) == 16);
    assert!(offset_of!(hwloc_obj, total_memory) == 32);
    assert!(offset_of!(hwloc_obj, attr) == 40);
    assert!(offset_of!(hwloc_obj, parent) == 72);
    assert!(offset_of!(hwloc_obj, next_sibling) == 88);
    assert!(offset_of!(hwloc_obj, io_first_child) == 160);
    assert!(offset_of!(hwloc_obj, cpuset) == 184);
    assert!(offset_of!(hwloc_obj, nodeset) == 200);
    assert!(offset_of!(hwloc_obj, gp_index) == 240);
    assert!(size_of::<hwloc_pcidev_attr_s>() == 24);
    assert!(offset_of!(hwloc_pcidev_attr_s, class_id) == 6);
    assert!(offset_of!(hwloc_pcidev_attr_s, vendor_id) == 8);
    assert!(offset_of!(hwloc_pcidev_attr_s, revision) == 16);
    assert!(offset_of!(hwloc_pcidev_attr_s, linkspeed) == 20);
    assert!(offset_of!(hwloc_bridge_attr_s, upstream_type) == 24);
    assert!(offset_of!(hwloc_bridge_attr_s, downstream_domain) == 28);
    assert!(offset_of!(hwloc_bridge_attr_s, downstream_type) == 32);
    assert!(offset_of!(hwloc_bridge_attr_s, depth) == 36);
    assert!(offset_of!(hwloc_distances_s, objs) == 8);
    assert!(offset_of!(hwloc_distances_s, values) == 24);
};
