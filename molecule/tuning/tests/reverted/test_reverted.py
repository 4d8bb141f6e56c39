"""After host_tuning_state: absent: the originals read back, and nothing of the role left."""

import json
import os
from pathlib import Path

REPORT = "/var/lib/socketwise/tuning-report.json"


def value(host, path: str) -> str:
    text = host.file(path).content_string.strip()
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else text


def saved_before_the_scenario() -> dict[str, str]:
    saved = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "kernel.json"
    return json.loads(saved.read_text())


def test_kernel_values_are_the_originals_again(host):
    saved = saved_before_the_scenario()
    # What the role found: prepare had turned NUMA balancing on.
    saved["/proc/sys/kernel/numa_balancing"] = "1"
    for path, original in saved.items():
        if path.startswith(("/proc/sys", "/sys/kernel/mm", "/sys/devices/system/node")):
            assert value(host, path) == original, path
    function = host.check_output("readlink -f /sys/class/net/eth0/device/..")
    for irq in host.file(f"{function}/msi_irqs").listdir():
        path = f"/proc/irq/{irq}/smp_affinity_list"
        assert value(host, path) == saved[path], path


def test_report_says_every_knob_was_restored(host):
    report = json.loads(host.file(REPORT).content_string)
    assert report["state"] == "absent"
    expected = {
        "kernel.numa_balancing": "restored",
        "hugepages.node0.2048kB": "restored",
        "thp.enabled": "restored",
        "thp.defrag": "restored",
        "irq_affinity.eth0": "restored",
        "irqbalance": "restored",
    }
    # A VM with a cpuidle driver (haltpoll) has its C-states managed, and put back.
    if host.file("/sys/devices/system/cpu/cpu0/cpuidle").is_directory:
        expected["cpuidle.node0"] = "restored"
    assert {knob["name"]: knob["status"] for knob in report["knobs"]} == expected


def test_irqbalance_is_as_before_the_role(irqbalance, irqbalance_before):
    assert (irqbalance.active, irqbalance.enabled) == ("active", "enabled")
    assert (irqbalance.active, irqbalance.enabled) == (
        irqbalance_before.active,
        irqbalance_before.enabled,
    )
    assert irqbalance.config == irqbalance_before.config
    # The daemon that runs now read the configuration put back: it bans no CPU.
    assert irqbalance.daemon_environment
    assert "IRQBALANCE_BANNED_CPULIST" not in irqbalance.daemon_environment


def test_nothing_of_the_role_is_left_behind(host):
    for path in (
        "/etc/sysctl.d/60-socketwise-tuning.conf",
        "/etc/systemd/system/socketwise-tuning.service",
        "/etc/socketwise/tuning.json",
        "/usr/local/lib/socketwise/tuning",
        "/usr/local/lib/socketwise/socketwise_tuning.py",
        "/usr/local/lib/socketwise/socketwise_topology.py",
        "/var/lib/socketwise/tuning-backup.json",
    ):
        assert not host.file(path).exists, path
    units = host.run("systemctl list-unit-files socketwise-tuning.service")
    assert "0 unit files listed" in units.stdout
