"""socketwise_port_owners, run by ansible against this machine: several listeners in one
call, each answered with the program in the way of its ports."""

from __future__ import annotations

import json
import os
import socket
import subprocess

from .playbooks import BIN, REPO


def test_several_listeners_are_checked_in_one_call_each_with_its_clashes():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        listeners = [
            {"variable": "plan_port", "address": "127.0.0.1", "ports": [port]},
            {"variable": "vllm_service_metrics_port", "address": "127.0.0.1", "ports": []},
        ]
        done = subprocess.run(
            [str(BIN / "ansible"), "localhost", "-i", "inventories/local", "-m",
             "socketwise_port_owners", "-a", json.dumps({"listeners": listeners})],
            cwd=REPO, capture_output=True, text=True, check=False,
            env=dict(os.environ, ANSIBLE_LIBRARY=str(REPO / "roles/vllm_service/library"),
                     ANSIBLE_MODULE_UTILS=str(REPO / "roles/vllm_service/module_utils"),
                     ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="json"),
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    first, second = result["results"]
    assert first["item"]["variable"] == "plan_port"
    assert [(c["port"], c["pid"]) for c in first["clashes"]] == [(port, os.getpid())]
    assert second["clashes"] == []
    assert result["clashes"] == first["clashes"]
