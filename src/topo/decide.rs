//! Placement decisions: pure functions over a [`Topology`]'s data (no hwloc calls), so
//! they are tested on synthetic topologies.
//!
//! - [`Topology::locality`] / [`Topology::numa_locality`]: NCCL-style path types.
//! - [`Topology::cpuset_near`]: where a thread serving a device or NUMA node should run.
//! - [`Topology::socket_helper_cpus`]: where the socket transport's helper threads run.
//! - [`Topology::nic_for`]: the network adapter for a GPU or NUMA node, by proximity
//!   (same PCIe switch, then same NUMA node, then NUMA distance), then link speed; exact
//!   ties spread GPUs over the tied NICs in bus order, otherwise the lowest bus id wins.

use std::cmp::Reverse;

use super::{CpuSet, DeviceId, Locality, Near, PciDevice, Topology};

/// Sort key of a candidate NIC: smaller is better.
type NicKey = (Locality, u64, Reverse<u64>);

impl Topology {
    /// How far apart two devices are: `PIX` when both sit at most one bridge below a
    /// shared PCIe switch (or one device is asked about itself), `PXB` when they share a
    /// switch further up, `PHB` when they meet at the host bridge or share a NUMA node,
    /// else `SYS`. Unknown ids count as `SYS`.
    pub fn locality(&self, a: DeviceId, b: DeviceId) -> Locality {
        let (Some(da), Some(db)) = (self.device(a), self.device(b)) else {
            return Locality::Sys;
        };
        if a == b {
            return Locality::Pix;
        }
        for (i, hop) in da.path.iter().enumerate() {
            if let Some(j) = db.path.iter().position(|h| h.key == hop.key) {
                return match (hop.host, i <= 1 && j <= 1) {
                    (true, _) => Locality::Phb,
                    (false, true) => Locality::Pix,
                    (false, false) => Locality::Pxb,
                };
            }
        }
        let shares_node = da.numa_nodes.iter().any(|n| db.numa_nodes.contains(n));
        let both_unplaced = da.numa_nodes.is_empty() && db.numa_nodes.is_empty();
        if shares_node || (both_unplaced && da.cpuset.intersects(&db.cpuset)) {
            Locality::Phb
        } else {
            Locality::Sys
        }
    }

    /// How far a device is from a NUMA node: `PHB` when the node is local to the device,
    /// else `SYS`. Unknown ids count as `SYS`.
    pub fn numa_locality(&self, device: DeviceId, node: u32) -> Locality {
        match self.device(device) {
            Some(d) if d.numa_nodes.contains(&node) => Locality::Phb,
            _ => Locality::Sys,
        }
    }

    /// Where to bind a thread that serves `near` (a NIC's or GPU's progress thread, or a
    /// helper working on a NUMA node's memory): the processors local to the device, or the
    /// node's processors (its package's for a memory-only node). Falls back to the whole
    /// machine when the locality is unknown, so the result is never narrower than it should
    /// be and is empty only for an empty machine.
    pub fn cpuset_near(&self, near: Near) -> CpuSet {
        let local = match near {
            Near::Device(id) => self.device(id).map(|d| d.cpuset.clone()),
            Near::Numa(node) => self.numa_node(node).map(|n| {
                if n.cpuset.is_empty() {
                    n.package
                        .and_then(|p| self.packages().iter().find(|pkg| pkg.os_index == p))
                        .map(|pkg| pkg.cpuset.clone())
                        .unwrap_or_default()
                } else {
                    n.cpuset.clone()
                }
            }),
        };
        local.filter(|c| !c.is_empty()).unwrap_or_else(|| self.cpuset().clone())
    }

    /// Where the socket transport's helper threads (acceptor, striped senders and
    /// receivers) should run: near the NIC behind interface `ifname` when the topology knows
    /// it, else near the NUMA node of `creator_cpu` (the thread that made the communicator,
    /// whose memory the helpers read and write). `None` when that is the whole machine
    /// (binding would change nothing) or nothing is known.
    pub fn socket_helper_cpus(&self, ifname: &str, creator_cpu: Option<u32>) -> Option<CpuSet> {
        let near = match self.device_by_name(ifname) {
            Some(nic) => Near::Device(nic.id),
            None => {
                let cpu = creator_cpu?;
                Near::Numa(self.numa_nodes().iter().find(|n| n.cpuset.contains(cpu))?.os_index)
            }
        };
        let cpus = self.cpuset_near(near);
        (!cpus.is_empty() && cpus != *self.cpuset()).then_some(cpus)
    }

    /// The NIC to use for `near`, among all NICs: see [`Topology::nic_for_among`].
    pub fn nic_for(&self, near: Near) -> Option<&PciDevice> {
        let nics: Vec<DeviceId> = self.nics().map(|d| d.id).collect();
        self.nic_for_among(near, &nics)
    }

    /// The NIC to use for `near` among `allowed` (ids that are not NICs of this topology
    /// are ignored): a NIC asked about itself is its own answer; otherwise the nearest by
    /// [`Locality`] (same switch > same NUMA node > elsewhere), then the smallest NUMA
    /// distance, then the fastest PCIe link. NICs still tied are handed out over the GPUs
    /// that tie on exactly the same NICs, both in bus order (GPU k gets NIC k mod n); for a
    /// NUMA node or a non-GPU device the lowest bus id wins. `None` when no NIC qualifies.
    pub fn nic_for_among(&self, near: Near, allowed: &[DeviceId]) -> Option<&PciDevice> {
        let mut candidates: Vec<&PciDevice> =
            allowed.iter().filter_map(|&id| self.device(id)).filter(|d| d.is_nic()).collect();
        candidates.sort_by_key(|d| d.id);
        candidates.dedup_by_key(|d| d.id);
        if let Near::Device(id) = near {
            if let Some(me) = candidates.iter().find(|d| d.id == id) {
                return Some(me);
            }
        }
        let best = self.best_nics(near, &candidates);
        match (near, best.as_slice()) {
            (_, []) => None,
            (_, [only]) => Some(only),
            (Near::Device(id), tied) if self.device(id).is_some_and(PciDevice::is_gpu) => {
                let sharing: Vec<DeviceId> = self
                    .gpus()
                    .filter(|g| g.id == id || self.best_nics(Near::Device(g.id), &candidates) == best)
                    .map(|g| g.id)
                    .collect();
                let k = sharing.iter().position(|&g| g == id).unwrap_or(0);
                Some(tied[k % tied.len()])
            }
            (_, tied) => Some(tied[0]),
        }
    }

    /// The candidates with the smallest key, in bus order.
    fn best_nics<'a>(&self, near: Near, candidates: &[&'a PciDevice]) -> Vec<&'a PciDevice> {
        let keyed: Vec<(NicKey, &PciDevice)> = candidates.iter().map(|&nic| (self.nic_key(near, nic), nic)).collect();
        let Some(best) = keyed.iter().map(|(k, _)| *k).min() else {
            return Vec::new();
        };
        keyed.into_iter().filter(|(k, _)| *k == best).map(|(_, nic)| nic).collect()
    }

    fn nic_key(&self, near: Near, nic: &PciDevice) -> NicKey {
        let (locality, from) = match near {
            Near::Device(id) => (self.locality(id, nic.id), self.device(id).and_then(PciDevice::numa)),
            Near::Numa(node) => (self.numa_locality(nic.id, node), Some(node)),
        };
        let distance = match (from, nic.numa()) {
            (Some(a), Some(b)) => self.numa_distance(a, b).unwrap_or(u64::MAX),
            _ => u64::MAX,
        };
        // MB/s, so that equal speeds compare equal.
        let speed =
            if nic.link_speed.is_finite() && nic.link_speed > 0.0 { (nic.link_speed * 1000.0) as u64 } else { 0 };
        (locality, distance, Reverse(speed))
    }
}

#[cfg(test)]
mod tests {
    use super::super::model::{BridgeHop, BusId, DeviceKind, NicKind, NumaDistances, NumaNode, Package, Parts};
    use super::*;

    fn bus(bus: u8) -> BusId {
        BusId { domain: 0, bus, device: 0, function: 0 }
    }

    fn dev(kind: DeviceKind, b: u8, names: &[&str], node: u32, path: &[(u64, bool)], speed: f32) -> PciDevice {
        PciDevice {
            id: DeviceId(0),
            kind,
            bus_id: bus(b),
            vendor_id: 0x15b3,
            device_id: 0,
            class_id: 0x0200,
            names: names.iter().map(|s| (*s).to_owned()).collect(),
            cpuset: CpuSet::range(node * 4, node * 4 + 3),
            numa_nodes: vec![node],
            link_speed: speed,
            path: path.iter().map(|&(key, host)| BridgeHop { key, host }).collect(),
        }
    }

    /// Two NUMA nodes (cpus 0-3, 4-7); node 0 has one switch (bridge 2 under root port 1,
    /// host bridge 0) with two GPUs and two identical NICs; node 1 has one NIC.
    fn hand_built() -> Topology {
        let eth = DeviceKind::Nic(NicKind::Ethernet);
        let switch0 = [(2, false), (1, false), (0, true)];
        let parts = Parts {
            cpuset: CpuSet::range(0, 7),
            total_memory: 2 << 30,
            packages: vec![Package { os_index: 0, cpuset: CpuSet::range(0, 7), numa_nodes: vec![0, 1], cores: 8 }],
            numa_nodes: vec![
                NumaNode { os_index: 0, cpuset: CpuSet::range(0, 3), memory: 1 << 30, package: Some(0) },
                NumaNode { os_index: 1, cpuset: CpuSet::range(4, 7), memory: 1 << 30, package: Some(0) },
                NumaNode { os_index: 2, cpuset: CpuSet::new(), memory: 1 << 30, package: Some(0) },
            ],
            cores: Vec::new(),
            pu_count: 8,
            devices: vec![
                dev(eth, 0x20, &["eth1"], 1, &[(10, true)], 25.0),
                dev(DeviceKind::Gpu, 0x04, &[], 0, &switch0, 32.0),
                dev(eth, 0x06, &["mlx5_1"], 0, &switch0, 32.0),
                dev(DeviceKind::Gpu, 0x03, &[], 0, &switch0, 32.0),
                dev(eth, 0x05, &["mlx5_0"], 0, &switch0, 32.0),
            ],
            distances: Some(NumaDistances { name: None, nodes: vec![0, 1], values: vec![10, 20, 20, 10] }),
        };
        Topology::from_parts(parts, super::super::Source::XmlString, None)
    }

    fn id(t: &Topology, name: &str) -> DeviceId {
        t.device_by_name(name).unwrap().id
    }

    #[test]
    fn tied_nics_are_spread_over_gpus_in_bus_order() {
        let t = hand_built();
        let gpus: Vec<DeviceId> = t.gpus().map(|g| g.id).collect();
        assert_eq!(gpus.len(), 2);
        assert_eq!(t.device(gpus[0]).unwrap().bus_id, bus(3), "devices are in bus order");
        let picks: Vec<String> = gpus.iter().map(|&g| t.nic_for(Near::Device(g)).unwrap().name()).collect();
        assert_eq!(picks, ["mlx5_0", "mlx5_1"]);
        // Deterministic: asking again gives the same answers.
        assert_eq!(t.nic_for(Near::Device(gpus[1])).unwrap().name(), "mlx5_1");
        // NUMA node 0: tie between the two switch NICs, lowest bus id; node 1: its own NIC.
        assert_eq!(t.nic_for(Near::Numa(0)).unwrap().name(), "mlx5_0");
        assert_eq!(t.nic_for(Near::Numa(1)).unwrap().name(), "eth1");
        // A NIC is its own answer; restricted candidates are honoured.
        let eth1 = id(&t, "eth1");
        assert_eq!(t.nic_for(Near::Device(eth1)).unwrap().name(), "eth1");
        assert_eq!(t.nic_for_among(Near::Device(gpus[0]), &[eth1, gpus[1]]).unwrap().name(), "eth1");
        assert!(t.nic_for_among(Near::Device(gpus[0]), &[]).is_none());
        assert!(t.nic_for_among(Near::Device(gpus[0]), &[gpus[1]]).is_none(), "a GPU is no NIC");
    }

    #[test]
    fn localities() {
        let t = hand_built();
        let (g0, m0, eth1) = (t.gpus().next().unwrap().id, id(&t, "mlx5_0"), id(&t, "eth1"));
        assert_eq!(t.locality(g0, m0), Locality::Pix);
        assert_eq!(t.locality(g0, g0), Locality::Pix);
        assert_eq!(t.locality(g0, eth1), Locality::Sys);
        assert_eq!(t.locality(g0, DeviceId(99)), Locality::Sys);
        assert_eq!(t.numa_locality(g0, 0), Locality::Phb);
        assert_eq!(t.numa_locality(g0, 1), Locality::Sys);
    }

    #[test]
    fn cpusets_near() {
        let t = hand_built();
        assert_eq!(t.cpuset_near(Near::Device(id(&t, "eth1"))).to_string(), "4-7");
        assert_eq!(t.cpuset_near(Near::Numa(0)).to_string(), "0-3");
        assert_eq!(t.cpuset_near(Near::Numa(2)).to_string(), "0-7", "memory-only node: its package");
        assert_eq!(t.cpuset_near(Near::Numa(7)).to_string(), "0-7", "unknown node: the machine");
        assert_eq!(t.cpuset_near(Near::Device(DeviceId(99))).to_string(), "0-7");
    }

    #[test]
    fn pxb_and_phb_paths() {
        let eth = DeviceKind::Nic(NicKind::Ethernet);
        let parts = Parts {
            cpuset: CpuSet::range(0, 3),
            numa_nodes: vec![NumaNode { os_index: 0, cpuset: CpuSet::range(0, 3), memory: 0, package: None }],
            devices: vec![
                // Cascaded switches: GPU under switch 5 under switch 2; NIC under switch 6 under 2.
                dev(DeviceKind::Gpu, 1, &[], 0, &[(7, false), (5, false), (3, false), (2, false), (0, true)], 16.0),
                dev(eth, 2, &["far"], 0, &[(8, false), (6, false), (4, false), (2, false), (0, true)], 16.0),
                // Directly on the host bridge.
                dev(eth, 3, &["onboard"], 0, &[(0, true)], 1.0),
                // Another host bridge of the same node.
                dev(eth, 4, &["other_hb"], 0, &[(9, true)], 1.0),
            ],
            ..Parts::default()
        };
        let t = Topology::from_parts(parts, super::super::Source::XmlString, None);
        let g = t.gpus().next().unwrap().id;
        assert_eq!(t.locality(g, id(&t, "far")), Locality::Pxb);
        assert_eq!(t.locality(g, id(&t, "onboard")), Locality::Phb);
        assert_eq!(t.locality(g, id(&t, "other_hb")), Locality::Phb, "same NUMA node");
        assert_eq!(t.nic_for(Near::Device(g)).unwrap().name(), "far");
        // Same locality: the faster link wins before the bus id.
        assert_eq!(t.nic_for(Near::Numa(0)).unwrap().name(), "far");
    }
}
