"""Ansible door into socketwise.common.typed: `socketwise_typed` gives a role's values as
the types their argument specs declare, `socketwise_type_errors` says which do not
convert. The same file serves every role that reads numbers or switches (linked into
their filter_plugins/)."""

import sys
from pathlib import Path

from ansible.errors import AnsibleFilterError

try:
    from socketwise.common.typed import declared_types, type_errors, typed, undeclared
except ImportError:
    # Run from a checkout whose package is not installed in Ansible's Python:
    # the package sits three levels above this role's filter_plugins/.
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from socketwise.common.typed import declared_types, type_errors, typed, undeclared


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
            "socketwise_typed": socketwise_typed,
            "socketwise_type_errors": socketwise_type_errors,
        }
