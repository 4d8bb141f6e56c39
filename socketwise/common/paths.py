"""Where socketwise keeps what it builds once and reuses (lab rootfs, wheelhouse, model)."""

import os
from pathlib import Path


def cache_dir() -> Path:
    """The controller-side cache; SOCKETWISE_CACHE overrides the default."""
    return Path(os.environ.get("SOCKETWISE_CACHE", "/var/cache/socketwise"))


def repo_root() -> Path:
    """The checkout that holds roles/, playbooks/ and inventories/."""
    return Path(__file__).resolve().parents[2]
