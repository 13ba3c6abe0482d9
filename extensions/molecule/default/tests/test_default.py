"""The one-box compose scenario, checked on the box (testinfra over SSH) and from outside it.

Runs in molecule's verify step, after converge, idempotence and check. The compose project
runs on the engine's host; the box drives it with the docker CLI, so container checks run
`docker` on the box. HTTP checks come from this machine to the published gateway. The tests
run in file order: the later ones restart and redeploy what the earlier ones looked at.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import openai
import pytest
import testinfra
import testinfra.utils.ansible_runner
import yaml

ROOT = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
HOST = testinfra.utils.ansible_runner.AnsibleRunner(INVENTORY).get_hosts("all")[0]
DEPLOY = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "lobes-default"
GATEWAY = "http://172.30.20.1:18000"
GEARS = ("vllm-cortex", "vllm-embedder", "vllm-reranker", "vllm-senses")
SERVICES = (*GEARS, "gateway")
KEYS = ("molecule-default-inbound-7f3c9a", "molecule-default-mesh-2b8e41")
VERSION = yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"]


@pytest.fixture(scope="module")
def box():
    return testinfra.get_host(f"ansible://{HOST}?ansible_inventory={INVENTORY}")


def compose(box, *args: str) -> str:
    """docker compose on the box, in the deployed project."""
    command = box.run(" ".join(["docker", "compose", "--project-directory", str(DEPLOY), *args]))
    assert command.rc == 0, command.stderr
    return command.stdout


def containers(box) -> dict:
    """service -> `docker inspect` of its container."""
    ids = compose(box, "ps", "--all", "--quiet").split()
    inspected = json.loads(box.check_output("docker inspect " + " ".join(ids)))
    return {item["Config"]["Labels"]["com.docker.compose.service"]: item for item in inspected}


def health(state: dict) -> dict:
    return {name: item["State"].get("Health", {}).get("Status") for name, item in state.items()}


def wait_healthy(box, services=SERVICES, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        state = containers(box)
        if all(health(state).get(name) == "healthy" for name in services):
            return state
        assert time.monotonic() < deadline, f"not healthy in {timeout} s: {health(state)}"
        time.sleep(1)


def get_json(path: str) -> dict:
    with urllib.request.urlopen(f"{GATEWAY}{path}", timeout=10) as answer:
        return json.loads(answer.read())


def playbook(name: str, *args: str) -> subprocess.CompletedProcess:
    """A collection playbook against molecule's inventory (over SSH), as converge ran site;
    whatever it did, no key is in its output."""
    run = subprocess.run(["ansible-playbook", "-i", INVENTORY, f"lobes.fleet.{name}", *args],
                         capture_output=True, text=True, timeout=600, check=False)
    for key in KEYS:
        assert key not in run.stdout + run.stderr, f"{name} printed a key"
    return run


def client() -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{GATEWAY}/v1", api_key=KEYS[0], max_retries=0, timeout=60)


def chat_answers() -> None:
    """A plain and a streamed chat through the gateway, with the official client."""
    plain = client().chat.completions.create(
        model="main", messages=[{"role": "user", "content": "Say hello."}], max_tokens=16)
    assert plain.choices[0].message.content
    assert plain.model == "sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP"
    chunks = list(client().chat.completions.create(
        model="main", messages=[{"role": "user", "content": "Count."}], max_tokens=16,
        stream=True, stream_options={"include_usage": True}))
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text and chunks[-1].usage.completion_tokens > 0


def test_every_service_is_a_healthy_container_running_the_simulator(box):
    state = wait_healthy(box)
    assert sorted(state) == sorted(SERVICES)
    for name in GEARS:
        assert state[name]["Config"]["Image"] == "lobes/base:bookworm"
        assert "lobes_sim" in state[name]["Args"]
    assert "lobes_gateway" in state["gateway"]["Args"]


def test_health_reports_the_collections_version_and_verify_passes():
    assert get_json("/health")["version"] == VERSION
    verify = playbook("verify")
    assert verify.returncode == 0, verify.stdout[-3000:]


def test_an_openai_chat_plain_and_streamed_is_answered_through_the_gateway():
    chat_answers()
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{GATEWAY}/v1", api_key="wrong", max_retries=0).models.list()


def test_only_the_gateway_is_published_and_reachable_from_outside(box):
    state = containers(box)
    published = {name for name, item in state.items()
                 if any(item["NetworkSettings"]["Ports"].get(port)
                        for port in item["NetworkSettings"]["Ports"])}
    assert published == {"gateway"}
    # The box is another machine on another network: the gateway answers it, no gear does.
    probe = ("import socket, sys; s = socket.socket(); s.settimeout(3); "
             "sys.exit(s.connect_ex((sys.argv[1], int(sys.argv[2]))))")
    assert box.run(f"python3 -c '{probe}' 172.30.20.1 18000").rc == 0
    for name in GEARS:
        for network in state[name]["NetworkSettings"]["Networks"].values():
            assert box.run(f"python3 -c '{probe}' {network['IPAddress']} 8000").rc != 0, name


def test_env_is_private_and_no_key_is_in_a_log(box):
    env = box.file(str(DEPLOY / ".env"))
    assert env.mode == 0o600 and all(key in env.content_string for key in KEYS)
    logs = box.check_output(f"cat {DEPLOY}/state/log/*.log")
    assert "lobes logwrap" in logs
    for name in SERVICES:
        logs += compose(box, "logs", "--no-color", name)
    for key in KEYS:
        assert key not in logs


def test_a_crashed_gear_and_gateway_restart_and_their_logs_persist(box):
    before = containers(box)
    for name in ("vllm-cortex", "gateway"):
        # A crash of the service process (logwrap then exits with its status), not a stop:
        # `docker kill` would count as stopped by hand, which a restart policy respects.
        target = "lobes_sim" if name != "gateway" else "lobes_gateway"
        compose(box, "exec", "--user", "root", name, "pkill", "-KILL", "-f",
                f"'^python3 -m {target}'")
    after = wait_healthy(box)
    for name in ("vllm-cortex", "gateway"):
        assert after[name]["Id"] == before[name]["Id"]
        assert after[name]["RestartCount"] == before[name]["RestartCount"] + 1
    log = box.file(str(DEPLOY / "state" / "log" / "vllm-cortex.log")).content_string
    assert log.count("started: ") >= 2 and "exited with status -9" in log
    chat_answers()


def test_logs_outlive_a_recreated_container(box):
    marks = box.file(str(DEPLOY / "state" / "log" / "gateway.log")).content_string.count("started")
    compose(box, "up", "--detach", "--wait", "--force-recreate", "--no-deps", "gateway")
    log = box.file(str(DEPLOY / "state" / "log" / "gateway.log")).content_string
    assert log.count("started") == marks + 1


def test_an_env_change_recreates_only_the_gateway(box):
    before = containers(box)
    tuning = json.dumps({"fleet_gateway_tuning": {"LOBES_SWAP_DEGRADED_THRESHOLD": 75}})
    changed = playbook("site", "-e", tuning)
    assert changed.returncode == 0, changed.stdout[-3000:]
    after = wait_healthy(box)
    assert after["gateway"]["Id"] != before["gateway"]["Id"]
    assert {name: after[name]["Id"] for name in GEARS} == {
        name: before[name]["Id"] for name in GEARS}
    assert "LOBES_SWAP_DEGRADED_THRESHOLD=75" in box.file(str(DEPLOY / ".env")).content_string


def starts(box, service: str) -> int:
    """How many times the service's container has started (logwrap marks each start)."""
    return box.file(str(DEPLOY / "state" / "log" / f"{service}.log")).content_string.count(
        "started: ")


def test_a_change_whose_gears_fail_to_start_restores_the_files_and_containers_that_ran(
        box, tmp_path):
    """From a stopped project, a change of .env and a simulator that exits at start: cortex,
    first in the start order, never becomes healthy, so the gears after it never start; the
    rollback then restores the files and source and runs every container of them."""
    env_before = box.file(str(DEPLOY / ".env")).content_string
    compose(box, "down", "--timeout", "5")
    before = {name: starts(box, name) for name in GEARS}
    broken = tmp_path / "gateway"
    shutil.copytree(ROOT / "gateway", broken, ignore=shutil.ignore_patterns("__pycache__"))
    (broken / "lobes_sim" / "__main__.py").write_text("raise SystemExit('no simulator')\n")
    failing = json.dumps({"fleet_gateway_tuning": {"LOBES_SWAP_DEGRADED_THRESHOLD": 80},
                          "fleet_compose_wait_timeout": 20, "verify_timeout": 10,
                          "gateway_source_dir": str(broken)})
    failed = playbook("site", "-e", failing)
    assert failed.returncode != 0
    # The callback may wrap the message: compare its words.
    words = " ".join((failed.stdout + failed.stderr).split())
    assert "gateway source were restored and restarted" in words
    # Why, from the gear's own log (lobes.fleet.compose_failures), masked as any log quote.
    said = words[words.find("failed during rollout"):]
    assert "vllm-cortex: " in said and "no simulator" in said, said
    wait_healthy(box)
    after = {name: starts(box, name) - before[name] for name in GEARS}
    # cortex: its failed starts, then the rollback's; the gears after it in the chain: the
    # rollback's only.
    assert after["vllm-cortex"] >= 2, after
    assert after["vllm-senses"] == after["vllm-embedder"] == after["vllm-reranker"] == 1, after
    assert box.file(str(DEPLOY / ".env")).content_string == env_before
    chat_answers()


def test_a_port_another_container_publishes_is_refused_by_preflight_naming_it(box):
    """The gateway moved to a port a stranger's container publishes: preflight names the
    container, and nothing of the box changes (the plan's own port, held by the project's
    gateway, passed preflight in every run before this one)."""
    box.run("docker rm --force lobes-stranger")
    started = box.run("docker run --detach --name lobes-stranger --publish "
                      "172.30.20.1:18001:8000 lobes/base:bookworm python3 -m http.server 8000")
    assert started.rc == 0, started.stderr
    try:
        moved = json.dumps({"fleet_gateway_port": 18001, "fleet_origin": "http://172.30.20.1:18001",
                            "fleet_verify_url": "http://172.30.20.1:18001"})
        refused = playbook("site", "-e", moved)
    finally:
        box.run("docker rm --force lobes-stranger")
    words = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode != 0
    assert ("port 18001 (gateway) is held by container lobes-stranger, not by this deployment"
            in words), words[-3000:]
    assert get_json("/health")["version"] == VERSION


def test_down_removes_the_containers_and_networks(box):
    down = playbook("down")
    assert down.returncode == 0, down.stdout[-3000:]
    assert compose(box, "ps", "--all", "--quiet").split() == []
    project = DEPLOY.name
    assert box.check_output(
        f"docker network ls --quiet --filter label=com.docker.compose.project={project}") == ""
