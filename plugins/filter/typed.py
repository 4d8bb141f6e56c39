"""Ansible door into socketwise.common.typed: `socketwise.kit.typed` gives a role's values as
the types their argument specs declare, `socketwise.kit.type_errors` says which do not
convert. Every role that reads numbers or switches uses it."""

from ansible.errors import AnsibleFilterError
from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.common.typed import (
    declared_types,
    type_errors,
    typed,
    undeclared,
)


def _types(values):
    types = declared_types()
    missing = undeclared(values, types)
    if missing:
        raise AnsibleFilterError(f"no int, float or bool argument spec for {', '.join(missing)}")
    return types


def socketwise_typed(values):
    return typed(values, _types(values))


def socketwise_type_errors(values):
    return type_errors(values, _types(values))


class FilterModule:
    def filters(self):
        return {
            "typed": socketwise_typed,
            "type_errors": socketwise_type_errors,
        }
