"""HTTP to the kit's own endpoints, never through a proxy (stdlib only: shipped to hosts).

A host's http_proxy/https_proxy are for the outside world. The kit's own requests (an
instance's /health and /metrics, a front door) sent through one would hand the front
door's bearer key to the proxy, and a proxy that cannot reach a loopback or private
address answers late or not at all, so the check times out instead of answering.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import urllib.request
from collections.abc import Mapping
from http.client import HTTPResponse
from urllib.parse import unquote, urlsplit

UNIX_SCHEME = "http+unix"


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over the Unix socket whose percent-encoded path is the URL's host."""

    def __init__(self, host: str, timeout: float | None = None) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = unquote(host)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class _UnixHandler(urllib.request.AbstractHTTPHandler):
    def _open(self, request: urllib.request.Request) -> HTTPResponse:
        # The Host header names no socket path, whatever the URL's host is.
        request.add_unredirected_header("Host", "localhost")
        return self.do_open(_UnixConnection, request)


# urllib finds a handler's methods by name: PROTOCOL_open and PROTOCOL_request.
setattr(_UnixHandler, f"{UNIX_SCHEME}_open", _UnixHandler._open)
setattr(_UnixHandler, f"{UNIX_SCHEME}_request", urllib.request.AbstractHTTPHandler.do_request_)


def urlopen(
    url: str | urllib.request.Request, timeout: float, context: ssl.SSLContext | None = None
) -> HTTPResponse:
    """urllib.request.urlopen, without the environment's proxies (`context`: for https),
    and over a Unix socket for an http+unix URL."""
    # build_opener adds a ProxyHandler that reads the environment unless it is given one;
    # an empty one uses no proxy at all.
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({}), _UnixHandler()]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers).open(url, timeout=timeout)


def bypassing_proxies(environment: Mapping[str, str], url: str) -> dict[str, str]:
    """ENVIRONMENT with URL's host added to no_proxy, for a tool that honours the proxy
    variables itself (vLLM's benchmark: aiohttp with trust_env; GuideLLM: httpx): it still
    fetches from the outside through the proxy, and reaches the kit's endpoint directly.
    Both spellings are set, as tools differ in which one they read first."""
    given = environment.get("no_proxy") or environment.get("NO_PROXY") or ""
    hosts = ",".join(host for host in (given, urlsplit(url).hostname) if host)
    return {**environment, "no_proxy": hosts, "NO_PROXY": hosts}
