#!/usr/bin/python
"""Ansible door into socketwise.host.tuning's host half (shipped as module_utils, stdlib only)."""

DOCUMENTATION = r"""
---
module: host_tuning
short_description: Set the kernel knobs of a tuning spec, with a backup, read-back and report
description:
  - With I(state=present), reads every knob of I(spec) (from the C(socketwise_tuning_spec)
    filter), records the current value of every managed knob in I(backup) before the first
    change (originals already recorded there are never overwritten), writes what differs,
    reads it back and returns a report with desired, before (the recorded original), after
    and status per knob.
  - With I(state=absent), writes back every original recorded in I(backup), reads it back,
    reports it, and removes I(backup) once every knob is back.
  - A knob the host lacks (no cpufreq in a VM, read-only C(/proc/sys) in a container, a NIC
    without IRQs, irqbalance not installed) is reported with status C(unavailable) and the
    reason; it never fails the task.
  - Check mode changes nothing and predicts the values; C(--diff) shows each knob that
    changes, before and after.
  - Persisting the values across reboots (sysctl.d, the boot-time unit, the kernel command
    line) is the role's job; this module returns what to persist in C(persist).
options:
  spec:
    description: The tuning spec, C({schema, knobs}). Required with I(state=present).
    type: dict
  state:
    description: C(present) tunes, C(absent) restores the recorded originals.
    type: str
    choices: [present, absent]
    default: present
  backup:
    description: Where the originals are recorded on the host (JSON).
    type: path
    default: /var/lib/socketwise/tuning-backup.json
author: socketwise
"""

EXAMPLES = r"""
- name: Decide every knob from the facts and the plan
  ansible.builtin.set_fact:
    decision: "{{ socketwise_topology | socketwise_tuning_spec(socketwise_plan) }}"

- name: Tune the host
  socketwise.kit.host_tuning:
    spec: "{{ decision.spec }}"

- name: Put back what socketwise changed
  socketwise.kit.host_tuning:
    state: absent
"""

RETURN = r"""
report:
  description: The tuning report, C({schema, state, backup, reboot_required, knobs}); each
    knob has C(name), C(desired), C(before), C(after), C(status) (set, short, partial,
    reboot-required, unavailable, unmanaged, restored, not-restored) and C(reason).
  returned: always
  type: dict
persist:
  description: What must survive a reboot, C({sysctl, boot, kernel_args}); empty for absent.
  returned: always
  type: dict
reboot_required:
  description: True when 1 GB pages wait for the kernel command line of the next boot.
  returned: always
  type: bool
python:
  description: The host's Python that ran the module (for the boot-time unit).
  returned: always
  type: str
"""

import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.host.tuning import (
    Host,
    KnobError,
    restore,
    tune,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "spec": {"type": "dict"},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "backup": {"type": "path", "default": "/var/lib/socketwise/tuning-backup.json"},
        },
        required_if=[("state", "present", ["spec"])],
        supports_check_mode=True,
    )

    def run(argv):
        return module.run_command(argv, environ_update={"LC_ALL": "C"})

    host = Host("/", run=run)
    params = module.params
    try:
        if params["state"] == "present":
            outcome = tune(host, params["spec"], params["backup"], check=module.check_mode)
        else:
            outcome = restore(host, params["backup"], check=module.check_mode)
    except KnobError as exc:
        module.fail_json(msg=str(exc))
    result = {
        "changed": outcome["changed"],
        "report": outcome["report"],
        "persist": outcome["persist"],
        "reboot_required": outcome["reboot_required"],
        "python": sys.executable,
    }
    if module._diff:
        result["diff"] = outcome["diff"]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
