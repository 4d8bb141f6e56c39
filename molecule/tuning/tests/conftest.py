"""irqbalance on the lab machine as real systemd and its files show it, for every verifier;
and what prepare saved before the role first ran (../../prepare.yml)."""

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

CONFIG = "/etc/default/irqbalance"


@dataclass
class Irqbalance:
    active: str  # systemd's ActiveState
    enabled: str  # its UnitFileState
    config: str  # /etc/default/irqbalance, byte for byte
    daemon_environment: dict[str, str]  # the running daemon's; empty when none runs


def unit_state(shown: str) -> tuple[str, str]:
    properties = dict(line.split("=", 1) for line in shown.splitlines())
    return properties["ActiveState"], properties["UnitFileState"]


@pytest.fixture
def irqbalance(host) -> Irqbalance:
    shown = host.check_output(
        "systemctl show -p ActiveState -p UnitFileState -p MainPID irqbalance.service"
    )
    pid = dict(line.split("=", 1) for line in shown.splitlines())["MainPID"]
    environment = {}
    if pid != "0":
        raw = host.file(f"/proc/{pid}/environ").content
        environment = dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)
    return Irqbalance(*unit_state(shown), host.file(CONFIG).content_string, environment)


@pytest.fixture
def irqbalance_before() -> Irqbalance:
    saved = json.loads(
        (Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "irqbalance.json").read_text()
    )
    return Irqbalance(*unit_state(saved["state"]), saved["config"], {})
