"""Ansible door into socketwise.serve.gate: the filters `socketwise.kit.gate_figures`,
`socketwise.kit.gate_problems` and `socketwise.kit.gate_tolerance_error`."""

from ansible_collections.socketwise.kit.plugins.module_utils.lazy import core_filter

# The core is imported inside each filter, never when the file loads: Ansible loads every
# filter file of the collection in each task's process (docs/development/architecture.md).


class FilterModule:
    def filters(self):
        return {
            "gate_figures": core_filter("serve.gate", "figures"),
            "gate_problems": core_filter("serve.gate", "problems"),
            "gate_tolerance_error": core_filter("serve.gate", "tolerance_error"),
        }
