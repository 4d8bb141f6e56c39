"""Ansible door into socketwise.serve.unitvalues, tlsvalues and limits, the filters
socketwise.kit.X for these X: `systemd_quote`, `unit_value_errors`, `secret_errors`,
`address_errors`, `account_error`, `number_errors`, `listener_clashes`, `tls_error`,
`fleet_ca_errors`, `cert_sha256` (a certificate's pin), `cert_names_error` (names the
kit's door certificate cannot carry), `gpu_devices` (a GPU unit's DeviceAllow= nodes);
each unit's MemoryMax= and TasksMax=, sized from the plan: `instance_limits`,
`stage_limits` and `llamacpp_limits`. The cluster role uses them too."""

import importlib

# The core is imported inside each filter, never when the file loads: Ansible loads every
# filter file of the collection in each task's process (docs/development/architecture.md).


CORE = "ansible_collections.socketwise.kit.plugins.module_utils.socketwise"


def _core(module, name):
    """The core's MODULE.NAME as a filter, imported when the filter is first called."""

    def call(*args, **kwargs):
        return getattr(importlib.import_module(f"{CORE}.{module}"), name)(*args, **kwargs)

    return call


def systemd_quote(value, command_line=True):
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.serve import unitvalues

    return unitvalues.quote(value, command_line)


def socketwise_unit_value_errors(values):
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.serve import unitvalues

    return unitvalues.unit_value_errors(values)


def socketwise_secret_errors(values):
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.serve import unitvalues

    return unitvalues.secret_errors(values)


def socketwise_account_error(user, home, account):
    """account_error as a string: empty when the account may serve."""
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.serve import unitvalues

    return unitvalues.account_error(user, home, account) or ""


def socketwise_tls_error(cert, key):
    """tls_error as a string: empty when the pair serves."""
    from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.serve.tlsvalues import (
        tls_error,
    )

    return tls_error(cert, key) or ""


class FilterModule:
    def filters(self):
        return {
            "systemd_quote": systemd_quote,
            "unit_value_errors": socketwise_unit_value_errors,
            "secret_errors": socketwise_secret_errors,
            "address_errors": _core("serve.unitvalues", "address_errors"),
            "account_error": socketwise_account_error,
            "number_errors": _core("serve.unitvalues", "number_errors"),
            "listener_clashes": _core("serve.unitvalues", "listener_clashes"),
            "tls_error": socketwise_tls_error,
            "fleet_ca_errors": _core("serve.tlsvalues", "fleet_ca_errors"),
            "cert_sha256": _core("serve.tlsvalues", "certificate_sha256"),
            "cert_names_error": _core("serve.doorcerts", "names_error"),
            "gpu_devices": _core("serve.unitvalues", "gpu_devices"),
            "instance_limits": _core("serve.limits", "instance_limits"),
            "stage_limits": _core("serve.limits", "stage_limits"),
            "llamacpp_limits": _core("serve.limits", "llamacpp_limits"),
        }
