"""Readiness: every instance up, or the first one that cannot come up named at once."""

import contextlib
import http.server
import json
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from socketwise.serve.ready import (
    FrontDoor,
    complete,
    last_error,
    restart_running,
    wait_completions,
    wait_ready,
)

from .playbooks import run_module

UP = {"ActiveState": "active", "SubState": "running", "Result": "success", "NRestarts": "0"}


def test_every_instance_answering_is_ready():
    answers = {"http://a/health": iter([False, True]), "http://b/health": iter([True])}
    result = wait_ready(
        [{"unit": "a", "url": "http://a/health"}, {"unit": "b", "url": "http://b/health"}],
        timeout=5, state=lambda unit: UP, probe=lambda url: next(answers[url]), interval=0,
    )  # fmt: skip
    assert sorted(result["ready"]) == ["a", "b"]
    assert (result["failed"], result["waiting"]) == ({}, [])


def test_a_new_secret_restarts_the_running_instances_only():
    # A first deploy's instances are not running yet: they are started later, not here.
    states = {"a": UP, "b": {**UP, "ActiveState": "inactive", "SubState": "dead"}}
    restarted = []
    instances = [{"unit": "a", "url": "http://a/health"}, {"unit": "b", "url": "http://b/health"}]
    running = restart_running(instances, state=states.__getitem__, restart=restarted.append)
    assert (running, restarted) == ([instances[0]], ["a"])


def test_a_restart_for_a_new_secret_drains_the_instance_from_the_front_door_first():
    # The host door's runtime API: the instance's requests in flight (scur) finish one
    # poll after the drain; only then does systemd restart it; it comes back, and the
    # call returns once the door's own check has it UP again.
    said: list[str] = []
    stats = iter([(2, "UP"), (0, "DRAIN"), (0, "DOWN"), (0, "UP")])

    def runtime(socket_path: str, command: str) -> str:
        said.append(command)
        if command != "show stat":
            return "\n"
        scur, status = next(stats)
        return (
            "# pxname,svname,scur,status\nvllm,FRONTEND,5,OPEN\n"
            f"vllm_instances,vllm-sn,{scur},{status}\nvllm_instances,BACKEND,2,UP\n"
        )

    door = FrontDoor("/run/socketwise-lb/admin.sock", "vllm_instances", runtime, interval=0)
    instances = [{"unit": "socketwise-vllm-sn.service", "url": "http://a/health"}]
    restart_running(
        instances,
        state=lambda unit: UP,
        restart=lambda unit: said.append(f"restart {unit}"),
        leave=lambda units: door.drain(units, timeout=5),
    )
    door.ready(["socketwise-vllm-sn.service"], timeout=5)
    assert said == [
        "set server vllm_instances/vllm-sn state drain",
        "show stat",
        "show stat",
        "restart socketwise-vllm-sn.service",
        "set server vllm_instances/vllm-sn state ready",
        "show stat",
        "show stat",
    ]


def test_a_unit_that_crashes_while_awaited_stops_the_wait_at_once():
    states = iter([UP, {**UP, "ActiveState": "activating", "SubState": "auto-restart",
                        "Result": "exit-code"}])  # fmt: skip
    result = wait_ready(
        [{"unit": "socketwise-vllm-sn.service", "url": "http://x/health"}],
        timeout=600, state=lambda unit: next(states), probe=lambda url: False, interval=0,
    )  # fmt: skip
    assert result["failed"] == {
        "socketwise-vllm-sn.service": "socketwise-vllm-sn.service is activating (exit-code) "
        "and restarted 0 time(s) while awaited"
    }


def test_a_restart_counted_by_systemd_stops_the_wait():
    states = iter([UP, {**UP, "NRestarts": "1"}])
    result = wait_ready(
        [{"unit": "u", "url": "http://x/health"}],
        timeout=600, state=lambda unit: next(states), probe=lambda url: False, interval=0,
    )  # fmt: skip
    assert "restarted 1 time(s)" in result["failed"]["u"]


def test_an_instance_still_loading_at_the_timeout_is_named():
    result = wait_ready(
        [{"unit": "u", "url": "http://x/health"}],
        timeout=0, state=lambda unit: UP, probe=lambda url: False, interval=0,
    )  # fmt: skip
    assert result == {"ready": {}, "failed": {}, "waiting": ["u"]}


def test_the_line_that_says_why_is_the_last_error_of_the_journal():
    journal = (
        "usage: api_server.py [-h] [--model MODEL]\n"
        "api_server.py: error: unrecognized arguments: --no-such-flag\n"
        "socketwise-vllm-sn.service: Main process exited, code=exited, status=2/INVALIDARGUMENT\n"
    )
    assert last_error(journal) == "api_server.py: error: unrecognized arguments: --no-such-flag"
    assert last_error("") == "(nothing in the journal)"


@pytest.fixture
def health_server():
    """A /health answering 200 on 127.0.0.1, served from a thread; yields its URL."""

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/health"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("variable", ["http_proxy", "HTTP_PROXY"])
def test_a_host_s_proxy_does_not_come_between_the_check_and_the_instance(
    monkeypatch, health_server, variable
):
    # A proxy that is not there (the discard port of loopback) and nothing exempted: a
    # request that went through it would fail, and the instance would never be ready.
    monkeypatch.setenv(variable, "http://127.0.0.1:9")
    for exempt in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(exempt, raising=False)
    result = wait_ready(
        [{"unit": "u", "url": health_server}], timeout=0, state=lambda unit: UP, interval=0
    )
    assert list(result["ready"]) == ["u"]


def answer(status: int, tokens: int = 0) -> dict:
    return {"status": status, "msg": "", "json": {"usage": {"completion_tokens": tokens}}}


def test_completions_are_asked_for_until_each_endpoint_gives_one():
    answers = {"a": [answer(503), answer(200, 0), answer(200, 8)], "b": [answer(200, 8)]}
    asked = []

    def post(url, model, key):
        asked.append(url)
        return answers[url].pop(0)

    result = wait_completions(["a", "b"], "m", "k", timeout=60, post=post, interval=0)
    # A 200 with no generated tokens is not a completion; an endpoint that gave one is
    # asked no more.
    assert asked == ["a", "b", "a", "a"]
    assert result["problems"] == []
    assert [r["url"] for r in result["results"]] == ["a", "b"]
    assert result["results"][0]["json"]["usage"]["completion_tokens"] == 8


def test_an_instance_behind_a_door_is_asked_with_the_backend_credential():
    keys = {}

    def post(url, model, key):
        keys[url] = key
        return answer(200, 8)

    wait_completions(["instance", "door"], "m", "client", 60, post, 0, {"instance": "backend"})
    assert keys == {"instance": "backend", "door": "client"}


def test_an_endpoint_that_never_completes_is_named_with_its_last_answer():
    result = wait_completions(
        ["a"], "m", "", timeout=0, post=lambda *_: {**answer(503), "msg": "Unavailable"}
    )
    assert result["problems"] == ["a: HTTP 503 Unavailable"]


def test_a_completion_carries_the_key_and_model_and_reaches_a_real_server():
    seen = {}

    class Completions(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            seen["auth"] = self.headers["Authorization"]
            seen["body"] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            body = json.dumps({"usage": {"completion_tokens": 8}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Completions)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = wait_completions([url], "tiny", "sekrit", timeout=5, interval=0)
        nothing = complete("http://127.0.0.1:9", "tiny", "")
    finally:
        server.shutdown()
        server.server_close()
    assert result["problems"] == []
    assert seen["auth"] == "Bearer sekrit" and seen["body"]["model"] == "tiny"
    assert nothing["status"] == 0


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _OnSocket(http.server.BaseHTTPRequestHandler):
    """An instance's handler on a Unix socket (its clients have no address), quiet."""

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def address_string(self):
        return "unix"

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def on_socket(path: Path, handler: type[_OnSocket]) -> Iterator[str]:
    """HANDLER serving on the Unix socket PATH, while the block runs: its http+unix URL."""
    server = _UnixServer(str(path), handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield "http+unix://" + str(path).replace("/", "%2F")
    finally:
        server.shutdown()
        server.server_close()


def test_an_instance_on_a_unix_socket_is_checked_and_asked_there(tmp_path):
    # An instance serves only on its Unix socket: /health and a completion reach it there,
    # with the backend credential; a socket nobody serves is not ready.
    seen = []

    class Instance(_OnSocket):
        def do_GET(self):
            seen.append(("GET", self.path, self.headers["Host"]))
            self._answer(b"")

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(("POST", self.path, self.headers["Authorization"]))
            self._answer(json.dumps({"usage": {"completion_tokens": 8}}).encode())

    gone = "http+unix://" + str(tmp_path / "gone.sock").replace("/", "%2F")
    with on_socket(tmp_path / "api.sock", Instance) as url:
        ready = wait_ready(
            [{"unit": "u", "url": url + "/health"}], timeout=0, state=lambda unit: UP, interval=0
        )
        result = wait_completions([url], "tiny", "client", 5, complete, 0, {url: "backend"})
        never = wait_ready(
            [{"unit": "g", "url": gone + "/health"}], timeout=0, state=lambda unit: UP, interval=0
        )
    assert list(ready["ready"]) == ["u"] and result["problems"] == []
    assert seen == [
        ("GET", "/health", "localhost"),
        ("POST", "/v1/completions", "Bearer backend"),
    ]
    assert never["ready"] == {} and never["waiting"] == ["g"], never


def test_the_deploy_asks_an_instance_on_its_socket_and_reads_its_version_there(tmp_path):
    # The readiness module, as verify.yml runs it: each instance's completion with the
    # backend credential and vLLM's /version, all on the instance's Unix socket.
    class Instance(_OnSocket):
        def do_GET(self):
            body = {"version": "0.32.0"} if self.path == "/version" else {}
            self._answer(json.dumps(body).encode())

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            tokens = 8 if self.headers["Authorization"] == "Bearer backend-credential" else 0
            self._answer(json.dumps({"usage": {"completion_tokens": tokens}}).encode())

    with on_socket(tmp_path / "api.sock", Instance) as url:
        result, _ = run_module(
            "socketwise.kit.completion",
            {"urls": [url], "model": "tiny", "api_key": "client-key", "timeout": 5,
             "backend_urls": [url], "backend_key": "backend-credential",
             "version_url": url + "/version"},
        )  # fmt: skip
    assert result["problems"] == [] and result["version"] == "0.32.0", result


def test_a_unit_that_exited_while_awaited_stops_the_wait_at_once():
    """A unit that stopped (inactive, dead: it exited and systemd gave up) is named at
    once, with its state, not waited on until the ready timeout."""
    states = iter([UP, {**UP, "ActiveState": "inactive", "SubState": "dead"}])
    result = wait_ready(
        [{"unit": "u", "url": "http://x/health"}],
        timeout=600, state=lambda unit: next(states), probe=lambda url: False, interval=0,
    )  # fmt: skip
    assert list(result["failed"]) == ["u"] and "inactive" in result["failed"]["u"]


def test_a_drain_of_two_instances_waits_for_both_to_finish_their_requests():
    """A host's instances restart together for a new secret: each leaves the door, and the
    restart waits until neither has a request in flight, not until one of them is idle."""
    polls = [(0, 3), (0, 1), (0, 0)]
    said: list[str] = []
    answered: list[tuple[int, int]] = []

    def runtime(socket_path: str, command: str) -> str:
        said.append(command)
        if command != "show stat":
            return "\n"
        answered.append(polls[min(len(answered), len(polls) - 1)])
        first, second = answered[-1]
        return (
            "# pxname,svname,scur,status\n"
            f"vllm_instances,vllm-dp0,{first},DRAIN\nvllm_instances,vllm-dp1,{second},DRAIN\n"
        )

    door = FrontDoor("/run/socketwise-lb/admin.sock", "vllm_instances", runtime, interval=0)
    door.drain(["socketwise-vllm-dp0.service", "socketwise-vllm-dp1.service"], timeout=60)
    assert said[:2] == [f"set server vllm_instances/vllm-dp{n} state drain" for n in (0, 1)]
    # It waited through the second's requests and stopped once neither had any.
    assert (0, 1) in answered and answered[-1] == (0, 0)
