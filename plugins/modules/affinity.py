#!/usr/bin/python
"""Ansible door into socketwise.serve.verify: real CPU affinity of vLLM services vs the plan,
and the platform and kernels each service really loaded."""

DOCUMENTATION = r"""
---
module: affinity
short_description: Compare the CPUs vLLM's processes really run on with the plan
description:
  - For each planned instance, walks the process tree of its systemd unit and reads
    C(Cpus_allowed_list) of every process and thread from C(/proc).
  - Each planned rank must be served by one C(VLLM::Worker*) process whose threads run
    on exactly the rank's CPUs; no process of the unit may run outside C(cpus_allowed).
  - Where the plan keeps cores for the front end (C(frontend_cpus)) and the units moved
    it there (C(frontend)), the API server and its other processes must run on them,
    and its engine core's scheduler (its main thread) on C(engine_cpus).
  - Reads the shared libraries the unit's processes map (C(/proc/PID/maps)) to say
    which vLLM platform (C(ZenCpuPlatform) when zentorch is loaded, else C(CpuPlatform)),
    which kernel library (C(_C), C(_C_AVX512), C(_C_AVX2)) and which preloads really run.
  - Read-only; the same answer in check mode.
options:
  instances:
    description: The plan's C(instances) list (name, ranks, cpus_allowed).
    type: list
    elements: dict
    required: true
  preload:
    description: Paths the units put in C(LD_PRELOAD); each must be mapped by the service.
    type: list
    elements: str
    default: []
  unit_prefix:
    description: Unit name prefix; the unit of instance N is PREFIX + N + C(.service).
    type: str
    default: socketwise-
  compare:
    description: >-
      Compare what runs with the plan and report every disagreement as a problem; false
      (vLLM's own placement, the baseline) only reports what runs.
    type: bool
    default: true
  containers:
    description: >-
      The units run Podman containers named like the units (without C(.service)): walk
      the container's processes (its PID from C(podman inspect)), not Podman's.
    type: bool
    default: false
  frontend:
    description: >-
      The units moved each instance's front end to its C(frontend_cpus) (and its
      scheduler to C(engine_cpus)): check that they run there. False where the units
      leave them where vLLM starts them (an image's server, in its container's CPU set).
    type: bool
    default: true
author: socketwise
"""

EXAMPLES = r"""
- name: Check the affinity of every planned instance
  socketwise.kit.affinity:
    instances: "{{ socketwise_plan.instances }}"
  register: affinity
"""

RETURN = r"""
instances:
  description: >-
    Per instance its unit, main PID, processes (pid, comm, title, CPUs) and runtime
    (platform, kernels, runtime_libraries).
  returned: always
  type: list
  elements: dict
problems:
  description: One line per disagreement between the plan and what runs; empty when they agree.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.serve.verify import (
    check_instance,
    describe,
    missing_preloads,
    process_tree,
    runtime,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "instances": {"type": "list", "elements": "dict", "required": True},
            "preload": {"type": "list", "elements": "str", "default": []},
            "unit_prefix": {"type": "str", "default": "socketwise-"},
            "containers": {"type": "bool", "default": False},
            "compare": {"type": "bool", "default": True},
            "frontend": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    report, problems = [], []
    for instance in module.params["instances"]:
        unit = f"{module.params['unit_prefix']}{instance['name']}.service"
        rc, out, err = module.run_command(
            ["systemctl", "show", "-p", "MainPID", "--value", unit],
            environ_update={"LC_ALL": "C"},
        )
        main_pid = int(out.strip() or 0) if rc == 0 else 0
        if main_pid and module.params["containers"]:
            # conmon, not `podman run`, is the container's parent: start from its PID.
            rc, out, err = module.run_command(
                ["podman", "inspect", "--format", "{{.State.Pid}}", unit.removesuffix(".service")]
            )
            main_pid = int(out.strip() or 0) if rc == 0 else 0
        if main_pid == 0:
            problems.append(f"{instance['name']}: unit {unit} has no running process")
            report.append({"name": instance["name"], "unit": unit, "main_pid": None})
            continue
        pids = process_tree(main_pid)
        processes = [p for p in map(describe, pids) if p]
        loaded = runtime(pids)
        if module.params["compare"]:
            planned = instance if module.params["frontend"] else {**instance, "frontend_cpus": []}
            problems += check_instance(planned, processes)
            problems += missing_preloads(instance["name"], module.params["preload"], loaded)
        report.append(
            {
                "name": instance["name"],
                "unit": unit,
                "main_pid": main_pid,
                "processes": processes,
                "runtime": loaded,
            }
        )
    module.exit_json(changed=False, instances=report, problems=problems)


if __name__ == "__main__":
    main()
