"""One OCI image per build class, built on the controller with buildah; no registry.

    python -m socketwise.build.image CACHE --class CLASS --rootfs DIR --wheelhouse DIR --venv PATH

The image is a local Debian rootfs (such as the lab's debootstrap build) with the class's
wheelhouse installed into a venv at PATH, the same path and the same command line
(`PATH/bin/vllm serve ...`) as the venv method, so one unit template serves both. It
leaves the controller as an `oci-archive` file that hosts `podman load`.

Build once: the tag is `localhost/socketwise-vllm:<class>-<hash>`, the hash taken over
the rootfs's build id, the wheelhouse's requirements (every wheel's sha256), the venv
path and this recipe, so a changed wheelhouse or rootfs gives a new tag and an
unchanged one nothing to do. The archive's description (`<name>.json`, written last,
beside `<name>.oci.tar`) says it is complete; with it there, nothing runs.

buildah runs with `--isolation chroot` (no user namespace or cgroup setup, which this
kind of machine refuses). The wheelhouse is copied in for the install and removed in
the same layer, so the image holds the venv, not the wheels twice.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from socketwise.build.wheelhouse import MARKER, REQUIREMENTS, install_argv, read_marker
from socketwise.common.files import building, read_json, sha256

REPOSITORY = "localhost/socketwise-vllm"
# Bump when the steps below change what an image holds: it is part of every tag.
RECIPE = 1
# Debian packages the image adds to the rootfs: the allocator every class preloads.
PACKAGES = ("libtcmalloc-minimal4",)
# The rootfs's build id (socketwise.lab.rootfs.BUILD_ID_FILE).
ROOTFS_ID_FILE = "etc/socketwise-lab-build"


class ImageError(RuntimeError):
    """A build that cannot start or did not finish, in one line with the fix."""


def content_id(rootfs: Path, wheelhouse: Path, venv: str) -> str:
    """The hash every input of the image contributes to (12 hex digits)."""
    try:
        rootfs_id = (rootfs / ROOTFS_ID_FILE).read_text().strip()
    except OSError as error:
        raise ImageError(
            f"{rootfs}: no {ROOTFS_ID_FILE}, so not a finished socketwise rootfs; write a "
            f"unique build id into it, or build one with `python -m socketwise.lab.rootfs`"
        ) from error
    try:
        requirements = (wheelhouse / REQUIREMENTS).read_bytes()
    except OSError as error:
        raise ImageError(
            f"{wheelhouse}: no {REQUIREMENTS}, so not a finished wheelhouse; "
            "build it with `python -m socketwise.build.wheelhouse CACHE --class CLASS`"
        ) from error
    digest = hashlib.sha256()
    for part in (f"recipe {RECIPE}", rootfs_id, venv, " ".join(PACKAGES)):
        digest.update(part.encode() + b"\n")
    digest.update(requirements)
    return digest.hexdigest()[:12]


def archive_digest(archive: Path) -> str:
    """The manifest digest an `oci-archive` holds: what `podman load` gives the image."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ImageError(f"{archive}: no index.json, so not an OCI archive")
        index = json.load(member)
    return index["manifests"][0]["digest"]


def _buildah(*args: str) -> str:
    """Run buildah, return its output; on failure an ImageError with the output's end."""
    done = subprocess.run(["buildah", *args], check=False, text=True, capture_output=True)
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()[-2000:]
        raise ImageError(f"buildah {args[0]} failed: {output}")
    return done.stdout.strip()


def build(cache: Path, build_class: str, rootfs: Path, wheelhouse: Path, venv: str) -> dict:
    """Build (once) the image of BUILD_CLASS and its archive under CACHE; describe it.

    Returns {"class", "tag", "archive", "digest", "wheelhouse_sha256", "seconds",
    "built"}; "built" is true only when this call ran buildah.
    """
    if shutil.which("buildah") is None:
        raise ImageError("buildah is not installed on the controller; run scripts/setup")
    cache, rootfs, wheelhouse = Path(cache), Path(rootfs), Path(wheelhouse)
    wheels = read_marker(wheelhouse)
    if wheels is None:
        raise ImageError(f"{wheelhouse}: no {MARKER}, so not a finished wheelhouse")
    name = f"{build_class}-{content_id(rootfs, wheelhouse, venv)}"
    requirements_sha256 = sha256(wheelhouse / REQUIREMENTS)
    described_file = cache / f"{name}.json"
    archive = cache / f"{name}.oci.tar"
    described = read_json(described_file)
    if described and archive.is_file() and archive.stat().st_size == described.get("bytes"):
        return described | {"built": False}
    cache.mkdir(parents=True, exist_ok=True)
    tag = f"{REPOSITORY}:{name}"
    started = time.monotonic()
    container = _buildah("from", "--name", f"socketwise-build-{name}", "scratch")
    try:
        mount = Path(_buildah("mount", container))
        # cp -a keeps owners, modes and links, which `buildah copy` would make root's.
        subprocess.run(["cp", "-a", f"{rootfs}/.", str(mount)], check=True)
        inside = f"/tmp/socketwise-wheelhouse-{wheelhouse.name}"
        shutil.copytree(wheelhouse, f"{mount}{inside}")
        steps = [
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-q", "-y", "--no-install-recommends", *PACKAGES],
            ["apt-get", "clean"],
            ["python3", "-m", "venv", venv],
            install_argv(Path(inside), f"{venv}/bin/python"),
            ["rm", "-rf", inside, "/var/lib/apt/lists", "/root/.cache"],
        ]
        for step in steps:
            _buildah("run", "--isolation", "chroot", "--network", "host", container, "--", *step)
        _buildah("umount", container)
        _buildah(
            "config",
            "--label", f"socketwise.class={build_class}",
            "--label", f"socketwise.wheelhouse_sha256={requirements_sha256}",
            "--env", f"PATH={venv}/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--cmd", f"{venv}/bin/vllm --version",
            container,
        )  # fmt: skip
        _buildah("commit", "--quiet", "--rm", container, tag)
        container = ""
        partial = archive.with_name(f".{archive.name}.partial")
        partial.unlink(missing_ok=True)
        _buildah("push", "--quiet", tag, f"oci-archive:{partial}:{tag}")
        os.replace(partial, archive)
        _buildah("rmi", tag)  # the archive is what hosts get; keep the controller's disk
    finally:
        if container:
            subprocess.run(["buildah", "rm", container], check=False, capture_output=True)
    described = {
        "class": build_class,
        "tag": tag,
        "archive": str(archive),
        "bytes": archive.stat().st_size,
        "digest": archive_digest(archive),
        "wheelhouse_sha256": requirements_sha256,
        "venv": venv,
        "seconds": round(time.monotonic() - started, 1),
    }
    tmp = described_file.with_name(f".{described_file.name}.tmp")
    tmp.write_text(json.dumps(described, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, described_file)
    return described | {"built": True}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m socketwise.build.image",
        description="Build a build class's vLLM image once; print it as JSON.",
    )
    parser.add_argument("cache", type=Path, help="where the archives and descriptions live")
    parser.add_argument("--class", dest="build_class", required=True, help="the build class")
    parser.add_argument(
        "--rootfs", type=Path, required=True, help="the Debian rootfs the image starts from"
    )
    parser.add_argument("--wheelhouse", type=Path, required=True, help="the class's wheelhouse")
    parser.add_argument("--venv", required=True, help="the venv's path inside the image")
    args = parser.parse_args(argv)
    try:
        with building(args.cache):
            described = build(args.cache, args.build_class, args.rootfs, args.wheelhouse, args.venv)
    except ImageError as error:
        print(f"socketwise.build.image: {error}", file=sys.stderr)
        return 2
    print(json.dumps(described, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
