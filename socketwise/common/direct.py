"""HTTP to the kit's own endpoints, never through a proxy (stdlib only: shipped to hosts).

A host's http_proxy/https_proxy are for the outside world. The kit's own requests (an
instance's /health and /metrics, a front door) sent through one would hand the front
door's bearer key to the proxy, and a proxy that cannot reach a loopback or private
address answers late or not at all, so the check times out instead of answering.
"""

from __future__ import annotations

import ssl
import urllib.request
from collections.abc import Mapping
from http.client import HTTPResponse
from urllib.parse import urlsplit


def urlopen(
    url: str | urllib.request.Request, timeout: float, context: ssl.SSLContext | None = None
) -> HTTPResponse:
    """urllib.request.urlopen, without the environment's proxies (`context`: for https)."""
    # build_opener adds a ProxyHandler that reads the environment unless it is given one;
    # an empty one uses no proxy at all.
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
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
