"""Ansible door into socketwise.serve.gate: the filters `socketwise.kit.gate_figures`,
`socketwise.kit.gate_problems` and `socketwise.kit.gate_tolerance_error`."""

from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.serve import gate


class FilterModule:
    def filters(self):
        return {
            "gate_figures": gate.figures,
            "gate_problems": gate.problems,
            "gate_tolerance_error": gate.tolerance_error,
        }
