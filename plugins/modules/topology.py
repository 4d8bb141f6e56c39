#!/usr/bin/python
"""Ansible door into socketwise.facts.topology (shipped as module_utils, stdlib only)."""

DOCUMENTATION = r"""
---
module: topology
short_description: Detect sockets, NUMA nodes, cores, ISA, memory, GPU and NIC locality
description:
  - Reads C(/sys) and C(/proc) under I(root) and returns the socketwise topology
    document (schema 1) as the fact C(socketwise_topology).
  - On a live host (I(root) C(/)) with C(nvidia-smi), it also asks nvidia-smi for the
    NVIDIA GPUs' name, memory and links; a captured tree keeps those answers under
    C(socketwise/) below its root.
  - Read-only. It changes nothing on the host, so check mode returns the same facts.
  - The document is the one C(socketwise topology) prints; its keys are listed in
    docs/reference/topology-schema.md.
options:
  root:
    description: Directory that holds the C(sys) and C(proc) trees to read.
    type: path
    default: /
author: socketwise
"""

EXAMPLES = r"""
- name: Detect the host's topology
  socketwise.kit.topology:
- name: Read a captured tree instead of the live host
  socketwise.kit.topology:
    root: /srv/captures/r730
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to the host.
  returned: always
  type: dict
  contains:
    socketwise_topology:
      description: The topology document, schema 1.
      type: dict
      sample:
        schema: 1
        smt: true
        sockets: [{"id": 0, "nodes": [0], "cores": 14}]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.facts.topology import (
    TopologyError,
    detect_here,
)


def main():
    module = AnsibleModule(
        argument_spec={"root": {"type": "path", "default": "/"}},
        supports_check_mode=True,
    )
    try:
        facts = detect_here(module.params["root"])
    except TopologyError as exc:
        module.fail_json(msg=f"cannot read the topology under {module.params['root']}: {exc}")
    module.exit_json(changed=False, ansible_facts={"socketwise_topology": facts})


if __name__ == "__main__":
    main()
