#!/usr/bin/python
"""Ansible door into socketwise.serve.ready.wait_completions (shipped as module_utils)."""

DOCUMENTATION = r"""
---
module: completion
short_description: Ask endpoints for a real completion until each gives one
description:
  - POSTs a short completion to each URL's /v1/completions until it answers 200 with
    generated tokens, or I(timeout) passes. One result per endpoint, with the seconds it
    took; never fails itself (the task after it decides, naming the host).
  - The key is a no_log option; it reaches neither the output nor the result.
  - Read-only.
options:
  urls:
    description: Base URLs (scheme, address, port) of the endpoints.
    type: list
    elements: str
    required: true
  model:
    description: The served model name to ask for; empty for the endpoint's only one.
    type: str
    default: ""
  api_key:
    description: The front door's key; empty for an endpoint without one.
    type: str
    default: ""
  backend_urls:
    description: Those of I(urls) that are instances behind a front door, asked with I(backend_key).
    type: list
    elements: str
    default: []
  backend_key:
    description: The host's backend credential (vLLM's own key), for I(backend_urls).
    type: str
    default: ""
  timeout:
    description: Seconds to keep asking at most.
    type: int
    default: 60
  version_url:
    description:
      - vLLM's C(/version) to read once every endpoint answered (in the same call, not a
        round trip of its own); empty for none.
    type: str
    default: ""
author: socketwise
"""

RETURN = r"""
results:
  description: Per URL, its first completion or last answer (url, status, msg, json, seconds).
  type: list
  returned: always
problems:
  description: For each endpoint that gave no completion, its URL, HTTP status and reason.
  type: list
  returned: always
seconds:
  description: Seconds from the call until every endpoint answered (or the timeout).
  type: float
  returned: always
version:
  description: The version I(version_url) answered; C(unknown) when it gave none.
  type: str
  returned: when I(version_url) is given
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.common.direct import urlopen
from ansible_collections.socketwise.kit.plugins.module_utils.socketwise.serve.ready import (
    wait_completions,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "urls": {"type": "list", "elements": "str", "required": True},
            "model": {"type": "str", "default": ""},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "backend_urls": {"type": "list", "elements": "str", "default": []},
            "backend_key": {"type": "str", "default": "", "no_log": True},
            "timeout": {"type": "int", "default": 60},
            "version_url": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    params = module.params
    keys = dict.fromkeys(params["backend_urls"], params["backend_key"])
    result = wait_completions(
        params["urls"], params["model"], params["api_key"], params["timeout"], keys=keys
    )
    if params["version_url"]:
        try:
            # An instance's Unix socket too (http+unix), never through a proxy.
            with urlopen(params["version_url"], timeout=10) as answer:
                result["version"] = str(json.loads(answer.read())["version"])
        except Exception:  # noqa: BLE001 - any failure reads as an unknown version
            result["version"] = "unknown"
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
