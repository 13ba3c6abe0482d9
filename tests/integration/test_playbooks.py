"""The playbooks against a copy of inventories/local: the whole life of the embedded default.

One deployment walks every step the operator does, in order (each step depends on the one
before, so they live in one test): --check on a clean state directory (writes nothing),
site.yml, a chat request through the gateway, a second run with changed=0, --check --diff on
a changed inventory (a diff, no change), a change that fails verify (rolled back to the
previous files), verify.yml, status.yml, down.yml. Ports and the state directory are the
test's own, never :8000.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from tests.support.client import chat
from tests.support.ports import free_block

from .conftest import GATEWAY_SRC, ROOT, VENV_BIN, ansible_env, supervisor

# The catalog has 11 roles; gears take port_base + catalog index.
GEAR_PORT_SPAN = 12


class LocalMesh:
    """A copy of inventories/local on the test's own ports and state directory."""

    def __init__(self, tmp_path: Path) -> None:
        self.inventory = tmp_path / "inventory"
        shutil.copytree(ROOT / "inventories" / "local", self.inventory)
        self.deploy_dir = tmp_path / "deploy"
        # The gateway's port right below its gears' block.
        block = free_block(GEAR_PORT_SPAN + 1)
        self.port, self.gear_port_base = block, block + 1
        self.host_vars = self.inventory / "host_vars" / "localhost.yml"
        self.edit(
            fleet_gateway_port=self.port,
            fleet_origin=f"http://127.0.0.1:{self.port}",
            fleet_deploy_dir=str(self.deploy_dir),
            fleet_gear_port_base=self.gear_port_base,
        )

    def edit(self, **changes: object) -> None:
        values = yaml.safe_load(self.host_vars.read_text())
        values.update(changes)
        self.host_vars.write_text(yaml.safe_dump(values, sort_keys=False))

    def edit_role(self, role: str, **changes: object) -> None:
        values = yaml.safe_load(self.host_vars.read_text())
        values["fleet_roles"][role].update(changes)
        self.host_vars.write_text(yaml.safe_dump(values, sort_keys=False))

    def playbook(self, name: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                str(VENV_BIN / "ansible-playbook"),
                "-i",
                str(self.inventory),
                str(ROOT / "playbooks" / name),
                *args,
            ],
            cwd=ROOT,
            env=ansible_env(),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
            return json.loads(r.read())

    def chat(self, model: str) -> dict:
        """One chat completion for `model` through the deployed gateway; its JSON answer."""
        reply = chat(f"http://127.0.0.1:{self.port}", {"model": model}, timeout=60)
        assert reply.status == 200, reply.body
        return reply.json()

    def processes(self) -> dict[str, int]:
        rows = supervisor(self.deploy_dir / "state", "status")["status"]
        return {row["name"]: row["child_pid"] for row in rows if row["running"]}

    def rendered(self) -> dict[str, str]:
        return {name: (self.deploy_dir / name).read_text() for name in (".env", "services.json")}


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _recap(result: subprocess.CompletedProcess) -> dict[str, int]:
    match = re.search(r"localhost\s+:\s+(.*)", result.stdout.split("PLAY RECAP")[-1])
    assert match, result.stdout[-3000:] + result.stderr[-3000:]
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(1))}


def _ok(result: subprocess.CompletedProcess) -> dict[str, int]:
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return _recap(result)


@pytest.mark.slow
def test_local_default_lifecycle(mesh: LocalMesh) -> None:
    # 0. --check on a machine never deployed: it plans, and writes and starts nothing.
    assert _ok(mesh.playbook("site.yml", "--check", "--diff"))["changed"] > 0
    assert not mesh.deploy_dir.exists()

    # 1. site.yml on a clean machine leaves a gateway that answers an OpenAI chat request.
    first = _ok(mesh.playbook("site.yml"))
    assert first["changed"] > 0
    health = mesh.get("/health")
    assert health["version"] == yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"]
    reply = mesh.chat("main")
    assert reply["object"] == "chat.completion"
    assert reply["model"] == "sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP"
    assert reply["choices"][0]["message"]["content"]
    assert (mesh.deploy_dir / ".env").stat().st_mode & 0o777 == 0o600
    deployed = mesh.deploy_dir / "gateway" / "lobes_gateway" / "__init__.py"
    assert deployed.read_text() == (GATEWAY_SRC / "lobes_gateway" / "__init__.py").read_text()
    running = mesh.processes()
    assert set(running) == {
        "gateway",
        "gear-cortex",
        "gear-senses",
        "gear-embedder",
        "gear-reranker",
    }

    # 2. A second run changes nothing and restarts nothing.
    assert _ok(mesh.playbook("site.yml"))["changed"] == 0
    assert mesh.processes() == running

    # 3. --check --diff on a changed inventory shows the diff and changes nothing.
    before = mesh.rendered()
    mesh.edit_role("senses", context=16384)
    check = mesh.playbook("site.yml", "--check", "--diff")
    assert _ok(check)["changed"] > 0
    assert "-MULTIMODAL_MAX_MODEL_LEN=32768" in check.stdout
    assert "+MULTIMODAL_MAX_MODEL_LEN=16384" in check.stdout
    assert mesh.rendered() == before
    assert mesh.processes() == running
    assert mesh.get("/capabilities")["roles"]["senses"]["context"] == 32768

    # 4. A change whose gears exit as they start fails the rollout at once, quoting the gear's
    # log, and is rolled back to the files and source that ran before.
    mesh.edit_role("senses", context=16384)
    broken_sim = mesh.deploy_dir.parent / "broken-sim"
    shutil.copytree(GATEWAY_SRC, broken_sim, ignore=shutil.ignore_patterns("__pycache__"))
    (broken_sim / "lobes_sim" / "__main__.py").write_text("raise SystemExit('no simulator')\n")
    failed = mesh.playbook("site.yml", "-e", f"gateway_source_dir={broken_sim}")
    assert failed.returncode != 0
    assert _recap(failed)["rescued"] == 1
    assert "service 'gear-cortex' exited with 1 before it became healthy" in failed.stdout
    assert "no simulator" in failed.stdout
    assert "gateway source were restored and restarted" in failed.stdout
    assert mesh.rendered() == before
    mesh.edit_role("senses", context=32768)
    assert _ok(mesh.playbook("verify.yml", "-e", "verify_timeout=60"))["changed"] == 0
    assert mesh.chat("multimodal")["model"] == "coolthor/gemma-4-12B-it-NVFP4A16"
    # The rollback restarted every gear (their source changed twice): cortex counts anew.
    assert mesh.chat("main")["model"] == "sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP"

    # 4b. A gateway source that fails the verify gate is rolled back too: the source that ran
    # before is put back and its gateway runs again.
    deployed = mesh.deploy_dir / "gateway" / "lobes_gateway" / "__main__.py"
    good = deployed.read_text()
    broken = mesh.deploy_dir.parent / "broken-gateway"
    shutil.copytree(GATEWAY_SRC, broken, ignore=shutil.ignore_patterns("__pycache__"))
    (broken / "lobes_gateway" / "__main__.py").write_text("raise SystemExit('broken build')\n")
    failed = mesh.playbook("site.yml", "-e", f"gateway_source_dir={broken}",
                           "-e", "verify_timeout=10")
    assert failed.returncode != 0 and _recap(failed)["rescued"] == 1
    assert "gateway source were restored and restarted" in failed.stdout
    assert deployed.read_text() == good
    assert _ok(mesh.playbook("verify.yml", "-e", "verify_timeout=60"))["changed"] == 0
    assert _ok(mesh.playbook("site.yml"))["changed"] == 0

    # 5. status.yml: one row per role, served here and ready; the box's pressure and tokens;
    # the picture of the mesh.
    pictures = mesh.deploy_dir.parent / "mesh-status"
    status = mesh.playbook("status.yml", "-e", f"fleet_status_dir={pictures}")
    _ok(status)
    assert re.search(r"localhost: pressure warm \(swap [\d.]+ %, iowait [\d.]+ %, MemAvailable "
                     r"[\d.]+ %, PSI [-\d.]+\); tokens: cortex \d+ prompt / [1-9]\d* generated",
                     status.stdout), status.stdout
    assert '"localhost" [label="localhost (sim)\\nserves: cortex, embedder, reranker, senses' \
        in (pictures / "mesh.dot").read_text()
    if shutil.which("dot"):
        assert "<svg" in (pictures / "mesh.svg").read_text()
        assert (pictures / "mesh.png").read_bytes()[:4] == b"\x89PNG"
    for role, context in (
        ("cortex", 131072),
        ("senses", 32768),
        ("embedder", 8192),
        ("reranker", 8192),
    ):
        assert re.search(rf"localhost\s+{role}\s+here\s+yes\s+{context}\s+\d+", status.stdout)
    # Each box's memory against its gears' declared shares (a sim box: a Spark's 0.30 + 0.14 +
    # 0.06 + 0.06 of 128 GiB), every gear running.
    assert re.search(r"localhost: [\d.]+ of [\d.]+ GiB available \(page cache [\d.]+, swap free "
                     r"[\d.]+\); gears' shares 71\.7 GiB: gear-cortex 38\.4 running, gear-senses "
                     r"17\.9 running", status.stdout), status.stdout

    # 6. down.yml stops everything: no process left, the port closed; a re-run changes nothing.
    pids = mesh.processes()
    assert _ok(mesh.playbook("down.yml"))["changed"] > 0
    assert mesh.processes() == {}
    assert not any(_alive(pid) for pid in pids.values())
    with pytest.raises(OSError):
        mesh.get("/health")
    assert _ok(mesh.playbook("down.yml"))["changed"] == 0


@pytest.mark.slow
def test_no_key_in_any_ansible_output_or_log_even_at_vvv(mesh: LocalMesh) -> None:
    """Keys reach the box's .env (mode 0600) and nothing else: not the output of site.yml,
    verify.yml, status.yml or down.yml at -vvv, not a log, pidfile or other file of the box."""
    keys = {"fleet_gateway_api_key": f"inbound-{uuid.uuid4().hex}",
            "fleet_mesh_key": f"mesh-{uuid.uuid4().hex}"}
    mesh.edit(**keys)
    outputs = [mesh.playbook(name, "-vvv") for name in ("site.yml", "verify.yml", "status.yml")]
    for result in outputs:
        _ok(result)
    files = {path: path.read_bytes() for path in mesh.deploy_dir.rglob("*")
             if path.is_file() and path.name != ".env"}
    outputs.append(mesh.playbook("down.yml", "-vvv"))
    text = "".join(result.stdout + result.stderr for result in outputs)
    for key in keys.values():
        assert key not in text
        assert [str(path) for path, data in files.items() if key.encode() in data] == []
        assert key in (mesh.deploy_dir / ".env").read_text()
