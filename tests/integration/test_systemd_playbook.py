"""The gears and gateway roles on the process runtime: systemd units when forced, else the
supervisor; down.yml on the runtime rendered on the box. --check only: no systemd runs here,
so no unit can start."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT, VENV_BIN, ansible_env

SERVICES = ROOT / "tests" / "fixtures" / "golden" / "systemd" / "services.json"

PLAYBOOK = """\
- name: Run a process-runtime box
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Start the gears
      ansible.builtin.import_role:
        name: lobes.fleet.gears
      vars:
        gears_plan: {runtime: process}
    - name: Start the gateway
      ansible.builtin.import_role:
        name: lobes.fleet.gateway
        tasks_from: up
      vars:
        gateway_plan: {runtime: process}
"""


@pytest.fixture
def box(tmp_path: Path) -> Path:
    """A rendered box (services.json, .env, gateway source) and a playbook driving its roles."""
    deploy = tmp_path / "box"
    for package in ("lobes_gateway", "lobes_sim"):
        (deploy / "gateway" / package).mkdir(parents=True)
    shutil.copy(SERVICES, deploy / "services.json")
    (deploy / ".env").write_text("LOBES_PORT=8000\n")
    (tmp_path / "box.yml").write_text(PLAYBOOK)
    return tmp_path


def _check_run(box: Path, *extra_vars: str, playbook: Path | None = None) -> dict[str, dict]:
    """Run the playbook (box.yml by default) with --check --diff; return each task's localhost
    result by name."""
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,",
            str(playbook or box / "box.yml"),
            "--check", "--diff", "-e", "ansible_connection=local",
            "-e", f"ansible_python_interpreter={sys.executable}",
            "-e", f"fleet_deploy_dir={box / 'box'}", "-e", f"fleet_unit_dir={box / 'units'}"]
    for pair in extra_vars:
        argv += ["-e", pair]
    env = {**ansible_env(), "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
           "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    tasks = json.loads(done.stdout)["plays"][0]["tasks"]
    # Role task names read "lobes.fleet.<role> : <name>".
    return {t["task"]["name"].split(" : ", 1)[-1]: t["hosts"]["localhost"] for t in tasks}


def test_forced_systemd_check_reports_the_units_it_would_write(box: Path) -> None:
    tasks = _check_run(box, "fleet_service_manager=systemd")
    gears = tasks["Write the systemd units of the gears"]
    gateway = tasks["Write the systemd units of the gateway"]
    assert gears["changed"] is True
    assert gears["changed_units"] == ["lobes-localhost-gear-cortex.service",
                                      "lobes-localhost-gear-senses.service"]
    assert gateway["changed_units"] == ["lobes-localhost-gateway.service"]
    assert f"WorkingDirectory={box / 'box'}" in gateway["diff"]["after"]
    assert f"EnvironmentFile={box / 'box' / '.env'}" in gateway["diff"]["after"]
    assert "Run the supervised processes of the gears" not in tasks
    assert not (box / "units").exists()


def test_auto_without_systemd_keeps_the_supervisor(box: Path) -> None:
    tasks = _check_run(box)
    assert "Run the supervised processes of the gears" in tasks
    assert "Run the supervised processes of the gateway" in tasks
    assert "Write the systemd units of the gears" not in tasks


def test_down_stops_the_runtime_rendered_on_the_box(box: Path) -> None:
    # The inventory now says compose, the box still runs services.json: down stops processes
    # and units and never asks Docker.
    tasks = _check_run(box, "fleet_runtime=compose", playbook=ROOT / "playbooks" / "down.yml")
    assert tasks["Stop the supervised processes of the gateway"]["changed"] is False
    assert "Remove the systemd units of the gateway" in tasks
    assert "Stop the supervised processes of the box's services" in tasks
    assert "Remove the systemd units of the box's services" in tasks
    assert not any("containers" in name for name in tasks)


def test_down_on_a_box_never_rendered_stops_nothing(box: Path) -> None:
    (box / "box" / "services.json").unlink()
    tasks = _check_run(box, playbook=ROOT / "playbooks" / "down.yml")
    assert not any(word in name for name in tasks
                   for word in ("supervised processes", "systemd units", "containers"))
