"""The credentials role's door secrets as a host's root finds them on disk: play 1's check
decides the keys and token from the inventory's values, then door-secrets writes them with
the door's certificate and its caller's files into a root-only directory, in one write.
Run as the kit runs them (include_role), the host reached as the controller itself, on a
real directory in place of /etc/socketwise/secrets.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

from . import frontdoor
from .playbooks import run_playbook

KEY = "0123456789abcdef" * 2
NEW_KEY = "fedcba9876543210" * 2
TOKEN = "scrape-" + "t" * 25

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Decide the keys as play 1 does
      ansible.builtin.include_role:
        name: credentials
        tasks_from: check
      vars:
        credentials_door_listen: 127.0.0.1
        credentials_door_addresses: [127.0.0.1]
    - name: Write the door's secrets as a host's door does
      ansible.builtin.include_role:
        name: credentials
        tasks_from: door-secrets
      vars:
        credentials_secrets_dir: "{{ secrets_dir }}"
        credentials_keep_client_keys: "{{ keep }}"
        credentials_secret_files:
          - {name: engine.env, content: "ENGINE=1\\n"}
"""


def write(tmp_path: Path, secrets: Path, given: dict, keep: bool = False) -> int:
    """One write of a door's secrets into SECRETS with the inventory values GIVEN; how many
    tasks changed the host."""
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    (tmp_path / "token").write_text(TOKEN + "\n")
    extra = {
        "secrets_dir": str(secrets),
        "keep": keep,
        "credentials_metrics_token_file": str(tmp_path / "token"),
        "credentials_dir": str(tmp_path / "credentials"),
    } | given
    run = run_playbook(
        str(play), "-i", "localhost,", "-c", "local", "-e", json.dumps(extra),
        "-e", "ansible_python_interpreter={{ ansible_playbook_python }}",
    )  # fmt: skip
    assert run.returncode == 0, run.output[-3000:]
    assert KEY not in run.output and TOKEN not in run.output
    return run.recap("localhost")["changed"]


def files(secrets: Path) -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(secrets.iterdir())}


def test_a_tls_door_gets_its_keys_token_and_certificate_root_only_in_one_write(tmp_path):
    secrets = tmp_path / "secrets"
    cert, key = frontdoor.self_signed(tmp_path, "edge-01")
    tls = {"credentials_api_key": KEY, "credentials_tls_cert": str(cert)}
    tls |= {"credentials_tls_key": str(key)}
    assert write(tmp_path, secrets, tls) == 1
    assert files(secrets) == {
        "client-keys": KEY + "\n",
        "engine.env": "ENGINE=1\n",
        # The operator's certificate and key, as HAProxy takes them: one PEM.
        "frontdoor.pem": cert.read_text() + key.read_text(),
        "scrape-keys": TOKEN + "\n",
    }
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
    assert {stat.S_IMODE(path.stat().st_mode) for path in secrets.iterdir()} == {0o600}
    # Written again, nothing changes (a converged door is not reloaded).
    assert write(tmp_path, secrets, tls) == 0
    # Plain HTTP: the door keeps no certificate.
    assert write(tmp_path, secrets, {"credentials_api_key": KEY}) == 1
    assert "frontdoor.pem" not in files(secrets)


def test_a_rotation_gives_the_door_both_keys_and_a_door_told_to_keep_its_keys_keeps_them(
    tmp_path,
):
    secrets = tmp_path / "secrets"
    write(tmp_path, secrets, {"credentials_api_key": KEY})
    # rollout.yml's first fleet play: the door keeps the keys it has until every host took
    # the new ones.
    assert write(tmp_path, secrets, {"credentials_api_key": NEW_KEY}, keep=True) == 0
    assert files(secrets)["client-keys"] == KEY + "\n"
    rotation = {"credentials_api_key": NEW_KEY, "credentials_api_key_previous": KEY}
    assert write(tmp_path, secrets, rotation) == 1
    assert files(secrets)["client-keys"] == f"{NEW_KEY}\n{KEY}\n"
