//! Topology tests: synthetic hwloc XML fixtures (tests/topo/, made by generate.py) with the
//! decisions they imply, malformed input, and a smoke test on the real machine.

use super::*;

#[cfg(feature = "hwloc")]
mod with_hwloc {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn fixture(name: &str) -> Topology {
        let path = format!("{}/tests/topo/{name}", env!("CARGO_MANIFEST_DIR"));
        Topology::from_xml_file(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn named<'a>(t: &'a Topology, name: &str) -> &'a PciDevice {
        t.device_by_name(name).unwrap_or_else(|| panic!("no device {name}"))
    }

    /// A fresh path under /tmp for this test process.
    fn temp_path(tag: &str) -> PathBuf {
        static N: AtomicUsize = AtomicUsize::new(0);
        PathBuf::from(format!(
            "/tmp/ferroccl-topo-{}-{}-{tag}.xml",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ))
    }

    const NO_PCI: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" allowed_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" allowed_nodeset="0x00000001" gp_index="1">
    <object type="NUMANode" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="2" local_memory="1073741824"/>
    <object type="Core" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="3">
      <object type="PU" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="4"/>
    </object>
    <object type="Core" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="5">
      <object type="PU" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="6"/>
    </object>
  </object>
</topology>
"#;

    #[test]
    fn two_socket_host_is_read() {
        let t = fixture("two_socket.xml");
        assert!(matches!(t.source(), Source::XmlFile(_)));
        assert!(!t.is_this_system());
        assert_eq!(t.cpuset().to_string(), "0-15");
        assert_eq!((t.pu_count(), t.cores().len(), t.packages().len(), t.numa_nodes().len()), (16, 8, 2, 2));
        assert_eq!(t.total_memory(), 128 << 30);
        for (i, pkg) in t.packages().iter().enumerate() {
            let i = u32::try_from(i).unwrap();
            assert_eq!(pkg.os_index, i);
            assert_eq!(pkg.cpuset, CpuSet::range(8 * i, 8 * i + 7));
            assert_eq!((pkg.numa_nodes.as_slice(), pkg.cores), ([i].as_slice(), 4));
            let node = t.numa_node(i).unwrap();
            assert_eq!((node.memory, node.package, &node.cpuset), (64 << 30, Some(i), &pkg.cpuset));
        }
        assert!(t.cores().iter().all(|c| c.cpuset.len() == 2 && c.package.is_some()));
        assert_eq!(
            (t.numa_distance(0, 0), t.numa_distance(0, 1), t.numa_distance(1, 0)),
            (Some(10), Some(21), Some(21))
        );
        assert_eq!(t.distances().unwrap().name.as_deref(), Some("NUMALatency"));

        let buses = |it: &mut dyn Iterator<Item = &PciDevice>| it.map(|d| d.bus_id.to_string()).collect::<Vec<_>>();
        assert_eq!(buses(&mut t.gpus()), ["0000:03:00.0", "0000:04:00.0", "0000:43:00.0", "0000:44:00.0"]);
        assert_eq!(buses(&mut t.nics()), ["0000:00:1f.6", "0000:05:00.0", "0000:45:00.0"]);
        assert!(t.devices().iter().enumerate().all(|(i, d)| d.id.index() == i), "ids follow bus order");
        let ib = named(&t, "mlx5_0");
        assert_eq!(ib.names, ["ib0", "mlx5_0"]);
        assert_eq!(
            (ib.kind, ib.vendor_id, ib.class_id, ib.numa()),
            (DeviceKind::Nic(NicKind::InfiniBand), 0x15b3, 0x0207, Some(0))
        );
        let roce = named(&t, "ens45f0np0");
        assert_eq!(
            (roce.kind, roce.numa(), roce.id),
            (DeviceKind::Nic(NicKind::Ethernet), Some(1), named(&t, "mlx5_1").id)
        );
        let gpu = named(&t, "cuda2");
        assert_eq!((gpu.vendor_id, gpu.device_id, gpu.class_id, gpu.numa()), (0x10de, 0x2335, 0x0302, Some(1)));
        assert!((gpu.link_speed - 31.5).abs() < 0.1, "{}", gpu.link_speed);
        assert_eq!(t.device_by_bus_id("0000:43:00.0".parse().unwrap()).unwrap().id, gpu.id);
        assert_eq!(named(&t, "43:00.0").id, gpu.id);
        assert!(t.device_by_name("vda").is_none() && t.device_by_name("eth9").is_none());
    }

    #[test]
    fn two_socket_decisions() {
        let t = fixture("two_socket.xml");
        let gpus: Vec<&PciDevice> = t.gpus().collect();
        for (i, gpu) in gpus.iter().enumerate() {
            let socket = u32::try_from(i / 2).unwrap();
            let nic = t.nic_for(Near::Device(gpu.id)).unwrap();
            let expected = if socket == 0 { "mlx5_0" } else { "mlx5_1" };
            assert!(nic.answers_to(expected), "GPU {i} got {:?}", nic.names);
            assert_eq!(t.locality(gpu.id, nic.id), Locality::Pix);
            let cpus = t.cpuset_near(Near::Device(gpu.id));
            assert_eq!(cpus, t.packages()[i / 2].cpuset, "GPU {i} binds to its socket");
            assert_eq!(t.cpuset_near(Near::Device(nic.id)), cpus, "so does its NIC's progress thread");
            assert_eq!(t.cpuset_near(Near::Numa(socket)), cpus);
        }
        let (g0, g1, g2) = (gpus[0].id, gpus[1].id, gpus[2].id);
        let (eno1, mlx0, mlx1) = (named(&t, "eno1").id, named(&t, "mlx5_0").id, named(&t, "mlx5_1").id);
        assert_eq!(t.locality(g0, g1), Locality::Pix, "same PCIe switch");
        assert_eq!(t.locality(g0, eno1), Locality::Phb, "same host bridge");
        assert_eq!(t.locality(g0, g2), Locality::Sys);
        assert_eq!(t.locality(g0, mlx1), Locality::Sys);
        assert_eq!((t.numa_locality(mlx0, 0), t.numa_locality(mlx0, 1)), (Locality::Phb, Locality::Sys));
        // Same NUMA node beats another socket; another socket is still better than nothing.
        assert_eq!(t.nic_for_among(Near::Device(g0), &[eno1, mlx1]).unwrap().id, eno1);
        assert_eq!(t.nic_for_among(Near::Device(g0), &[mlx1]).unwrap().id, mlx1);
        // For a NUMA node: both socket-0 NICs are local; the 31.5 GB/s one beats the onboard port.
        assert_eq!(t.nic_for(Near::Numa(0)).unwrap().id, mlx0);
        assert_eq!(t.nic_for(Near::Numa(1)).unwrap().id, mlx1);
        assert_eq!(t.nic_for(Near::Device(eno1)).unwrap().id, eno1);
    }

    #[test]
    fn two_socket_graph_lines_and_binding() {
        let t = fixture("two_socket.xml");
        let lines = t.graph_lines();
        let has = |prefix: &str| assert!(lines.iter().any(|l| l.starts_with(prefix)), "no {prefix:?} in {lines:#?}");
        has("GRAPH Machine cpus 0-15 pus 16 cores 8 packages 2 numa 2 mem 128GB gpus 4 nics 3 from XML file ");
        has("GRAPH Package 1 cpus 8-15 cores 4 numa 1");
        has("GRAPH NUMA 0 cpus 0-7 mem 64GB");
        has("GRAPH NUMA 1 distances 21 10");
        has("GRAPH GPU 2 pci 0000:43:00.0 (cuda2) [10de:2335] numa 1 cpus 8-15 link 31.5GB/s");
        has("GRAPH NIC ib0,mlx5_0 pci 0000:05:00.0 numa 0 cpus 0-7 IB [15b3:1021] link 31.5GB/s");
        has("GRAPH NIC eno1 pci 0000:00:1f.6 numa 0 cpus 0-7 Ethernet");
        has("GRAPH GPU 3 pci 0000:44:00.0 uses NIC ens45f0np0,mlx5_1 (PIX)");
        assert_eq!(lines.len(), 1 + 2 + 2 + 2 + 4 + 3 + 4);
        t.log_graph();
        // Not this machine: binding is a logged no-op, not an error.
        let b = t.bind_current_thread(&CpuSet::range(0, 7)).unwrap();
        assert!(matches!(b, Binding::Skipped(ref why) if why.contains("not this machine")), "{b:?}");
        assert!(t.bind_current_thread(&CpuSet::new()).is_err());
        assert!(t.current_thread_binding().is_err());
    }

    #[test]
    fn xml_round_trip_keeps_everything() {
        let t = fixture("two_socket.xml");
        let xml = t.to_xml().unwrap();
        let again = Topology::from_xml_str(&xml).unwrap();
        assert_eq!(again.devices(), t.devices());
        assert_eq!(again.numa_nodes(), t.numa_nodes());
        assert_eq!(again.packages(), t.packages());
        assert_eq!(again.distances(), t.distances());
        let path = temp_path("roundtrip");
        t.dump_to(&path).unwrap();
        let from_file = Topology::from_xml_file(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(from_file.graph_lines()[1..], t.graph_lines()[1..], "only the source differs");
    }

    #[test]
    fn single_numa_box_with_one_nic() {
        let t = fixture("single_numa.xml");
        assert_eq!((t.packages().len(), t.numa_nodes().len(), t.cores().len(), t.pu_count()), (1, 1, 4, 4));
        assert_eq!(t.numa_nodes()[0].memory, 24 << 30);
        assert_eq!(t.gpus().count(), 0);
        assert!(t.distances().is_none());
        let nics: Vec<&PciDevice> = t.nics().collect();
        assert_eq!(nics.len(), 1, "the virtio disk is not tracked");
        let eth0 = nics[0];
        assert_eq!(
            (eth0.names.as_slice(), eth0.numa(), eth0.vendor_id),
            (["eth0".to_owned()].as_slice(), Some(0), 0x1af4)
        );
        assert_eq!(t.nic_for(Near::Numa(0)).unwrap().id, eth0.id);
        assert!(t.nic_for(Near::Numa(3)).is_some(), "any NIC beats none");
        assert_eq!(t.cpuset_near(Near::Device(eth0.id)).to_string(), "0-3");
        let lines = t.graph_lines();
        assert!(lines.contains(&"GRAPH NUMA 0 cpus 0-3 mem 24GB".to_owned()), "{lines:#?}");
        assert!(
            lines.iter().any(|l| l.starts_with("GRAPH NIC eth0 pci 0000:00:03.0 numa 0 cpus 0-3 Ethernet")),
            "{lines:#?}"
        );
    }

    #[test]
    fn socket_helpers_run_near_their_nic_or_the_creators_memory() {
        let t = fixture("two_socket.xml");
        // eno1 hangs off socket 0, ens45f0np0 off socket 1 (cpus 0-7 / 8-15).
        assert_eq!(t.socket_helper_cpus("eno1", Some(12)).unwrap().to_string(), "0-7", "the NIC wins");
        assert_eq!(t.socket_helper_cpus("ens45f0np0", Some(0)).unwrap().to_string(), "8-15");
        // No such NIC (loopback): the creating thread's NUMA node.
        assert_eq!(t.socket_helper_cpus("lo", Some(9)).unwrap().to_string(), "8-15");
        assert_eq!(t.socket_helper_cpus("lo", Some(3)).unwrap().to_string(), "0-7");
        assert_eq!(t.socket_helper_cpus("lo", None), None, "nothing known: leave the threads alone");
        assert_eq!(t.socket_helper_cpus("lo", Some(99)), None, "a cpu outside the topology");
        // One NUMA node covering the machine: binding would change nothing.
        let flat = Topology::from_xml_str(NO_PCI).unwrap();
        assert_eq!(flat.socket_helper_cpus("lo", Some(1)), None);
    }

    #[test]
    fn machine_without_pci_or_packages_still_works() {
        let t = Topology::from_xml_str(NO_PCI).unwrap();
        assert_eq!(t.source(), &Source::XmlString);
        assert!(t.devices().is_empty() && t.packages().is_empty());
        assert_eq!((t.numa_nodes().len(), t.cores().len(), t.pu_count()), (1, 2, 2));
        assert_eq!(t.numa_nodes()[0].package, None);
        assert!(t.nic_for(Near::Numa(0)).is_none());
        assert_eq!(t.cpuset_near(Near::Numa(0)).to_string(), "0-1");
        assert_eq!(t.cpuset_near(Near::Device(DeviceId(0))).to_string(), "0-1");
        assert!(t.graph_lines().iter().any(|l| l == "GRAPH no GPU or NIC found on the PCI bus"));
        assert!(t.to_xml().unwrap().contains("NUMANode"));
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        for bad in ["", "not xml at all", "<topology version=\"2.0\"></topology>", "<topology", NO_PCI.split_at(400).0]
        {
            match Topology::from_xml_str(bad) {
                Err(Error::InvalidArgument(msg)) => assert!(msg.contains("topology XML"), "{msg}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        assert!(matches!(Topology::from_xml_str("<topo\0logy>"), Err(Error::InvalidArgument(_))));
        match Topology::from_xml_file("/nonexistent/topo.xml") {
            Err(e @ Error::System { .. }) => assert!(e.to_string().contains("/nonexistent/topo.xml"), "{e}"),
            other => panic!("{other:?}"),
        }
        let t = fixture("single_numa.xml");
        assert!(matches!(t.dump_to(Path::new("/nonexistent/dir/t.xml")), Err(Error::System { .. })));
        assert!(matches!(t.dump_per(Some("/nonexistent/dir/t.xml".into())), Err(Error::System { .. })));
        assert_eq!(t.dump_per(None).unwrap(), None);
        assert_eq!(t.dump_per(Some(String::new())).unwrap(), None);
    }

    #[test]
    fn real_machine_smoke() {
        let t = Topology::load().unwrap();
        assert_eq!(t.source(), &Source::ThisSystem);
        assert!(t.is_this_system());
        assert!(!t.cpuset().is_empty() && t.pu_count() >= 1 && !t.numa_nodes().is_empty());
        t.log_graph();
        for line in t.graph_lines() {
            println!("{line}");
        }
        let path = temp_path("smoke");
        assert_eq!(t.dump_per(Some(path.display().to_string())).unwrap(), Some(path.clone()));
        let again = Topology::from_xml_file(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(again.cpuset(), t.cpuset());
        assert_eq!(again.numa_nodes(), t.numa_nodes());
        assert_eq!(again.devices(), t.devices());
        assert!(std::ptr::eq(Topology::system(), Topology::system()));

        // Bind a fresh thread near the first NUMA node (or a NIC) and read the binding back.
        let near = t.nics().next().map_or(Near::Numa(t.numa_nodes()[0].os_index), |n| Near::Device(n.id));
        let cpus = t.cpuset_near(near);
        let (binding, now) = std::thread::scope(|s| {
            s.spawn(|| (t.bind_current_thread(&cpus).unwrap(), t.current_thread_binding().unwrap())).join().unwrap()
        });
        match binding {
            Binding::Bound(set) => assert_eq!(now, set),
            Binding::Skipped(why) => println!("binding skipped: {why}"),
        }
        // Processors the machine does not have: a no-op.
        let b = t.bind_current_thread(&CpuSet::range(60_000, 60_001)).unwrap();
        assert!(matches!(b, Binding::Skipped(_)), "{b:?}");
    }
}

#[cfg(not(feature = "hwloc"))]
#[test]
fn without_hwloc_the_machine_is_flat() {
    let t = Topology::load().unwrap();
    assert_eq!(t.source(), &Source::Flat);
    assert_eq!((t.packages().len(), t.numa_nodes().len()), (1, 1));
    assert!(t.devices().is_empty() && !t.cpuset().is_empty());
    assert!(matches!(Topology::from_xml_str("<topology/>"), Err(Error::InvalidUsage(_))));
    assert!(matches!(t.to_xml(), Err(Error::InvalidUsage(_))));
    assert!(matches!(t.bind_current_thread(t.cpuset()).unwrap(), Binding::Skipped(_)));
    assert_eq!(t.cpuset_near(Near::Numa(0)), *t.cpuset());
}

#[test]
fn memory_sizes_print_like_nccl() {
    assert_eq!(gigabytes(24 << 30), "24GB");
    assert_eq!(gigabytes(8_147_165_184), "7.6GB");
    assert_eq!(gigabytes(10_736_000_000), "10GB");
    assert_eq!(gigabytes(512 << 20), "512MB");
    assert_eq!(gigabytes(0), "0MB");
}
