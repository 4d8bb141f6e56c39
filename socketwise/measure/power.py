"""Mean power of a host over a time window: RAPL energy counters and IPMI DCMI readings.

Stdlib only and self-contained: the benchmark role ships this one file to the host and
runs `python3 power.py --seconds N`, which prints JSON (schema below) after N seconds,
or earlier on SIGTERM/SIGINT with what it measured so far.

Sources:
- `rapl`: `/sys/class/powercap/intel-rapl:N` package domains (AMD's kernels name
  theirs the same) and their `dram` subdomains. `energy_uj` counts up to
  `max_energy_range_uj` and wraps to 0, so counters are read every `interval` seconds
  and each delta is corrected for one wrap. Watts = sum of package deltas / elapsed time.
- `ipmi`: `ipmitool dcmi power reading` ("Instantaneous power reading: 147 Watts"),
  polled every `interval` seconds; watts = mean of the readings. This is the whole box
  (PSU input) where the BMC supports DCMI.
A source a host does not have (no powercap, counters readable by root only, no
ipmitool, no BMC, DCMI not activated) is reported as {"missing": reason}, never an error.

Output: {"seconds": elapsed, "sources": {"rapl": {"watts": W, "domains": {"package-0":
W, "package-0/dram": W, ...}}, "ipmi": {"watts": W, "samples": n}}} with a missing
source as {"missing": "why"}.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

POWERCAP = "sys/class/powercap"
_PACKAGE_DIR = re.compile(r"^intel-rapl:\d+$")
_DCMI_READING = re.compile(r"Instantaneous power reading:\s*([0-9.]+)\s*Watts", re.IGNORECASE)
_DCMI_STATE = re.compile(r"Power reading state is:\s*(\w+)", re.IGNORECASE)


class Missing(Exception):
    """A power source this host does not offer; the message says why."""


# --- RAPL -----------------------------------------------------------------------------


def rapl_domains(root: str | Path = "/") -> dict[str, Path]:
    """Package domains and their dram subdomains: {"package-0": dir, "package-0/dram": dir}."""
    base = Path(root) / POWERCAP
    if not base.is_dir():
        raise Missing(f"no {base} (kernel without powercap, or a container without /sys)")
    domains = {}
    for package in sorted(p for p in base.iterdir() if _PACKAGE_DIR.match(p.name)):
        name = _read(package / "name")
        if not name.startswith("package"):
            continue
        domains[name] = package
        for sub in sorted(package.glob(f"{package.name}:*")):
            if _read(sub / "name") == "dram":
                domains[f"{name}/dram"] = sub
    if not domains:
        raise Missing(f"no RAPL package domain under {base}")
    return domains


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except PermissionError as exc:
        raise Missing(f"{path} is readable by root only; run as root") from exc
    except OSError as exc:
        raise Missing(f"cannot read {path}: {exc.strerror}") from exc


def read_counters(domains: dict[str, Path]) -> dict[str, int]:
    """energy_uj of every domain."""
    return {name: int(_read(path / "energy_uj")) for name, path in domains.items()}


def max_ranges(domains: dict[str, Path]) -> dict[str, int]:
    return {name: int(_read(path / "max_energy_range_uj")) for name, path in domains.items()}


def energy_delta_uj(before: int, after: int, max_range_uj: int) -> int:
    """Energy between two readings of one counter, allowing for one wrap past its range."""
    delta = after - before
    return delta + max_range_uj if delta < 0 else delta


def rapl_watts(
    samples: list[dict[str, int]], elapsed_s: float, ranges: dict[str, int]
) -> dict[str, object]:
    """Mean watts over consecutive counter readings taken `elapsed_s` apart in all."""
    if len(samples) < 2 or elapsed_s <= 0:
        raise Missing("fewer than two RAPL readings")
    watts = {}
    for name, max_range in ranges.items():
        joules = sum(
            energy_delta_uj(samples[i - 1][name], samples[i][name], max_range)
            for i in range(1, len(samples))
        )
        watts[name] = round(joules / 1e6 / elapsed_s, 2)
    total = sum(w for name, w in watts.items() if "/" not in name)
    return {"watts": round(total, 2), "domains": watts}


# --- IPMI DCMI ------------------------------------------------------------------------


def parse_dcmi(text: str) -> float:
    """Watts from `ipmitool dcmi power reading`; Missing when there is no usable reading."""
    state = _DCMI_STATE.search(text)
    if state and state.group(1).lower() != "activated":
        raise Missing(f"DCMI power reading state is {state.group(1)} on this BMC")
    reading = _DCMI_READING.search(text)
    if not reading:
        raise Missing("no 'Instantaneous power reading' in ipmitool's output")
    return float(reading.group(1))


Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=20,
        env={"LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )


def ipmi_reading(ipmitool: str = "ipmitool", run: Runner = _run) -> float:
    if shutil.which(ipmitool) is None:
        raise Missing(f"{ipmitool} not installed")
    try:
        done = run([ipmitool, "dcmi", "power", "reading"])
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Missing(f"{ipmitool} dcmi power reading failed: {exc}") from exc
    if done.returncode != 0:
        first = (done.stderr or done.stdout).strip().splitlines()[:1]
        raise Missing(
            f"{ipmitool} dcmi power reading exited {done.returncode}: "
            f"{first[0] if first else 'no output'}"
        )
    return parse_dcmi(done.stdout)


# --- sampling -------------------------------------------------------------------------


class Sources:
    """The sources a host has, opened once; `read()` takes one timestamped sample.

    A sample is {"t": seconds, "rapl": {domain: energy_uj} or None, "ipmi": watts or
    None}; `missing` names each source the host does not offer, with the reason.
    """

    def __init__(
        self,
        root: str | Path = "/",
        ipmitool: str = "ipmitool",
        run: Runner = _run,
        clock: Callable[[], float] = time.time,
    ):
        self.ipmitool, self.run, self.clock = ipmitool, run, clock
        self.missing: dict[str, str] = {}
        self._ipmi_why = ""
        self.domains: dict[str, Path] = {}
        self.ranges: dict[str, int] = {}
        try:
            self.domains = rapl_domains(root)
            self.ranges = max_ranges(self.domains)
        except Missing as exc:
            self.missing["rapl"] = str(exc)
        self.first = self.read()
        if self.first["ipmi"] is None:
            self.missing.setdefault("ipmi", self._ipmi_why)

    def read(self) -> dict:
        sample: dict = {"t": self.clock(), "rapl": None, "ipmi": None}
        if "rapl" not in self.missing:
            try:
                sample["rapl"] = read_counters(self.domains)
            except Missing as exc:
                self.missing["rapl"] = str(exc)
        if "ipmi" not in self.missing:
            # One failed poll of a slow BMC leaves the other readings standing.
            try:
                sample["ipmi"] = ipmi_reading(self.ipmitool, self.run)
            except Missing as exc:
                self._ipmi_why = str(exc)
        return sample


def spanning(samples: list[dict], start: float, end: float) -> list[dict]:
    """The timestamped samples from the last at or before `start` to the first at or
    after `end`: a window widened to the sampling grid, never narrowed."""
    before = [i for i, sample in enumerate(samples) if sample["t"] <= start]
    after = [i for i, sample in enumerate(samples) if sample["t"] >= end]
    return samples[before[-1] if before else 0 : (after[0] if after else len(samples) - 1) + 1]


def within(samples: list[dict], start: float, end: float) -> list[dict]:
    """The timestamped samples taken inside [start, end], or the one nearest its middle
    when the window is shorter than the sampling interval (none for no samples)."""
    inside = [sample for sample in samples if start <= sample["t"] <= end]
    if not inside and samples:
        inside = [min(samples, key=lambda sample: abs(sample["t"] - (start + end) / 2))]
    return inside


def window(
    sources_missing: dict[str, str],
    ranges: dict[str, int],
    samples: list[dict],
    start: float,
    end: float,
) -> dict:
    """Mean watts per source over [start, end] from timestamped samples.

    RAPL: the energy over `spanning` readings, corrected for wraps between consecutive
    readings. IPMI: the mean of the readings `within` the window.
    """
    sources: dict[str, dict] = {}
    if "rapl" in sources_missing:
        sources["rapl"] = {"missing": sources_missing["rapl"]}
    else:
        span = spanning([s for s in samples if s.get("rapl") is not None], start, end)
        elapsed = span[-1]["t"] - span[0]["t"] if span else 0.0
        try:
            sources["rapl"] = rapl_watts([s["rapl"] for s in span], elapsed, ranges)
        except Missing as exc:
            sources["rapl"] = {"missing": str(exc)}
    if "ipmi" in sources_missing:
        sources["ipmi"] = {"missing": sources_missing["ipmi"]}
    else:
        inside = [
            s["ipmi"] for s in within([s for s in samples if s.get("ipmi") is not None], start, end)
        ]
        if inside:
            sources["ipmi"] = {"watts": round(sum(inside) / len(inside), 2),
                               "samples": len(inside)}  # fmt: skip
        else:
            sources["ipmi"] = {"missing": "no DCMI reading in the window"}
    return {"seconds": round(end - start, 3), "sources": sources}


def measure(
    seconds: float,
    root: str | Path = "/",
    interval: float = 1.0,
    ipmitool: str = "ipmitool",
    run: Runner = _run,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    stop: Callable[[], bool] = lambda: False,
) -> dict:
    """Sample every source for `seconds` (or until `stop()`) and return the mean watts."""
    sources = Sources(root, ipmitool, run, clock)
    samples = [sources.first]
    start = samples[0]["t"]
    while not stop():
        left = seconds - (clock() - start)
        if left <= 0:
            break
        sleep(min(interval, left))
        samples.append(sources.read())
    return window(sources.missing, sources.ranges, samples, start, clock())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Mean power over a window, as JSON.")
    parser.add_argument("--seconds", type=float, required=True, help="window length")
    parser.add_argument("--interval", type=float, default=1.0, help="poll interval (1 s)")
    parser.add_argument("--root", default="/", help="read ROOT/sys instead of /sys")
    parser.add_argument("--ipmitool", default="ipmitool", help="ipmitool command")
    args = parser.parse_args(argv)
    stopped = []

    def request_stop(signum: int, frame: object) -> None:
        stopped.append(signum)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    result = measure(
        args.seconds, args.root, args.interval, args.ipmitool, stop=lambda: bool(stopped)
    )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
