"""Ansible door into socketwise.plan.hwclass.build: the filter `socketwise_build`."""

import sys
from pathlib import Path

try:
    from socketwise.plan.hwclass import BuildRefused, build
except ImportError:
    # Run from a checkout whose package is not installed in Ansible's Python.
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from socketwise.plan.hwclass import BuildRefused, build


def socketwise_build(topology, override=None):
    """{"build": {"class", "dtype", "reason", "detected"}, "error": null} or the error."""
    try:
        return {"build": build(topology, override or None), "error": None}
    except BuildRefused as exc:
        return {"build": None, "error": str(exc)}


class FilterModule:
    def filters(self):
        return {"socketwise_build": socketwise_build}
