"""Save and put back the kernel values that host tuning changes, on the machine it runs on.

The lab's machines share the controller's kernel, so a scenario saves these values on the
controller before it changes anything and restores them at the end, whatever happened in
between: `python3 kernel_state.py save FILE` (keeps an existing FILE: the first snapshot
is the one to go back to) and `python3 kernel_state.py restore FILE`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PATTERNS = (
    "proc/sys/kernel/numa_balancing",
    "sys/kernel/mm/transparent_hugepage/enabled",
    "sys/kernel/mm/transparent_hugepage/defrag",
    "sys/devices/system/node/node*/hugepages/hugepages-*/nr_hugepages",
    "proc/irq/*/smp_affinity_list",
    "sys/devices/system/cpu/cpu*/cpuidle/state*/disable",
)


def _value(path: Path) -> str:
    text = path.read_text().strip()
    # THP files list every mode with the selected one in brackets; the selection is written.
    if "[" in text:
        return text.split("[", 1)[1].split("]", 1)[0]
    return text


def snapshot(root: Path = Path("/")) -> dict[str, str]:
    return {str(p): _value(p) for pattern in PATTERNS for p in sorted(root.glob(pattern))}


def restore(saved: dict[str, str]) -> list[str]:
    """Write back every value that differs; return the paths written."""
    written = []
    for name, value in saved.items():
        path = Path(name)
        if path.exists() and _value(path) != value:
            try:
                path.write_text(f"{value}\n")
            except OSError as exc:
                print(f"kernel_state: cannot restore {name} to {value!r}: {exc}", file=sys.stderr)
                continue
            written.append(name)
    return written


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("save", "restore"):
        print("usage: kernel_state.py save|restore FILE", file=sys.stderr)
        return 2
    action, file = argv[0], Path(argv[1])
    if action == "save":
        if not file.exists():
            file.write_text(json.dumps(snapshot(), indent=1) + "\n")
        return 0
    for name in restore(json.loads(file.read_text())):
        print(f"restored {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
