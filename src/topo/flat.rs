//! A flat view of this machine without hwloc: one package and one NUMA node holding the
//! processors this process may run on, and no PCI devices. The backend of builds without
//! the `hwloc` feature, and what [`super::Topology::system`] falls back to when hwloc fails.

use super::model::{NumaNode, Package, Parts};
use super::CpuSet;

/// This machine, flat.
pub(crate) fn parts() -> Parts {
    let cpuset = allowed_cpus();
    let total_memory = physical_memory();
    Parts {
        packages: vec![Package { os_index: 0, cpuset: cpuset.clone(), numa_nodes: vec![0], cores: cpuset.len() }],
        numa_nodes: vec![NumaNode { os_index: 0, cpuset: cpuset.clone(), memory: total_memory, package: Some(0) }],
        pu_count: cpuset.len(),
        cpuset,
        total_memory,
        ..Parts::default()
    }
}

#[cfg(target_os = "linux")]
fn allowed_cpus() -> CpuSet {
    // SAFETY: cpu_set_t is plain data; all-zero is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live cpu_set_t of the size passed; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &raw mut set) };
    if rc != 0 {
        return every_cpu();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `i` is below CPU_SETSIZE, the capacity of `set`.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .filter_map(|i| u32::try_from(i).ok())
        .collect()
}

#[cfg(not(target_os = "linux"))]
fn allowed_cpus() -> CpuSet {
    every_cpu()
}

fn every_cpu() -> CpuSet {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    (0..u32::try_from(n).unwrap_or(u32::MAX)).collect()
}

fn physical_memory() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, page_size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    match (u64::try_from(pages), u64::try_from(page_size)) {
        (Ok(p), Ok(s)) => p.saturating_mul(s),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn flat_view_has_this_process_cpus() {
        let p = super::parts();
        assert!(!p.cpuset.is_empty());
        assert_eq!(p.pu_count, p.cpuset.len());
        assert!(p.total_memory > 0);
        assert!(p.devices.is_empty());
    }
}
