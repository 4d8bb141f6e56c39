"""Wait until every instance answers /health, or stop as soon as one cannot come up; then
until each endpoint gives a real completion.

Stdlib only: shipped to hosts as the role's module_utils package (roles/vllm_service).
A unit that fails or restarts while it is awaited will not come up on its own (a bad
argument, a model it cannot load): waiting out the whole timeout would only delay the
rollback, so the wait ends there with the unit's last journal lines.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from ..common.direct import urlopen

JOURNAL_LINES = 15
COMPLETION = {"prompt": "socketwise says hello", "max_tokens": 8}
# The kit's own front doors, addressed by IP, may serve a certificate made for a name or
# signed by a private CA the host does not hold: the check is that it serves, not who it is.
UNVERIFIED = ssl._create_unverified_context()


def unit_state(unit: str) -> dict[str, str]:
    """systemd's ActiveState, SubState, Result and NRestarts of `unit`."""
    shown = subprocess.run(
        ["systemctl", "show", unit, "-p", "ActiveState,SubState,Result,NRestarts"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return dict(line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)


def healthy(url: str) -> bool:
    try:
        with urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def journal_tail(unit: str) -> str:
    shown = subprocess.run(
        ["journalctl", "-u", unit, "-n", str(JOURNAL_LINES), "--no-pager", "-o", "cat"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return shown.stdout.strip()


def last_error(journal: str) -> str:
    """The line of a journal tail that says why: the last one naming an error, else the last."""
    lines = [line.strip() for line in journal.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["(nothing in the journal)"])[-1]


def restart_unit(unit: str) -> None:
    subprocess.run(["systemctl", "restart", unit], check=True, capture_output=True)


def runtime_command(socket_path: str, command: str) -> str:
    """One command to an HAProxy runtime API (its Unix socket), and the answer."""
    with socket.socket(socket.AF_UNIX) as runtime:
        runtime.settimeout(10)
        runtime.connect(socket_path)
        runtime.sendall(command.encode() + b"\n")
        return b"".join(iter(lambda: runtime.recv(65536), b"")).decode()


class FrontDoor:
    """A host's front door, by its runtime API: the servers of BACKEND (the instances,
    named like their units without `socketwise-` and `.service`) leave it before a
    restart, their requests in flight finishing, and come back after it."""

    def __init__(
        self,
        socket_path: str,
        backend: str,
        command: Callable[[str, str], str] = runtime_command,
        interval: float = 0.5,
    ):
        self.socket_path, self.backend, self.command = socket_path, backend, command
        self.interval = interval

    @staticmethod
    def server(unit: str) -> str:
        return unit.removeprefix("socketwise-").removesuffix(".service")

    def servers(self) -> dict[str, dict[str, str]]:
        """Each server of the backend's `show stat` row (scur: requests in flight)."""
        lines = self.command(self.socket_path, "show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]
        return {
            row["svname"]: row
            for row in rows
            if row.get("pxname") == self.backend and row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def in_flight(self) -> dict[str, int]:
        return {name: int(row.get("scur") or 0) for name, row in self.servers().items()}

    def drain(self, units: list[str], timeout: float) -> None:
        """No new request to the units' servers; back once those in flight are done (or
        TIMEOUT passed). With every server drained the door answers 503 at once, which
        the fleet door retries on another host."""
        servers = [self.server(unit) for unit in units]
        for server in servers:
            self.command(self.socket_path, f"set server {self.backend}/{server} state drain")
        until = time.monotonic() + timeout
        while any(self.in_flight().get(s, 0) for s in servers) and time.monotonic() < until:
            time.sleep(self.interval)

    def ready(self, units: list[str], timeout: float, settle: float = 0) -> None:
        """The units' servers back, and UP by the door's own check (or TIMEOUT passed);
        then SETTLE seconds more, for a fleet door's checks to see the host serve again
        before the next host's instances leave."""
        servers = [self.server(unit) for unit in units]
        for server in servers:
            self.command(self.socket_path, f"set server {self.backend}/{server} state ready")
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            status = {name: row.get("status", "") for name, row in self.servers().items()}
            if all(status.get(s, "").startswith("UP") for s in servers):
                break
            time.sleep(self.interval)
        time.sleep(settle)


def restart_running(
    instances: list[dict],
    state: Callable[[str], dict[str, str]] = unit_state,
    restart: Callable[[str], None] = restart_unit,
    leave: Callable[[list[str]], None] = lambda units: None,
) -> list[dict]:
    """Restart those of `instances` ([{"unit", "url"}]) whose unit is active, and return
    them: one not running yet is left to be started, with nothing to wait for. LEAVE gets
    their units first (a front door drains them)."""
    running = [i for i in instances if state(i["unit"]).get("ActiveState") == "active"]
    leave([i["unit"] for i in running])
    for instance in running:
        restart(instance["unit"])
    return running


def wait_ready(
    instances: list[dict],
    timeout: float,
    state: Callable[[str], dict[str, str]] = unit_state,
    probe: Callable[[str], bool] = healthy,
    interval: float = 1.0,
) -> dict:
    """`instances`: [{"unit", "url"}]. Returns {"ready": {unit: seconds}, "failed": {unit:
    why}, "waiting": [units]}: every unit ready, or the first failure (or the timeout)."""
    started = time.monotonic()
    restarts = {i["unit"]: int(state(i["unit"]).get("NRestarts") or 0) for i in instances}
    ready: dict[str, float] = {}
    while True:
        for instance in instances:
            unit = instance["unit"]
            if unit in ready:
                continue
            if probe(instance["url"]):
                ready[unit] = round(time.monotonic() - started, 1)
                continue
            now = state(unit)
            again = int(now.get("NRestarts") or 0) - restarts[unit]
            down = now.get("ActiveState") in ("failed", "inactive")
            if down or now.get("SubState") == "auto-restart" or again > 0:
                why = (
                    f"{unit} is {now.get('ActiveState')} ({now.get('Result')}) and restarted "
                    f"{again} time(s) while awaited"
                )
                return {"ready": ready, "failed": {unit: why}, "waiting": []}
        waiting = [i["unit"] for i in instances if i["unit"] not in ready]
        if not waiting or time.monotonic() - started > timeout:
            return {"ready": ready, "failed": {}, "waiting": waiting}
        time.sleep(interval)


def complete(url: str, model: str, api_key: str, timeout: float = 30) -> dict:
    """One completion from `url`/v1/completions: {"status", "msg", "json"} (status 0: no
    answer at all). An empty `model` asks for the endpoint's only one."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(
        f"{url}/v1/completions",
        data=json.dumps({**({"model": model} if model else {}), **COMPLETION}).encode(),
        headers=headers,
        method="POST",
    )
    try:
        with urlopen(request, timeout, context=UNVERIFIED) as answer:
            return {"status": answer.status, "msg": "OK", "json": json.loads(answer.read())}
    except urllib.error.HTTPError as error:
        return {"status": error.code, "msg": str(error.reason), "json": {}}
    except (urllib.error.URLError, OSError, ValueError) as error:
        return {"status": 0, "msg": str(getattr(error, "reason", error)), "json": {}}


def completed(answer: dict) -> bool:
    """An answer with generated tokens in it, not just a 200."""
    usage = answer["json"].get("usage") if isinstance(answer["json"], dict) else None
    return (
        answer["status"] == 200
        and isinstance(usage, dict)
        and usage.get("completion_tokens", 0) > 0
    )


def wait_completions(
    urls: list[str],
    model: str,
    api_key: str,
    timeout: float,
    post: Callable[[str, str, str], dict] = complete,
    interval: float = 5.0,
    keys: dict[str, str] | None = None,
) -> dict:
    """Ask each of `urls` for a completion until it gives one, or `timeout` passes, with
    `api_key`, or the URL's own key in `keys` (an instance behind a door takes the host's
    backend credential, not a client's key). Returns
    {"results": [{"url", "status", "msg", "json", "seconds"}] in the order of `urls` (each
    URL's first completion, or its last answer), "problems": ["URL: HTTP status msg"] of those
    that gave none, "seconds": how long it all took}."""
    started = time.monotonic()
    answers: dict[str, dict] = {}
    while True:
        for url in urls:
            if url in answers and completed(answers[url]):
                continue
            answer = post(url, model, (keys or {}).get(url, api_key))
            answers[url] = {"url": url, **answer, "seconds": round(time.monotonic() - started, 1)}
        waiting = [url for url in urls if not completed(answers[url])]
        if not waiting or time.monotonic() - started > timeout:
            return {
                "results": [answers[url] for url in urls],
                "problems": [
                    f"{url}: HTTP {answers[url]['status']} {answers[url]['msg']}".rstrip()
                    for url in waiting
                ],
                "seconds": round(time.monotonic() - started, 1),
            }
        time.sleep(interval)
