"""Ansible door into socketwise.serve.unitvalues, tlsvalues and limits: the filters
`systemd_quote` and `socketwise_unit_value_errors`, `socketwise_secret_errors`,
`socketwise_address_errors`, `socketwise_account_error`, `socketwise_number_errors`,
`socketwise_listener_clashes`, `socketwise_tls_error`, `socketwise_fleet_ca_errors`,
`socketwise_cert_sha256` (a certificate's pin), `socketwise_cert_names_error` (names the
kit's door certificate cannot carry),
`socketwise_gpu_devices` (a GPU unit's DeviceAllow= nodes); each
unit's MemoryMax= and TasksMax=, sized from the plan: `socketwise_instance_limits`,
`socketwise_stage_limits` and `socketwise_llamacpp_limits`. The same file serves the
cluster role (linked into its filter_plugins/)."""

import sys
from pathlib import Path

try:
    from socketwise.serve import limits
    from socketwise.serve.doorcerts import names_error
    from socketwise.serve.tlsvalues import certificate_sha256, fleet_ca_errors, tls_error
    from socketwise.serve.unitvalues import (
        account_error,
        address_errors,
        gpu_devices,
        listener_clashes,
        number_errors,
        quote,
        secret_errors,
        unit_value_errors,
    )
except ImportError:
    # Run from a checkout whose package is not installed in Ansible's Python:
    # the package sits three levels above this role's filter_plugins/.
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from socketwise.serve import limits
    from socketwise.serve.doorcerts import names_error
    from socketwise.serve.tlsvalues import certificate_sha256, fleet_ca_errors, tls_error
    from socketwise.serve.unitvalues import (
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
            "socketwise_unit_value_errors": socketwise_unit_value_errors,
            "socketwise_secret_errors": socketwise_secret_errors,
            "socketwise_address_errors": address_errors,
            "socketwise_account_error": socketwise_account_error,
            "socketwise_number_errors": number_errors,
            "socketwise_listener_clashes": listener_clashes,
            "socketwise_tls_error": socketwise_tls_error,
            "socketwise_fleet_ca_errors": fleet_ca_errors,
            "socketwise_cert_sha256": certificate_sha256,
            "socketwise_cert_names_error": names_error,
            "socketwise_gpu_devices": gpu_devices,
            "socketwise_instance_limits": limits.instance_limits,
            "socketwise_stage_limits": limits.stage_limits,
            "socketwise_llamacpp_limits": limits.llamacpp_limits,
        }
