"""playbooks/models.yml on boxes of this machine, against the hub stand-in: a checkpoint fetched
once and locked, then copied box to box over real SSH (an sshd per box); a second run that moves
nothing; a corrupted copy repaired from another box; a box without room refused before any byte
moves; unplanned revisions pruned only when asked, never one a running process uses; a slowed
copy watched mid-way through its progress file, the play's lines and status.yml."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from ansible_collections.lobes.fleet.plugins.module_utils.model_progress import Progress, figures

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


def test_prune_removes_unplanned_revisions_only_when_asked_and_never_one_in_use(hub, tmp_path):
    commit = hub.add_commit(REPO, FILES, lfs={"model.safetensors"})
    boxes = Boxes(tmp_path, ["alpha"], hub.endpoint)
    assert boxes.playbook().returncode == 0
    root = boxes.model_dirs["alpha"]
    old, staged, used = (root / REPO / ("1" * 40), root / ".partial" / "acme" / "gone" / ("2" * 40),
                         root / "acme" / "gone" / ("3" * 40))
    outside = tmp_path / "outside" / ("4" * 40)
    for directory in (old, staged, used, outside):
        directory.mkdir(parents=True)
        (directory / "model.safetensors").write_bytes(b"w" * 64)
    (root / "acme" / "linked").symlink_to(outside.parent)  # a checkpoint that leads outside
    gear = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)",
                             "--model", str(used)])
    try:
        told = boxes.playbook()
        assert told.returncode == 0, told.stdout[-3000:]
        assert f"alpha: unplanned, a prune (fleet_models_prune) would remove {old}" in told.stdout
        assert f"would remove {staged}" in told.stdout
        assert f"alpha: unplanned but in use by a running gear, kept: {used}" in told.stdout
        assert "changed=0" in recap(told, "alpha") and old.is_dir() and staged.is_dir()

        checked = boxes.playbook("-e", "fleet_models_prune=true", "--check", "--diff")
        assert checked.returncode == 0, checked.stdout[-3000:]
        assert "changed=1" in recap(checked, "alpha") and old.is_dir() and staged.is_dir()
        assert f"-{old}" in checked.stdout

        pruned = boxes.playbook("-e", "fleet_models_prune=true")
        assert pruned.returncode == 0, pruned.stdout[-3000:]
        assert f"alpha: removed {old}" in pruned.stdout
        assert not old.exists() and not staged.exists() and not staged.parent.exists()
        assert used.is_dir() and (outside / "model.safetensors").is_file()
        assert {p.name for p in boxes.revision_dir("alpha", commit).iterdir()} >= set(FILES)

        again = boxes.playbook("-e", "fleet_models_prune=true")
        assert again.returncode == 0 and "changed=0" in recap(again, "alpha")
    finally:
        gear.kill()
        gear.wait()
    freed = boxes.playbook("-e", "fleet_models_prune=true")
    assert freed.returncode == 0 and not used.exists()


BIG = {"config.json": b'{"model_type": "tiny"}\n', "model.safetensors": bytes(range(256)) * 8192}


def slow_python(path: Path, bytes_per_tick: int) -> Path:
    """A Python that runs the model server and relays its output slowly: a slow link."""
    path.write_text(
        f"#!{sys.executable}\n"
        "import subprocess, sys, time\n"
        f"proc = subprocess.Popen([{sys.executable!r}, *sys.argv[1:]], stdout=subprocess.PIPE)\n"
        f"while chunk := proc.stdout.read({bytes_per_tick}):\n"
        "    sys.stdout.buffer.write(chunk)\n"
        "    sys.stdout.buffer.flush()\n"
        "    time.sleep(0.05)\n"
        "sys.exit(proc.wait())\n")
    path.chmod(0o755)
    return path


def status(boxes: Boxes, *args: str) -> subprocess.CompletedProcess:
    """status.yml's copies play alone (the gateways it reads first are not running here)."""
    return subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(boxes.inventory),
         str(ROOT / "playbooks" / "status.yml"), "--start-at-task", "Read the box's copy progress",
         *args], cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=120,
        check=False)


def test_a_slow_copy_shows_bytes_rate_and_time_left_while_it_runs_and_none_once_whole(
        hub, sshds, tmp_path):
    commit = hub.add_commit(REPO, BIG, lfs={"model.safetensors"})
    boxes = Boxes(tmp_path, ["alpha", "beta"], hub.endpoint, sshds)
    alpha_vars = boxes.inventory / "host_vars" / "alpha.yml"
    values = yaml.safe_load(alpha_vars.read_text())
    # beta copies from alpha at about 160 KiB/s: some 13 s for the 2 MiB of weights.
    values["models_serve_python"] = str(slow_python(tmp_path / "slow-python", 8192))
    alpha_vars.write_text(yaml.safe_dump(values))
    hub.faults.delay["model.safetensors"] = 0.02  # alpha's fetch from the hub: some 10 s
    progress = boxes.model_dirs["beta"] / ".progress" / f"acme__tiny-chat@{commit}.json"
    play = subprocess.Popen(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(boxes.inventory),
         str(ROOT / "playbooks" / "models.yml")],
        cwd=ROOT, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    readings = []
    try:
        while play.poll() is None:
            if progress.exists():
                with contextlib.suppress(FileNotFoundError):  # whole between the two calls
                    record = json.loads(progress.read_text())
                    if not readings or record["bytes_done"] != readings[-1]["bytes_done"]:
                        readings.append(record)
            time.sleep(0.2)
        out = play.stdout.read()
    finally:
        play.kill()
        play.wait()
    assert play.returncode == 0, out[-4000:]
    total = sum(map(len, BIG.values()))
    assert len(readings) >= 3, readings
    done = [record["bytes_done"] for record in readings]
    # The last rewrite may count every byte: the file goes only once the revision is verified.
    assert done == sorted(done) and done[0] < done[-1] <= total
    assert all(record["bytes_total"] == total and record["source"] == "127.0.0.1"
               for record in readings)
    last_short = [record for record in readings if record["bytes_done"] < total][-1]
    moving = figures(last_short, now=last_short["updated"], stall_after=60)
    assert moving and moving.rate > 0 and moving.seconds_left > 0
    # The play said, while alpha fetched and beta copied, how far each was.
    assert re.search(rf"alpha: acme/tiny-chat@\w+ from {re.escape(hub.endpoint)}: [\d.]+ MiB "
                     r"of 2\.0 MiB, [\d.]+ MiB/s, \d+ s left", out), out[-4000:]
    assert re.search(r"beta: acme/tiny-chat@\w+ from 127\.0\.0\.1: [\d.]+ MiB of 2\.0 MiB, "
                     r"[\d.]+ MiB/s, \d+ s left", out), out[-4000:]
    assert not progress.exists()
    shown = status(boxes)
    assert shown.returncode == 0, shown.stdout[-3000:]
    assert "beta: no checkpoint copy under way" in shown.stdout

    # A copy cut midway leaves its file: status.yml shows it stalled, with its figures.
    cut = Progress(str(boxes.model_dirs["beta"]), "acme/other", "5" * 40, total=4 << 20,
                   done=1 << 20, source="alpha", clock=lambda: time.time() - 600)
    cut.write()
    stalled = status(boxes)
    assert re.search(r"beta: copying acme/other@5{12} from alpha: 1\.0 MiB of 4\.0 MiB, "
                     r"0\.00 MiB/s, time left unknown; STALLED, no bytes for \d+ s",
                     stalled.stdout), stalled.stdout[-3000:]
