#!/usr/bin/env python3
"""Write the golden hwloc XML topologies used by test_topo.

The files are what hwloc 2.x would export (lstopo --of xml) on these
machines with its CUDA and NVML backends enabled: each GPU is a PCIDev with
two OS devices, cudaN (COPROC) and nvmlN (GPU), and NVLink bandwidth is a
"NVLinkBandwidth" distances2 matrix over the nvml OS devices in MB/s, with
1000000 on the diagonal as hwloc's NVML backend writes it.  NVSwitches are
PCIDevs of subtype NVSwitch in a distances2hetero matrix, links going
GPU->switch only, as NVML reports them.

The committed XML files are the golden data; this script only documents how
they were made.  Run it from tests/topo/ to regenerate them.
"""

NVLINK_MBPS = 25000          # one NVLink 2.0-4.0 link, unidirectional, as hwloc counts it
DIAG = 1000000               # hwloc's artificial local bandwidth


class Gp:
    def __init__(self):
        self.n = 0

    def __call__(self):
        self.n += 1
        return self.n


def mask(bits):
    v = 0
    for b in bits:
        v |= 1 << b
    return "0x%08x" % v


def array_elems(tag, items, indent):
    """hwloc writes 10 values per element, each followed by a space;
    length counts the characters of the content."""
    out = []
    for i in range(0, len(items), 10):
        s = "".join("%s " % x for x in items[i:i + 10])
        out.append('%s<%s length="%d">%s</%s>' % (indent, tag, len(s), s, tag))
    return out


def topology(name, sockets, cores_per_socket, gpus_per_socket, nvswitches=0,
             gpu_model="NVIDIA H100 80GB HBM3", nvlink=None, switch_links=None,
             numa_latency=None):
    """nvlink[i][j]: links between GPU i and j; switch_links[i][s]: links
    from GPU i to switch s.  Returns the XML text."""
    gp = Gp()
    L = []
    ncpu = sockets * cores_per_socket
    allcpu = mask(range(ncpu))
    allnode = mask(range(sockets))
    L.append('<?xml version="1.0" encoding="UTF-8"?>')
    L.append('<!DOCTYPE topology SYSTEM "hwloc2.dtd">')
    L.append('<topology version="2.0">')
    L.append('  <object type="Machine" os_index="0" cpuset="%s" complete_cpuset="%s" '
             'allowed_cpuset="%s" nodeset="%s" complete_nodeset="%s" allowed_nodeset="%s" '
             'gp_index="%d">' % (allcpu, allcpu, allcpu, allnode, allnode, allnode, gp()))
    for k, v in (("Backend", "Linux"), ("OSName", "Linux"), ("HostName", name),
                 ("Architecture", "x86_64"), ("hwlocVersion", "2.9.0")):
        L.append('    <info name="%s" value="%s"/>' % (k, v))
    nvml_gp = []
    switch_gp = []
    gpu = 0
    bus = 0x10
    for s in range(sockets):
        cpus = range(s * cores_per_socket, (s + 1) * cores_per_socket)
        cs, ns = mask(cpus), mask([s])
        sets = 'cpuset="%s" complete_cpuset="%s" nodeset="%s" complete_nodeset="%s"' % (cs, cs, ns, ns)
        L.append('    <object type="Package" os_index="%d" %s gp_index="%d">' % (s, sets, gp()))
        L.append('      <info name="CPUVendor" value="GenuineIntel"/>')
        L.append('      <info name="CPUModel" value="Golden CPU"/>')
        L.append('      <object type="NUMANode" os_index="%d" %s gp_index="%d" '
                 'local_memory="1099511627776">' % (s, sets, gp()))
        L.append('        <page_type size="4096" count="268435456"/>')
        L.append('      </object>')
        for c in cpus:
            one = 'cpuset="%s" complete_cpuset="%s" nodeset="%s" complete_nodeset="%s"' % (
                mask([c]), mask([c]), ns, ns)
            L.append('      <object type="Core" os_index="%d" %s gp_index="%d">' % (c, one, gp()))
            L.append('        <object type="PU" os_index="%d" %s gp_index="%d"/>' % (c, one, gp()))
            L.append('      </object>')
        devs = []
        for _ in range(gpus_per_socket):
            devs.append(("gpu", gpu))
            gpu += 1
        per = nvswitches // sockets if nvswitches else 0
        for i in range(per):
            devs.append(("switch", s * per + i))
        first = bus
        last = bus + len(devs) - 1
        L.append('      <object type="Bridge" gp_index="%d" bridge_type="0-1" depth="0" '
                 'bridge_pci="0000:[%02x-%02x]">' % (gp(), first, last))
        for kind, idx in devs:
            if kind == "gpu":
                L.append('        <object type="PCIDev" gp_index="%d" pci_busid="0000:%02x:00.0" '
                         'pci_type="0302 [10de:2330] [10de:16c1] a1" pci_link_speed="31.507692">'
                         % (gp(), bus))
                L.append('          <object type="OSDev" gp_index="%d" name="cuda%d" subtype="CUDA" '
                         'osdev_type="5">' % (gp(), idx))
                for k, v in (("Backend", "CUDA"), ("GPUVendor", "NVIDIA Corporation"),
                             ("GPUModel", gpu_model), ("CUDAGlobalMemorySize", "83543040"),
                             ("CUDAL2CacheSize", "51200"), ("CUDAMultiProcessors", "132"),
                             ("CUDACoresPerMP", "128"), ("CUDASharedMemorySizePerMP", "48")):
                    L.append('            <info name="%s" value="%s"/>' % (k, v))
                L.append('          </object>')
                g = gp()
                nvml_gp.append(g)
                L.append('          <object type="OSDev" gp_index="%d" name="nvml%d" subtype="NVML" '
                         'osdev_type="1">' % (g, idx))
                for k, v in (("Backend", "NVML"), ("GPUVendor", "NVIDIA Corporation"),
                             ("GPUModel", gpu_model),
                             ("NVIDIAUUID", "GPU-%08x-0000-4000-8000-%012x" % (0x901de000 + idx, idx))):
                    L.append('            <info name="%s" value="%s"/>' % (k, v))
                L.append('          </object>')
                L.append('        </object>')
            else:
                g = gp()
                switch_gp.append(g)
                L.append('        <object type="PCIDev" gp_index="%d" subtype="NVSwitch" '
                         'pci_busid="0000:%02x:00.0" pci_type="0680 [10de:22a3] [10de:1796] a1" '
                         'pci_link_speed="0.250000"/>' % (g, bus))
            bus += 1
        bus = (bus + 0x10) & ~0xf
        L.append('      </object>')
        L.append('    </object>')
    L.append('  </object>')

    if numa_latency:
        n = len(numa_latency)
        vals = [v for row in numa_latency for v in row]
        L.append('  <distances2 type="NUMANode" nbobjs="%d" kind="5" name="NUMALatency" '
                 'indexing="os">' % n)
        L += array_elems("indexes", list(range(n)), "    ")
        L += array_elems("u64values", vals, "    ")
        L.append('  </distances2>')

    ngpu = len(nvml_gp)
    if nvlink is not None:
        vals = []
        for i in range(ngpu):
            for j in range(ngpu):
                vals.append(DIAG if i == j else nvlink[i][j] * NVLINK_MBPS)
        # FROM_OS | MEANS_BANDWIDTH
        L.append('  <distances2 type="OSDev" nbobjs="%d" kind="9" name="NVLinkBandwidth" '
                 'indexing="gp">' % ngpu)
        L += array_elems("indexes", nvml_gp, "    ")
        L += array_elems("u64values", vals, "    ")
        L.append('  </distances2>')
    if switch_links is not None:
        objs = ["OSDev:%d" % g for g in nvml_gp] + ["PCIDev:%d" % g for g in switch_gp]
        n = len(objs)
        vals = []
        for i in range(n):
            for j in range(n):
                if i == j:
                    v = DIAG
                elif i < ngpu and j >= ngpu:
                    # NVML reports links from the GPU side: GPU row, switch column
                    v = switch_links[i][j - ngpu] * NVLINK_MBPS
                elif i >= ngpu and j < ngpu:
                    v = switch_links[j][i - ngpu] * NVLINK_MBPS
                else:
                    v = 0
                vals.append(v)
        # FROM_OS | MEANS_BANDWIDTH | HETEROGENEOUS_TYPES
        L.append('  <distances2hetero nbobjs="%d" kind="25" name="NVLinkBandwidth">' % n)
        L += array_elems("indexes", objs, "    ")
        L += array_elems("u64values", vals, "    ")
        L.append('  </distances2hetero>')
    L.append('</topology>')
    return "\n".join(L) + "\n"


def main():
    lat2 = [[10, 21], [21, 10]]
    mesh = [[0 if i == j else 2 for j in range(8)] for i in range(8)]
    # DGX H100 style: 18 links per GPU, 5+4+4+5 to the four NVSwitches
    sw = [[5, 4, 4, 5] for _ in range(8)]
    uneven = [[0, 4, 2, 1],
              [4, 0, 1, 2],
              [2, 1, 0, 4],
              [1, 2, 4, 0]]
    files = {
        "nvlink-mesh-8gpu.xml": topology("golden-nvlink-mesh-8gpu", 2, 4, 4, nvlink=mesh,
                                         numa_latency=lat2),
        "nvswitch-8gpu.xml": topology("golden-nvswitch-8gpu", 2, 4, 4, nvswitches=4,
                                      switch_links=sw, numa_latency=lat2),
        "pcie-2socket-8gpu.xml": topology("golden-pcie-2socket-8gpu", 2, 4, 4,
                                          gpu_model="NVIDIA L40S", numa_latency=lat2),
        "nvlink-uneven-4gpu.xml": topology("golden-nvlink-uneven-4gpu", 1, 4, 4, nvlink=uneven,
                                           gpu_model="Tesla V100-SXM2-32GB"),
        "no-gpu.xml": topology("golden-no-gpu", 2, 4, 0, numa_latency=lat2),
    }
    for name, text in files.items():
        with open(name, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
