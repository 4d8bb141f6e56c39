"""Ansible doors into socketwise.plan: the filters `socketwise.kit.plan`,
`socketwise.kit.calibration_vet` (what a group's calibration decides for this deploy) and
`socketwise.kit.fleet_summary`/`socketwise.kit.fleet_lines` (the fleet's dry run)."""

from ansible_collections.socketwise.kit.plugins.module_utils.lazy import core_filter

# The core is imported inside each filter, never when the file loads: Ansible loads every
# filter file of the collection in each task's process (docs/development/architecture.md).


def socketwise_plan(topology, **request):
    """Return {"plan": ..., "error": null} or {"plan": null, "error": ..., "field": ...}.

    Errors are returned, not raised, so the role can name the host and the
    variable at fault in one line before anything on the host changes.
    """
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.plan.planner import (
        PlanError,
        PlanRequest,
        plan,
    )

    try:
        return {
            "plan": plan(topology, PlanRequest.from_values(**request)),
            "error": None,
            "field": None,
        }
    except PlanError as exc:
        return {"plan": None, "error": str(exc), "field": exc.field}


def socketwise_calibration_vet(record, given, vllm_spec, model, model_revision=""):
    """calibrated.vet's answer, with "error" (the one line) instead of an exception."""
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.plan import calibrated

    try:
        return calibrated.vet(record, given, vllm_spec, model, model_revision) | {"error": None}
    except calibrated.CalibrationError as exc:
        return {"measured": None, "reset": {}, "note": None, "error": str(exc)}


def socketwise_fleet_summary(plans, artifacts_dir):
    """{host: plan} -> fleet.summary, each host compared with its last deploy."""
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.plan import fleet

    return fleet.summary(
        [
            {"host": host, "plan": planned, "deployed": fleet.deployed_plan(artifacts_dir, host)}
            for host, planned in plans.items()
        ]
    )


class FilterModule:
    def filters(self):
        return {
            "plan": socketwise_plan,
            "calibration_vet": socketwise_calibration_vet,
            "fleet_summary": socketwise_fleet_summary,
            "fleet_lines": core_filter("plan.fleet", "lines"),
        }
