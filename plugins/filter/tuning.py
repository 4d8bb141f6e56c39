"""Ansible door into socketwise.host.tuning.decide: the filter `socketwise.kit.tuning_spec`."""

from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.host.tuning import (
    Settings,
    TuningError,
    decide,
)


def socketwise_tuning_spec(topology, plan, **settings):
    """Return {"spec": ..., "error": null} or {"spec": null, "error": ..., "variable": ...}.

    Errors are returned, not raised, so the role can name the host, the variable and its
    value in one line before anything on the host changes.
    """
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
