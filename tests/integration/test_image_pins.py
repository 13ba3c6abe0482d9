"""Engine images pinned by digest, on a real Docker engine (scripts/engine.sh) and a registry of
the test's own on 127.0.0.1 (Debian's docker-registry, scripts/tools.sh).

A simulator image built here is pushed under a tag and its local copy removed, so the deploy
pulls it by tag and Docker records the registry's digest: the first site.yml locks that digest
and renders repository@digest, a second run changes nothing, verify passes; then a second build
pushed under the same tag runs in the gear's container, and verify names host, role, the locked
digest and the one running.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from ansible_collections.lobes.fleet.plugins.module_utils.models import read_lock_file

from tests.support.ports import free_block

from .conftest import ROOT, VENV_BIN, ansible_env, run
from .test_playbooks import GEAR_PORT_SPAN, _ok, _recap

BASE_IMAGE = "lobes/base:bookworm"  # scripts/engine.sh builds it
GEAR = "vllm-embedder"


def push_build(ref: str, build: str, context: Path) -> str:
    """Build an image of its own (a label tells the builds apart), push it under `ref`, remove
    the local copy; the digest the registry gave it."""
    context.mkdir(parents=True, exist_ok=True)
    (context / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nLABEL lobes.test.build={build}\n")
    run("docker", "build", "-q", "-t", ref, str(context))
    run("docker", "push", ref)
    name = ref.rsplit(":", 1)[0]
    held = json.loads(run("docker", "image", "inspect", "--format", "{{json .RepoDigests}}", ref))
    [digest] = [entry.split("@", 1)[1] for entry in held if entry.startswith(name + "@")]
    run("docker", "rmi", ref)
    return digest


class ComposeBox:
    """This machine as one compose box whose simulated gear runs an image pulled by tag."""

    def __init__(self, tmp_path: Path, image: str) -> None:
        self.inventory = tmp_path / "inventory"
        (self.inventory / "host_vars").mkdir(parents=True)
        (self.inventory / "hosts.yml").write_text("all:\n  hosts:\n    localhost:\n")
        # The compose project is named after the directory: one of its own on a shared engine.
        self.deploy_dir = tmp_path / f"lobes-img-{uuid.uuid4().hex[:8]}"
        block = free_block(GEAR_PORT_SPAN + 1)
        self.port = block
        (self.inventory / "host_vars" / "localhost.yml").write_text(yaml.safe_dump({
            "ansible_connection": "local",
            "ansible_python_interpreter": "{{ ansible_playbook_python }}",
            "fleet_python": "{{ ansible_playbook_python }}",
            "fleet_hardware": "sim", "fleet_runtime": "compose",
            "fleet_gateway_host": "127.0.0.1", "fleet_gateway_port": block,
            "fleet_origin": f"http://127.0.0.1:{block}", "fleet_gear_port_base": block + 1,
            "fleet_deploy_dir": str(self.deploy_dir),
            "fleet_gateway_image": BASE_IMAGE, "fleet_sim_image": image,
            "fleet_sim_time_scale": 10.0, "fleet_compose_wait_timeout": 120,
            "fleet_roles": {"embedder": {}},
        }, sort_keys=False))
        self.lock_file = self.inventory / "fleet.lock.yml"

    def playbook(self, name: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(VENV_BIN / "ansible-playbook"), "-i", str(self.inventory),
             str(ROOT / "playbooks" / name)],
            cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=600,
            check=False)

    def gear_image(self) -> str:
        compose = yaml.safe_load((self.deploy_dir / "compose.yaml").read_text())
        return compose["services"][GEAR]["image"]

    def compose(self, *args: str) -> str:
        return run("docker", "compose", "--project-directory", str(self.deploy_dir), *args)


@pytest.mark.slow
def test_a_tag_is_locked_on_first_deploy_run_by_digest_and_a_skew_fails_verify(
        tmp_path: Path, registry: str) -> None:
    name = f"{registry}/lobes-test/sim-{uuid.uuid4().hex[:8]}"
    ref = f"{name}:v1"
    first_digest = push_build(ref, "1", tmp_path / "build-1")
    box = ComposeBox(tmp_path, ref)
    pulled = [f"{name}@{first_digest}"]
    try:
        # 1. The first deploy pulls the tag, locks the digest the box got, runs it by digest.
        first = _ok(box.playbook("site.yml"))
        assert first["changed"] > 0
        assert read_lock_file(str(box.lock_file)).images == ((ref, first_digest),)
        assert box.gear_image() == f"{name}@{first_digest}"
        lock_text = box.lock_file.read_text()

        # 2. A second run changes nothing, the lock included, and still renders the digest.
        second = _ok(box.playbook("site.yml"))
        assert second["changed"] == 0, second
        assert box.lock_file.read_text() == lock_text
        assert box.gear_image() == f"{name}@{first_digest}"
        _ok(box.playbook("verify.yml"))

        # 3. Another build under the same tag, run in the gear's container (the tag pulled
        # again by hand): verify names host, role, the locked digest and the one running.
        second_digest = push_build(ref, "2", tmp_path / "build-2")
        assert second_digest != first_digest
        pulled.append(f"{name}@{second_digest}")
        project = box.deploy_dir / "compose.yaml"
        project.write_text(project.read_text().replace(f"{name}@{first_digest}", ref))
        box.compose("up", "-d", "--pull", "always", "--no-deps", GEAR)
        skewed = box.playbook("verify.yml")
        assert skewed.returncode != 0
        assert _recap(skewed)["failed"] == 1
        assert (f"host localhost, role embedder, field image: declared {first_digest}, "
                f"advertised {second_digest}") in skewed.stdout
    finally:
        if (box.deploy_dir / "compose.yaml").exists():
            box.compose("down", "--remove-orphans", "--timeout", "5")
        subprocess.run(["docker", "rmi", "-f", *pulled, ref], capture_output=True, check=False)
