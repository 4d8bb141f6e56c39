"""Talk to a deployed front door as a client would, and look for a secret where it must
not be: shared by the lab tests."""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import subprocess
from pathlib import Path

from socketwise.lab import machines as lab

# Every vLLM route that is not an OpenAI client's, as the issue lists them, and spellings
# of allowed ones that must not slip through (encoded, dotted, other case).
REFUSED_PATHS = [
    "/metrics",
    "/tokenize",
    "/detokenize",
    "/pooling",
    "/invocations",
    "/collective_rpc",
    "/sleep",
    "/wake_up",
    "/reset_prefix_cache",
    "/start_profile",
    "/stop_profile",
    "/scale_elastic_ep",
    "/load_lora_adapter",
    "/unload_lora_adapter",
    "/pause",
    "/resume",
    "/update_weights",
    "/server_info",
    "/version",
    "/docs",
    "/openapi.json",
    "/v1/load_lora_adapter",
    "/v1/completions/../../metrics",
    "/v1/%63ompletions",
    "/V1/completions",
]
COMPLETION = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 6}


def self_signed(directory: Path, name: str, prefix: str = "tls") -> tuple[Path, Path]:
    """(certificate, key) of a new self-signed pair for NAME, as PEM files in DIRECTORY."""
    cert, key = directory / f"{prefix}.crt", directory / f"{prefix}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def call(
    address: str,
    port: int,
    path: str,
    key: str | None = None,
    body: dict | None = None,
    tls: bool = False,
    timeout: float = 60,
    ca: Path | None = None,
    cert: Path | None = None,
) -> tuple[int, bytes]:
    """(status, body) of one request; the path goes out exactly as given. No answer within
    `timeout` seconds raises (TimeoutError, an OSError). Over TLS the door's certificate is
    taken as it comes, or verified against CA for ADDRESS; CERT: a client certificate and
    its key (one PEM) to show."""
    if tls or ca:
        context = ssl.create_default_context(cafile=ca)
        if ca is None:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if cert is not None:
            context.load_cert_chain(cert)
        connection = http.client.HTTPSConnection(address, port, timeout=timeout, context=context)
    else:
        connection = http.client.HTTPConnection(address, port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        connection.request(
            "POST" if body is not None else "GET",
            path,
            body=json.dumps(body) if body is not None else None,
            headers=headers,
        )
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def completion_tokens(
    address: str, port: int, key: str, tls: bool = False, model: str = COMPLETION["model"]
) -> int:
    """The tokens of one completion of MODEL, which must be answered as MODEL."""
    status, body = call(address, port, "/v1/completions", key, COMPLETION | {"model": model}, tls)
    assert status == 200, (status, body[:300])
    answer = json.loads(body)
    assert answer["model"] == model, answer
    return answer["usage"]["completion_tokens"]


def streamed_reads(address: str, port: int, key: str, tokens: int = 128) -> tuple[int, int]:
    """(reads, tokens): a streamed completion of TOKENS tokens read off the socket as a
    client reads it, how many reads brought token events and how many tokens the stream
    says it sent (its closing usage). Sent as they are made, the tokens come in many reads;
    held back, in one or two. vLLM merges the tokens of a client that falls behind into one
    event, so the count of events is no measure on a busy machine."""
    body = json.dumps({
        **COMPLETION, "max_tokens": tokens, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    })  # fmt: skip
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Connection: close\r\n\r\n{body}"
    )
    reads, received = 0, b""
    with socket.create_connection((address, port), timeout=60) as connection:
        connection.sendall(request.encode())
        while data := connection.recv(65536):
            reads += b'"text":' in data
            received += data
    sent = re.findall(rb'"completion_tokens":\s*([0-9]+)', received)
    return reads, int(sent[-1]) if sent else 0


def answers(address: str, port: int) -> bool:
    """Whether anything accepts a TCP connection there."""
    try:
        socket.create_connection((address, port), timeout=5).close()
        return True
    except OSError:
        return False


# The metrics door's port in the lab (door_metrics_port's default).
METRICS_PORT = 9180


def scrape(
    address: str, path: str, token: str | None, source: str = "127.0.0.1"
) -> tuple[int, str]:
    """(status, body) of a GET of PATH at a metrics door, with TOKEN as the bearer, from
    SOURCE (the lab's extra metrics source by default)."""
    connection = http.client.HTTPConnection(address, METRICS_PORT, timeout=10,
                                            source_address=(source, 0))  # fmt: skip
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        connection.request("GET", path, headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.read().decode(errors="replace")
    finally:
        connection.close()


# Runs on the host with the key on standard input, so the key is in no command line.
_FIND_ON_HOST = r"""
import glob, os, subprocess, sys
key = sys.stdin.read().strip()
found = []
for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        if key in open(path, "rb").read().decode(errors="replace"):
            found.append(path)
    except OSError:
        pass
for path in (
    glob.glob("/etc/systemd/system/socketwise-*")
    + glob.glob("/etc/socketwise/*.cfg")
    + glob.glob("/etc/socketwise/monitor/*")
):
    if os.path.isfile(path) and key in open(path).read():
        found.append(path)
units = [os.path.basename(p) for p in glob.glob("/etc/systemd/system/socketwise-*.service")]
for command in (["systemctl", "show", *units], ["journalctl", "--no-pager", "-o", "cat"]):
    if key in subprocess.run(command, capture_output=True, text=True).stdout:
        found.append(" ".join(command[:2]))
print("\n".join(found))
"""


def key_places_on_host(machine: lab.Machine, key: str) -> list[str]:
    """Where on the host `key` shows outside its root-only files: process command lines,
    unit files, `systemctl show`, the journal, the front doors' and the monitor's
    configuration."""
    done = subprocess.run(
        lab.ssh_command(machine, f"python3 -c '{_FIND_ON_HOST}'"),
        input=key,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line]


def files_holding(directory: Path, key: str) -> list[Path]:
    return [
        path
        for path in directory.rglob("*")
        if path.is_file() and key.encode() in path.read_bytes()
    ]
