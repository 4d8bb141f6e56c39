"""Ansible door into socketwise.host.tuning.decide: the filter `socketwise.kit.tuning_spec`."""

# The core is imported inside each filter, never when the file loads: Ansible loads every
# filter file of the collection in each task's process (docs/development/architecture.md).


def socketwise_tuning_spec(topology, plan, **settings):
    """Return {"spec": ..., "error": null} or {"spec": null, "error": ..., "variable": ...}.

    Errors are returned, not raised, so the role can name the host, the variable and its
    value in one line before anything on the host changes.
    """
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.host.tuning import (
        Settings,
        TuningError,
        decide,
    )

    try:
        return {
            "spec": decide(topology, plan, Settings.from_values(**settings)),
            "error": None,
            "variable": None,
        }
    except TuningError as exc:
        return {"spec": None, "error": str(exc), "variable": exc.variable}


class FilterModule:
    def filters(self):
        return {"tuning_spec": socketwise_tuning_spec}
