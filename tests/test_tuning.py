"""Host tuning: the decisions on the fixture machines, and tune/restore on their sys/proc trees.

The host half runs against fixture trees (never the live kernel): the knobs a fixture
machine lacks are added here where a test needs them, and systemctl is a recorded fake.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from socketwise.facts.files import format_cpulist
from socketwise.facts.topology import detect
from socketwise.host import tuning
from socketwise.host.tuning import Host, Settings, TuningError, decide, restore, tune
from socketwise.host.tuning.irq import nic_irqs
from socketwise.plan.planner import PlanRequest, plan

from .machines import build_machine
from .playbooks import run_playbook
from .shipped import host_python, ship

REPO = Path(__file__).resolve().parent.parent
EVENS = list(range(0, 28, 2))
BACKUP = "var/lib/socketwise/tuning-backup.json"


def by_name(spec_or_report: dict) -> dict[str, dict]:
    return {knob["name"]: knob for knob in spec_or_report["knobs"]}


@pytest.fixture
def facts(tmp_path):
    def load(name: str, **request) -> tuple[dict, dict, Path]:
        root = build_machine(name, tmp_path / name)
        topology = detect(root)
        return topology, plan(topology, PlanRequest(**request)), root

    return load


def two_core_lab_host(reserve: int) -> tuple[dict, dict]:
    """The 2-core, one-node machine this project is developed and tested on."""
    topology = {
        "schema": 1,
        "nodes": [{"id": 0, "socket": 0, "cpus": [0, 1], "cores": [[0], [1]], "memory_mb": 24000}],
        "gpus": [],
        "nics": [{"name": "eth0", "pci": "0000:00:03.0", "numa_node": None}],
        "isa": {"avx2": True},
    }
    return topology, plan(topology, PlanRequest(layout="sn", model_gb=1, reserve_cores=reserve))


# --- decisions -----------------------------------------------------------------------------


def test_r730_sn_tunes_only_the_serving_socket_and_steers_the_nic_to_its_reserved_cores(facts):
    topology, sn, _ = facts("r730", layout="sn", model_gb=8)
    knobs = by_name(decide(topology, sn, Settings(hugepages_gb_per_node=4)))
    assert list(knobs) == [
        "kernel.numa_balancing",
        "hugepages.node0.2048kB",
        "thp.enabled",
        "thp.defrag",
        "irq_affinity.eno1",
        "irqbalance",
        "cpu_governor.node0",
        "cpuidle.node0",
    ], "node 1 runs no rank: no hugepages, governor or C-states there"
    assert knobs["kernel.numa_balancing"]["desired"] == 0
    assert knobs["hugepages.node0.2048kB"]["desired"] == 2048  # 4 GB of 2 MB pages
    assert (knobs["thp.enabled"]["desired"], knobs["thp.defrag"]["desired"]) == (
        "always",
        "madvise",
    )
    # eno1 hangs off node 0: its IRQs go to the two cores node 0 keeps for the OS.
    assert knobs["irq_affinity.eno1"]["desired"] == "24,26,52,54"
    # irqbalance keeps off every thread of an inference core, siblings included.
    banned = EVENS[:12] + [c + 28 for c in EVENS[:12]]
    assert knobs["irqbalance"]["desired"] == {"banned_cpulist": format_cpulist(banned)}
    assert knobs["cpu_governor.node0"]["cpus"] == sorted(EVENS + [c + 28 for c in EVENS])
    assert knobs["cpuidle.node0"]["desired"] is None, "C-states are left alone by default"


def test_dp_reserves_hugepages_on_every_serving_node(facts):
    topology, dp, _ = facts("r730", layout="dp", model_gb=8)
    knobs = by_name(decide(topology, dp, Settings(hugepages_per_node=100, hugepages_size="2M")))
    assert knobs["hugepages.node0.2048kB"]["desired"] == 100
    assert knobs["hugepages.node1.2048kB"]["desired"] == 100


def test_1g_pages_are_counted_in_whole_pages(facts):
    topology, sn, _ = facts("r730", layout="sn", model_gb=8)
    spec = decide(topology, sn, Settings(hugepages_size="1G", hugepages_gb_per_node=4.5))
    assert by_name(spec)["hugepages.node0.1048576kB"]["desired"] == 5


def test_hugepages_beyond_what_the_node_spares_after_model_and_kv_are_refused(facts):
    # SN on a 64 GB node: 8 GB weights, KV 37 GB, OS reserve 6.4 GB -> 12.6 GB to spare.
    topology, sn, _ = facts("r730", layout="sn", model_gb=8)
    assert sn["instances"][0]["kvcache_gb"] == 37
    decide(topology, sn, Settings(hugepages_gb_per_node=12.5))
    with pytest.raises(TuningError) as refused:
        decide(topology, sn, Settings(hugepages_gb_per_node=13))
    assert refused.value.variable == "hugepages_gb_per_node"
    message = str(refused.value)
    assert message.startswith("node 0 can spare 12.6 GB for hugepages, not 13 GB")
    assert "model weights 8 GB, KV cache 37 GB, OS reserve 6.4 GB" in message
    assert "set host_tuning_hugepages_gb_per_node to at most 12.5" in message
    with pytest.raises(TuningError, match="to at most 6451") as by_count:
        decide(topology, sn, Settings(hugepages_per_node=7000))
    assert by_count.value.variable == "hugepages_per_node"


def test_tp_counts_each_nodes_share_of_the_weights_and_other_page_pools(facts):
    # TP-2 holds 4 GB of the 8 GB per node, KV 40: 64 - 6.4 - 4 - 40 = 13.6 GB; the fixture's
    # 1024 2 MB pages (2 GB) already hold memory when 1 GB pages are asked for.
    topology, tp, _ = facts("r730", layout="tp", model_gb=8)
    decide(topology, tp, Settings(hugepages_gb_per_node=13.5))
    with pytest.raises(TuningError, match="can spare 11.6 GB .* other hugepages 2 GB"):
        decide(topology, tp, Settings(hugepages_size="1G", hugepages_gb_per_node=12))


def test_gpu_server_keeps_nic_irqs_on_the_nic_node_that_does_not_infer(facts):
    # SN runs on node 1 (the GPUs); the NICs sit on node 0, whose CPUs all stay free.
    topology, sn, _ = facts("gpu", layout="sn")
    knobs = by_name(decide(topology, sn, Settings()))
    assert {r["node"] for r in sn["instances"][0]["ranks"]} == {1}
    node0 = format_cpulist(next(n["cpus"] for n in topology["nodes"] if n["id"] == 0))
    assert knobs["irq_affinity.ens2f0np0"]["desired"] == node0
    assert knobs["irq_affinity.ens2f1np1"]["desired"] == node0
    assert "hugepages.node0.2048kB" not in knobs and "cpu_governor.node1" in knobs


def test_a_plan_on_the_gpus_steers_nic_irqs_to_the_gpus_node_and_stops_page_migration(facts):
    # vLLM on the GPUs of node 1: the NICs of node 0 hand their IRQs to node 1's reserve.
    topology, on_gpus, _ = facts("gpu", device="gpu", model_gb=10, gpu_memory_gb=40)
    assert [use["node"] for use in on_gpus["nodes"]] == [1]
    knobs = by_name(decide(topology, on_gpus, Settings()))
    reserve = format_cpulist(on_gpus["nodes"][0]["reserved_cpus"])
    assert knobs["irq_affinity.ens2f0np0"]["desired"] == reserve
    assert knobs["irq_affinity.ens2f1np1"]["desired"] == reserve
    assert knobs["kernel.numa_balancing"]["desired"] == 0
    # Without a reserve there, it says what to set instead of choosing another node.
    _, bare, _ = facts("gpu", device="gpu", model_gb=10, gpu_memory_gb=40, reserve_cores=0)
    knob = by_name(decide(topology, bare, Settings()))["irq_affinity.ens2f0np0"]
    assert knob["desired"] is None and "set plan_reserve_cores to 1" in knob["unavailable"]


def test_vm_nic_without_a_numa_node_belongs_to_the_only_node(facts):
    topology, sn, _ = facts("vm", layout="sn", model_gb=1)
    assert topology["nics"][0]["numa_node"] is None
    knobs = by_name(decide(topology, sn, Settings()))
    assert knobs["irq_affinity.eth0"]["desired"] == "6-7", "the two cores node 0 reserves"


def test_lab_host_without_reserved_cores_reports_irqs_unavailable_with_the_fix():
    knobs = by_name(decide(*two_core_lab_host(reserve=0), Settings()))
    assert knobs["irq_affinity.eth0"]["desired"] is None
    assert "set plan_reserve_cores to 1 or more" in knobs["irq_affinity.eth0"]["unavailable"]
    assert "set plan_reserve_cores to 1 or more" in knobs["irqbalance"]["unavailable"]
    with_reserve = by_name(decide(*two_core_lab_host(reserve=1), Settings()))
    assert with_reserve["irq_affinity.eth0"]["desired"] == "1"
    assert with_reserve["irqbalance"]["desired"] == {"banned_cpulist": "0"}


def test_host_without_nics_reports_irq_affinity_unavailable(facts):
    topology, sn, _ = facts("nonuma", layout="sn")
    knob = by_name(decide(topology, sn, Settings()))["irq_affinity"]
    assert knob["unavailable"] == "the topology facts list no NIC with a device behind it"


def test_null_variables_leave_knobs_alone_but_still_list_them(facts):
    topology, sn, _ = facts("r730", layout="sn")
    none = Settings(
        numa_balancing=None,
        thp=None,
        thp_defrag=None,
        irq_affinity=False,
        irqbalance=None,
        cpu_governor=None,
    )
    knobs = decide(topology, sn, none)["knobs"]
    assert len(knobs) == 8 and all(knob["desired"] is None for knob in knobs)


@pytest.mark.parametrize(
    ("settings", "variable", "words"),
    [
        (
            {"hugepages_per_node": 4, "hugepages_gb_per_node": 1},
            "hugepages_gb_per_node",
            "not both",
        ),
        ({"hugepages_size": "4M"}, "hugepages_size", "2M, 1G"),
        ({"thp": "sometimes"}, "thp", "always, madvise, never"),
        ({"irqbalance": "off"}, "irqbalance", "ban, stop"),
        ({"numa_balancing": "2"}, "numa_balancing", r"use 0 \(off, the default\), 1 \(on\)"),
        ({"hugepages_per_node": -1}, "hugepages_per_node", "negative"),
        (
            {"irq_nics": ["eth9"]},
            "irq_nics",
            r"no NIC named eth9 in the topology facts \(NICs: eno1\)",
        ),
    ],
)
def test_bad_settings_name_the_variable_and_the_fix(facts, settings, variable, words):
    topology, sn, _ = facts("r730", layout="sn")
    with pytest.raises(TuningError, match=words) as refused:
        decide(topology, sn, Settings.from_values(**settings))
    assert refused.value.variable == variable


def test_settings_from_extra_vars_strings():
    settings = Settings.from_values(
        numa_balancing="1", hugepages_per_node="64", hugepages_gb_per_node="", irq_nics=None
    )
    assert settings == Settings(numa_balancing=1, hugepages_per_node=64)
    assert Settings.from_values(numa_balancing=False).numa_balancing == 0
    with pytest.raises(TuningError, match="'lots' is not a number"):
        Settings.from_values(hugepages_gb_per_node="lots")


# --- the host half, on fixture trees ---------------------------------------------------------


class FakeSystemd:
    """systemctl for irqbalance.service: answers is-active/is-enabled, records the rest."""

    def __init__(self, active: bool = True, enabled: bool = True):
        self.active, self.enabled = active, enabled
        self.calls: list[str] = []

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        verb = argv[1]
        if verb == "is-active":
            return (0 if self.active else 3), ("active" if self.active else "inactive"), ""
        if verb == "is-enabled":
            return (0 if self.enabled else 1), ("enabled" if self.enabled else "disabled"), ""
        self.calls.append(" ".join(argv[1:]))
        if verb in ("start", "restart"):
            self.active = True
        elif verb == "stop":
            self.active = False
        elif verb in ("enable", "disable"):
            self.enabled = verb == "enable"
        return 0, "", ""


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def read(root: Path, relative: str) -> str:
    return (root / relative).read_text().strip()


def add_tunables(root: Path, cpus: list[int], irqs: dict[str, list[int]]) -> None:
    """What the fixture trees lack for tuning: cpufreq, cpuidle, IRQs, irqbalance."""
    write(root, "proc/irq/default_smp_affinity", "ffffffff,ffffffff\n")
    for pci, numbers in irqs.items():
        for irq in numbers:
            write(root, f"sys/bus/pci/devices/{pci}/msi_irqs/{irq}", "msix\n")
            write(root, f"proc/irq/{irq}/smp_affinity_list", f"0-{max(cpus)}\n")
    for cpu in cpus:
        base = f"sys/devices/system/cpu/cpu{cpu}"
        write(root, f"{base}/cpufreq/scaling_governor", "powersave\n")
        write(root, f"{base}/cpufreq/scaling_available_governors", "performance powersave\n")
        for state, (name, latency) in enumerate([("POLL", 0), ("C1", 2), ("C6", 133)]):
            write(root, f"{base}/cpuidle/state{state}/name", f"{name}\n")
            write(root, f"{base}/cpuidle/state{state}/latency", f"{latency}\n")
            write(root, f"{base}/cpuidle/state{state}/disable", "0\n")
    write(root, "usr/sbin/irqbalance", "")
    write(root, "etc/default/irqbalance", "#IRQBALANCE_ONESHOT=\n#IRQBALANCE_BANNED_CPULIST=\n")
    write(root, "proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1\n")


@pytest.fixture
def r730_host(facts):
    """An R730 tree with every knob, SN planned, and the settings of a full tuning run."""
    topology, sn, root = facts("r730", layout="sn", model_gb=8)
    add_tunables(root, list(range(56)), {"0000:01:00.0": [120, 121, 122]})
    systemd = FakeSystemd()
    spec = decide(topology, sn, Settings(hugepages_per_node=2048, cstate_max_latency_us=10))
    return Host(root, run=systemd), spec, root, systemd


def test_check_mode_predicts_every_change_and_writes_nothing(r730_host):
    host, spec, root, systemd = r730_host
    before = {p: p.read_text() for p in root.rglob("*") if p.is_file()}
    outcome = tune(host, spec, BACKUP, check=True)
    assert outcome["changed"]
    assert {p: p.read_text() for p in root.rglob("*") if p.is_file()} == before
    assert systemd.calls == []
    knobs = by_name(outcome["report"])
    assert knobs["hugepages.node0.2048kB"]["after"] == 2048
    assert knobs["irq_affinity.eno1"]["after"] == {"120": "24,26,52,54"} | {
        "121": "24,26,52,54",
        "122": "24,26,52,54",
    }
    assert 'thp.enabled: "madvise"\n' in outcome["diff"]["before"]
    assert 'thp.enabled: "always"\n' in outcome["diff"]["after"]


def test_tune_sets_reads_back_and_records_originals_then_changes_nothing(r730_host):
    host, spec, root, systemd = r730_host
    first = tune(host, spec, BACKUP)
    assert first["changed"]
    knobs = by_name(first["report"])
    assert {name: k["status"] for name, k in knobs.items()} == dict.fromkeys(knobs, "set")
    assert read(root, "proc/sys/kernel/numa_balancing") == "0"
    assert read(root, "sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages") == (
        "2048"
    )
    assert read(root, "sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages") == (
        "1024"
    ), "node 1 serves nothing: its pool is left as it was"
    assert read(root, "sys/kernel/mm/transparent_hugepage/enabled") == "always"
    assert read(root, "proc/irq/121/smp_affinity_list") == "24,26,52,54"
    assert read(root, "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") == "performance"
    assert read(root, "sys/devices/system/cpu/cpu1/cpufreq/scaling_governor") == "powersave"
    assert read(root, "sys/devices/system/cpu/cpu0/cpuidle/state2/disable") == "1", "C6: 133 us"
    assert read(root, "sys/devices/system/cpu/cpu0/cpuidle/state1/disable") == "0", "C1: 2 us"
    assert "IRQBALANCE_BANNED_CPULIST=0-22:2,28-50:2" not in read(root, "etc/default/irqbalance")
    assert read(root, "etc/default/irqbalance").endswith(
        "IRQBALANCE_BANNED_CPULIST=" + knobs["irqbalance"]["desired"]["banned_cpulist"]
    )
    assert systemd.calls == ["restart irqbalance.service"]
    # before is the original, after the read-back value.
    assert knobs["kernel.numa_balancing"]["before"] == 1
    node0 = format_cpulist(EVENS + [c + 28 for c in EVENS])
    assert knobs["cpu_governor.node0"]["before"] == {"powersave": node0}
    backup = json.loads((root / BACKUP).read_text())["knobs"]
    assert backup["thp.enabled"]["original"] == "madvise"
    assert backup["irq_affinity.eno1"]["original"] == dict.fromkeys(["120", "121", "122"], "0-55")

    second = tune(host, spec, BACKUP)
    assert not second["changed"]
    assert second["report"] == first["report"], "the report of an idempotent run is the same"
    assert systemd.calls == ["restart irqbalance.service"]


def test_a_recorded_original_is_never_overwritten_by_a_tuned_value(r730_host, facts):
    host, spec, root, _ = r730_host
    tune(host, spec, BACKUP)
    topology, sn, _ = facts("r730", layout="sn", model_gb=8)
    never = decide(topology, sn, Settings(thp="never", hugepages_per_node=2048))
    report = tune(host, never, BACKUP)["report"]
    assert read(root, "sys/kernel/mm/transparent_hugepage/enabled") == "never"
    assert by_name(report)["thp.enabled"]["before"] == "madvise"
    backup = json.loads((root / BACKUP).read_text())["knobs"]
    assert backup["thp.enabled"]["original"] == "madvise"


def test_restore_puts_every_original_back_and_removes_the_backup(r730_host):
    host, spec, root, systemd = r730_host
    thp = "sys/kernel/mm/transparent_hugepage/enabled"
    pristine = {
        p: p.read_text()
        for p in root.rglob("*")
        if p.is_file() and "irqbalance" not in p.name and "transparent_hugepage" not in str(p)
    }
    tune(host, spec, BACKUP)
    check = restore(host, BACKUP, check=True)
    assert check["changed"] and (root / BACKUP).exists()
    outcome = restore(host, BACKUP)
    assert outcome["changed"]
    statuses = {k["name"]: k["status"] for k in outcome["report"]["knobs"]}
    assert set(statuses.values()) == {"restored"}, statuses
    assert not (root / BACKUP).exists()
    after = {p: p.read_text() for p in pristine if p.exists()}
    assert after == pristine
    assert read(root, thp) == "madvise"
    assert "IRQBALANCE_BANNED_CPULIST=" not in read(root, "etc/default/irqbalance").replace(
        "#IRQBALANCE_BANNED_CPULIST=", ""
    )
    assert systemd.calls == ["restart irqbalance.service", "restart irqbalance.service"]
    nothing = restore(host, BACKUP)
    assert not nothing["changed"] and nothing["report"]["knobs"] == []


@pytest.mark.parametrize(
    "original",
    [
        '# Set by hand\nIRQBALANCE_ONESHOT=0\nIRQBALANCE_BANNED_CPULIST="1,3"\n# keep this\n',
        None,
    ],
    ids=["edited-file", "no-file"],
)
def test_irqbalance_config_is_restored_byte_for_byte(r730_host, original):
    host, spec, root, systemd = r730_host
    config = root / "etc/default/irqbalance"
    if original is None:
        config.unlink()
    else:
        config.write_text(original)
        config.chmod(0o640)
    tune(host, spec, BACKUP)
    assert "IRQBALANCE_BANNED_CPULIST=0,2,4," in config.read_text()
    outcome = restore(host, BACKUP)
    assert by_name(outcome["report"])["irqbalance"]["status"] == "restored"
    if original is None:
        assert not config.exists(), "a file socketwise created is removed again"
    else:
        assert config.read_text() == original
        assert config.stat().st_mode & 0o777 == 0o640
    assert not list(config.parent.glob(".*partial"))


def test_irqbalance_stop_is_undone_by_restore(r730_host, facts):
    host, _, root, systemd = r730_host
    topology, sn, _ = facts("r730", layout="sn", model_gb=8)
    spec = decide(topology, sn, Settings(irqbalance="stop"))
    tune(host, spec, BACKUP)
    assert (systemd.active, systemd.enabled) == (False, False)
    restore(host, BACKUP)
    assert (systemd.active, systemd.enabled) == (True, True)
    assert systemd.calls == ["disable irqbalance.service", "stop irqbalance.service"] + [
        "enable irqbalance.service",
        "restart irqbalance.service",
    ]


def test_read_only_host_reports_every_knob_unavailable_and_persists_nothing(r730_host):
    host, spec, root, systemd = r730_host
    read_only = Host(root, run=systemd, writable=lambda path: False)
    before = {p: p.read_text() for p in root.rglob("*") if p.is_file()}
    outcome = tune(read_only, spec, BACKUP)
    assert not outcome["changed"]
    assert {p: p.read_text() for p in root.rglob("*") if p.is_file()} == before
    for knob in outcome["report"]["knobs"]:
        assert knob["status"] == "unavailable", knob
        assert "read-only here" in knob["reason"]
        assert knob["before"] == knob["after"] is not None, "the value is still reported"
    assert outcome["persist"] == {"sysctl": {}, "boot": [], "kernel_args": None}


def test_vm_without_cpufreq_cpuidle_or_irqbalance_reports_them_unavailable(facts):
    topology, sn, root = facts("vm", layout="sn", model_gb=1)
    spec = decide(topology, sn, Settings(cstate_max_latency_us=10))
    outcome = tune(Host(root, run=FakeSystemd()), spec, BACKUP)
    knobs = by_name(outcome["report"])
    assert knobs["kernel.numa_balancing"]["reason"] == (
        "no /proc/sys/kernel/numa_balancing (kernel without NUMA balancing)"
    )
    assert knobs["cpu_governor.node0"]["reason"] == (
        "no cpufreq on CPU 0 (a VM, or no cpufreq driver loaded)"
    )
    assert knobs["cpuidle.node0"]["reason"].startswith("no cpuidle states on CPU 0")
    assert knobs["irqbalance"]["reason"] == "irqbalance is not installed: nothing moves IRQs back"
    assert knobs["irq_affinity.eth0"]["reason"].startswith("eth0 has no IRQs to steer")
    assert knobs["thp.enabled"]["status"] == "set"
    assert outcome["persist"]["sysctl"] == {}
    assert [k["name"] for k in outcome["persist"]["boot"]] == ["thp.enabled", "thp.defrag"]


def test_kernel_without_numa_tunes_the_global_hugepage_pool(facts):
    topology, sn, root = facts("nonuma", layout="sn")
    spec = decide(topology, sn, Settings(hugepages_per_node=16))
    report = tune(Host(root, run=FakeSystemd()), spec, None)["report"]
    assert by_name(report)["hugepages.node0.2048kB"]["status"] == "set"
    assert read(root, "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages") == "16"


def test_nic_irqs_are_found_in_proc_interrupts_when_sysfs_has_none(facts):
    _, _, root = facts("vm")
    write(
        root,
        "proc/interrupts",
        "           CPU0       CPU1\n"
        " 37:          0          0 PCI-MSIX-0000:00:03.0   0-edge      virtio2-config\n"
        " 38:          0      34861 PCI-MSIX-0000:00:03.0   1-edge      eth0-input.0\n"
        " 39:      36107          0 PCI-MSIX-0000:00:03.0   2-edge      eth0-output.0\n"
        "NMI:          0          0   Non-maskable interrupts\n",
    )
    assert nic_irqs(Host(root), "eth0", None) == [38, 39]


class FlakyKernel(Host):
    """A kernel that grants fewer hugepages than asked and keeps managed IRQs in place."""

    def write(self, relative: str, text: str) -> None:
        if relative.endswith("hugepages-2048kB/nr_hugepages"):
            text = str(min(int(text), 1500)) + "\n"
        if relative == "proc/irq/122/smp_affinity_list":
            raise tuning.KnobError("managed", 5)
        super().write(relative, text)


def test_short_hugepages_and_managed_irqs_are_reported_not_hidden(r730_host):
    _, spec, root, systemd = r730_host
    knobs = by_name(tune(FlakyKernel(root, run=systemd), spec, BACKUP)["report"])
    hugepages = knobs["hugepages.node0.2048kB"]
    assert (hugepages["status"], hugepages["after"]) == ("short", 1500)
    assert "found 1500 of 2048 free 2048kB pages on node 0" in hugepages["reason"]
    irqs = knobs["irq_affinity.eno1"]
    assert irqs["status"] == "partial"
    assert irqs["reason"] == "the kernel manages the affinity of IRQs 122"


def test_1g_pages_go_on_the_kernel_command_line_and_say_a_reboot_is_required(facts):
    topology, tp, root = facts("r730", layout="tp", model_gb=8)
    spec = decide(topology, tp, Settings(hugepages_size="1G", hugepages_per_node=4))
    no_grub = tune(Host(root, run=FakeSystemd()), spec, BACKUP)
    knob = by_name(no_grub["report"])["hugepages.node0.1048576kB"]
    assert knob["status"] == "unavailable"
    assert "add 'hugepagesz=1G hugepages=0:4' to it yourself" in knob["reason"]
    assert no_grub["persist"]["kernel_args"] is None

    write(root, "usr/sbin/update-grub", "")
    write(root, "proc/cmdline", "root=/dev/sda1\n")
    outcome = tune(Host(root, run=FakeSystemd()), spec, BACKUP)
    assert outcome["reboot_required"] and outcome["report"]["reboot_required"]
    statuses = {k["name"]: k["status"] for k in outcome["report"]["knobs"]}
    assert statuses["hugepages.node0.1048576kB"] == "reboot-required"
    assert outcome["persist"]["kernel_args"] == "hugepagesz=1G hugepages=0:4,1:4"
    assert not any(k["kind"] == "hugepages" for k in outcome["persist"]["boot"])
    assert read(
        root, "sys/devices/system/node/node0/hugepages/hugepages-1048576kB/nr_hugepages"
    ) == ("0"), "1 GB pages are never allocated at run time"
    backup = json.loads((root / BACKUP).read_text())["knobs"]
    assert backup["hugepages.node0.1048576kB"]["original"] == 0

    # Booted with the arguments, but the kernel found only 3 pages on node 0.
    write(root, "proc/cmdline", "root=/dev/sda1 hugepagesz=1G hugepages=0:4,1:4\n")
    pools = "sys/devices/system/node/node{}/hugepages/hugepages-1048576kB/nr_hugepages"
    write(root, pools.format(0), "3\n")
    write(root, pools.format(1), "4\n")
    booted = by_name(tune(Host(root, run=FakeSystemd()), spec, BACKUP)["report"])
    assert booted["hugepages.node0.1048576kB"]["status"] == "short"
    assert booted["hugepages.node1.1048576kB"]["status"] == "set"


def test_boot_helper_reapplies_the_persisted_knobs(r730_host, tmp_path):
    host, spec, root, _ = r730_host
    outcome = tune(host, spec, BACKUP)
    # A reboot: the runtime values are back at the kernel's defaults.
    write(root, "sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never\n")
    write(root, "proc/irq/120/smp_affinity_list", "0-55\n")
    lines = tuning.apply_at_boot(Host(root), outcome["persist"]["boot"])
    assert 'thp.enabled: set "always"' in lines
    assert read(root, "sys/kernel/mm/transparent_hugepage/enabled") == "always"
    assert read(root, "proc/irq/120/smp_affinity_list") == "24,26,52,54"
    assert not any(line.startswith(("irqbalance", "kernel.")) for line in lines)


def test_boot_helper_runs_from_the_shipped_files_with_only_the_standard_library(tmp_path):
    # As the unit runs it: the files the role installs, outside the checkout, no knobs to touch.
    shipped = ship("host_tuning", "__host_tuning_helper_files", tmp_path / "lib")
    spec = tmp_path / "tuning.json"
    spec.write_text(json.dumps({"schema": 1, "knobs": []}))
    argv, env = host_python(shipped, "socketwise.host.tuning", "apply", str(spec))
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    argv, env = host_python(shipped, "socketwise.host.tuning")
    usage = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert usage.returncode == 2 and "usage" in usage.stderr


# --- the role's public interface -------------------------------------------------------------


def test_argument_specs_declare_every_default_with_the_same_value():
    role = REPO / "roles/host_tuning"
    defaults = yaml.safe_load((role / "defaults/main.yml").read_text())
    options = yaml.safe_load((role / "meta/argument_specs.yml").read_text())["argument_specs"]
    declared = options["main"]["options"]
    assert set(declared) == set(defaults)
    for name, value in defaults.items():
        assert declared[name].get("default") == value, name


def test_playbook_refuses_too_many_hugepages_in_one_line_before_changing_anything(tmp_path):
    root = build_machine("r730", tmp_path / "r730")
    # The controller itself, from a fixture tree; --check as a second guard.
    done = run_playbook(
        "playbooks/tune.yml",
        *("-i", "inventories/local", "--check"),
        *("-e", f"topology_root={root}", "-e", "plan_layout=sn", "-e", "plan_model_gb=8"),
        *("-e", "host_tuning_hugepages_gb_per_node=40"),
        *("-e", f"socketwise_artifacts_dir={tmp_path / 'artifacts'}"),
    )
    assert done.returncode != 0
    assert (
        "localhost: host_tuning_hugepages_gb_per_node=40: node 0 can spare 12.6 GB for hugepages"
        in done.output
    ), done.output[-3000:]
    assert "set host_tuning_hugepages_gb_per_node to at most 12.5" in done.output
    assert "Set every knob" not in done.output, "nothing ran after the refusal"


@pytest.mark.parametrize(
    ("provided", "accepted"),
    [
        (
            {
                "host_tuning_numa_balancing": None,
                "host_tuning_thp": None,
                "host_tuning_thp_defrag": None,
                "host_tuning_irqbalance": None,
                "host_tuning_cpu_governor": None,
            },
            True,
        ),
        ({"host_tuning_numa_balancing": "1", "host_tuning_thp": "never"}, True),
        ({"host_tuning_thp": "sometimes"}, False),
        ({"host_tuning_irqbalance": "off"}, False),
    ],
)
def test_role_argument_validation_takes_null_as_leave_it_alone(tmp_path, provided, accepted):
    playbook = tmp_path / "validate.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Validate like the role does",
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "ansible.builtin.validate_argument_spec": {
                                "argument_spec": "{{ (lookup('file', spec) | from_yaml)"
                                ".argument_specs.main.options }}",
                                "provided_arguments": "{{ provided }}",
                            }
                        }
                    ],
                }
            ]
        )
    )
    extra = {"spec": str(REPO / "roles/host_tuning/meta/argument_specs.yml"), "provided": provided}
    done = run_playbook(str(playbook), "-i", "inventories/local", "-e", json.dumps(extra))
    assert (done.returncode == 0) == accepted, done.output[-2000:]


def test_a_c_state_whose_exit_latency_equals_the_bound_stays_enabled(facts):
    """host_tuning_cstate_max_latency_us disables the C-states that take longer to leave,
    not those that take exactly as long: with 2 us C1 (2 us) stays, and with 0 POLL does."""
    topology, sn, root = facts("r730", layout="sn", model_gb=8)
    add_tunables(root, list(range(56)), {})
    for bound, kept, disabled in ((2, "state1", "state2"), (0, "state0", "state1")):
        spec = decide(topology, sn, Settings(cstate_max_latency_us=bound))
        tune(Host(root, run=FakeSystemd()), spec, None)
        base = "sys/devices/system/cpu/cpu0/cpuidle"
        assert read(root, f"{base}/{kept}/disable") == "0", bound
        assert read(root, f"{base}/{disabled}/disable") == "1", bound
