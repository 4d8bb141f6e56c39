"""Wait until every instance answers /health, or stop as soon as one cannot come up.

Stdlib only: shipped to hosts as the role's module_utils package (roles/vllm_service).
A unit that fails or restarts while it is awaited will not come up on its own (a bad
argument, a model it cannot load): waiting out the whole timeout would only delay the
rollback, so the wait ends there with the unit's last journal lines.
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
from collections.abc import Callable

from ..common.direct import urlopen

JOURNAL_LINES = 15


def unit_state(unit: str) -> dict[str, str]:
    """systemd's ActiveState, SubState, Result and NRestarts of `unit`."""
    shown = subprocess.run(
        ["systemctl", "show", unit, "-p", "ActiveState,SubState,Result,NRestarts"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return dict(line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)


def healthy(url: str) -> bool:
    try:
        with urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def journal_tail(unit: str) -> str:
    shown = subprocess.run(
        ["journalctl", "-u", unit, "-n", str(JOURNAL_LINES), "--no-pager", "-o", "cat"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return shown.stdout.strip()


def last_error(journal: str) -> str:
    """The line of a journal tail that says why: the last one naming an error, else the last."""
    lines = [line.strip() for line in journal.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["(nothing in the journal)"])[-1]


def wait_ready(
    instances: list[dict],
    timeout: float,
    state: Callable[[str], dict[str, str]] = unit_state,
    probe: Callable[[str], bool] = healthy,
    interval: float = 1.0,
) -> dict:
    """`instances`: [{"unit", "url"}]. Returns {"ready": {unit: seconds}, "failed": {unit:
    why}, "waiting": [units]}: every unit ready, or the first failure (or the timeout)."""
    started = time.monotonic()
    restarts = {i["unit"]: int(state(i["unit"]).get("NRestarts") or 0) for i in instances}
    ready: dict[str, float] = {}
    while True:
        for instance in instances:
            unit = instance["unit"]
            if unit in ready:
                continue
            if probe(instance["url"]):
                ready[unit] = round(time.monotonic() - started, 1)
                continue
            now = state(unit)
            again = int(now.get("NRestarts") or 0) - restarts[unit]
            down = now.get("ActiveState") in ("failed", "inactive")
            if down or now.get("SubState") == "auto-restart" or again > 0:
                why = (
                    f"{unit} is {now.get('ActiveState')} ({now.get('Result')}) and restarted "
                    f"{again} time(s) while awaited"
                )
                return {"ready": ready, "failed": {unit: why}, "waiting": []}
        waiting = [i["unit"] for i in instances if i["unit"] not in ready]
        if not waiting or time.monotonic() - started > timeout:
            return {"ready": ready, "failed": {}, "waiting": waiting}
        time.sleep(interval)
