"""Ansible door into socketwise.serve.unitvalues, tlsvalues and limits, the filters
socketwise.kit.X for these X: `systemd_quote`, `unit_value_errors`, `secret_errors`,
`address_errors`, `account_error`, `number_errors`, `listener_clashes`, `tls_error`,
`fleet_ca_errors`, `cert_sha256` (a certificate's pin), `cert_names_error` (names the
kit's door certificate cannot carry), `gpu_devices` (a GPU unit's DeviceAllow= nodes);
each unit's MemoryMax= and TasksMax=, sized from the plan: `instance_limits`,
`stage_limits` and `llamacpp_limits`. The cluster role uses them too."""

from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.serve import limits
from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.serve.doorcerts import (
    names_error,
)
from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.serve.tlsvalues import (
    certificate_sha256,
    fleet_ca_errors,
    tls_error,
)
from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.serve.unitvalues import (
    account_error,
    address_errors,
    gpu_devices,
    listener_clashes,
    number_errors,
    quote,
    secret_errors,
    unit_value_errors,
)


def systemd_quote(value, command_line=True):
    return quote(value, command_line)


def socketwise_unit_value_errors(values):
    return unit_value_errors(values)


def socketwise_secret_errors(values):
    return secret_errors(values)


def socketwise_account_error(user, home, account):
    """account_error as a string: empty when the account may serve."""
    return account_error(user, home, account) or ""


def socketwise_tls_error(cert, key):
    """tls_error as a string: empty when the pair serves."""
    return tls_error(cert, key) or ""


class FilterModule:
    def filters(self):
        return {
            "systemd_quote": systemd_quote,
            "unit_value_errors": socketwise_unit_value_errors,
            "secret_errors": socketwise_secret_errors,
            "address_errors": address_errors,
            "account_error": socketwise_account_error,
            "number_errors": number_errors,
            "listener_clashes": listener_clashes,
            "tls_error": socketwise_tls_error,
            "fleet_ca_errors": fleet_ca_errors,
            "cert_sha256": certificate_sha256,
            "cert_names_error": names_error,
            "gpu_devices": gpu_devices,
            "instance_limits": limits.instance_limits,
            "stage_limits": limits.stage_limits,
            "llamacpp_limits": limits.llamacpp_limits,
        }
