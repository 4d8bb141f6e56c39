"""What a user checks on hosts served by the image method: each runs its build class's
image (loaded once, the digest the controller built), the front door answers with the key
only, the server runs unprivileged in a read-only container, its worker threads on the
planned CPUs, and the key is in no unit, argv or `podman inspect`."""

import json
import os
import re
import urllib.error
import urllib.request
from pathlib import Path

import testinfra.utils.ansible_runner

from socketwise.facts.files import parse_cpulist

testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(
    os.environ["MOLECULE_INVENTORY_FILE"]
).get_hosts("all")

ARTIFACTS = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "artifacts"
CACHE = Path(os.environ.get("SOCKETWISE_CACHE", "/var/cache/socketwise"))
KEY = (CACHE / "lab" / "api-key").read_text().strip()


def summary(host) -> dict:
    name = host.backend.get_hostname()
    return json.loads((ARTIFACTS / name / "deploy-summary.json").read_text())


def completion(host, key: str | None) -> dict:
    plan = summary(host)["plan"]
    request = urllib.request.Request(
        f"http://{host.ansible.get_variables()['ansible_host']}:{plan['endpoint_port']}/v1/completions",
        data=json.dumps({"model": "tiny-llama", "prompt": "Hello", "max_tokens": 5}).encode(),
        headers={"Content-Type": "application/json"}
        | ({"Authorization": f"Bearer {key}"} if key else {}),
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


def test_each_host_runs_only_its_classs_image_with_the_digest_built(host):
    build = summary(host)["build"]
    assert build["install_method"] == "image"
    assert build["image"].startswith(f"localhost/socketwise-vllm:{build['class']}-")
    built = json.loads((CACHE / "images" / (build["image"].split(":")[1] + ".json")).read_text())
    assert build["image_digest"] == built["digest"]
    images = host.check_output("podman images --format '{{.Repository}}:{{.Tag}} {{.Digest}}'")
    assert images.splitlines() == [f"{build['image']} {built['digest']}"]
    # The archive was removed once loaded: the host keeps one copy, in Podman's store.
    assert host.check_output(f"ls {summary(host)['model'].rsplit('/models/', 1)[0]}/images") == ""


def test_the_image_is_of_the_class_the_cpu_calls_for():
    """zentorch is in the zen image only: vLLM picked its Zen platform there alone."""
    (build,) = [json.loads(p.read_text())["build"] for p in ARTIFACTS.glob("*/deploy-summary.json")]
    assert build["class"] == build["detected"]
    built = [json.loads(p.read_text()) for p in (CACHE / "images").glob("*.json")]
    assert build["image_digest"] in {b["digest"] for b in built}
    assert build["platform"] == ("ZenCpuPlatform" if build["class"] == "zen" else "CpuPlatform")


def test_the_front_door_answers_a_real_completion_with_the_key_only(host):
    assert completion(host, KEY)["usage"]["completion_tokens"] > 0
    try:
        completion(host, None)
        raise AssertionError("the front door answered without the key")
    except urllib.error.HTTPError as refused:
        assert refused.code == 401


def test_the_server_runs_unprivileged_in_a_read_only_container(host):
    uid = host.user("vllm").uid
    for instance in summary(host)["plan"]["instances"]:
        name = f"socketwise-{instance['name']}"
        assert host.service(name).is_running
        pid = host.check_output(f"podman inspect --format '{{{{.State.Pid}}}}' {name}")
        assert host.check_output(f"stat -c %u /proc/{pid}") == str(uid)
        assert host.run(f"podman exec {name} touch /usr/socketwise-probe").rc != 0
        assert host.run(f"podman exec {name} touch /tmp/probe").rc == 0


def test_worker_threads_run_on_exactly_the_planned_cpus(host):
    """Read from the host, through the container's own PID: not what the deploy said."""
    for instance in summary(host)["plan"]["instances"]:
        name = f"socketwise-{instance['name']}"
        pid = host.check_output(f"podman inspect --format '{{{{.State.Pid}}}}' {name}")
        tree = host.check_output(
            f"ps -e -o pid=,ppid=,comm= | awk -v root={pid} "
            "'{parent[$1]=$2; comm[$1]=$3} END {for (p in parent) "
            "{q=p; while (q && q!=root) q=parent[q]; "
            "if (q==root && comm[p] ~ /^VLLM::Worker/) print p}}'"
        )
        workers = sorted(tree.split())
        assert len(workers) == len(instance["ranks"]), tree
        # vLLM binds each OpenMP thread to one CPU of its rank: together, all of them.
        cpus = set()
        for worker in workers:
            status = host.check_output(f"cat /proc/{worker}/task/*/status")
            for listed in re.findall(r"Cpus_allowed_list:\s*(\S+)", status):
                cpus.update(parse_cpulist(listed))
        assert cpus == {cpu for rank in instance["ranks"] for cpu in rank["cpus"]}


def test_the_key_is_in_no_unit_argv_or_podman_inspect(host):
    for instance in summary(host)["plan"]["instances"]:
        name = f"socketwise-{instance['name']}"
        assert KEY not in host.file(f"/etc/systemd/system/{name}.service").content_string
        assert KEY not in host.check_output(f"podman inspect {name}")
        pid = host.check_output(f"podman inspect --format '{{{{.State.Pid}}}}' {name}")
        assert KEY not in host.check_output(f"tr '\\0' ' ' < /proc/{pid}/cmdline")
