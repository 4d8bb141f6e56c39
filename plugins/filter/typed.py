"""Ansible door into socketwise.common.typed: `socketwise.kit.typed` gives a role's values as
the types their argument specs declare, `socketwise.kit.type_errors` says which do not
convert. Every role that reads numbers or switches uses it."""

from ansible.errors import AnsibleFilterError

# The core is imported inside each filter, never when the file loads: Ansible loads every
# filter file of the collection in each task's process (docs/development/architecture.md).


def _types(values):
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.common.typed import (
        declared_types,
        undeclared,
    )

    types = declared_types()
    missing = undeclared(values, types)
    if missing:
        raise AnsibleFilterError(f"no int, float or bool argument spec for {', '.join(missing)}")
    return types


def socketwise_typed(values):
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.common.typed import (
        typed,
    )

    return typed(values, _types(values))


def socketwise_type_errors(values):
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.common.typed import (
        type_errors,
    )

    return type_errors(values, _types(values))


class FilterModule:
    def filters(self):
        return {
            "typed": socketwise_typed,
            "type_errors": socketwise_type_errors,
        }
