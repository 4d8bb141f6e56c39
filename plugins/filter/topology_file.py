"""Ansible door into socketwise.plan.nodes.read_topology: the filter
`socketwise.kit.topology_file` (a saved topology instead of live detection)."""

# The core is imported inside each filter, never when the file loads: Ansible loads every
# filter file of the collection in each task's process (docs/development/architecture.md).


def socketwise_topology_file(path):
    """{"topology": ..., "error": null} or {"topology": null, "error": ...} for a file on
    the controller, so the role names the host and the file in one line."""
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.plan.nodes import (
        PlanError,
        read_topology,
    )

    try:
        return {"topology": read_topology(path), "error": None}
    except PlanError as exc:
        return {"topology": None, "error": str(exc)}


class FilterModule:
    def filters(self):
        return {"topology_file": socketwise_topology_file}
