#!/usr/bin/env python3
"""Regenerates the synthetic hwloc v2 XML topologies in this directory.

Needs hwloc's tools (Debian: `apt-get install hwloc`): `lstopo-no-graphics` builds the CPU and
memory part from a synthetic description, this script adds PCI bridges, GPUs and NICs (as
hwloc's Linux backend reports them), and `hwloc-annotate` adds the NUMA distance matrix, so
every file is one that hwloc itself wrote and reads back. Run: `python3 tests/topo/generate.py`.
"""

import os
import subprocess
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
GP = [1000]


def gp():
    GP[0] += 1
    return str(GP[0])


def obj(parent, **attrs):
    return ET.SubElement(parent, "object", {k: v for k, v in attrs.items()})


def info(parent, name, value):
    ET.SubElement(parent, "info", {"name": name, "value": value})


def host_bridge(parent, domain, lo, hi):
    return obj(parent, type="Bridge", gp_index=gp(), bridge_type="0-1", depth="0",
               bridge_pci=f"{domain:04x}:[{lo:02x}-{hi:02x}]")


def pci_bridge(parent, busid, vendor_dev, depth, lo, hi, speed="31.507692"):
    return obj(parent, type="Bridge", gp_index=gp(), bridge_type="1-1", depth=str(depth),
               pci_busid=busid, pci_type=f"0604 [{vendor_dev}] [0000:0000] 00",
               pci_link_speed=speed, bridge_pci=f"0000:[{lo:02x}-{hi:02x}]")


def pci_dev(parent, busid, klass, vendor_dev, subsys, speed, **infos):
    d = obj(parent, type="PCIDev", gp_index=gp(), pci_busid=busid,
            pci_type=f"{klass} [{vendor_dev}] [{subsys}] 00", pci_link_speed=speed)
    for k, v in infos.items():
        info(d, k, v)
    return d


def os_dev(parent, name, osdev_type, subtype=None, **infos):
    attrs = {"type": "OSDev", "gp_index": gp(), "name": name, "osdev_type": str(osdev_type)}
    if subtype:
        attrs["subtype"] = subtype
    d = ET.SubElement(parent, "object", attrs)
    for k, v in infos.items():
        info(d, k, v)
    return d


def gpu(parent, busid, index):
    d = pci_dev(parent, busid, "0302", "10de:2335", "10de:18be", "31.507692",
                PCIVendor="NVIDIA Corporation", PCIDevice="GH100 [H200 SXM 141GB]")
    os_dev(d, f"cuda{index}", 5, "CUDA", Backend="CUDA", GPUVendor="NVIDIA Corporation",
           GPUModel="NVIDIA H200", CUDAGlobalMemorySize="146800640")
    return d


def cpu_part(description, backend_note):
    xml = subprocess.run(["lstopo-no-graphics", "--input", description, "--of", "xml"],
                         check=True, capture_output=True, text=True).stdout
    root = ET.fromstring(xml)
    machine = root.find("object")
    for i in list(machine.findall("info")):
        if i.get("name") in ("ProcessName", "SyntheticDescription"):
            machine.remove(i)
        elif i.get("name") == "Backend":
            i.set("value", "Synthetic")
    # infos come before child objects in hwloc's format
    last_info = max(i for i, child in enumerate(machine) if child.tag == "info")
    machine.insert(last_info + 1, ET.Element("info", {"name": "ferrocclFixture", "value": backend_note}))
    return root, machine


def write(root, name, distances=None):
    raw = os.path.join(tempfile.mkdtemp(), "raw.xml")
    ET.ElementTree(root).write(raw, encoding="UTF-8", xml_declaration=True)
    out = os.path.join(HERE, name)
    if distances:
        dist = os.path.join(os.path.dirname(raw), "dist.txt")
        with open(dist, "w") as f:
            f.write(distances)
        subprocess.run(["hwloc-annotate", raw, out, "--", "root", "--", "distances", dist], check=True)
    else:
        subprocess.run(["hwloc-annotate", raw, out, "--", "root", "--", "none"], check=True)
    print("wrote", out)


def two_socket():
    """2 packages x 4 cores x 2 PUs, one 64 GiB NUMA node each; per socket one PCIe switch
    holding 2 H200 GPUs and one ConnectX NIC (InfiniBand on socket 0, Ethernet on socket 1),
    plus a slow onboard Ethernet port on socket 0's host bridge."""
    root, machine = cpu_part("pack:2 [numa(memory=68719476736)] core:4 pu:2",
                             "two_socket: 2 packages, 2 NUMA nodes, 4 GPUs, 3 NICs")
    pkgs = machine.findall("object[@type='Package']")
    for p, pkg in enumerate(pkgs):
        base = 0x40 * p
        hb = host_bridge(pkg, 0, base, base + 0x3F)
        if p == 0:
            eno = pci_dev(hb, "0000:00:1f.6", "0200", "8086:15b9", "17aa:2280", "0.250000",
                          PCIVendor="Intel Corporation", PCIDevice="Ethernet Connection I219-LM")
            os_dev(eno, "eno1", 2, Address="a4:bb:6d:00:00:01")
        root_port = pci_bridge(hb, f"0000:{base:02x}:01.0", "8086:347a", 1, base + 1, base + 5)
        upstream = pci_bridge(root_port, f"0000:{base + 1:02x}:00.0", "1000:c030", 2, base + 2, base + 5)
        for slot in range(3):
            bus = base + 3 + slot
            down = pci_bridge(upstream, f"0000:{base + 2:02x}:{slot:02x}.0", "1000:c030", 3, bus, bus)
            busid = f"0000:{bus:02x}:00.0"
            if slot < 2:
                gpu(down, busid, 2 * p + slot)
            elif p == 0:
                nic = pci_dev(down, busid, "0207", "15b3:1021", "15b3:0041", "31.507692",
                              PCIVendor="Mellanox Technologies", PCIDevice="MT2910 Family [ConnectX-7]")
                os_dev(nic, "ib0", 2, Address="00:00:10:49:fe:80:00:00:00:00:00:00:b8:3f:d2:03:00:aa:00:01")
                os_dev(nic, "mlx5_0", 3, "OpenFabrics", NodeGUID="b83f:d203:00aa:0001",
                       Port1State="4", Port1LID="0x1", Port1LinkLayer="InfiniBand")
            else:
                nic = pci_dev(down, busid, "0200", "15b3:101d", "15b3:0016", "15.753846",
                              PCIVendor="Mellanox Technologies", PCIDevice="MT2892 Family [ConnectX-6 Dx]")
                os_dev(nic, "ens45f0np0", 2, Address="b8:3f:d2:00:00:45")
                os_dev(nic, "mlx5_1", 3, "OpenFabrics", NodeGUID="b83f:d203:00bb:0001",
                       Port1State="4", Port1LinkLayer="Ethernet")
    write(root, "two_socket.xml", "name=NUMALatency\n5\n2\nNUMANode:0\nNUMANode:1\n10\n21\n21\n10\n")


def single_numa():
    """A small VM: 1 package x 4 cores, one 24 GiB NUMA node, a virtio disk and one virtio
    Ethernet NIC under a host bridge attached to the machine, no GPU, no distance matrix."""
    root, machine = cpu_part("pack:1 [numa(memory=25769803776)] core:4 pu:1",
                             "single_numa: 1 package, 1 NUMA node, 1 NIC, no GPU")
    hb = host_bridge(machine, 0, 0, 0)
    disk = pci_dev(hb, "0000:00:02.0", "0180", "1af4:1042", "1af4:1100", "0.000000")
    os_dev(disk, "vda", 0, Size="268435456", SectorSize="512")
    nic = pci_dev(hb, "0000:00:03.0", "0200", "1af4:1041", "1af4:1100", "0.000000")
    os_dev(nic, "eth0", 2, Address="02:fc:00:00:00:01")
    write(root, "single_numa.xml")


if __name__ == "__main__":
    two_socket()
    single_numa()
