"""playbooks/models.yml between the scenario's hosts, after the converge filled them: every box
that loads the checkpoint holds it whole; a corrupted file is found and copied again; a box cut
off from the others in the middle of a copy keeps what it received and resumes from there; a box
whose models filesystem is too small is refused before any byte moves."""

from __future__ import annotations

import ipaddress
import json
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from tests.support.hub_standin import HubStandin

ROOT = Path(__file__).resolve().parents[4]
INVENTORY = Path(os.environ.get("LOBES_MODELS_INVENTORY", "/nonexistent"))
CHECKPOINT = "acme/fill-model"
MODEL_DIR = "/var/lib/lobes/models"
NETWORK = "molecule-models"
ADDRESSES = {"seed": "172.30.40.11", "box-b": "172.30.40.12", "box-c": "172.30.40.13",
             "small": "172.30.40.14"}
LOADS = ["seed", "box-b", "box-c"]
# Slow enough that a copy of the 64 MiB shards takes many seconds, so the cut lands in one.
LINK_RATE = "40mbit"
PLAYBOOK_S = 300
# Hashes every regular file under a directory (path relative to it -> sha256), on the box.
_HASH_SCRIPT = """
import hashlib, json, os, sys
root = sys.argv[1]
found = {}
for where, _dirs, names in os.walk(root):
    for name in names:
        path = os.path.join(where, name)
        digest = hashlib.sha256()
        with open(path, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
        found[os.path.relpath(path, root)] = [os.path.getsize(path), digest.hexdigest()]
print(json.dumps(found))
"""


def locked() -> tuple[str, dict]:
    entry = yaml.safe_load((INVENTORY / "fleet.lock.yml").read_text())["models"][CHECKPOINT]
    return entry["revision"], entry["files"]


def docker(*argv: str, check: bool = True) -> str:
    done = subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0 or not check, f"docker {' '.join(argv)}: {done.stderr}"
    return done.stdout


def on_box(box: str, *argv: str) -> str:
    return docker("exec", f"models-{box}", *argv)


def files_under(box: str, directory: str) -> dict:
    """path -> [size, sha256] of every file under `directory` on the box ({} when absent)."""
    return json.loads(on_box(box, "python3", "-c", _HASH_SCRIPT, directory))


def final_dir(revision: str) -> str:
    return f"{MODEL_DIR}/{CHECKPOINT}/{revision}"


def staging_dir(revision: str) -> str:
    return f"{MODEL_DIR}/.partial/{CHECKPOINT}/{revision}"


def held_whole(box: str) -> bool:
    """The box's final directory holds exactly the lock's files, each of its size and hash."""
    revision, files = locked()
    found = files_under(box, final_dir(revision))
    found.pop(".lobes-manifest.json", None)
    return found == {name: [entry["size"], entry["sha256"]] for name, entry in files.items()}


def playbook(*args: str, as_json: bool = False, wait: bool = True):
    env = {name: value for name, value in os.environ.items() if name != "ANSIBLE_FORCE_COLOR"}
    if as_json:
        env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.posix.json"
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(INVENTORY),
            str(ROOT / "playbooks" / "models.yml"), *args]
    if not wait:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=PLAYBOOK_S, check=False)


def recap(run: subprocess.CompletedProcess, host: str) -> str:
    return next(line for line in run.stdout.splitlines() if line.startswith(f"{host} "))


def pulls(run: subprocess.CompletedProcess, host: str) -> list[dict]:
    """The model_pull results of `host` in a run printed by the JSON callback (the pulls run in
    the background; the task that follows them returns each one's result)."""
    results = []
    # The progress lines the follow task prints come before the callback's one JSON document.
    document = re.search(r"^\{$", run.stdout, re.MULTILINE)
    assert document is not None, run.stdout[-3000:]
    for play in json.loads(run.stdout[document.start():])["plays"]:
        for task in play["tasks"]:
            if "Follow this round's pulls" in task["task"]["name"]:
                results += task["hosts"].get(host, {}).get("results", [])
    return results


def netns(box: str, *argv: str) -> None:
    """Run a host tool (tc, iptables) in the box's network namespace."""
    pid = docker("inspect", "--format", "{{.State.Pid}}", f"models-{box}").strip()
    subprocess.run(["nsenter", "-t", pid, "-n", *argv], check=True, capture_output=True,
                   timeout=30)


@contextmanager
def slow_links(boxes: list[str]) -> Iterator[None]:
    """What `boxes` send is held to LINK_RATE."""
    for box in boxes:
        netns(box, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", LINK_RATE,
              "burst", "64kb", "latency", "500ms")
    try:
        yield
    finally:
        for box in boxes:
            netns(box, "tc", "qdisc", "del", "dev", "eth0", "root")


@contextmanager
def cut_off(box: str, peers: list[str]) -> Iterator[None]:
    """A partition between `box` and `peers` (the controller still reaches every box)."""
    rules = [(chain, flag, ADDRESSES[peer]) for peer in peers
             for chain, flag in (("INPUT", "-s"), ("OUTPUT", "-d"))]
    for chain, flag, address in rules:
        netns(box, "iptables", "-I", chain, flag, address, "-j", "DROP")
    try:
        yield
    finally:
        for chain, flag, address in rules:
            netns(box, "iptables", "-D", chain, flag, address, "-j", "DROP")


def staged_bytes(box: str, revision: str) -> int:
    return sum(size for size, _digest in files_under(box, staging_dir(revision)).values())


def wait_for(condition, message: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.2)


def test_every_box_that_loads_it_holds_it_whole_and_the_small_one_nothing() -> None:
    assert all(held_whole(box) for box in LOADS)
    revision, _files = locked()
    assert not files_under("small", f"{MODEL_DIR}/{CHECKPOINT}")
    assert not files_under("small", staging_dir(revision))


def test_a_corrupted_file_is_found_and_copied_again() -> None:
    revision, _files = locked()
    shard = f"{final_dir(revision)}/model-00002-of-00002.safetensors"
    on_box("box-b", "python3", "-c", "import sys\nwith open(sys.argv[1], 'r+b') as f:\n"
           " f.seek(1 << 20); byte = f.read(1); f.seek(1 << 20); f.write(bytes([byte[0] ^ 255]))",
           shard)
    assert not held_whole("box-b")
    run = playbook()
    assert run.returncode == 0, run.stdout[-4000:]
    assert held_whole("box-b")
    assert "changed=0" not in recap(run, "box-b")
    assert all("changed=0" in recap(run, box) for box in ("seed", "box-c", "small"))


def test_a_box_cut_off_mid_copy_resumes_where_it_stopped() -> None:
    revision, files = locked()
    total = sum(entry["size"] for entry in files.values())
    on_box("box-c", "rm", "-rf", final_dir(revision), staging_dir(revision))
    sources = ["seed", "box-b"]
    with slow_links(sources):
        cut_run = playbook(wait=False)
        try:
            wait_for(lambda: staged_bytes("box-c", revision) > 8 * 1024 * 1024,
                     "box-c's copy never started", 120)
            with cut_off("box-c", sources):
                output = cut_run.communicate(timeout=PLAYBOOK_S)[0]
                received = staged_bytes("box-c", revision)
        finally:
            if cut_run.poll() is None:
                cut_run.kill()
                cut_run.wait()
    assert cut_run.returncode != 0, output[-4000:]
    assert "box-c" in output and 0 < received < total, (received, output[-3000:])
    assert not held_whole("box-c")

    resumed = playbook(as_json=True)
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert held_whole("box-c")
    (pull,) = pulls(resumed, "box-c")
    assert pull["resumed"], pull
    # Only what the cut left out crossed the link again.
    assert pull["bytes_copied"] == total - received, (pull["bytes_copied"], total, received)


def test_a_box_without_room_is_refused_before_any_byte_moves() -> None:
    revision, _files = locked()
    run = playbook("-e", json.dumps(cortex_on()))
    assert run.returncode != 0
    said = run.stdout + run.stderr
    assert f"host small, path {MODEL_DIR}: needs" in said, said[-3000:]
    assert not files_under("small", staging_dir(revision))
    assert not files_under("small", f"{MODEL_DIR}/{CHECKPOINT}")
    assert all(held_whole(box) for box in LOADS)


def cortex_on(revision: str | None = None) -> dict:
    """Every box's cortex on the hub checkpoint (at `revision` when given)."""
    role = {"engine": "vllm-cpu", "checkpoint": CHECKPOINT, "served_name": "fill-model",
            "context": 2048, "max_active": 4}
    return {"fleet_roles": {"cortex": {**role, **({"revision": revision} if revision else {})}}}


@pytest.fixture
def hub() -> Iterator[HubStandin]:
    """The hub stand-in on this machine's address on the scenario's network."""
    subnet = docker("network", "inspect", NETWORK, "--format",
                    "{{(index .IPAM.Config 0).Subnet}}").strip()
    # Docker gives the host the network's first address (the boxes' gateway).
    standin = HubStandin(str(ipaddress.ip_network(subnet)[1])).start()
    yield standin
    standin.stop()


def test_a_pin_moved_to_a_new_revision_comes_from_the_hub_once_and_reaches_every_box(
        hub: HubStandin) -> None:
    """The documented step: the new revision declared, the old entry deleted from the lock."""
    weights = random.Random("new revision").randbytes(3 * 1024 * 1024)
    new = hub.add_commit(CHECKPOINT, {"config.json": b'{"model_type": "llama"}\n',
                                      "model.safetensors": weights})
    lock_file = INVENTORY / "fleet.lock.yml"
    lock = yaml.safe_load(lock_file.read_text())
    del lock["models"][CHECKPOINT]
    lock_file.write_text(yaml.safe_dump(lock))

    # The small box takes it too: 3 MiB fit in its 32 MiB once no headroom is asked.
    run = playbook("-e", json.dumps({**cortex_on(new), "fleet_hub_endpoint": hub.endpoint,
                                     "models_headroom_bytes": 0}))
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert locked()[0] == new
    assert all(held_whole(box) for box in [*LOADS, "small"])
    # The weights left the hub (its CDN) once; the other boxes copied them box to box.
    assert sum(request.bytes_sent for request in hub.log(file="model.safetensors")) == \
        len(weights)


@pytest.fixture(autouse=True, scope="module")
def _scenario() -> None:
    if not (INVENTORY / "fleet.lock.yml").exists():
        pytest.fail("run by the models scenario's verify, after its converge: "
                    f"no lock file in {INVENTORY}")
