"""Fake hosts for tests: compact machine descriptions written out as sysfs/procfs trees.

`build_machine(name, root)` writes `root/sys` and `root/proc` holding exactly the
files socketwise.topology reads, laid out (symlinks included) as the kernel does,
so `detect(root)` sees the machine. `MACHINES` names every machine.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from socketwise.facts.files import format_cpulist
from socketwise.facts.gpus import CAPTURED_NVIDIA_SMI, NVIDIA_DRIVER_GPUS

GIB_KB = 1024 * 1024

BROADWELL_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts acpi "
    "mmx fxsr sse sse2 ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc arch_perfmon "
    "pebs bts rep_good nopl xtopology nonstop_tsc cpuid aperfmperf pni pclmulqdq dtes64 "
    "monitor ds_cpl vmx smx est tm2 ssse3 sdbg fma cx16 xtpr pdcm pcid dca sse4_1 sse4_2 "
    "x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand lahf_lm abm "
    "3dnowprefetch cpuid_fault epb cat_l3 cdp_l3 invpcid_single pti intel_ppin ssbd ibrs ibpb "
    "stibp tpr_shadow flexpriority ept vpid ept_ad fsgsbase tsc_adjust bmi1 hle avx2 smep "
    "bmi2 erms invpcid rtm cqm rdt_a rdseed adx smap intel_pt xsaveopt cqm_llc "
    "cqm_occup_llc cqm_mbm_total cqm_mbm_local dtherm ida arat pln pts md_clear flush_l1d"
)
GENOA_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr "
    "sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good amd_lbr_v2 "
    "nopl nonstop_tsc cpuid extd_apicid aperfmperf rapl pni pclmulqdq monitor ssse3 fma cx16 "
    "pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand lahf_lm cmp_legacy svm "
    "extapic cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw ibs skinit wdt tce topoext "
    "perfctr_core perfctr_nb bpext perfctr_llc mwaitx cpb cat_l3 cdp_l3 invpcid_single hw_pstate "
    "ssbd mba perfmon_v2 ibrs ibpb stibp ibrs_enhanced vmmcall fsgsbase bmi1 avx2 smep bmi2 erms "
    "invpcid cqm rdt_a avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd "
    "sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves cqm_llc cqm_occup_llc "
    "cqm_mbm_total cqm_mbm_local avx512_bf16 clzero irperf xsaveerptr rdpru wbnoinvd amd_ppin "
    "cppc arat npt lbrv svm_lock nrip_save tsc_scale vmcb_clean flushbyasid decodeassists "
    "pausefilter pfthreshold avic v_vmsave_vmload vgif x2avic v_spec_ctrl vnmi avx512vbmi umip "
    "pku ospke avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg avx512_vpopcntdq la57 "
    "rdpid overflow_recov succor smca fsrm flush_l1d"
)
# Zen 3 (Milan, Ryzen 5000): Genoa's flags without any AVX-512.
MILAN_FLAGS = " ".join(flag for flag in GENOA_FLAGS.split() if not flag.startswith("avx512"))
SAPPHIRE_RAPIDS_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts acpi "
    "mmx fxsr sse sse2 ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc art arch_perfmon "
    "pebs bts rep_good nopl xtopology nonstop_tsc cpuid aperfmperf tsc_known_freq pni pclmulqdq "
    "dtes64 monitor ds_cpl vmx smx est tm2 ssse3 sdbg fma cx16 xtpr pdcm pcid dca sse4_1 sse4_2 "
    "x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand lahf_lm abm 3dnowprefetch "
    "cpuid_fault epb cat_l3 cat_l2 cdp_l3 intel_ppin cdp_l2 ssbd mba ibrs ibpb stibp "
    "ibrs_enhanced tpr_shadow flexpriority ept vpid ept_ad fsgsbase tsc_adjust bmi1 avx2 smep "
    "bmi2 erms invpcid cqm rdt_a avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb "
    "intel_pt avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves cqm_llc "
    "cqm_occup_llc cqm_mbm_total cqm_mbm_local split_lock_detect avx_vnni avx512_bf16 wbnoinvd "
    "dtherm ida arat pln pts hfi vnmi avx512vbmi umip pku ospke waitpkg avx512_vbmi2 gfni vaes "
    "vpclmulqdq avx512_vnni avx512_bitalg tme avx512_vpopcntdq la57 rdpid bus_lock_detect "
    "cldemote movdiri movdir64b enqcmd fsrm md_clear serialize tsxldtrk pconfig arch_lbr ibt "
    "amx_bf16 avx512_fp16 amx_tile amx_int8 flush_l1d arch_capabilities"
)
SKYLAKE_VM_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr "
    "sse sse2 ss syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology cpuid "
    "tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes "
    "xsave avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch fsgsbase bmi1 avx2 smep bmi2 "
    "erms invpcid avx512f avx512dq rdseed adx smap clflushopt clwb avx512cd avx512bw avx512vl "
    "xsaveopt xsavec xgetbv1 xsaves arat pku ospke"
)

# What an ordinary tuned-nothing server shows; machines override pieces of it.
DEFAULT_KNOBS = {
    "proc/sys/kernel/numa_balancing": "1\n",
    "sys/kernel/mm/transparent_hugepage/enabled": "always [madvise] never\n",
    "sys/kernel/mm/transparent_hugepage/defrag": "always defer defer+madvise [madvise] never\n",
}
DEFAULT_PROCESSES = {1: "systemd", 2: "kthreadd", 812: "irqbalance", 903: "sshd"}
# Ice Lake server: Sapphire Rapids' flags without AMX.
ICELAKE_FLAGS = " ".join(f for f in SAPPHIRE_RAPIDS_FLAGS.split() if not f.startswith("amx"))
DEFAULT_HUGEPAGES = {"2048kB": (0, 0), "1048576kB": (0, 0)}


@dataclass(frozen=True)
class Pci:
    path: str  # below /sys/devices, e.g. "pci0000:00/0000:00:03.0"
    pci_class: str
    vendor: str
    numa_node: int = -1
    local_cpus: str | None = None  # local_cpulist; None leaves the file out
    files: Mapping[str, str] = field(default_factory=dict)  # more of the device's own files

    @property
    def address(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Machine:
    vendor: str
    model_name: str
    family: int
    model: int
    flags: str
    # (socket, node, logical CPUs of one physical core)
    cores: list[tuple[int, int, tuple[int, ...]]]
    # node id -> memory; None writes a kernel without /sys/devices/system/node
    node_memory_gb: dict[int, int] | None
    distances: list[list[int]] = field(default_factory=lambda: [[10]])
    offline: frozenset[int] = frozenset()
    memory_gb: int | None = None  # /proc/meminfo; defaults to the nodes' sum
    hugepages: Mapping[str, tuple[int, int]] = field(default_factory=lambda: DEFAULT_HUGEPAGES)
    pci: tuple[Pci, ...] = ()
    # interface -> its device's path below /sys/devices; None for a virtual interface
    nics: Mapping[str, str | None] = field(default_factory=lambda: {"lo": None})
    knobs: Mapping[str, str] = field(default_factory=lambda: DEFAULT_KNOBS)
    processes: Mapping[int, str] = field(default_factory=lambda: DEFAULT_PROCESSES)
    # What nvidia-smi printed (`query`, `topo`), kept where a captured tree keeps it.
    nvidia_smi: Mapping[str, str] | None = None


def nvidia_smi_answers(gpus: list[tuple[str, str, int, str, int]], links: list[list[str]]) -> dict:
    """nvidia-smi's two answers for GPUs (address as nvidia-smi spells it, name, MiB, CPU
    affinity, NUMA affinity) and the links between them (the `topo -m` matrix, "X" on the
    diagonal), laid out as nvidia-smi prints them."""
    query = "".join(f"{bus}, {name}, {mib}\n" for bus, name, mib, _, _ in gpus)
    header = "\t" + "\t".join(f"GPU{i}" for i in range(len(gpus)))
    header += "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    rows = [
        f"GPU{i}\t"
        + "\t".join(" X " if cell == "X" else cell for cell in row)
        + f"\t{gpus[i][3]}\t{gpus[i][4]}\t\tN/A"
        for i, row in enumerate(links)
    ]
    legend = (
        "\nLegend:\n\n  X    = Self\n"
        "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes\n"
        "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host "
        "Bridges within a NUMA node\n"
        "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
        "  PXB  = Connection traversing multiple PCIe bridges\n"
        "  PIX  = Connection traversing at most a single PCIe bridge\n"
        "  NV#  = Connection traversing a bonded set of # NVLinks\n"
    )
    return {"query": query, "topo": "\n".join([header, *rows, legend])}


def nvidia_gpus(
    name: str,
    mib: int,
    gpus: list[tuple[str, str, int]],
    affinity: list[str],
    link: Callable[[int, int], str],
    nodeless: frozenset[str] | set[str] = frozenset(),
    minors: list[int] | None = None,
) -> dict:
    """`pci`, `nvidia_smi` and the driver's files for a Machine of NVIDIA GPUs of one model:
    each GPU as (the path of the port above it, its bus, its node), `affinity` each node's
    CPUs (the GPUs' local CPUs), link(a, b) the path between GPUs a and b; GPUs whose bus
    is in `nodeless` get no node from the firmware (-1); `minors` the device minors the
    driver gave them, in the order of `gpus` (default: PCI bus order)."""
    devices = tuple(
        Pci(f"{port}/0000:{bus}:00.0", "0x030200", "0x10de",
            -1 if bus in nodeless else node, affinity[node])
        for port, bus, node in gpus
    )  # fmt: skip
    answers = [
        (f"00000000:{bus.upper()}:00.0", name, mib, affinity[node], node) for _, bus, node in gpus
    ]
    buses = [bus for _, bus, _ in gpus]
    minors = minors if minors is not None else [sorted(buses).index(bus) for bus in buses]
    driver = {
        f"proc/{NVIDIA_DRIVER_GPUS}/0000:{bus}:00.0/information": (
            f"Model: \t\t {name}\nBus Location: \t 0000:{bus}:00.0\nDevice Minor: \t {minor}\n"
        )
        for bus, minor in zip(buses, minors, strict=True)
    }
    return {
        "pci": devices,
        "nvidia_smi": nvidia_smi_answers(answers, link_matrix(len(gpus), link)),
        "knobs": {**DEFAULT_KNOBS, **driver},
    }


def link_matrix(count: int, link: Callable[[int, int], str]) -> list[list[str]]:
    """The links matrix with link(a, b) between GPUs a and b."""
    return [["X" if a == b else link(a, b) for b in range(count)] for a in range(count)]


def _two_nodes(gb: int, remote: int = 21) -> dict:
    return {"node_memory_gb": {0: gb, 1: gb}, "distances": [[10, remote], [remote, 10]]}


# DGX H100's GPUs: (bus, node).
DGX_GPUS = (("1b", 0), ("43", 0), ("52", 0), ("61", 0), ("9d", 1), ("c3", 1), ("d1", 1), ("df", 1))
# The PCIe box's GPUs: (root bus, switch bus, switch port, GPU bus, node).
PCIE_4GPU = (
    ("00", "01", "00", "02", 0),
    ("00", "01", "01", "03", 0),
    ("80", "81", "00", "82", 1),
    ("80", "81", "01", "83", 1),
)

MACHINES: dict[str, Machine] = {
    # Dell R730: socket 0 holds the even CPUs, socket 1 the odd; sibling of c is c+28.
    "r730": Machine(
        vendor="GenuineIntel",
        model_name="Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz",
        family=6,
        model=79,
        flags=BROADWELL_FLAGS,
        cores=[(c % 2, c % 2, (c, c + 28)) for c in range(28)],
        **_two_nodes(64),
        hugepages={"2048kB": (1024, 1000), "1048576kB": (0, 0)},
        pci=(Pci("pci0000:00/0000:00:03.0/0000:01:00.0", "0x020000", "0x14e4", 0),),
        nics={"lo": None, "eno1": "pci0000:00/0000:00:03.0/0000:01:00.0"},
    ),
    "epyc2s": Machine(
        vendor="AuthenticAMD",
        model_name="AMD EPYC 9554 64-Core Processor",
        family=25,
        model=17,
        flags=GENOA_FLAGS,
        cores=[(c // 64, c // 64, (c, c + 128)) for c in range(128)],
        **_two_nodes(384, remote=32),
    ),
    # The Zen 3 generation before it: AVX2 only.
    "milan": Machine(
        vendor="AuthenticAMD",
        model_name="AMD EPYC 7763 64-Core Processor",
        family=25,
        model=1,
        flags=MILAN_FLAGS,
        cores=[(c // 64, c // 64, (c, c + 128)) for c in range(128)],
        **_two_nodes(256, remote=32),
    ),
    # The same EPYC pair in NPS4: each socket is four nodes of 16 cores.
    "epyc-nps4": Machine(
        vendor="AuthenticAMD",
        model_name="AMD EPYC 9554 64-Core Processor",
        family=25,
        model=17,
        flags=GENOA_FLAGS,
        cores=[(c // 64, c // 16, (c, c + 128)) for c in range(128)],
        node_memory_gb={node: 96 for node in range(8)},
        distances=[
            [10 if a == b else 12 if a // 4 == b // 4 else 32 for b in range(8)] for a in range(8)
        ],  # fmt: skip
    ),
    # Sapphire Rapids in SNC2: each socket is split into two nodes of 28 cores.
    "snc": Machine(
        vendor="GenuineIntel",
        model_name="Intel(R) Xeon(R) Platinum 8480+",
        family=6,
        model=143,
        flags=SAPPHIRE_RAPIDS_FLAGS,
        cores=[(c // 56, c // 28, (c, c + 112)) for c in range(112)],
        node_memory_gb={0: 128, 1: 128, 2: 128, 3: 128},
        distances=[[10, 12, 21, 21], [12, 10, 21, 21], [21, 21, 10, 12], [21, 21, 12, 10]],
    ),
    # Node 2 is CXL-attached memory with no CPUs.
    "cxl": Machine(
        vendor="GenuineIntel",
        model_name="Intel(R) Xeon(R) Platinum 8480+",
        family=6,
        model=143,
        flags=SAPPHIRE_RAPIDS_FLAGS,
        cores=[(c // 16, c // 16, (c, c + 32)) for c in range(32)],
        node_memory_gb={0: 256, 1: 256, 2: 128},
        distances=[[10, 21, 14], [21, 10, 24], [14, 24, 10]],
    ),
    # CPUs 6 and 7 taken offline; their siblings 14 and 15 stay as single-thread cores.
    "offline": Machine(
        vendor="GenuineIntel",
        model_name="Intel(R) Xeon(R) CPU E5-2630 v4 @ 2.20GHz",
        family=6,
        model=79,
        flags=BROADWELL_FLAGS,
        cores=[(0, 0, (c, c + 8)) for c in range(8)],
        node_memory_gb={0: 32},
        offline=frozenset({6, 7}),
    ),
    # A small cloud VM: no SMT, a virtio NIC, no NUMA balancing knob, irqbalance not running.
    "vm": Machine(
        vendor="GenuineIntel",
        model_name="Intel Xeon Processor (Skylake, IBRS)",
        family=6,
        model=85,
        flags=SKYLAKE_VM_FLAGS,
        cores=[(0, 0, (c,)) for c in range(8)],
        node_memory_gb={0: 32},
        pci=(Pci("pci0000:00/0000:00:03.0", "0x020000", "0x1af4"),),
        nics={"lo": None, "eth0": "pci0000:00/0000:00:03.0/virtio0"},
        knobs={k: v for k, v in DEFAULT_KNOBS.items() if "numa_balancing" not in k},
        processes={1: "systemd", 344: "sshd"},
    ),
    # Two H100s on node 1, the 25G NIC (behind a root port) and the BMC's VGA on node 0.
    "gpu": Machine(
        vendor="GenuineIntel",
        model_name="Intel(R) Xeon(R) Gold 6448Y",
        family=6,
        model=143,
        flags=SAPPHIRE_RAPIDS_FLAGS,
        cores=[(c // 32, c // 32, (c, c + 64)) for c in range(64)],
        **_two_nodes(256, remote=20),
        pci=(
            Pci("pci0000:00/0000:00:1c.0/0000:03:00.0", "0x030000", "0x1a03", 0),
            Pci("pci0000:30/0000:30:02.0/0000:31:00.0", "0x020000", "0x15b3", 0),
            Pci("pci0000:30/0000:30:02.0/0000:31:00.1", "0x020000", "0x15b3", 0),
            Pci("pci0000:c9/0000:c9:02.0/0000:ca:00.0", "0x030200", "0x10de", 1),
            Pci("pci0000:e0/0000:e0:02.0/0000:e1:00.0", "0x030200", "0x10de", 1),
        ),
        nics={
            "lo": None,
            "docker0": None,
            "veth1a2b3c": None,
            "ens2f0np0": "pci0000:30/0000:30:02.0/0000:31:00.0",
            "ens2f1np1": "pci0000:30/0000:30:02.0/0000:31:00.1",
        },
    ),
    # The cross-NUMA study's server: both GPUs hang off socket 0 (an inference process on
    # socket 1's cores crosses the interconnect for every host-side access).
    "gpu-cross": Machine(
        vendor="GenuineIntel",
        model_name="Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz",
        family=6,
        model=106,
        flags=ICELAKE_FLAGS,
        cores=[(c // 32, c // 32, (c, c + 64)) for c in range(64)],
        **_two_nodes(256),
        **nvidia_gpus(
            "NVIDIA A100 80GB PCIe",
            81920,
            [
                (f"pci0000:{bus}/0000:{bus}:02.0", gpu, 0)
                for bus, gpu in (("16", "17"), ("30", "31"))
            ],
            ["0-31,64-95"],
            lambda a, b: "NODE",
        ),
    ),
    # An 8-GPU NVLink box (DGX H100): four H100s on each socket, every pair 18 NVLinks apart.
    "dgx-h100": Machine(
        vendor="GenuineIntel",
        model_name="Intel(R) Xeon(R) Platinum 8480C",
        family=6,
        model=143,
        flags=SAPPHIRE_RAPIDS_FLAGS,
        cores=[(c // 56, c // 56, (c, c + 112)) for c in range(112)],
        **_two_nodes(1024),
        **nvidia_gpus(
            "NVIDIA H100 80GB HBM3",
            81559,
            [
                (f"pci0000:{int(gpu, 16) - 1:02x}/0000:{int(gpu, 16) - 1:02x}:01.0", gpu, node)
                for gpu, node in DGX_GPUS
            ],
            ["0-55,112-167", "56-111,168-223"],
            lambda a, b: "NV18",
        ),
    ),
    # PCIe only: two L40S behind one switch on each socket (PIX within a pair, SYS across
    # sockets). The firmware gives one of them (82:00.0) no node: its local CPUs say node 1.
    # Its driver's device minors are not in bus order.
    "pcie-4gpu": Machine(
        vendor="AuthenticAMD",
        model_name="AMD EPYC 9354 32-Core Processor",
        family=25,
        model=17,
        flags=GENOA_FLAGS,
        cores=[(c // 32, c // 32, (c, c + 64)) for c in range(64)],
        **_two_nodes(384, remote=32),
        **nvidia_gpus(
            "NVIDIA L40S",
            46068,
            [
                (
                    f"pci0000:{root}/0000:{root}:01.1/0000:{switch}:00.0/0000:{switch}:{slot}.0",
                    gpu,
                    node,
                )
                for root, switch, slot, gpu, node in PCIE_4GPU
            ],  # fmt: skip
            ["0-31,64-95", "32-63,96-127"],
            lambda a, b: "PIX" if a // 2 == b // 2 else "SYS",
            nodeless={"82"},
            # The driver numbered the second switch's GPUs first (its probe order).
            minors=[2, 3, 0, 1],
        ),
    ),
    # The hybrid MoE study's host: 2x EPYC 9554 with one 48 GB GPU, on socket 0.
    "hybrid-9554": Machine(
        vendor="AuthenticAMD",
        model_name="AMD EPYC 9554 64-Core Processor",
        family=25,
        model=17,
        flags=GENOA_FLAGS,
        cores=[(c // 64, c // 64, (c, c + 128)) for c in range(128)],
        **_two_nodes(384, remote=32),
        **nvidia_gpus(
            "NVIDIA RTX 6000 Ada Generation",
            49140,
            [("pci0000:40/0000:40:01.1", "41", 0)],
            ["0-63,128-191"],
            lambda a, b: "SYS",
        ),
    ),
    # A Xeon E with its own Intel display device (00:02.0, before the cards in bus order)
    # and two RTX A4000s off the CPU's root ports. The tree kept nvidia-smi's answers but
    # not the driver's /proc files, so no GPU has a device minor.
    "igpu-2gpu": Machine(
        vendor="GenuineIntel",
        model_name="Intel(R) Xeon(R) E-2388G CPU @ 3.20GHz",
        family=6,
        model=167,
        flags=ICELAKE_FLAGS,
        cores=[(0, 0, (c, c + 8)) for c in range(8)],
        node_memory_gb={0: 64},
        pci=(
            Pci("pci0000:00/0000:00:02.0", "0x030000", "0x8086", -1, "0-15"),
            Pci("pci0000:00/0000:00:01.0/0000:01:00.0", "0x030000", "0x10de", -1, "0-15"),
            Pci("pci0000:00/0000:00:01.1/0000:02:00.0", "0x030000", "0x10de", -1, "0-15"),
        ),
        nvidia_smi=nvidia_smi_answers(
            [(f"00000000:0{bus}:00.0", "NVIDIA RTX A4000", 16376, "0-15", 0) for bus in (1, 2)],
            link_matrix(2, lambda a, b: "PHB"),
        ),
    ),
    # AMD GPUs: amdgpu tells memory and name in sysfs (no nvidia-smi).
    "mi210": Machine(
        vendor="AuthenticAMD",
        model_name="AMD EPYC 9554 64-Core Processor",
        family=25,
        model=17,
        flags=GENOA_FLAGS,
        cores=[(0, 0, (c, c + 64)) for c in range(64)],
        node_memory_gb={0: 512},
        pci=tuple(
            Pci(
                f"pci0000:{bus}/0000:{bus}:01.1/0000:{gpu}:00.0",
                "0x038000",
                "0x1002",
                0,
                "0-127",
                {"mem_info_vram_total": str(64 * 2**30), "product_name": "AMD Instinct MI210"},
            )
            for bus, gpu in (("20", "23"), ("60", "63"))
        ),
    ),
    # A kernel built without CONFIG_NUMA (and without THP or NUMA balancing), with /proc
    # holding no process table.
    "nonuma": Machine(
        vendor="AuthenticAMD",
        model_name="AMD Ryzen 7 5800X 8-Core Processor",
        family=25,
        model=33,
        flags=MILAN_FLAGS,
        cores=[(0, 0, (c, c + 8)) for c in range(8)],
        node_memory_gb=None,
        memory_gb=64,
        knobs={},
        processes={},
    ),
}


def build_machine(name: str, root: Path) -> Path:
    """Write machine `name` as a sys/proc tree under `root`; returns `root`.

    Building the same machine into the same root again is harmless.
    """
    machine = MACHINES[name]
    sys_dir, proc_dir = root / "sys", root / "proc"
    online = sorted(
        c for _, _, threads in machine.cores for c in threads if c not in machine.offline
    )

    cpu_dir = sys_dir / "devices/system/cpu"
    _write(cpu_dir / "online", format_cpulist(online))
    # core_id restarts on every socket, as on real hosts; detection must not key cores on it.
    core_ids: dict[int, int] = {}
    for socket, _node, threads in machine.cores:
        core_id = core_ids[socket] = core_ids.get(socket, -1) + 1
        for cpu in threads:
            if cpu in machine.offline:
                # An offline CPU keeps its directory but loses its topology files.
                _write(cpu_dir / f"cpu{cpu}/online", "0")
                continue
            topology = cpu_dir / f"cpu{cpu}/topology"
            _write(topology / "physical_package_id", str(socket))
            _write(topology / "core_id", str(core_id))
            siblings = [c for c in threads if c not in machine.offline]
            _write(topology / "thread_siblings_list", format_cpulist(siblings))

    memory_gb = machine.memory_gb or sum((machine.node_memory_gb or {}).values())
    _write(proc_dir / "meminfo", f"MemTotal:       {memory_gb * GIB_KB} kB\nMemFree: 1024 kB\n")
    _write(proc_dir / "cpuinfo", "\n".join(_cpuinfo_block(machine, cpu) for cpu in online))

    if machine.node_memory_gb is None:
        _write_hugepages(sys_dir / "kernel/mm/hugepages", machine.hugepages)
    else:
        for node, gb in machine.node_memory_gb.items():
            node_dir = sys_dir / f"devices/system/node/node{node}"
            # Offline CPUs stay in the node's cpulist, as they do on arm64 and ppc64.
            cpus = [c for _, n, threads in machine.cores if n == node for c in threads]
            _write(node_dir / "cpulist", format_cpulist(cpus))
            _write(node_dir / "distance", " ".join(map(str, machine.distances[node])))
            _write(
                node_dir / "meminfo",
                f"Node {node} MemTotal:       {gb * GIB_KB} kB\nNode {node} MemFree: 1024 kB\n",
            )
            _write_hugepages(node_dir / "hugepages", machine.hugepages)

    for device in machine.pci:
        device_dir = sys_dir / "devices" / device.path
        _write(device_dir / "class", device.pci_class)
        _write(device_dir / "vendor", device.vendor)
        _write(device_dir / "numa_node", str(device.numa_node))
        if device.local_cpus is not None:
            _write(device_dir / "local_cpulist", device.local_cpus)
        for name, text in device.files.items():
            _write(device_dir / name, text)
        _symlink(sys_dir / "bus/pci/devices" / device.address, device_dir)

    for interface, device_path in machine.nics.items():
        if device_path is None:
            interface_dir = sys_dir / "devices/virtual/net" / interface
        else:
            interface_dir = sys_dir / "devices" / device_path / "net" / interface
            _symlink(interface_dir / "device", sys_dir / "devices" / device_path)
        _write(interface_dir / "address", "52:54:00:12:34:56")
        _symlink(sys_dir / "class/net" / interface, interface_dir)

    for path, text in machine.knobs.items():
        _write(root / path, text)
    for answer, text in (machine.nvidia_smi or {}).items():
        _write(root / CAPTURED_NVIDIA_SMI[answer], text)
    for pid, comm in machine.processes.items():
        _write(proc_dir / str(pid) / "comm", comm)
    return root


def _cpuinfo_block(machine: Machine, cpu: int) -> str:
    socket = next(s for s, _, threads in machine.cores if cpu in threads)
    return (
        f"processor\t: {cpu}\n"
        f"vendor_id\t: {machine.vendor}\n"
        f"cpu family\t: {machine.family}\n"
        f"model\t\t: {machine.model}\n"
        f"model name\t: {machine.model_name}\n"
        f"physical id\t: {socket}\n"
        f"flags\t\t: {machine.flags}\n"
    )


def _write_hugepages(pools_dir: Path, pools: Mapping[str, tuple[int, int]]) -> None:
    for size, (total, free) in pools.items():
        _write(pools_dir / f"hugepages-{size}/nr_hugepages", str(total))
        _write(pools_dir / f"hugepages-{size}/free_hugepages", str(free))


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")


def _symlink(link: Path, target: Path) -> None:
    # sysfs links are relative, so the tree stays valid wherever it is built.
    link.parent.mkdir(parents=True, exist_ok=True)
    target.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(os.path.relpath(target, link.parent))
