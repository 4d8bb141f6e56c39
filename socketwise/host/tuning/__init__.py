"""Host tuning for vLLM on CPU: what each kernel knob should be, and setting it with proof.

One surface, one module per knob family behind it:

- `decide(topology, plan, settings)` (decide.py) runs on the controller and returns the spec:
  one entry per knob with the value it should have, or None (leave it alone), or why the
  host cannot have it. A request the host cannot hold raises `TuningError`.
- `tune(host, spec, backup, check)` and `restore(host, backup, check)` (apply.py) run on
  the target; `apply_at_boot` is what the boot-time unit runs (`python3 -m
  socketwise.host.tuning apply SPEC`, __main__.py).
- The families: numa_balancing.py, hugepages.py, thp.py, irq.py (NIC IRQ affinity and
  irqbalance), cpu.py (governor and C-states); each decides its knobs and implements the
  `Kind` of base.py that reads, writes and restores them.

Everything here is shipped to targets (the role's module_utils package, the boot-time
helper), so it imports only the standard library and the stdlib-only stages it builds on
(facts, plan), with relative imports that resolve wherever the package is copied; an import
contract checks it. `from __future__ import annotations` keeps the annotations from being
evaluated on targets whose Python predates 3.10.
"""

from .apply import apply_at_boot, restore, tune
from .base import Host, KnobError, TuningError
from .decide import Settings, decide

__all__ = [
    "Host",
    "KnobError",
    "Settings",
    "TuningError",
    "apply_at_boot",
    "decide",
    "restore",
    "tune",
]
