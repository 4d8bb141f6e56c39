"""Ansible door into socketwise.plan.hwclass.build: the filter `socketwise.kit.build`."""

from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.plan.hwclass import (
    BuildRefused,
    build,
)


def socketwise_build(topology, override=None):
    """{"build": {"class", "dtype", "reason", "detected"}, "error": null} or the error."""
    try:
        return {"build": build(topology, override or None), "error": None}
    except BuildRefused as exc:
        return {"build": None, "error": str(exc)}


class FilterModule:
    def filters(self):
        return {"build": socketwise_build}
