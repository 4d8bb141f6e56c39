"""Which releases, venvs and models under the kit's home a release cleanup removes.

Stdlib only: shipped to hosts as the role's module_utils package (roles/vllm_service).
A host keeps the release it runs and the one before it (`current` and `previous` in
`<home>/releases`) with the venvs and models they name; older ones go. What goes is
decided on the host's real directories, not on strings: a home given as `/opt/socketwise/`
or through a symlink names the same directories as `/opt/socketwise`, and a directory the
kit did not make (an operator's model, a copied venv) is never removed, because only a
directory that carries the kit's own marker for its name can be the kit's:

- `<home>/releases/<id>` holds a `release.json` whose `id` is `<id>`;
- `<home>/venvs/<build id>` holds `.socketwise-<build id>` (roles/vllm, venv.yml);
- `<home>/models/<name>-<revision>` holds `.socketwise-complete` recording `<revision>`
  (roles/vllm, main.yml).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterable, Mapping

AREAS = ("releases", "venvs", "models")
# The links release.yml points at the releases a host keeps.
LINKS = ("current", "previous")
RELEASE_FILE = "release.json"
MARKER_PREFIX = ".socketwise-"
MODEL_MARKER = ".socketwise-complete"


def _regular_file(path: str) -> bool:
    """A plain file, not a link: a marker reached through a link may be anyone's."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _read_release(path: str) -> dict | None:
    """The release.json in directory `path`, or None when it is missing or unreadable."""
    file = os.path.join(path, RELEASE_FILE)
    if not _regular_file(file):
        return None
    try:
        with open(file, encoding="utf-8") as handle:
            release = json.load(handle)
    except (OSError, ValueError):
        return None
    return release if isinstance(release, dict) else None


def _first_line(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.readline().strip()
    except (OSError, ValueError):
        return ""


def is_kits(area: str, path: str) -> bool:
    """Whether directory `path` in `area` (releases, venvs, models) carries the kit's marker
    for its own name: a copy under another name, or an operator's directory, does not."""
    name = os.path.basename(path)
    if area == "releases":
        release = _read_release(path)
        return release is not None and release.get("id") == name
    if area == "venvs":
        return _regular_file(os.path.join(path, MARKER_PREFIX + name))
    marker = os.path.join(path, MODEL_MARKER)
    revision = _first_line(marker) if _regular_file(marker) else ""
    return bool(revision) and name.endswith("-" + revision)


def _kept_paths(releases: str, keep: list[Mapping]) -> set[str]:
    """The real paths of the releases to keep (the given ones and those `current` and
    `previous` name on disk) and of the venvs and models they name."""
    kept_releases = {os.path.realpath(os.path.join(releases, str(r["id"]))) for r in keep}
    for link in LINKS:
        path = os.path.join(releases, link)
        if os.path.islink(path):
            kept_releases.add(os.path.realpath(path))
    records = keep + [r for r in map(_read_release, sorted(kept_releases)) if r]
    used = {
        os.path.realpath(record[key])
        for record in records
        for key in ("venv", "model")
        # A model given as a Hugging Face id is no directory of the host's.
        if isinstance(record.get(key), str) and os.path.isabs(record[key])
    }
    return kept_releases | used


def removable(home: str, releases: str, keep: Iterable[Mapping]) -> list[str]:
    """The directories a cleanup removes (by their real paths), releases first: every direct
    child of `<home>/releases`, `<home>/venvs` and `<home>/models` that is a directory (not
    a link), carries the kit's marker for its name, and is neither a kept release nor a
    venv or model one of them names. `keep` holds releases as in release.json (`id`,
    `venv`, `model`). Raises ValueError when `releases` is not `<home>/releases`."""
    if not os.path.isabs(home):
        raise ValueError(f"the kit's home {home!r} is not an absolute path")
    # realpath normalizes (a trailing `/`, `//`, `.`) and resolves a symlinked home, so a
    # directory is compared with what is kept by where it really is.
    home_dir = os.path.realpath(home)
    if os.path.realpath(releases) != os.path.join(home_dir, "releases"):
        raise ValueError(f"the releases directory {releases!r} is not {home}/releases")
    keep = list(keep)
    kept = _kept_paths(os.path.join(home_dir, "releases"), keep)
    doomed = []
    for area in AREAS:
        area_dir = os.path.join(home_dir, area)
        try:
            names = sorted(os.listdir(area_dir))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            path = os.path.join(area_dir, name)
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                continue
            if os.path.realpath(path) not in kept and is_kits(area, path):
                doomed.append(path)
    return doomed


def prune(home: str, releases: str, keep: Iterable[Mapping], dry_run: bool = False) -> list[str]:
    """Remove what `removable` names (nothing in a dry run) and return it."""
    doomed = removable(home, releases, keep)
    if not dry_run:
        for path in doomed:
            # rmtree removes links inside the tree, never what they point at.
            shutil.rmtree(path)
    return doomed
