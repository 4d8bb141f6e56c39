"""The built-in model's size presets, generated for real with the cached model-building
venv (torch, transformers, tokenizers) that a lab deploy installs on the controller."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from socketwise.common import paths
from socketwise.lab import tinymodel

REPO = Path(__file__).resolve().parent.parent


def test_an_unknown_size_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"size '2g': choose one of tiny, 0\.5g, 1g"):
        tinymodel.generate(tmp_path / "model", preset="2g")
    assert not (tmp_path / "model").exists()


def test_presets_hold_the_weight_bytes_their_names_promise() -> None:
    vocab = 612  # what the built-in corpus trains
    for name, gigabytes in (("0.5g", 0.5), ("1g", 1.0)):
        weight_bytes = 2 * tinymodel.PRESETS[name].parameters(vocab)
        assert 0.9 * gigabytes < weight_bytes / 1e9 < 1.05 * gigabytes, name
        assert tinymodel.PRESETS[name].kv_heads % 2 == 0  # tensor parallel 2 splits them
    assert tinymodel.PRESETS["tiny"].parameters(vocab) == 3_461_376


def _generate(out: Path, *args: str) -> dict:
    python = paths.cache_dir() / "vllm-venv" / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no model-building venv at {python}: a lab deploy (test_deploy_lab) makes it")
    subprocess.run(
        [str(python), "-m", "socketwise.lab.tinymodel", str(out), *args],
        cwd=REPO, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads((out / tinymodel.MARKER).read_text())


@pytest.mark.lab
def test_sizes_share_the_tokenizer_and_generate_byte_identical(tmp_path: Path) -> None:
    tiny = _generate(tmp_path / "tiny")
    again = _generate(tmp_path / "again")
    assert tiny == again  # every file's sha256, the marker's own record
    half = _generate(tmp_path / "half", "--size=0.5g")
    assert half["preset"] == "0.5g" and half["dtype"] == "bfloat16"
    assert half["parameters"] == tinymodel.PRESETS["0.5g"].parameters(half["vocab_size"])
    weights = half["files"]["model.safetensors"]["size"]
    assert 0.45e9 < weights < 0.5e9 and weights >= 2 * half["parameters"]
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert half["files"][name]["sha256"] == tiny["files"][name]["sha256"], name
    config = json.loads((tmp_path / "half" / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"]) == (2048, 5)


@pytest.mark.lab
def test_two_builds_at_once_build_the_model_once(tmp_path: Path) -> None:
    # Two deploys from one controller (or two test workers) ask for the model together.
    python = paths.cache_dir() / "vllm-venv" / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no model-building venv at {python}: a lab deploy (test_deploy_lab) makes it")
    argv = [str(python), "-m", "socketwise.lab.tinymodel", str(tmp_path / "model")]
    builds = [
        subprocess.Popen(
            argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(2)
    ]
    said = [build.communicate(timeout=600)[0] for build in builds]
    assert [build.returncode for build in builds] == [0, 0], said
    assert sorted(": generated," in out for out in said) == [False, True], said
    assert sorted(p.name for p in tmp_path.iterdir()) == [".model.lock", "model"]
