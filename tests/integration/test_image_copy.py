"""Gear images copied box to box (fleet_images_from: boxes) on real Docker engines: the source
box is this machine's engine, which pulled the image from a registry of the test's own; the
target box is a second dockerd of its own (data root, socket), so what it holds is only what
crossed. The tar crosses over a real sshd, through the copy key's forced command.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from ansible_collections.lobes.fleet.plugins.module_utils.images import copy_tag, running_digest
from ansible_collections.lobes.fleet.plugins.module_utils.model_files import image_paths

from tests.support.ports import free_block
from tests.support.sshd import Sshd, require_openssh

from .conftest import GATEWAY_SRC, ROOT, VENV_BIN, ansible_env, run
from .test_model_fetch import _args_file, _env, _module_argv
from .test_playbooks import GEAR_PORT_SPAN

LAYER = random.Random(11).randbytes(6 << 20)  # a layer big enough to cut a copy midway


def build_and_pull(registry: str, build: str, context: Path) -> str:
    """An image of its own (a random layer, a label per build) pushed to the registry, removed,
    and pulled back by digest, as a box that reaches the registry holds it: its pinned ref."""
    context.mkdir(parents=True, exist_ok=True)
    (context / "layer.bin").write_bytes(LAYER)
    (context / "Dockerfile").write_text(
        f"FROM scratch\nCOPY layer.bin /\nLABEL lobes.test={build}\n")
    name = f"{registry}/lobes-test/copy-{uuid.uuid4().hex[:8]}"
    run("docker", "build", "-q", "-t", f"{name}:v1", str(context))
    run("docker", "push", f"{name}:v1")
    held = json.loads(run("docker", "image", "inspect", "--format", "{{json .RepoDigests}}",
                          f"{name}:v1"))
    [pinned] = [entry for entry in held if entry.startswith(name + "@")]
    run("docker", "rmi", f"{name}:v1")
    run("docker", "pull", pinned)
    return pinned


def docker_on(host: str | None, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"DOCKER_HOST": host} if host else {})}
    return subprocess.run(["docker", *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def image_id(host: str | None, ref: str) -> str | None:
    done = docker_on(host, "image", "inspect", "--format", "{{.Id}}", ref)
    return done.stdout.strip() if done.returncode == 0 else None


@dataclass
class Boxes:
    """The source box (this engine, its model_dir served by sshd) and the target's engine."""

    base: Path
    source: Path
    key: Path
    sshd: Sshd
    commands: Path
    target_host: str
    pinned: str
    other: str

    def served(self) -> list[str]:
        return self.commands.read_text().splitlines() if self.commands.exists() else []

    def module(self, name: str, tmp_path: Path, *, on_target: bool, check: bool = False,
               **args: object) -> dict:
        env = {**_env(), **({"DOCKER_HOST": self.target_host} if on_target else {})}
        done = subprocess.run(_module_argv(name, _args_file(tmp_path, args, check)), env=env,
                              capture_output=True, text=True, timeout=300, check=False)
        return json.loads(done.stdout)

    def pull(self, tmp_path: Path, dest: Path, *, check: bool = False, **args: object) -> dict:
        args = {"ref": self.pinned, "model_dir": str(dest), "source": "127.0.0.1",
                "host": "target", "ssh_user": self.sshd.user, "ssh_port": self.sshd.port,
                "ssh_key": str(self.key), "timeout": 20, **args}
        return self.module("image_pull", tmp_path, on_target=True, check=check, **args)


def hex_of(ref: str) -> str:
    return ref.rsplit(":", 1)[1]


@pytest.fixture(scope="module")
def boxes(tmp_path_factory: pytest.TempPathFactory, registry: str,
          second_engine: str) -> Iterator[Boxes]:
    require_openssh()
    base = tmp_path_factory.mktemp("imgcopy")
    pinned = build_and_pull(registry, "1", base / "build-1")
    other = build_and_pull(registry, "2", base / "build-2")
    commands = base / "commands.log"
    wrapper = base / "python"
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$SSH_ORIGINAL_COMMAND" >> {commands}\n'
                       f'exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    source = base / "source"
    run_args = {"tmp_path": base}
    boxes = Boxes(base, source, Path(), Sshd(base / "sshd"), commands, second_engine, pinned,
                  other)
    made = boxes.module("model_copy_key", **run_args, on_target=True, model_dir=str(base / "keys"))
    boxes.key = Path(made["path"])
    boxes.sshd.start()
    trusted = boxes.module("model_copy_key", **run_args, on_target=False, state="authorized",
                           public_keys=[made["public_key"]],
                           authorized_keys=str(boxes.sshd.authorized_keys), python=str(wrapper),
                           serve=str(GATEWAY_SRC / "lobes_model_serve.py"), model_dir=str(source))
    assert trusted["changed"] is True, trusted
    try:
        yield boxes
    finally:
        boxes.sshd.stop()
        docker_on(None, "rmi", "-f", pinned, other)


def test_the_source_exports_once_and_check_mode_writes_nothing(boxes, tmp_path):
    fresh = tmp_path / "models"
    would = boxes.module("image_export", tmp_path, on_target=False, check=True,
                         refs=[boxes.pinned], model_dir=str(fresh))
    assert (would["changed"], would["exported"]) == (True, [boxes.pinned]), would
    assert not fresh.exists()

    first = boxes.module("image_export", tmp_path, on_target=False, refs=[boxes.pinned],
                         model_dir=str(boxes.source))
    assert (first["changed"], first["exported"], first["held"]) == (
        True, [boxes.pinned], [boxes.pinned]), first
    tar, manifest = image_paths(str(boxes.source), hex_of(boxes.pinned))
    entry = json.loads(Path(manifest).read_text())
    assert entry["id"] == image_id(None, boxes.pinned)
    assert entry["size"] == os.path.getsize(tar)
    assert not os.listdir(os.path.join(boxes.source, ".images", ".partial"))

    again = boxes.module("image_export", tmp_path, on_target=False, refs=[boxes.pinned],
                         model_dir=str(boxes.source))
    assert (again["changed"], again["exported"]) == (False, []), again
    docker_on(boxes.target_host, "rmi", "-f", copy_tag(boxes.pinned))  # an earlier test's copy
    nowhere = boxes.module("image_export", tmp_path, on_target=True, refs=[boxes.pinned],
                           model_dir=str(tmp_path / "target"))
    assert (nowhere["changed"], nowhere["missing"]) == (False, [boxes.pinned]), nowhere


def test_the_tar_crosses_once_is_loaded_by_id_tagged_and_a_second_run_opens_no_ssh(boxes,
                                                                                   tmp_path):
    boxes.module("image_export", tmp_path, on_target=False, refs=[boxes.pinned],
                 model_dir=str(boxes.source))
    dest = tmp_path / "target"
    hexd = hex_of(boxes.pinned)
    docker_on(boxes.target_host, "rmi", "-f", copy_tag(boxes.pinned))  # an earlier test's copy
    logins, served = boxes.sshd.connections(), len(boxes.served())

    would = boxes.pull(tmp_path, dest, check=True)
    assert (would["changed"], would["pulled"]) == (True, True), would
    assert boxes.sshd.connections() == logins and not dest.exists()

    first = boxes.pull(tmp_path, dest)
    assert first.get("failed") is not True, first
    size = json.loads(Path(image_paths(str(boxes.source), hexd)[1]).read_text())["size"]
    assert boxes.served()[served:] == [f"imageinfo {hexd}", f"image {hexd} 0"]
    assert (first["pulled"], first["resumed"], first["bytes_copied"]) == (True, False, size)
    source_id = image_id(None, boxes.pinned)
    assert first["image_id"] == source_id
    assert image_id(boxes.target_host, copy_tag(boxes.pinned)) == source_id
    # docker load keeps no registry digest: the pinned reference does not resolve there.
    assert image_id(boxes.target_host, boxes.pinned) is None
    assert os.path.getsize(image_paths(str(dest), hexd)[0]) == size  # kept, to serve on

    logins, served = boxes.sshd.connections(), len(boxes.served())
    second = boxes.pull(tmp_path, dest)
    assert (second["changed"], second["pulled"], second["bytes_copied"]) == (False, False, 0)
    assert boxes.sshd.connections() == logins and len(boxes.served()) == served


def test_a_box_without_room_for_the_tar_is_refused_before_its_first_byte(boxes, tmp_path):
    boxes.module("image_export", tmp_path, on_target=False, refs=[boxes.pinned],
                 model_dir=str(boxes.source))
    dest = tmp_path / "target"
    hexd = hex_of(boxes.pinned)
    docker_on(boxes.target_host, "rmi", "-f", copy_tag(boxes.pinned))  # an earlier test's copy
    served = len(boxes.served())
    # More headroom than any disk has free: the box must be refused.
    refused = boxes.pull(tmp_path, dest, headroom_bytes=2 ** 50)
    assert refused.get("failed") is True, refused
    assert f"host target, path {dest}: needs" in refused["msg"], refused["msg"]
    assert "is free; free" in refused["msg"], refused["msg"]
    # Only the manifest was asked for: no byte of the tar moved, nothing was loaded.
    assert boxes.served()[served:] == [f"imageinfo {hexd}"]
    assert not any(path.is_file() and path.stat().st_size for path in dest.rglob("*.tar"))
    assert image_id(boxes.target_host, copy_tag(boxes.pinned)) is None


def test_a_cut_copy_resumes_from_its_offset_and_a_corrupt_one_is_copied_again(boxes, tmp_path):
    boxes.module("image_export", tmp_path, on_target=False, refs=[boxes.pinned],
                 model_dir=str(boxes.source))
    hexd = hex_of(boxes.pinned)
    whole = Path(image_paths(str(boxes.source), hexd)[0]).read_bytes()
    for case, staged_bytes, offset in (
            ("cut", whole[:3_000_001], 3_000_001),
            ("corrupt", whole[:-1] + bytes([whole[-1] ^ 0xFF]), 0)):
        docker_on(boxes.target_host, "rmi", "-f", copy_tag(boxes.pinned))
        dest = tmp_path / case
        staged = dest / ".images" / ".partial" / f"{hexd}.tar"
        staged.parent.mkdir(parents=True)
        staged.write_bytes(staged_bytes)
        served = len(boxes.served())

        result = boxes.pull(tmp_path, dest)

        assert result.get("failed") is not True, (case, result)
        assert boxes.served()[served:] == [f"imageinfo {hexd}", f"image {hexd} {offset}"], case
        assert result["bytes_copied"] == len(whole) - offset, case
        assert result["resumed"] is (offset > 0), case
        assert Path(image_paths(str(dest), hexd)[0]).read_bytes() == whole, case
        assert image_id(boxes.target_host, copy_tag(boxes.pinned)) == image_id(None, boxes.pinned)


def test_a_loaded_image_whose_id_is_not_the_manifests_fails_and_is_removed(boxes, tmp_path):
    boxes.module("image_export", tmp_path, on_target=False, refs=[boxes.other],
                 model_dir=str(boxes.source))
    hexd = hex_of(boxes.other)
    manifest = Path(image_paths(str(boxes.source), hexd)[1])
    entry = json.loads(manifest.read_text())
    found = entry["id"]
    claimed = "sha256:" + "e" * 64
    manifest.write_text(json.dumps({**entry, "id": claimed}))
    dest = tmp_path / "target"
    try:
        result = boxes.pull(tmp_path, dest, ref=boxes.other)
    finally:
        manifest.write_text(json.dumps(entry))

    assert result.get("failed") is True, result
    for part in ("host target", boxes.other, f"expected {claimed}", found):
        assert part in result["msg"], (part, result["msg"])
    assert image_id(boxes.target_host, found) is None
    assert image_id(boxes.target_host, copy_tag(boxes.other)) is None
    assert not os.path.exists(image_paths(str(dest), hexd)[0])


# ---------------------------------------------------------------- through the playbook

PLAY = """\
- name: Plan, then copy the gears' images as site.yml does
  hosts: all
  gather_facts: false
  tasks:
    - name: Plan the mesh
      lobes.fleet.mesh_plan:
      run_once: true
      register: site_plan
    - name: Copy the images of every box that copies its images
      ansible.builtin.include_role:
        name: lobes.fleet.models
        tasks_from: images
      vars:
        models_mesh_plan: "{{ site_plan.plan }}"
        models_images: "{{ site_plan.images }}"
"""


def _inventory(boxes: Boxes, root: Path) -> Path:
    """Two boxes on this machine, of one hardware group, running the pinned image: box-a pulls
    from the registry (this engine), box-b copies (its modules see only the second engine,
    through an interpreter that sets DOCKER_HOST) and reaches box-a's sshd."""
    inventory = root / "inventory"
    (inventory / "host_vars").mkdir(parents=True)
    (inventory / "hosts.yml").write_text("all:\n  hosts:\n    box-a:\n    box-b:\n")
    python_b = root / "python-b"
    python_b.write_text(f'#!/bin/sh\nDOCKER_HOST={boxes.target_host} exec {sys.executable} "$@"\n')
    python_b.chmod(0o755)
    serve_log = root / "python-serve"
    serve_log.write_text(f'#!/bin/sh\nprintf "%s\\n" "$SSH_ORIGINAL_COMMAND" >> {boxes.commands}\n'
                         f'exec {sys.executable} "$@"\n')
    serve_log.chmod(0o755)
    block = free_block(2 * (GEAR_PORT_SPAN + 1))
    for number, (host, python, images_from) in enumerate(
            (("box-a", sys.executable, "registry"), ("box-b", str(python_b), "boxes"))):
        port = block + number * (GEAR_PORT_SPAN + 1)
        (inventory / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump({
            "ansible_connection": "local", "ansible_python_interpreter": python,
            "fleet_hardware": "sim", "fleet_runtime": "compose",
            "fleet_gateway_host": "127.0.0.1", "fleet_gateway_port": port,
            "fleet_origin": f"http://127.0.0.1:{port}", "fleet_gear_port_base": port + 1,
            "fleet_deploy_dir": str(root / host / "deploy"),
            "fleet_model_dir": str(root / host / "models"),
            "fleet_sim_image": boxes.pinned, "fleet_images_from": images_from,
            "fleet_copy_ssh_user": boxes.sshd.user, "fleet_copy_ssh_port": boxes.sshd.port,
            "models_authorized_keys": str(root / host / "authorized_keys"),
            "models_serve_python": str(serve_log),
            "fleet_roles": {"embedder": {}},
        }, sort_keys=False))
    # box-a's sshd is the test's: it reads the authorized_keys the role writes for box-a.
    boxes.sshd.authorized_keys.unlink(missing_ok=True)
    boxes.sshd.authorized_keys.symlink_to(root / "box-a" / "authorized_keys")
    return inventory


def _play(inventory: Path, root: Path, *extra: str) -> tuple:
    playbook = root / "copy.yml"
    playbook.write_text(PLAY)
    done = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inventory),
                           str(playbook), *extra], cwd=ROOT, env=ansible_env(),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    recap = done.stdout.split("PLAY RECAP")[-1]
    changed = {host: int(count) for host, count in re.findall(r"(box-\w)\s+:.*?changed=(\d+)",
                                                              recap)}
    return changed, done.stdout


# Not marked slow, so it runs after the module tests above: it leaves the target engine
# holding the image and the source's sshd trusting the playbook's copy keys.
def test_site_copies_the_pinned_image_to_the_box_that_cannot_pull_and_a_second_run_changes_nothing(
        boxes, tmp_path):
    docker_on(boxes.target_host, "rmi", "-f", copy_tag(boxes.pinned))
    inventory = _inventory(boxes, tmp_path)
    hexd = hex_of(boxes.pinned)

    would, _out = _play(inventory, tmp_path, "--check", "--diff")
    assert would["box-b"] > 0 and image_id(boxes.target_host, copy_tag(boxes.pinned)) is None
    assert not (tmp_path / "box-a" / "models" / ".images").exists()

    served = len(boxes.served())
    first, out = _play(inventory, tmp_path)
    assert first["box-a"] > 0 and first["box-b"] > 0, out
    assert boxes.served()[served:] == [f"imageinfo {hexd}", f"image {hexd} 0"]
    assert image_id(boxes.target_host, copy_tag(boxes.pinned)) == image_id(None, boxes.pinned)

    served = len(boxes.served())
    second, out = _play(inventory, tmp_path)
    assert second == {"box-a": 0, "box-b": 0}, out
    assert len(boxes.served()) == served

    # An engine emptied since the copy: box-b loads the tar it kept, checks and tags it again,
    # and asks box-a for nothing.
    docker_on(boxes.target_host, "rmi", "-f", copy_tag(boxes.pinned))
    third, out = _play(inventory, tmp_path)
    assert third == {"box-a": 0, "box-b": 1}, out
    assert image_id(boxes.target_host, copy_tag(boxes.pinned)) == image_id(None, boxes.pinned)
    assert len(boxes.served()) == served


def test_compose_finds_the_copy_tag_without_a_registry_and_verify_reads_the_pinned_digest(
        boxes, tmp_path):
    boxes.module("image_export", tmp_path, on_target=False, refs=[boxes.pinned],
                 model_dir=str(boxes.source))
    assert boxes.pull(tmp_path, tmp_path / "target").get("failed") is not True
    tag = copy_tag(boxes.pinned)
    project = tmp_path / "project"
    project.mkdir()
    # As render writes a box that copies its images: the copy tag, pulled only when missing.
    (project / "compose.yaml").write_text(yaml.safe_dump({"services": {"gear": {
        "image": tag, "pull_policy": "missing", "command": ["/layer.bin"]}}}))
    compose = ("compose", "--project-directory", str(project))
    try:
        created = docker_on(boxes.target_host, *compose, "create")
        assert created.returncode == 0, created.stderr
        assert "Pulling" not in created.stdout + created.stderr  # the tag is found on the box

        read = boxes.module("image_digest", tmp_path, on_target=True, project_dir=str(project))
        container = read["containers"]["gear"]
        assert tag in container["repo_tags"] and container["repo_digests"] == []
        gear = {"service": "gear", "image": tag, "image_copy": boxes.pinned}
        assert running_digest(gear, read["containers"]) == boxes.pinned.split("@", 1)[1]
    finally:
        docker_on(boxes.target_host, *compose, "down", "--remove-orphans")
