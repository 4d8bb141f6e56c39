"""The boot-time helper: `python3 -m socketwise.host.tuning apply SPEC.json` (what the unit
`socketwise-tuning.service` runs, from the copy the host_tuning role installs)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .apply import apply_at_boot
from .base import Host, KnobError


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "apply":
        print("usage: python3 -m socketwise.host.tuning apply SPEC.json", file=sys.stderr)
        return 2
    try:
        knobs = json.loads(Path(args[1]).read_text())["knobs"]
        for line in apply_at_boot(Host(), knobs):
            print(line)
    except (OSError, ValueError, KeyError, KnobError) as exc:
        print(f"socketwise tuning: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
