"""The root-only secret files of a host's services, written in one call.

Stdlib only: shipped to hosts as the role's module_utils package (roles/vllm_service).
One call does what took a round trip per file (a copy each, a file task for the
directory, one for a file that must go): the directory root-only, each file written only
when its content, owner or mode differ (atomically, never half written), files that must
go removed, and credentials made once and read back. Nothing here logs a content.
"""

from __future__ import annotations

import os
import secrets
import stat
import string
import tempfile
from collections.abc import Iterable, Mapping

FILE_MODE = 0o600
# A credential made once: 48 letters and digits, as the backend key always was.
_ALPHABET = string.ascii_letters + string.digits
CREDENTIAL_LENGTH = 48


def _right(path: str, uid: int, gid: int, mode: int) -> bool:
    info = os.lstat(path)
    return (
        stat.S_ISREG(info.st_mode)
        and info.st_uid == uid
        and info.st_gid == gid
        and stat.S_IMODE(info.st_mode) == mode
    )


def _write(path: str, content: str, uid: int, gid: int) -> None:
    """Write CONTENT to PATH through a file beside it, owner and mode set before a byte."""
    handle, tmp = tempfile.mkstemp(prefix=".socketwise-", dir=os.path.dirname(path))
    try:
        os.fchmod(handle, FILE_MODE)
        os.fchown(handle, uid, gid)
        with os.fdopen(handle, "w") as out:
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _ensure_dir(directory: str, mode: int, uid: int, gid: int, check: bool) -> bool:
    if not os.path.isdir(directory):
        if not check:
            os.makedirs(directory, mode=mode)
            os.chown(directory, uid, gid)
            os.chmod(directory, mode)
        return True
    info = os.stat(directory)
    if stat.S_IMODE(info.st_mode) == mode and (info.st_uid, info.st_gid) == (uid, gid):
        return False
    if not check:
        os.chown(directory, uid, gid)
        os.chmod(directory, mode)
    return True


def apply(
    directory: str,
    files: Iterable[Mapping] = (),
    absent: Iterable[str] = (),
    once: Iterable[str] = (),
    dir_mode: int | None = None,
    check: bool = False,
    uid: int = 0,
    gid: int = 0,
) -> dict:
    """Bring DIRECTORY's secret files to what is asked; return what changed.

    `files`: each {name, content, force (default true)}; with force false a file that
    exists is left as it is. `absent`: names that must not be there. `once`: names of
    credentials made once (random, a line) and read back. `dir_mode`: make the directory
    with that mode (and root's) when given. In check mode nothing is written: the answer
    says what would change, and a credential not made yet is not read.

    Returns {"changed": [names, "." for the directory], "contents": {once name: text}}.
    """
    changed: list[str] = []
    if dir_mode is not None and _ensure_dir(directory, dir_mode, uid, gid, check):
        changed.append(".")
    for name in [*once, *(f["name"] for f in files), *absent]:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"{name!r} is not a file name in {directory}")
    contents: dict[str, str] = {}
    for name in once:
        path = os.path.join(directory, name)
        if not os.path.lexists(path):
            changed.append(name)
            if check:
                continue
            made = "".join(secrets.choice(_ALPHABET) for _ in range(CREDENTIAL_LENGTH))
            _write(path, made + "\n", uid, gid)
        if os.path.lexists(path):
            with open(path) as handle:
                contents[name] = handle.read()
    for wanted in files:
        path = os.path.join(directory, wanted["name"])
        exists = os.path.lexists(path)
        if exists and not wanted.get("force", True):
            continue
        if exists and _right(path, uid, gid, FILE_MODE):
            with open(path) as handle:
                if handle.read() == wanted["content"]:
                    continue
        changed.append(wanted["name"])
        if not check:
            _write(path, wanted["content"], uid, gid)
    for name in absent:
        path = os.path.join(directory, name)
        if os.path.lexists(path):
            changed.append(name)
            if not check:
                os.unlink(path)
    return {"changed": changed, "contents": contents}
