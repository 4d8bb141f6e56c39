#!/usr/bin/python
"""Ansible door into socketwise.serve.verify for units planned on a fixed CPU set: the
CPUs a llama.cpp server's or a vLLM stage's processes and threads really run on, and
its argv."""

DOCUMENTATION = r"""
---
module: pinned
short_description: Compare the CPUs each given unit's processes run on with its planned CPUs
description:
  - For each unit, walks the process tree of its main PID and reads
    C(Cpus_allowed_list) of every process and thread from C(/proc).
  - Every process and thread must be allowed exactly the unit's planned CPUs; with
    C(ranks) (a vLLM stage), each worker's threads exactly its rank's CPUs and no process
    any CPU outside C(cpus).
  - Also returns each main process's argv (the planned thread count is an argument).
  - Read-only; the same answer in check mode.
options:
  units:
    description: >-
      One entry per unit, C(unit) (its name) and C(cpus) (the planned CPUs), and for a vLLM
      stage C(ranks) (the CPUs of each of its workers).
    type: list
    elements: dict
    required: true
author: socketwise
"""

EXAMPLES = r"""
- name: Check where the RPC servers run
  socketwise.kit.pinned:
    units: [{unit: socketwise-rpc-node0.service, cpus: [0, 1]}]
"""

RETURN = r"""
units:
  description: Per unit its name, main PID, argv and processes (pid, comm, title, CPUs).
  returned: always
  type: list
  elements: dict
problems:
  description: One line per disagreement with the plan; empty when they agree.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.serve.verify import (
    check_instance,
    check_pinned,
    describe,
    process_tree,
)


def main():
    module = AnsibleModule(
        argument_spec={"units": {"type": "list", "elements": "dict", "required": True}},
        supports_check_mode=True,
    )
    report, problems = [], []
    for entry in module.params["units"]:
        unit = entry["unit"]
        rc, out, _ = module.run_command(["systemctl", "show", "-p", "MainPID", "--value", unit])
        main_pid = int(out.strip() or 0) if rc == 0 else 0
        if not main_pid:
            problems.append(f"{unit}: no running process")
            report.append({"unit": unit, "main_pid": None})
            continue
        processes = [p for p in map(describe, process_tree(main_pid)) if p]
        try:
            with open(f"/proc/{main_pid}/cmdline", "rb") as handle:
                argv = [a.decode(errors="replace") for a in handle.read().split(b"\0") if a]
        except OSError:
            argv = []
        if entry.get("ranks"):
            planned = {"name": unit, "cpus_allowed": entry["cpus"],
                       "ranks": [{"cpus": cpus} for cpus in entry["ranks"]]}  # fmt: skip
            problems += check_instance(planned, processes)
        else:
            problems += check_pinned(unit, processes, entry["cpus"])
        report.append({"unit": unit, "main_pid": main_pid, "argv": argv, "processes": processes})
    module.exit_json(changed=False, units=report, problems=problems)


if __name__ == "__main__":
    main()
