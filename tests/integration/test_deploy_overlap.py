"""The embedded default (process runtime) when runs overlap, die or meet a stranger: a port held
by another program is refused by preflight, naming it; runs started together, a pidfile emptied
or lost, and ansible-playbook killed mid-run all converge on one process per service, a second
rerun changes nothing, and down.yml leaves nothing of the deployment running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import lobes_processes
import pytest

from tests.support.wait import wait_until

from .conftest import ROOT, VENV_BIN, ansible_env
from .test_playbooks import LocalMesh, _ok, _recap

SERVICES = {"gateway", "gear-cortex", "gear-senses", "gear-embedder", "gear-reranker"}


def census(mesh: LocalMesh) -> tuple[dict, dict]:
    """service -> monitor pids, service -> pids carrying its marks."""
    return lobes_processes.deployment(str((mesh.deploy_dir / "state").resolve()))


def one_process_per_service(mesh: LocalMesh) -> None:
    monitors, started = census(mesh)
    assert {name: len(pids) for name, pids in monitors.items()} == dict.fromkeys(SERVICES, 1)
    assert {name: len(pids) for name, pids in started.items()} == dict.fromkeys(SERVICES, 1)


def nothing_left_after_down(mesh: LocalMesh) -> None:
    _ok(mesh.playbook("down.yml"))
    assert census(mesh) == ({}, {})


@pytest.fixture
def mesh(tmp_path: Path):
    deployed = LocalMesh(tmp_path)
    yield deployed
    subprocess.run([sys.executable, "-m", "lobes_supervisor", "--state-dir",
                    str(deployed.deploy_dir / "state"), "down"], check=False,
                   env={**os.environ, "PYTHONPATH": str(ROOT / "gateway")}, capture_output=True)


def _site(mesh: LocalMesh) -> subprocess.Popen:
    return subprocess.Popen(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(mesh.inventory),
         str(ROOT / "playbooks" / "site.yml")],
        cwd=ROOT, env={**ansible_env(), "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_a_stranger_on_a_gear_port_is_refused_by_preflight_naming_port_and_holder(mesh):
    senses_port = mesh.gear_port_base + 1
    stranger = subprocess.Popen([sys.executable, "-m", "http.server", str(senses_port),
                                 "--bind", "127.0.0.1"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: lobes_processes.port_holders(senses_port, "127.0.0.1")[0],
                   timeout=20, message="the stranger to listen")
        result = subprocess.run(
            [str(VENV_BIN / "ansible-playbook"), "-i", str(mesh.inventory),
             str(ROOT / "playbooks" / "site.yml")],
            cwd=ROOT, env=ansible_env(), capture_output=True, text=True, timeout=60, check=False)
    finally:
        stranger.terminate()
        stranger.wait()
    assert result.returncode != 0
    assert (f"port {senses_port} (gear-senses) is held by pid {stranger.pid} "
            f"({sys.executable} -m http.server {senses_port}") in result.stdout
    assert "fleet_gear_port_base" in result.stdout
    assert census(mesh) == ({}, {}) and not mesh.deploy_dir.exists()


@pytest.mark.slow
def test_overlapping_runs_and_damaged_pidfiles_leave_one_process_per_service(mesh):
    first, second = _site(mesh), _site(mesh)
    outputs = [run.communicate(timeout=300)[0] for run in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outputs
    one_process_per_service(mesh)
    assert _recap(mesh.playbook("site.yml"))["changed"] == 0

    (mesh.deploy_dir / "state" / "run" / "gear-cortex.pid").write_text("")
    (mesh.deploy_dir / "state" / "run" / "gateway.pid").unlink()
    assert _ok(mesh.playbook("site.yml"))["changed"] > 0
    one_process_per_service(mesh)
    assert _ok(mesh.playbook("site.yml"))["changed"] == 0
    nothing_left_after_down(mesh)


# Tasks at whose start ansible-playbook is killed: before anything runs on the box, while the
# gears start, while the gateway starts.
KILL_AT = ["Deploy the collection's gateway source to the box",
           "Run the supervised processes of the gears",
           "Run the supervised processes of the gateway"]


@pytest.mark.slow
def test_a_run_killed_at_any_point_converges_on_the_next(mesh):
    for task in KILL_AT:
        run = _site(mesh)
        for line in run.stdout:
            if f"{task}]" in line:
                run.send_signal(signal.SIGKILL)
                break
        run.wait(timeout=60)
        run.stdout.close()
        assert run.returncode == -signal.SIGKILL, f"the run ended before {task!r}"
        _ok(mesh.playbook("site.yml"))
        one_process_per_service(mesh)
        assert _ok(mesh.playbook("site.yml"))["changed"] == 0, task
    nothing_left_after_down(mesh)
