"""Shared fixtures: fake hosts from tests/machines.py, built in a fresh tmp dir; and how
the suite's two workers (README: `pytest -n 2`, pytest-xdist) share the lab modules."""

from collections.abc import Callable
from pathlib import Path

import pytest

from .machines import build_machine

# The lab whose machines each `lab` module boots (None: it boots none). Two modules of
# one lab at once would boot the same machines, so a lab's modules run on one worker, one
# after another, beside another lab's on the other worker; a lab module missing here
# stops the run before any test.
LAB_OF = {
    "test_cluster_lab.py": "cluster",
    "test_cluster_vllm_lab.py": "cluster",
    "test_deploy_lab.py": "lab",
    "test_lab.py": "lab",
    "test_molecule.py": "molecule",
    "test_rollout_lab.py": "rollout",
    "test_sweep_lab.py": "sweep",
    "test_tinymodel.py": None,
    "test_tuning_lab.py": "tune",
}


# The labs whose tests keep engines under load for minutes: the rollout module's open
# loop through every stage, the sweep's benchmark steps. vLLM's workers spin for a second
# after each step, so two of them at once fight over the controller's two cores (on
# 2026-12-03 the sweep's calibration, 8 minutes alone, had not finished after 26 beside
# the rollout module). They share one scope: one worker runs them one after the other.
UNDER_LOAD = {"rollout": "under-load", "sweep": "under-load"}
# Each scope's minutes alone (docs/measurements.md), roughly: the longest goes out first,
# so the last lab to start is a short one and the other worker's quick tests fill the
# wait for it.
LAB_MINUTES = {"under-load": 22, "lab": 15, "cluster": 7, "molecule": 6, "tune": 6}
# The quick modules' seconds alone where they are far more than their count of tests says
# (a tenth of a second each, the rest): one test of ansible-lint or of six playbook runs
# takes more than a module of a hundred. The longest go out first, so the run does not end
# on one worker running one of them while the other waits (-m "not lab" on two workers,
# 2026-12-06, a 2-core Xeon: the sums of each module's tests).
QUICK_SECONDS = {
    "tests/test_check_play.py": 90,
    "tests/test_frontdoor_rules.py": 75,
    "tests/test_lint.py": 45,
    "tests/test_release_role.py": 21,
    "tests/test_unit_security.py": 19,
    "tests/test_secret_files.py": 17,
    "tests/test_report.py": 17,
    "tests/test_fleet_plan.py": 14,
    "tests/test_credentials_role.py": 11,
}
# The scope of each lab's modules in the schedule below.
LAB_SCOPES = {lab: UNDER_LOAD.get(lab, lab) for lab in LAB_OF.values() if lab}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    unmeasured = set(LAB_SCOPES.values()) - set(LAB_MINUTES)
    if unmeasured:
        raise pytest.UsageError(
            f"tests/conftest.py: LAB_MINUTES has no minutes for the lab(s) {sorted(unmeasured)}"
        )
    for item in items:
        if item.get_closest_marker("lab") and item.path.name not in LAB_OF:
            raise pytest.UsageError(
                f"{item.path.name}: a lab module that tests/conftest.py's LAB_OF does not "
                "name; add it with the lab its machines belong to"
            )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling with a lab as the scope of its modules and a quick module
    as one scope (its module-scoped fixtures, a rendering of every unit or door of about a
    minute, are built once, not once per worker). The labs go out first, longest first,
    then the quick modules, longest first (QUICK_SECONDS); a worker gets its next scope
    only at its last test (it runs a test once it holds the next), and a worker still
    finishing a lab gets a quick module then, not the next lab: that lab goes to whichever
    worker is done first, not to one whose last test may run ten minutes."""
    from xdist.scheduler import LoadScopeScheduling

    labs = set(LAB_SCOPES.values())

    class OneWorkerPerLab(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return LAB_SCOPES.get(LAB_OF.get(Path(module).name), module)

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:
                self.ordered = True
                first = sorted(
                    self.workqueue,
                    key=lambda scope: (
                        (0, -LAB_MINUTES[scope]) if scope in labs
                        else (1, -QUICK_SECONDS.get(scope, len(self.workqueue[scope]) / 10))
                    ),
                )  # fmt: skip
                for scope in first:
                    self.workqueue.move_to_end(scope)
            super()._assign_work_unit(node)

        def _reschedule(self, node) -> None:
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            work = self.assigned_work[node]
            if self._pending_of(work) > 1:
                return
            scope = next(iter(self.workqueue))
            if any(name in labs and not all(tests.values()) for name, tests in work.items()):
                scope = next((name for name in self.workqueue if name not in labs), scope)
            self.workqueue.move_to_end(scope, last=False)
            self._assign_work_unit(node)

    return OneWorkerPerLab(config, log)


@pytest.fixture
def machine_root(tmp_path: Path) -> Callable[[str], Path]:
    """Factory: machine_root("r730") writes that machine's sys/proc tree and returns its root."""

    def build(name: str) -> Path:
        return build_machine(name, tmp_path / name)

    return build
