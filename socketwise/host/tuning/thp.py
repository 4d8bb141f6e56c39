"""Transparent hugepages (enabled, defrag): large weight and KV buffers get 2 MB pages
without a hugepage pool."""

from __future__ import annotations

import re
from typing import Any

from .base import FileKind, Host, Knob, KnobError

THP_MODES = ("always", "madvise", "never")
THP_DEFRAG_MODES = ("always", "defer", "defer+madvise", "madvise", "never")


def knobs(enabled: str | None, defrag: str | None) -> list[Knob]:
    return [
        {"name": f"thp.{file}", "kind": "thp", "file": file, "desired": mode}
        for file, mode in (("enabled", enabled), ("defrag", defrag))
    ]


class Thp(FileKind):
    def path(self, host: Host, knob: Knob) -> str:
        return f"sys/kernel/mm/transparent_hugepage/{knob['file']}"

    def missing(self, knob: Knob) -> str:
        return "no /sys/kernel/mm/transparent_hugepage (kernel without THP)"

    def parse(self, text: str) -> Any:
        # The kernel lists every mode and brackets the selected one; a file that holds
        # one bare word (a copied tree) holds the mode itself.
        match = re.search(r"\[([^\]]+)\]", text)
        if match:
            return match[1]
        if len(text.split()) == 1:
            return text.strip()
        raise KnobError(f"no [selected] mode in {text.strip()!r}")
