#!/usr/bin/python
"""Ansible door into socketwise.serve.ready (shipped as module_utils, stdlib only)."""

DOCUMENTATION = r"""
---
module: ready
short_description: Wait until every vLLM instance answers /health, or stop at the first that cannot
description:
  - Polls each instance's /health and its unit's state. Fails as soon as a unit fails or
    restarts while awaited (it would not come up on its own), with its last journal lines,
    or when I(timeout) passes.
  - Returns the seconds each instance took, from the call (restart-to-ready).
  - Read-only, unless I(restart) is set.
options:
  units:
    description: The instances' systemd units.
    type: list
    elements: str
    required: true
  urls:
    description: The /health URL of each unit's instance, in the same order.
    type: list
    elements: str
    required: true
  timeout:
    description: Seconds to wait at most.
    type: int
    default: 600
  restart:
    description:
      - Restart the units that are active first, then wait for those only (a unit not
        running yet is left to be started). With C(throttle=1), hosts do it one after
        another, each serving again before the next one's restart.
    type: bool
    default: false
  frontdoor_socket:
    description:
      - With I(restart), the runtime API socket of the host's front door, through which
        each instance leaves its backend first (its requests in flight finish) and comes
        back once it answers /health. Empty, none does.
    type: str
    default: ""
  frontdoor_backend:
    description: The front door's backend whose servers are the instances.
    type: str
    default: vllm_instances
  settle:
    description:
      - With I(frontdoor_socket), seconds to wait once the instances are back in the
        door and UP by its check, for a fleet door's checks to see the host serve again.
    type: int
    default: 0
author: socketwise
"""

RETURN = r"""
ready:
  description: Seconds each unit took to answer /health.
  type: dict
  returned: always
restarted:
  description: The units restarted (with I(restart)).
  type: list
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.serve.ready import (
    FrontDoor,
    journal_tail,
    last_error,
    restart_running,
    wait_ready,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "units": {"type": "list", "elements": "str", "required": True},
            "urls": {"type": "list", "elements": "str", "required": True},
            "timeout": {"type": "int", "default": 600},
            "restart": {"type": "bool", "default": False},
            "frontdoor_socket": {"type": "str", "default": ""},
            "frontdoor_backend": {"type": "str", "default": "vllm_instances"},
            "settle": {"type": "int", "default": 0},
        },
        supports_check_mode=True,
    )
    params = module.params
    if len(params["units"]) != len(params["urls"]):
        module.fail_json(msg="give one /health URL per unit")
    pairs = zip(params["units"], params["urls"], strict=True)
    instances = [{"unit": unit, "url": url} for unit, url in pairs]
    restarted, door = [], None
    if params["restart"]:
        if module.check_mode:
            running = [i["unit"] for i in restart_running(instances, restart=lambda unit: None)]
            module.exit_json(changed=bool(running), ready={}, restarted=running)
        leave = None
        if params["frontdoor_socket"]:
            door = FrontDoor(params["frontdoor_socket"], params["frontdoor_backend"])

            def leave(units):
                door.drain(units, params["timeout"])

        instances = restart_running(instances, **({"leave": leave} if leave else {}))
        restarted = [i["unit"] for i in instances]
    try:
        result = wait_ready(instances, params["timeout"]) | {"restarted": restarted}
    finally:
        if restarted and door:
            door.ready(restarted, params["timeout"], params["settle"])
    if result["failed"]:
        ((unit, why),) = result["failed"].items()
        journal = journal_tail(unit)
        module.fail_json(msg=f"{why}: {last_error(journal)}\n{journal}", **result)
    if result["waiting"]:
        module.fail_json(
            msg=f"no answer on /health within {module.params['timeout']} s from "
            + ", ".join(result["waiting"]),
            **result,
        )
    module.exit_json(changed=bool(restarted), **result)


if __name__ == "__main__":
    main()
