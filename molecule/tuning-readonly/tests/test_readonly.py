"""Read-only /proc/sys and /sys: every kernel knob unavailable, nothing changed or persisted."""

import json
import os
from pathlib import Path

REPORT = "/var/lib/socketwise/tuning-report.json"


def value(host, path: str) -> str:
    text = host.file(path).content_string.strip()
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else text


def test_every_knob_is_reported_unavailable_with_the_reason(host):
    report = json.loads(host.file(REPORT).content_string)
    knobs = {knob["name"]: knob for knob in report["knobs"]}
    assert set(knobs) == {
        "kernel.numa_balancing",
        "hugepages.node0.2048kB",
        "thp.enabled",
        "thp.defrag",
        "irq_affinity.eth0",
        "irqbalance",
        "cpu_governor.node0",
        "cpuidle.node0",
    }
    for name, knob in knobs.items():
        assert knob["status"] == "unavailable", name
    for name in ("kernel.numa_balancing", "hugepages.node0.2048kB", "thp.enabled", "thp.defrag"):
        assert "is read-only here" in knobs[name]["reason"], name
        # The value is still read and reported.
        assert knobs[name]["after"] == knobs[name]["before"] is not None
    assert knobs["irq_affinity.eth0"]["reason"].startswith("/proc/irq/")


def test_no_kernel_value_changed(host):
    saved = json.loads(
        (Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "kernel.json").read_text()
    )
    for path, original in saved.items():
        if host.file(path).exists:
            assert value(host, path) == original, path


def test_nothing_is_persisted_or_backed_up(host):
    for path in (
        "/etc/sysctl.d/60-socketwise-tuning.conf",
        "/etc/systemd/system/socketwise-tuning.service",
        "/etc/socketwise/tuning.json",
        "/var/lib/socketwise/tuning-backup.json",
    ):
        assert not host.file(path).exists, path
