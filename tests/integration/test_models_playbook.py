"""playbooks/models.yml on boxes of this machine, against the hub stand-in: a checkpoint fetched
once and locked, then copied box to box over real SSH (an sshd per box); a second run that moves
nothing; a corrupted copy repaired from another box; a box without room refused before any byte
moves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.hub_standin import HubStandin
from tests.support.ports import free_block
from tests.support.sshd import Sshd, require_openssh

from .conftest import ROOT, VENV_BIN, ansible_env

REPO = "acme/tiny-chat"
FILES = {
    "config.json": b'{"model_type": "tiny"}\n',
    "tokenizer.json": b'{"vocab": ["a", "b"]}\n' * 40,
    "model.safetensors": bytes(range(256)) * 4096,  # 1 MiB, an LFS file
}


def box_vars(port: int, model_dir: Path, endpoint: str) -> dict:
    """A box whose cortex runs vLLM's CPU build on a hub checkpoint (nothing is started)."""
    return {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "fleet_hardware": "sim", "fleet_runtime": "process",
            "fleet_gateway_host": "127.0.0.1", "fleet_gateway_port": port,
            "fleet_origin": f"http://127.0.0.1:{port}", "fleet_gear_port_base": port + 1,
            "fleet_python": sys.executable, "fleet_model_dir": str(model_dir),
            "fleet_hub_endpoint": endpoint,
            "fleet_roles": {"cortex": {"engine": "vllm-cpu", "checkpoint": REPO,
                                       "served_name": "tiny-chat", "context": 2048,
                                       "max_active": 4}}}


class Boxes:
    """An inventory of boxes on this machine, each with a models directory of its own."""

    def __init__(self, tmp_path: Path, hosts: list[str], endpoint: str,
                 sshds: dict[str, Sshd] | None = None) -> None:
        self.inventory = tmp_path / "inventory"
        (self.inventory / "host_vars").mkdir(parents=True)
        self.model_dirs = {host: tmp_path / "models" / host for host in hosts}
        (self.inventory / "hosts.yml").write_text(yaml.safe_dump(
            {"sim": {"hosts": {host: None for host in hosts}}}))
        for host in hosts:
            port = free_block(13)
            values = box_vars(port, self.model_dirs[host], endpoint)
            values["fleet_deploy_dir"] = str(tmp_path / "deploy" / host)
            if sshds:  # the box's own sshd: where the others copy from
                values["fleet_copy_ssh_port"] = sshds[host].port
                values["models_authorized_keys"] = str(sshds[host].authorized_keys)
            (self.inventory / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(values))
        self.lock_file = self.inventory / "fleet.lock.yml"

    def playbook(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(VENV_BIN / "ansible-playbook"), "-i", str(self.inventory),
             str(ROOT / "playbooks" / "models.yml"), *args],
            cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=300,
            check=False)

    def revision_dir(self, host: str, commit: str) -> Path:
        return self.model_dirs[host] / REPO / commit


@pytest.fixture
def hub():
    standin = HubStandin().start()
    yield standin
    standin.stop()


def recap(run: subprocess.CompletedProcess, host: str) -> str:
    return next(line for line in run.stdout.splitlines() if line.startswith(f"{host} "))


def test_a_checkpoint_is_fetched_once_locked_and_then_left_alone(hub, tmp_path):
    commit = hub.add_commit(REPO, FILES, lfs={"model.safetensors"})
    boxes = Boxes(tmp_path, ["alpha"], hub.endpoint)
    first = boxes.playbook()
    assert first.returncode == 0, first.stdout[-3000:]
    final = boxes.revision_dir("alpha", commit)
    assert {p.name: p.read_bytes() for p in final.iterdir() if p.name in FILES} == FILES
    lock = yaml.safe_load(boxes.lock_file.read_text())
    assert lock["models"][REPO]["revision"] == commit
    assert set(lock["models"][REPO]["files"]) == set(FILES)
    assert_not_an_inventory_source(boxes.inventory)
    fetched = len(hub.log())
    second = boxes.playbook()
    assert second.returncode == 0, second.stdout[-3000:]
    assert "changed=0" in recap(second, "alpha")
    # Locked and whole on the box: the hub is not asked again.
    assert len(hub.log()) == fetched


def assert_not_an_inventory_source(inventory: Path) -> None:
    """The lock file in the inventory's directory is not read as inventory (Ansible would make
    a group of each top-level key, `models`, `images`, and warn on every run)."""
    listed = subprocess.run([str(VENV_BIN / "ansible-inventory"), "-i", str(inventory), "--list"],
                            cwd=ROOT, env=ansible_env(), capture_output=True, text=True,
                            timeout=60, check=True)
    groups = set(json.loads(listed.stdout)["all"]["children"])
    assert not groups & {"models", "images", "version"}, groups
    assert "WARNING" not in listed.stderr, listed.stderr


def test_check_mode_says_what_would_move_and_moves_nothing(hub, tmp_path):
    hub.add_commit(REPO, FILES, lfs={"model.safetensors"})
    boxes = Boxes(tmp_path, ["alpha"], hub.endpoint)
    run = boxes.playbook("--check", "--diff")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "changed=1" in recap(run, "alpha")
    assert not boxes.model_dirs["alpha"].exists() and not boxes.lock_file.exists()
    assert not hub.log(file="model.safetensors")


def test_a_box_without_room_is_refused_before_any_byte_moves(hub, tmp_path):
    hub.add_commit(REPO, FILES, lfs={"model.safetensors"})
    boxes = Boxes(tmp_path, ["alpha"], hub.endpoint)
    # More headroom than any disk has free: the preflight must refuse the box.
    run = boxes.playbook("-e", "models_headroom_bytes=1125899906842624")
    assert run.returncode != 0
    model_dir = boxes.model_dirs["alpha"]
    assert f"host alpha, path {model_dir}: needs" in run.stdout
    assert "is free; free" in run.stdout
    assert not hub.log(file="model.safetensors") and not boxes.lock_file.exists()


HOSTS = ["alpha", "beta", "gamma"]


def weights_sent(hub: HubStandin) -> int:
    """Bytes of the weights the hub (and its CDN) sent, over every request."""
    return sum(request.bytes_sent for request in hub.log(file="model.safetensors"))


@pytest.fixture
def sshds(tmp_path):
    require_openssh()
    servers = {host: Sshd(tmp_path / "sshd" / host).start() for host in HOSTS}
    yield servers
    for server in servers.values():
        server.stop()


def test_three_boxes_get_one_download_box_to_box_and_a_corrupt_copy_is_repaired(
        hub, sshds, tmp_path):
    commit = hub.add_commit(REPO, FILES, lfs={"model.safetensors"})
    boxes = Boxes(tmp_path, HOSTS, hub.endpoint, sshds)
    first = boxes.playbook()
    assert first.returncode == 0, first.stdout[-4000:]
    for host in HOSTS:
        final = boxes.revision_dir(host, commit)
        assert {name: (final / name).read_bytes() for name in FILES} == FILES, host
    # One download from the hub: the weights left it once; alpha, the first box, fetched them
    # and beta and gamma copied them from a box that held them (beta in the first round).
    assert weights_sent(hub) == len(FILES["model.safetensors"])
    assert sshds["alpha"].connections() > 0 and sshds["gamma"].connections() == 0
    logins = {host: server.connections() for host, server in sshds.items()}

    second = boxes.playbook()
    assert second.returncode == 0, second.stdout[-4000:]
    assert all("changed=0" in recap(second, host) for host in HOSTS), second.stdout[-2000:]
    assert {host: server.connections() for host, server in sshds.items()} == logins
    assert weights_sent(hub) == len(FILES["model.safetensors"])

    weights = boxes.revision_dir("gamma", commit) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[4096] ^= 0xFF
    weights.write_bytes(bytes(data))
    third = boxes.playbook()
    assert third.returncode == 0, third.stdout[-4000:]
    assert weights.read_bytes() == FILES["model.safetensors"]
    assert "changed=0" in recap(third, "alpha") and "changed=0" not in recap(third, "gamma")
    assert weights_sent(hub) == len(FILES["model.safetensors"])
