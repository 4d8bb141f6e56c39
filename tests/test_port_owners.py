"""socketwise_port_owners, run by ansible against this machine: several listeners in one
call, each answered with the program in the way of its ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from socketwise.serve.verify import holds_net_admin

from .playbooks import REPO, run_module


def test_several_listeners_are_checked_in_one_call_each_with_its_clashes():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        listeners = [
            {"variable": "plan_port", "address": "127.0.0.1", "ports": [port]},
            {"variable": "door_metrics_port", "address": "127.0.0.1", "ports": []},
        ]
        result, _ = run_module("socketwise.kit.port_owners", {"listeners": listeners})
    first, second = result["results"]
    assert first["item"]["variable"] == "plan_port"
    assert [(c["port"], c["pid"]) for c in first["clashes"]] == [(port, os.getpid())]
    assert second["clashes"] == []
    assert result["clashes"] == first["clashes"]


def test_the_answer_says_whether_root_may_give_a_unit_a_network_of_its_own():
    # What this process holds, as the module reads it: a container without CAP_NET_ADMIN
    # gets its engines on the host's loopback, not a namespace systemd cannot set up.
    result, _ = run_module("socketwise.kit.port_owners", {"listeners": []})
    assert result["net_admin"] is holds_net_admin()
    held = setpriv_net_admin(drop=False)
    assert (held, setpriv_net_admin(drop=True)) == (holds_net_admin(), False)


def setpriv_net_admin(drop: bool) -> bool:
    """holds_net_admin() in a child whose bounding set has CAP_NET_ADMIN dropped, or not."""
    probe = "from socketwise.serve.verify import holds_net_admin; print(holds_net_admin())"
    argv = [sys.executable, "-c", probe]
    if drop:
        argv = ["setpriv", "--bounding-set=-net_admin", "--inh-caps=-net_admin", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=REPO)
    return done.stdout.strip() == "True"
