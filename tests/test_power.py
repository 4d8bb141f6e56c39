"""socketwise/power.py on fixture powercap trees and fake ipmitools: the watts a runner
records, counters that wrap, and sources a host lacks reported as missing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from socketwise.measure import power, rundir
from socketwise.report import analysis

POWER_PY = Path(power.__file__)
# What intel_rapl exposes on a Broadwell/Skylake server (max_energy_range_uj is per domain).
PACKAGE_RANGE = 262143328850
DRAM_RANGE = 65712999613
DCMI_OUTPUT = """
    Instantaneous power reading:                   147 Watts
    Minimum during sampling period:                 96 Watts
    Maximum during sampling period:                312 Watts
    Average power reading over sample period:      151 Watts
    IPMI timestamp:                           Sat Nov 22 03:00:00 2025
    Sampling period:                          00000001 Seconds.
    Power reading state is:                   activated
"""


class Powercap:
    """A sysfs powercap tree laid out as the kernel does: domains under
    devices/virtual/powercap, symlinked from class/powercap."""

    def __init__(self, root: Path, domains: dict[str, tuple[str, int, int]]):
        self.root = root
        self.dirs: dict[str, Path] = {}
        devices = root / "sys/devices/virtual/powercap/intel-rapl"
        klass = root / "sys/class/powercap"
        klass.mkdir(parents=True)
        devices.mkdir(parents=True)
        (klass / "intel-rapl").symlink_to(devices)
        for zone, (name, energy, max_range) in domains.items():
            parent = devices if zone.count(":") == 1 else self.dirs[zone.rsplit(":", 1)[0]]
            path = parent / zone
            path.mkdir()
            (path / "name").write_text(name + "\n")
            (path / "max_energy_range_uj").write_text(f"{max_range}\n")
            (klass / zone).symlink_to(path)
            self.dirs[zone] = path
            self.set(zone, energy)

    def set(self, zone: str, energy_uj: int) -> None:
        (self.dirs[zone] / "energy_uj").write_text(f"{energy_uj}\n")

    def get(self, zone: str) -> int:
        return int((self.dirs[zone] / "energy_uj").read_text())


def two_sockets(root: Path) -> Powercap:
    return Powercap(
        root,
        {
            "intel-rapl:0": ("package-0", 1_000_000_000, PACKAGE_RANGE),
            "intel-rapl:0:0": ("core", 500_000_000, PACKAGE_RANGE),
            "intel-rapl:0:1": ("dram", 10_000_000, DRAM_RANGE),
            # Package 1's counter is 0.3 J short of its range: it wraps in the first second.
            "intel-rapl:1": ("package-1", PACKAGE_RANGE - 300_000, PACKAGE_RANGE),
            "intel-rapl:1:0": ("dram", 20_000_000, DRAM_RANGE),
        },
    )


class FakeTime:
    """A clock that advances only when sleep() is called, running `tick` each second."""

    def __init__(self, tick):
        self.now = 1000.0
        self.tick = tick

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.tick(seconds)


def burn(cap: Powercap, watts: dict[str, float]):
    """A tick that adds `watts` x seconds of energy to each zone, wrapping like the kernel."""

    def tick(seconds: float) -> None:
        for zone, w in watts.items():
            max_range = int((cap.dirs[zone] / "max_energy_range_uj").read_text())
            cap.set(zone, (cap.get(zone) + int(w * seconds * 1e6)) % max_range)

    return tick


def no_ipmitool(tmp_path: Path) -> str:
    return str(tmp_path / "no-such-ipmitool")


def fake_ipmitool(tmp_path: Path, output: str, code: int = 0, stderr: str = "") -> str:
    script = tmp_path / "ipmitool"
    script.write_text(
        f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\nprintf '%s\\n' '{stderr}' >&2\nexit {code}\n"
    )
    script.chmod(0o755)
    return str(script)


def test_energy_delta_allows_for_a_counter_that_wrapped():
    assert power.energy_delta_uj(100, 400, PACKAGE_RANGE) == 300
    assert power.energy_delta_uj(PACKAGE_RANGE - 300_000, 500_000, PACKAGE_RANGE) == 800_000


def test_package_domains_and_their_dram_are_found_core_is_not(tmp_path):
    two_sockets(tmp_path)
    assert sorted(power.rapl_domains(tmp_path)) == [
        "package-0",
        "package-0/dram",
        "package-1",
        "package-1/dram",
    ]


def test_rapl_watts_over_two_packages_with_one_counter_wrapping(tmp_path):
    cap = two_sockets(tmp_path)
    watts = {"intel-rapl:0": 95.0, "intel-rapl:1": 80.0, "intel-rapl:0:1": 12.0}
    watts["intel-rapl:1:0"] = 9.0
    fake = FakeTime(burn(cap, watts))
    result = power.measure(
        3,
        tmp_path,
        interval=1.0,
        ipmitool=no_ipmitool(tmp_path),
        clock=fake.clock,
        sleep=fake.sleep,
    )
    assert cap.get("intel-rapl:1") < PACKAGE_RANGE - 300_000  # it did wrap
    rapl = result["sources"]["rapl"]
    assert rapl["domains"] == {
        "package-0": 95.0,
        "package-0/dram": 12.0,
        "package-1": 80.0,
        "package-1/dram": 9.0,
    }
    assert rapl["watts"] == 175.0  # the packages; DRAM is reported on its own
    assert result["seconds"] == 3


def test_ipmi_dcmi_reading_is_parsed():
    assert power.parse_dcmi(DCMI_OUTPUT) == 147.0
    with pytest.raises(power.Missing, match="state is deactivated"):
        power.parse_dcmi(DCMI_OUTPUT.replace("activated", "deactivated"))
    with pytest.raises(power.Missing, match="no 'Instantaneous power reading'"):
        power.parse_dcmi("Error: no response from BMC\n")


def test_ipmi_readings_are_averaged_over_the_window(tmp_path):
    readings = iter([140, 150, 160])

    def run(command):
        assert command[1:] == ["dcmi", "power", "reading"]
        text = DCMI_OUTPUT.replace("147 Watts", f"{next(readings)} Watts", 1)
        return subprocess.CompletedProcess(command, 0, text, "")

    fake = FakeTime(lambda seconds: None)
    result = power.measure(
        2,
        tmp_path,
        interval=1.0,
        ipmitool=fake_ipmitool(tmp_path, ""),
        run=run,
        clock=fake.clock,
        sleep=fake.sleep,
    )
    assert result["sources"]["ipmi"] == {"watts": 150.0, "samples": 3}


def test_missing_sources_are_reported_missing_not_raised(tmp_path):
    result = power.measure(0, tmp_path, ipmitool=no_ipmitool(tmp_path))
    assert "no " in result["sources"]["rapl"]["missing"]
    assert "not installed" in result["sources"]["ipmi"]["missing"]


def test_a_host_without_a_bmc_reports_ipmitool_s_complaint(tmp_path):
    tool = fake_ipmitool(
        tmp_path,
        "",
        code=1,
        stderr="Could not open device at /dev/ipmi0 or /dev/ipmi/0 or /dev/ipmidev/0",
    )
    result = power.measure(0, tmp_path, ipmitool=tool)
    assert result["sources"]["ipmi"]["missing"] == (
        f"{tool} dcmi power reading exited 1: Could not open device at /dev/ipmi0 or "
        f"/dev/ipmi/0 or /dev/ipmidev/0"
    )


def test_powercap_without_packages_is_missing(tmp_path):
    Powercap(tmp_path, {"intel-rapl-mmio:0": ("package-0", 1, PACKAGE_RANGE)})
    with pytest.raises(power.Missing, match="no RAPL package domain"):
        power.rapl_domains(tmp_path)


def power_cli(root: Path, ipmitool: str, seconds: float, interval: float) -> list[str]:
    """power.py's command line with -I -S: no site-packages and no project on the path,
    as on a target host."""
    return [
        sys.executable, "-I", "-S", str(POWER_PY), "--seconds", str(seconds),
        "--interval", str(interval), "--root", str(root), "--ipmitool", ipmitool,
    ]  # fmt: skip


def test_cli_runs_with_the_standard_library_only_and_prints_json(tmp_path):
    two_sockets(tmp_path)
    tool = fake_ipmitool(tmp_path, DCMI_OUTPUT)
    done = subprocess.run(
        power_cli(tmp_path, tool, seconds=0.3, interval=0.1),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["sources"]["ipmi"]["watts"] == 147.0
    assert result["sources"]["rapl"]["watts"] == 0.0  # nothing burned energy in the fixture


def test_cli_stops_early_on_sigterm_with_what_it_measured(tmp_path):
    tool = fake_ipmitool(tmp_path, DCMI_OUTPUT)
    process = subprocess.Popen(
        power_cli(tmp_path, tool, seconds=600, interval=0.2),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(1.5)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    result = json.loads(out)
    # What it measured until the signal, not the 600 s it was asked for.
    assert 0 < result["seconds"] < 600
    print(f"stopped after {result['seconds']} s")
    assert result["sources"]["ipmi"]["watts"] == 147.0
    assert "missing" in result["sources"]["rapl"]


def test_power_rows_feed_the_report(tmp_path):
    """The runner's path: power.py's JSON -> power.csv rows -> tok/W in the report."""
    idle = {"sources": {"ipmi": {"watts": 100.0, "samples": 5}, "rapl": {"missing": "x"}}}
    busy = {"sources": {"ipmi": {"watts": 150.0, "samples": 5}, "rapl": {"watts": 90.0}}}
    rows = rundir.power_rows("box", "idle", None, None, idle)
    rows += rundir.power_rows("box", "sn", None, 1, busy)
    assert [r["source"] for r in rows] == ["ipmi", "ipmi", "rapl"]
    rundir.write_csv(tmp_path / rundir.POWER, rundir.POWER_COLUMNS, rows)
    rundir.write_csv(
        tmp_path / rundir.SUMMARY,
        rundir.SUMMARY_COLUMNS,
        [{"host": "box", "layout": "sn", "concurrency": 1, "output_tok_s": 5.0}],
    )
    energy = analysis.analyse(tmp_path)["energy"]
    assert energy["source"] == "ipmi"
    assert energy["steps"][0]["tok_per_w_above_idle"] == pytest.approx(0.1)
    # RAPL had no idle reading: tok/W, but no tok/W above idle.
    rapl = energy["sources"]["rapl"]
    assert rapl["idle_watts"] is None
    assert rapl["steps"][0]["tok_per_w"] == pytest.approx(5 / 90, abs=1e-4)
    assert rapl["steps"][0]["tok_per_w_above_idle"] is None
