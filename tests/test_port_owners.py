"""socketwise_port_owners, run by ansible against this machine: several listeners in one
call, each answered with the program in the way of its ports."""

from __future__ import annotations

import os
import socket

from .playbooks import run_module


def test_several_listeners_are_checked_in_one_call_each_with_its_clashes():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        listeners = [
            {"variable": "plan_port", "address": "127.0.0.1", "ports": [port]},
            {"variable": "vllm_service_metrics_port", "address": "127.0.0.1", "ports": []},
        ]
        result, _ = run_module("socketwise_port_owners", {"listeners": listeners})
    first, second = result["results"]
    assert first["item"]["variable"] == "plan_port"
    assert [(c["port"], c["pid"]) for c in first["clashes"]] == [(port, os.getpid())]
    assert second["clashes"] == []
    assert result["clashes"] == first["clashes"]
