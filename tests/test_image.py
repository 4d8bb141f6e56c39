"""The image method's build identity: what makes a new image tag, and what refuses to
build. (The lab proof, test_image_lab.py, builds and serves a real image.)"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from socketwise.build.image import ROOTFS_ID_FILE, ImageError, archive_digest, content_id

VENV = "/opt/socketwise/venvs/9fc1d65d5fe4"


def _inputs(tmp_path: Path, rootfs_id: str = "20261124T1200-a", pins: str = "torch==2.13.0"):
    rootfs, wheelhouse = tmp_path / "rootfs", tmp_path / "wheelhouse"
    (rootfs / ROOTFS_ID_FILE).parent.mkdir(parents=True, exist_ok=True)
    (rootfs / ROOTFS_ID_FILE).write_text(rootfs_id + "\n")
    wheelhouse.mkdir(exist_ok=True)
    (wheelhouse / "requirements.txt").write_text(pins + " --hash=sha256:00\n")
    return rootfs, wheelhouse


def test_the_tag_changes_with_the_rootfs_the_wheels_or_the_venv_and_only_then(tmp_path):
    rootfs, wheelhouse = _inputs(tmp_path)
    first = content_id(rootfs, wheelhouse, VENV)
    assert content_id(rootfs, wheelhouse, VENV) == first, "same inputs, same tag: built once"
    assert len(first) == 12 and int(first, 16) >= 0
    assert content_id(rootfs, wheelhouse, "/opt/other") != first
    _inputs(tmp_path, rootfs_id="20261125T0900-b")
    assert content_id(rootfs, wheelhouse, VENV) != first, "a rebuilt rootfs gives a new tag"
    _inputs(tmp_path, pins="torch==2.13.1")
    assert content_id(rootfs, wheelhouse, VENV) != first, "a changed pin gives a new tag"


def test_an_unfinished_rootfs_or_wheelhouse_is_refused_with_the_fix(tmp_path):
    rootfs, wheelhouse = _inputs(tmp_path)
    (wheelhouse / "requirements.txt").unlink()
    with pytest.raises(ImageError, match="not a finished wheelhouse; build it with"):
        content_id(rootfs, wheelhouse, VENV)
    (rootfs / ROOTFS_ID_FILE).unlink()
    with pytest.raises(
        ImageError, match="not a finished socketwise rootfs; write a unique build id"
    ):
        content_id(rootfs, wheelhouse, VENV)


def test_the_digest_is_the_archives_manifest_the_one_podman_load_gives(tmp_path):
    digest = "sha256:" + "ab" * 32
    index = {"schemaVersion": 2, "manifests": [{"digest": digest, "size": 1}]}
    archive = tmp_path / "zen.oci.tar"
    with tarfile.open(archive, "w") as tar:
        data = json.dumps(index).encode()
        member = tarfile.TarInfo("index.json")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    assert archive_digest(archive) == digest
