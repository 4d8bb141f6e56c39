"""The built-in model's size presets, generated for real with the cached model-building
venv (torch, transformers, tokenizers) that a lab deploy installs on the controller. The
module installs that venv itself when no deploy has (a cold cache, or one whose built-in
model was made before), with the vllm role's own tasks, so it runs first or alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from socketwise.common import paths
from socketwise.facts.topology import detect
from socketwise.lab import tinymodel
from socketwise.plan.hwclass import isa_class

from .playbooks import run_playbook

REPO = Path(__file__).resolve().parent.parent
# prepare.yml's steps for the model-building venv on the controller, for the controller's
# own build class: its wheelhouse (built once into the cache), then the role's venv.yml
# into the venv prepare.yml uses. Both find their work done on a warm cache.
BUILDER_PLAY = """
- name: The model-building venv, as the vllm role's prepare.yml installs it
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Build the wheelhouse of the controller's build class
      ansible.builtin.command:
        argv:
          - {python}
          - -m
          - socketwise.build.wheelhouse
          - {wheelhouses}
          - --spec
          - {spec}
          - --class
          - {klass}
        chdir: {repo}
      register: built
      changed_when: (built.stdout_lines | last | from_json).built

    - name: Pick it
      ansible.builtin.set_fact:
        __vllm_host_build: "{{{{ built.stdout_lines | last | from_json }}}}"

    - name: Install the model-building venv
      ansible.builtin.include_role:
        name: vllm
        tasks_from: venv
      vars:
        vllm_venv_dir: "{{{{ __vllm_builder_venv }}}}"
        vllm_venv_wheelhouse: "{{{{ __vllm_wheelhouse }}}}"
        vllm_venv_python: "{{{{ ansible_playbook_python }}}}"
        vllm_venv_uv: "{{{{ ansible_playbook_python | dirname }}}}/uv"
"""


@pytest.fixture(scope="module")
def builder_python(tmp_path_factory) -> Path:
    """The model-building venv's python, installed first if no deploy has."""
    play = tmp_path_factory.mktemp("builder") / "builder.yml"
    role_defaults = yaml.safe_load((REPO / "roles/vllm/defaults/main.yml").read_text())
    play.write_text(
        BUILDER_PLAY.format(
            python=json.dumps(sys.executable),
            wheelhouses=json.dumps(str(paths.cache_dir() / "wheelhouse")),
            spec=json.dumps(role_defaults["vllm_spec"]),
            klass=isa_class(detect()),
            repo=json.dumps(str(REPO)),
        )
    )
    # No inventory: the implicit localhost, with this venv's python, as deploys' controller side.
    done = run_playbook(str(play))
    assert done.returncode == 0, done.output[-3000:]
    return paths.cache_dir() / "vllm-venv" / "bin" / "python"


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


def _generate(python: Path, out: Path, *args: str) -> dict:
    subprocess.run(
        [str(python), "-m", "socketwise.lab.tinymodel", str(out), *args],
        cwd=REPO, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads((out / tinymodel.MARKER).read_text())


@pytest.mark.lab
def test_sizes_share_the_tokenizer_and_generate_byte_identical(
    builder_python: Path, tmp_path: Path
) -> None:
    tiny = _generate(builder_python, tmp_path / "tiny")
    again = _generate(builder_python, tmp_path / "again")
    assert tiny == again  # every file's sha256, the marker's own record
    half = _generate(builder_python, tmp_path / "half", "--size=0.5g")
    assert half["preset"] == "0.5g" and half["dtype"] == "bfloat16"
    assert half["parameters"] == tinymodel.PRESETS["0.5g"].parameters(half["vocab_size"])
    weights = half["files"]["model.safetensors"]["size"]
    assert 0.45e9 < weights < 0.5e9 and weights >= 2 * half["parameters"]
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert half["files"][name]["sha256"] == tiny["files"][name]["sha256"], name
    config = json.loads((tmp_path / "half" / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"]) == (2048, 5)


@pytest.mark.lab
def test_two_builds_at_once_build_the_model_once(builder_python: Path, tmp_path: Path) -> None:
    # Two deploys from one controller (or two test workers) ask for the model together.
    argv = [str(builder_python), "-m", "socketwise.lab.tinymodel", str(tmp_path / "model")]
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
