"""After tuning with host_tuning_irqbalance: stop on the reverted machine: irqbalance is
stopped and disabled in systemd, as the report says, and its configuration is untouched."""

import json

REPORT = "/var/lib/socketwise/tuning-report.json"


def test_irqbalance_is_stopped_and_disabled_and_its_configuration_untouched(
    host, irqbalance, irqbalance_before
):
    knob = {k["name"]: k for k in json.loads(host.file(REPORT).content_string)["knobs"]}[
        "irqbalance"
    ]
    assert knob["status"] == "set"
    assert knob["before"] == {"banned_cpulist": None, "active": True, "enabled": True}
    assert knob["after"] == {"banned_cpulist": None, "active": False, "enabled": False}
    assert (irqbalance.active, irqbalance.enabled) == ("inactive", "disabled")
    assert irqbalance.daemon_environment == {}
    assert irqbalance.config == irqbalance_before.config
