"""Ansible door into socketwise.plan.hwclass.build: the filter `socketwise.kit.build`."""

# The core is imported inside each filter, never when the file loads: Ansible loads every
# filter file of the collection in each task's process (docs/development/architecture.md).


def socketwise_build(topology, override=None):
    """{"build": {"class", "dtype", "reason", "detected"}, "error": null} or the error."""
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.plan.hwclass import (
        BuildRefused,
        build,
    )

    try:
        return {"build": build(topology, override or None), "error": None}
    except BuildRefused as exc:
        return {"build": None, "error": str(exc)}


class FilterModule:
    def filters(self):
        return {"build": socketwise_build}
