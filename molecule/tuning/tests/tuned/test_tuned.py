"""After converge (and again after a reboot): the kernel values read back on the machine.

The scenario plans SN on the 2-core lab machine with one core reserved: CPU 0 infers,
CPU 1 is left to the OS and gets the NIC's IRQs. See ../../molecule.yml for the variables.
"""

import json
import os
import time
from pathlib import Path

NODE0_2M = "/sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages"
THP = "/sys/kernel/mm/transparent_hugepage"
REPORT = "/var/lib/socketwise/tuning-report.json"


def value(host, path: str) -> str:
    text = host.file(path).content_string.strip()
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else text


def eth0_irqs(host) -> list[str]:
    function = host.check_output("readlink -f /sys/class/net/eth0/device/..")
    return sorted(host.file(f"{function}/msi_irqs").listdir(), key=int)


def test_numa_balancing_is_off_and_persisted_in_sysctl_d(host):
    assert value(host, "/proc/sys/kernel/numa_balancing") == "0"
    conf = host.file("/etc/sysctl.d/60-socketwise-tuning.conf")
    assert conf.content_string.startswith("#\n# Ansible managed")
    assert "\nkernel.numa_balancing = 0\n" in conf.content_string


def test_hugepages_sit_on_the_serving_node(host):
    assert value(host, NODE0_2M) == "64"


def test_transparent_hugepages_follow_the_variables(host):
    assert value(host, f"{THP}/enabled") == "always"
    assert value(host, f"{THP}/defrag") == "defer"


def test_nic_irqs_stay_off_the_inference_core(host):
    irqs = eth0_irqs(host)
    assert irqs, "the virtio NIC's PCI function lists its MSI-X vectors"
    for irq in irqs:
        assert value(host, f"/proc/irq/{irq}/smp_affinity_list") == "1", irq


def test_boot_time_unit_is_enabled_and_has_run(host):
    unit = "socketwise-tuning.service"
    assert host.service(unit).is_enabled
    shown = host.check_output(f"systemctl show -p ActiveState -p Result -p ExecMainStatus {unit}")
    assert set(shown.split()) == {"ActiveState=active", "Result=success", "ExecMainStatus=0"}
    # journald may still be writing the unit's output when the unit has exited (a busy host).
    for _ in range(20):
        journal = host.check_output(f"journalctl -b -u {unit} -o cat")
        if 'thp.enabled: set "always"' in journal:
            break
        time.sleep(0.5)
    assert 'thp.enabled: set "always"' in journal
    assert host.run(f"systemd-analyze verify {unit}").rc == 0


def has_cpuidle(host) -> bool:
    # Some VMs have a cpuidle driver (haltpoll), some none: the machine's own tree decides.
    return host.file("/sys/devices/system/cpu/cpu0/cpuidle").is_directory


def test_report_says_what_was_set_and_what_this_host_lacks(host):
    report = json.loads(host.file(REPORT).content_string)
    knobs = {knob["name"]: knob for knob in report["knobs"]}
    assert {name: knob["status"] for name, knob in knobs.items()} == {
        "kernel.numa_balancing": "set",
        "hugepages.node0.2048kB": "set",
        "thp.enabled": "set",
        "thp.defrag": "set",
        "irq_affinity.eth0": "set",
        "irqbalance": "set",
        "cpu_governor.node0": "unavailable",
        "cpuidle.node0": "set" if has_cpuidle(host) else "unavailable",
    }
    # before: what the machine had before the first change (prepare turned balancing on).
    assert knobs["kernel.numa_balancing"]["before"] == 1
    assert knobs["hugepages.node0.2048kB"]["before"] == 0
    assert knobs["cpu_governor.node0"]["reason"].startswith("no cpufreq on CPU 0")
    # prepare installed irqbalance and started it; the role bans the inference core.
    running = {"active": True, "enabled": True}
    assert knobs["irqbalance"]["before"] == running | {"banned_cpulist": None}
    assert knobs["irqbalance"]["after"] == running | {"banned_cpulist": "0"}
    assert not report["reboot_required"]


def test_report_was_fetched_to_the_controller(host):
    fetched = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"]) / "artifacts/tune1/tuning-report.json"
    assert json.loads(fetched.read_text()) == json.loads(host.file(REPORT).content_string)


def test_irqbalance_runs_banned_from_the_inference_core(irqbalance, irqbalance_before):
    # As prepare left it, and as the report says (after): running, enabled.
    assert (irqbalance_before.active, irqbalance_before.enabled) == ("active", "enabled")
    assert (irqbalance.active, irqbalance.enabled) == ("active", "enabled")
    # One line added to its configuration, nothing else changed.
    assert irqbalance.config == irqbalance_before.config + "IRQBALANCE_BANNED_CPULIST=0\n"
    # The daemon that runs now read it: restarted after the change (and started at boot
    # with it after the reboot).
    assert irqbalance.daemon_environment.get("IRQBALANCE_BANNED_CPULIST") == "0"
