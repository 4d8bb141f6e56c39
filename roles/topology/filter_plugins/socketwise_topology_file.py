"""Ansible door into socketwise.plan.nodes.read_topology: the filter
`socketwise_topology_file` (a saved topology instead of live detection)."""

import sys
from pathlib import Path

try:
    from socketwise.plan.nodes import PlanError, read_topology
except ImportError:
    # Run from a checkout whose package is not installed in Ansible's Python.
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from socketwise.plan.nodes import PlanError, read_topology


def socketwise_topology_file(path):
    """{"topology": ..., "error": null} or {"topology": null, "error": ...} for a file on
    the controller, so the role names the host and the file in one line."""
    try:
        return {"topology": read_topology(path), "error": None}
    except PlanError as exc:
        return {"topology": None, "error": str(exc)}


class FilterModule:
    def filters(self):
        return {"socketwise_topology_file": socketwise_topology_file}
