"""kernel.numa_balancing: off by default, so the kernel does not migrate pages away from the
node the plan bound them to (latency spikes). Persisted through /etc/sysctl.d."""

from __future__ import annotations

from .base import FileKind, Host, Knob

SYSCTL_KEY = "kernel.numa_balancing"
# What kernel.numa_balancing may be set to, however the variable arrives (YAML, -e).
VALUES = {"0": 0, "1": 1, "false": 0, "true": 1}


def knob(desired: int | None) -> Knob:
    return {"name": SYSCTL_KEY, "kind": "numa_balancing", "desired": desired}


class NumaBalancing(FileKind):
    def path(self, host: Host, knob: Knob) -> str:
        return "proc/sys/kernel/numa_balancing"

    def missing(self, knob: Knob) -> str:
        return "no /proc/sys/kernel/numa_balancing (kernel without NUMA balancing)"
