#!/usr/bin/python
"""Ansible door into socketwise.serve.verify: who already listens on the ports a plan needs."""

DOCUMENTATION = r"""
---
module: port_owners
short_description: Find listeners that would keep planned vLLM or load-balancer ports from binding
description:
  - Reads C(/proc/net/tcp) and C(/proc/net/tcp6) and the owners of their sockets.
  - Listeners that belong to socketwise's own units (name starting with I(unit_prefix)),
    or to its Podman containers (named like those units), are not clashes, since a
    re-deploy replaces them.
  - Read-only; the same answer in check mode.
options:
  address:
    description: The address the services will bind (C(0.0.0.0) for all).
    type: str
  ports:
    description: The ports the plan needs.
    type: list
    elements: int
  listeners:
    description:
      - Instead of I(address) and I(ports), several at once (one call, one round trip),
        each a dict with C(address) and C(ports); its other keys come back with it.
    type: list
    elements: dict
  unit_prefix:
    description: Name prefix of socketwise's own units.
    type: str
    default: socketwise-
author: socketwise
"""

EXAMPLES = r"""
- name: Find port clashes
  socketwise.kit.port_owners:
    address: 0.0.0.0
    ports: [8000, 8001]
  register: clashes

- name: Find port clashes of several addresses in one call
  socketwise.kit.port_owners:
    listeners:
      - {address: 127.0.0.1, ports: [8001, 8002], variable: plan_port}
      - {address: 0.0.0.0, ports: [8000], variable: plan_port}
  register: owners  # owners.results: [{item: <listener>, clashes: [...]}, ...]
"""

RETURN = r"""
clashes:
  description: Listeners in the way (address, port, pid, owner); empty when all ports are free.
  returned: always (with I(listeners), those of all of them)
  type: list
  elements: dict
results:
  description: With I(listeners), one per listener in its order, C(item) and its C(clashes).
  returned: when I(listeners) is given
  type: list
  elements: dict
net_admin:
  description:
    - Whether the module's user (root) holds CAP_NET_ADMIN, so systemd can give a unit a
      network namespace of its own with its loopback up.
  returned: when I(listeners) is given
  type: bool
"""

import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.serve.verify import (
    holds_net_admin,
    port_clashes,
    process_tree,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "address": {"type": "str"},
            "ports": {"type": "list", "elements": "int"},
            "listeners": {"type": "list", "elements": "dict"},
            "unit_prefix": {"type": "str", "default": "socketwise-"},
        },
        required_one_of=[["address", "listeners"]],
        mutually_exclusive=[["address", "listeners"]],
        required_together=[["address", "ports"]],
        supports_check_mode=True,
    )
    prefix = module.params["unit_prefix"]
    rc, out, err = module.run_command(
        ["systemctl", "show", "-p", "MainPID", "--value", f"{prefix}*.service"],
        environ_update={"LC_ALL": "C"},
    )
    own = set()
    for line in out.split() if rc == 0 else []:
        if line.isdigit() and int(line):
            own.update(process_tree(int(line)))
    if shutil.which("podman"):
        # conmon, not `podman run`, is a container's parent: its processes are no unit's.
        rc, out, err = module.run_command(
            ["podman", "ps", "--filter", f"name=^{prefix}", "--format", "{{.Pid}}"],
            environ_update={"LC_ALL": "C"},
        )
        for line in out.split() if rc == 0 else []:
            if line.isdigit() and int(line):
                own.update(process_tree(int(line)))
    if module.params["listeners"] is None:
        clashes = port_clashes(module.params["address"], module.params["ports"], own)
        module.exit_json(changed=False, clashes=clashes)
    results = []
    for listener in module.params["listeners"]:
        try:
            ports = [int(port) for port in listener.get("ports") or []]
        except (TypeError, ValueError):
            module.fail_json(msg=f"listener {listener!r}: ports must be whole numbers")
        if "address" not in listener:
            module.fail_json(msg=f"listener {listener!r}: no address")
        results.append({"item": listener, "clashes": port_clashes(listener["address"], ports, own)})
    clashes = [clash for result in results for clash in result["clashes"]]
    module.exit_json(changed=False, clashes=clashes, results=results, net_admin=holds_net_admin())


if __name__ == "__main__":
    main()
