"""CPU frequency and idle states on the serving nodes: the cpufreq governor, and C-states
deeper than an exit-latency bound disabled. Both are absent in most VMs (unavailable)."""

from __future__ import annotations

import re
from typing import Any

from ...facts.files import format_cpulist, parse_cpulist
from .base import Host, Kind, Knob, Unavailable


def knobs(
    nodes: dict[int, dict],
    serving: dict[int, dict],
    governor: str | None,
    max_latency_us: int | None,
) -> list[Knob]:
    planned: list[Knob] = []
    for node in sorted(serving):
        cpus = list(nodes[node]["cpus"])
        planned.append(
            {
                "name": f"cpu_governor.node{node}",
                "kind": "cpu_governor",
                "node": node,
                "cpus": cpus,
                "desired": governor,
            }
        )
        planned.append(
            {
                "name": f"cpuidle.node{node}",
                "kind": "cpuidle",
                "node": node,
                "cpus": cpus,
                "desired": max_latency_us,
            }
        )
    return planned


class CpuGovernor(Kind):
    """value: {governor: cpulist}; desired: one governor for all of the node's CPUs."""

    def _dir(self, cpu: int) -> str:
        return f"sys/devices/system/cpu/cpu{cpu}/cpufreq"

    def read(self, host: Host, knob: Knob) -> Any:
        by_governor: dict[str, list[int]] = {}
        for cpu in knob["cpus"]:
            governor = host.read(
                f"{self._dir(cpu)}/scaling_governor",
                f"no cpufreq on CPU {cpu} (a VM, or no cpufreq driver loaded)",
            ).strip()
            by_governor.setdefault(governor, []).append(cpu)
        return {g: format_cpulist(cpus) for g, cpus in sorted(by_governor.items())}

    def writable(self, host: Host, knob: Knob, current: Any) -> None:
        for cpu in knob["cpus"]:
            host.require_writable(f"{self._dir(cpu)}/scaling_governor")

    def check(self, host: Host, knob: Knob, current: Any) -> None:
        for cpu in knob["cpus"]:
            offered = host.read(
                f"{self._dir(cpu)}/scaling_available_governors",
                f"CPU {cpu} lists no cpufreq governors",
            ).split()
            if knob["desired"] not in offered:
                raise Unavailable(
                    f"the cpufreq driver of CPU {cpu} offers no {knob['desired']} governor "
                    f"(it offers: {', '.join(offered) or 'none'})"
                )
        self.writable(host, knob, current)

    def matches(self, knob: Knob, current: Any, desired: Any) -> bool:
        return current == {desired: format_cpulist(knob["cpus"])}

    def predict(self, knob: Knob, current: Any, desired: Any) -> Any:
        return {desired: format_cpulist(knob["cpus"])}

    def apply(self, host: Host, knob: Knob, current: Any, desired: Any) -> None:
        self.restore(host, knob, current, {desired: format_cpulist(knob["cpus"])})

    def restore(self, host: Host, knob: Knob, current: Any, original: Any) -> None:
        now = {cpu: g for g, cpus in current.items() for cpu in parse_cpulist(cpus)}
        for governor, cpus in original.items():
            for cpu in parse_cpulist(cpus):
                if now.get(cpu) != governor:
                    host.write(f"{self._dir(cpu)}/scaling_governor", f"{governor}\n")


class CpuIdle(Kind):
    """value: {state: {"name", "latency_us", "disabled": cpulist}}; desired: the deepest exit
    latency (us) allowed: deeper states are disabled on the node's CPUs."""

    def _states(self, host: Host, cpu: int) -> list[str]:
        directory = host.path(f"sys/devices/system/cpu/cpu{cpu}/cpuidle")
        if not directory.is_dir():
            raise Unavailable(f"no cpuidle states on CPU {cpu} (no cpuidle driver: usual in VMs)")
        return sorted(
            (e.name for e in directory.iterdir() if re.fullmatch(r"state\d+", e.name)),
            key=lambda name: int(name[5:]),
        )

    def read(self, host: Host, knob: Knob) -> Any:
        value: dict[str, dict[str, Any]] = {}
        for cpu in knob["cpus"]:
            for state in self._states(host, cpu):
                base = f"sys/devices/system/cpu/cpu{cpu}/cpuidle/{state}"
                entry = value.setdefault(
                    state,
                    {
                        "name": host.read(f"{base}/name", "").strip(),
                        "latency_us": int(host.read(f"{base}/latency", "0")),
                        "disabled": [],
                    },
                )
                if host.read(f"{base}/disable", "0").strip() == "1":
                    entry["disabled"].append(cpu)
        for entry in value.values():
            entry["disabled"] = format_cpulist(entry["disabled"])
        return value

    def writable(self, host: Host, knob: Knob, current: Any) -> None:
        for cpu in knob["cpus"]:
            for state in self._states(host, cpu):
                host.require_writable(f"sys/devices/system/cpu/cpu{cpu}/cpuidle/{state}/disable")

    def matches(self, knob: Knob, current: Any, desired: Any) -> bool:
        return current == self.predict(knob, current, desired)

    def predict(self, knob: Knob, current: Any, desired: Any) -> Any:
        everywhere = format_cpulist(knob["cpus"])
        return {
            state: dict(entry, disabled=everywhere) if entry["latency_us"] > desired else entry
            for state, entry in current.items()
        }

    def apply(self, host: Host, knob: Knob, current: Any, desired: Any) -> None:
        self.restore(host, knob, current, self.predict(knob, current, desired))

    def restore(self, host: Host, knob: Knob, current: Any, original: Any) -> None:
        for state, entry in original.items():
            if state not in current:
                continue
            was = set(parse_cpulist(entry["disabled"]))
            now = set(parse_cpulist(current[state]["disabled"]))
            for cpu in knob["cpus"]:
                if (cpu in was) != (cpu in now):
                    host.write(
                        f"sys/devices/system/cpu/cpu{cpu}/cpuidle/{state}/disable",
                        "1\n" if cpu in was else "0\n",
                    )
