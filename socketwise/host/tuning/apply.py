"""Applying and restoring, on the host: read every knob of a spec, record the originals
before the first change (never overwriting a recorded original), write what differs, read
it back, and report desired, before, after and status per knob; put the originals back;
re-apply the runtime knobs at boot. A knob the host lacks is `unavailable`, with the
reason, never an error and never skipped."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from . import cpu, hugepages, irq, numa_balancing, thp
from .base import (
    NOT_RESTORED,
    REBOOT_REQUIRED,
    RESTORED,
    SCHEMA_VERSION,
    SET,
    UNAVAILABLE,
    UNMANAGED,
    Entry,
    Host,
    Kind,
    Knob,
    KnobError,
    Outcome,
    Persist,
    Spec,
    Unavailable,
)

KINDS: dict[str, Kind] = {
    "numa_balancing": numa_balancing.NumaBalancing(),
    "hugepages": hugepages.HugePages(),
    "thp": thp.Thp(),
    "irq_affinity": irq.IrqAffinity(),
    "irqbalance": irq.Irqbalance(),
    "cpu_governor": cpu.CpuGovernor(),
    "cpuidle": cpu.CpuIdle(),
}
# Kinds whose runtime value does not survive a reboot and that the boot-time unit
# re-applies; numa_balancing is persisted through sysctl.d, irqbalance through its own
# config file and unit state, 1 GB pages through the kernel command line.
BOOT_KINDS = ("hugepages", "thp", "irq_affinity", "cpu_governor", "cpuidle")
SYSCTL_KEYS = {"numa_balancing": numa_balancing.SYSCTL_KEY}


@dataclass
class _Look:
    """One knob as found: its current value, or why it is unavailable; and whether it
    needs a write."""

    knob: Knob
    current: Any = None
    reason: str | None = None
    # Not at its desired value yet; written now unless it is a 1 GB pool (boot only).
    pending: bool = False
    needs_write: bool = False


def _look(host: Host, knob: Knob) -> _Look:
    look = _Look(knob)
    kind = KINDS[knob["kind"]]
    try:
        look.current = kind.read(host, knob)
    except Unavailable as exc:
        look.reason = str(exc)
        return look
    if knob.get("unavailable"):
        look.reason = knob["unavailable"]
    elif knob["desired"] is not None:
        # Checked even when the value is already right: a knob the host does not let us
        # set (read-only /proc/sys) is unavailable, and nothing is persisted for it.
        try:
            kind.check(host, knob, look.current)
        except Unavailable as exc:
            look.reason = str(exc)
        else:
            look.pending = not kind.matches(knob, look.current, knob["desired"])
            look.needs_write = look.pending and not kind.boot_only(knob)
    return look


def _settle(host: Host, look: _Look, check: bool) -> tuple[Any, str, str | None]:
    """Write a knob that needs it (unless `check`), read it back: (after, status, reason)."""
    knob = look.knob
    kind = KINDS[knob["kind"]]
    if look.reason is not None:
        return look.current, UNAVAILABLE, look.reason
    if knob["desired"] is None:
        return look.current, UNMANAGED, None
    after = look.current
    if look.needs_write:
        if check:
            return kind.predict(knob, look.current, knob["desired"]), SET, None
        try:
            kind.apply(host, knob, look.current, knob["desired"])
        except Unavailable as exc:
            return look.current, UNAVAILABLE, str(exc)
        after = kind.read(host, knob)
    if kind.matches(knob, after, knob["desired"]):
        return after, SET, None
    status, reason = kind.shortfall(host, knob, after)
    return after, status, reason


def tune(host: Host, spec: Spec, backup: str | None, check: bool = False) -> Outcome:
    """Bring every knob of `spec` to its desired value and report it.

    With `backup` (a path on the host), the current value of every managed knob is
    recorded there before the first write; values already recorded are kept, so the file
    always holds what the host had before socketwise tuned it. The report's `before` is
    that original. `check` changes nothing and predicts `after`.
    """
    looks = [_look(host, knob) for knob in spec["knobs"]]
    recorded = _load_backup(host, backup) if backup else {}
    changed = False
    if backup and any(look.pending for look in looks):
        fresh = {
            look.knob["name"]: {
                "knob": look.knob,
                "original": look.current,
                "snapshot": KINDS[look.knob["kind"]].snapshot(host, look.knob),
            }
            for look in looks
            if look.reason is None
            and look.knob["desired"] is not None
            and look.knob["name"] not in recorded
        }
        if fresh:
            recorded.update(fresh)
            if not check:
                _save_backup(host, backup, recorded)
            changed = True
    entries: list[Entry] = []
    diff_before, diff_after = [], []
    for look in looks:
        after, status, reason = _settle(host, look, check)
        name = look.knob["name"]
        if look.needs_write and after != look.current:
            changed = True
            diff_before.append(f"{name}: {json.dumps(look.current, sort_keys=True)}\n")
            diff_after.append(f"{name}: {json.dumps(after, sort_keys=True)}\n")
        before = recorded[name]["original"] if name in recorded else look.current
        entries.append(_entry(look.knob, look.knob["desired"], before, after, status, reason))
    return {
        "changed": changed,
        "report": _report("present", backup, entries),
        "persist": _persistence(entries, spec),
        "reboot_required": any(e["status"] == REBOOT_REQUIRED for e in entries),
        "diff": {"before": "".join(diff_before), "after": "".join(diff_after)},
    }


def restore(host: Host, backup: str, check: bool = False) -> Outcome:
    """Write back every original recorded in `backup`, read it back, and report it.

    The backup file is removed once every knob is back (or unavailable); a knob that could
    not be restored (hugepages still in use) keeps it, so a later run can finish.
    """
    recorded = _load_backup(host, backup)
    entries: list[Entry] = []
    diff_before, diff_after = [], []
    pending = False
    for name, saved in recorded.items():
        knob, original = saved["knob"], saved["original"]
        kind = KINDS[knob["kind"]]
        try:
            current = kind.read(host, knob)
        except Unavailable as exc:
            entries.append(_entry(knob, original, None, None, UNAVAILABLE, str(exc)))
            continue
        after, status, reason = current, RESTORED, None
        if not kind.restored(current, original):
            try:
                kind.writable(host, knob, current)
                if check:
                    after = original
                else:
                    kind.put_back(host, knob, current, original, saved.get("snapshot"))
                    after = kind.read(host, knob)
            except Unavailable as exc:
                status, reason = UNAVAILABLE, str(exc)
            if status == RESTORED and not kind.restored(after, original):
                status, reason, pending = NOT_RESTORED, f"still {json.dumps(after)}", True
            if after != current:
                diff_before.append(f"{name}: {json.dumps(current, sort_keys=True)}\n")
                diff_after.append(f"{name}: {json.dumps(after, sort_keys=True)}\n")
        entries.append(_entry(knob, original, current, after, status, reason))
    changed = bool(diff_after)
    if recorded and not pending:
        changed = True
        if not check:
            host.path(backup).unlink()
    return {
        "changed": changed,
        "report": _report("absent", backup, entries),
        "persist": {"sysctl": {}, "boot": [], "kernel_args": None},
        "reboot_required": False,
        "diff": {"before": "".join(diff_before), "after": "".join(diff_after)},
    }


def _entry(
    knob: Knob, desired: Any, before: Any, after: Any, status: str, reason: str | None
) -> Entry:
    return {
        "name": knob["name"],
        "desired": desired,
        "before": before,
        "after": after,
        "status": status,
        "reason": reason,
    }


def _report(state: str, backup: str | None, entries: list[Entry]) -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        "state": state,
        "backup": backup,
        "reboot_required": any(e["status"] == REBOOT_REQUIRED for e in entries),
        "knobs": entries,
    }


def _persistence(entries: list[Entry], spec: Spec) -> Persist:
    """What must survive a reboot: only knobs that are managed and that this host has."""
    live = {e["name"] for e in entries if e["status"] not in (UNAVAILABLE, UNMANAGED)}
    knobs = [k for k in spec["knobs"] if k["name"] in live]
    one_gb = [k for k in knobs if hugepages.is_one_gb(k)]
    return {
        "sysctl": {SYSCTL_KEYS[k["kind"]]: k["desired"] for k in knobs if k["kind"] in SYSCTL_KEYS},
        "boot": [k for k in knobs if k["kind"] in BOOT_KINDS and not hugepages.is_one_gb(k)],
        "kernel_args": hugepages.kernel_args(one_gb) if one_gb else None,
    }


def _load_backup(host: Host, backup: str) -> dict[str, Any]:
    path = host.path(backup)
    if not path.is_file():
        return {}
    try:
        document = json.loads(path.read_text())
        return dict(document["knobs"])
    except (ValueError, KeyError, TypeError) as exc:
        raise KnobError(
            f"the tuning backup {backup} is unreadable ({exc}): fix or remove it by hand"
        ) from None


def _save_backup(host: Host, backup: str, recorded: dict[str, Any]) -> None:
    path = host.path(backup)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(
        json.dumps({"schema": SCHEMA_VERSION, "knobs": recorded}, indent=2, sort_keys=True) + "\n"
    )
    partial.chmod(0o600)
    partial.replace(path)


# --- boot-time helper ----------------------------------------------------------------------


def apply_at_boot(host: Host, knobs: list[Knob]) -> list[str]:
    """Re-apply runtime knobs after a reboot (no backup, no report): one line per knob."""
    lines = []
    for knob in knobs:
        after, status, reason = _settle(host, _look(host, knob), check=False)
        lines.append(
            f"{knob['name']}: {status} {json.dumps(after)}{f' ({reason})' if reason else ''}"
        )
    return lines
