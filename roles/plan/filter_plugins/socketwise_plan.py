"""Ansible door into socketwise.plan.planner: the filter `socketwise_plan`."""

import sys
from pathlib import Path

try:
    from socketwise.plan.planner import PlanError, PlanRequest, plan
except ImportError:
    # Run from a checkout whose package is not installed in Ansible's Python:
    # the package sits three levels above this role's filter_plugins/.
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from socketwise.plan.planner import PlanError, PlanRequest, plan


def socketwise_plan(topology, **request):
    """Return {"plan": ..., "error": null} or {"plan": null, "error": ..., "field": ...}.

    Errors are returned, not raised, so the role can name the host and the
    variable at fault in one line before anything on the host changes.
    """
    try:
        return {
            "plan": plan(topology, PlanRequest.from_values(**request)),
            "error": None,
            "field": None,
        }
    except PlanError as exc:
        return {"plan": None, "error": str(exc), "field": exc.field}


class FilterModule:
    def filters(self):
        return {"socketwise_plan": socketwise_plan}
