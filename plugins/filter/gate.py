"""Ansible door into socketwise.serve.gate: the filters `socketwise.kit.gate_figures`,
`socketwise.kit.gate_problems` and `socketwise.kit.gate_tolerance_error`."""

# The core is imported inside each filter, never when the file loads: Ansible loads every
# filter file of the collection in each task's process (docs/development/architecture.md).


def _gate():
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.serve import gate

    return gate


def gate_figures(*args, **kwargs):
    return _gate().figures(*args, **kwargs)


def gate_problems(*args, **kwargs):
    return _gate().problems(*args, **kwargs)


def gate_tolerance_error(*args, **kwargs):
    return _gate().tolerance_error(*args, **kwargs)


class FilterModule:
    def filters(self):
        return {
            "gate_figures": gate_figures,
            "gate_problems": gate_problems,
            "gate_tolerance_error": gate_tolerance_error,
        }
