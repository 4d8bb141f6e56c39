"""Ansible door into socketwise.serve.gate: the filters `socketwise_gate_figures`,
`socketwise_gate_problems` and `socketwise_gate_tolerance_error`."""

import sys
from pathlib import Path

try:
    from socketwise.serve import gate
except ImportError:
    # Run from a checkout whose package is not installed in Ansible's Python:
    # the package sits three levels above this role's filter_plugins/.
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from socketwise.serve import gate


class FilterModule:
    def filters(self):
        return {
            "socketwise_gate_figures": gate.figures,
            "socketwise_gate_problems": gate.problems,
            "socketwise_gate_tolerance_error": gate.tolerance_error,
        }
