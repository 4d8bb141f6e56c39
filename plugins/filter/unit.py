"""Ansible door into socketwise.serve.unitvalues, tlsvalues and limits, the filters
socketwise.kit.X for these X: `systemd_quote`, `unit_value_errors`, `secret_errors`,
`served_name_errors` (model names the fleet door cannot route by), `address_errors`,
`account_error`, `number_errors`, `listener_clashes`, `tls_error`, `fleet_ca_errors`,
`cert_sha256` (a certificate's pin), `cert_names_error` (names the kit's door certificate
cannot carry), `gpu_devices` (a GPU unit's DeviceAllow= nodes);
each unit's MemoryMax= and TasksMax=, sized from the plan: `instance_limits`,
`stage_limits` and `llamacpp_limits`. The cluster role uses them too."""

from ansible_collections.socketwise.kit.plugins.module_utils.lazy import core_filter

# The core is imported inside each filter, never when the file loads: Ansible loads every
# filter file of the collection in each task's process (docs/development/architecture.md).


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
            "systemd_quote": core_filter("serve.unitvalues", "quote"),
            "unit_value_errors": core_filter("serve.unitvalues", "unit_value_errors"),
            "served_name_errors": core_filter("serve.unitvalues", "served_name_errors"),
            "secret_errors": core_filter("serve.unitvalues", "secret_errors"),
            "address_errors": core_filter("serve.unitvalues", "address_errors"),
            "account_error": socketwise_account_error,
            "number_errors": core_filter("serve.unitvalues", "number_errors"),
            "listener_clashes": core_filter("serve.unitvalues", "listener_clashes"),
            "tls_error": socketwise_tls_error,
            "fleet_ca_errors": core_filter("serve.tlsvalues", "fleet_ca_errors"),
            "cert_sha256": core_filter("serve.tlsvalues", "certificate_sha256"),
            "cert_names_error": core_filter("serve.doorcerts", "names_error"),
            "gpu_devices": core_filter("serve.unitvalues", "gpu_devices"),
            "instance_limits": core_filter("serve.limits", "instance_limits"),
            "stage_limits": core_filter("serve.limits", "stage_limits"),
            "llamacpp_limits": core_filter("serve.limits", "llamacpp_limits"),
        }
