"""The gears and gateway roles on the process runtime: systemd units when forced, else the
supervisor. --check only: no systemd runs here, so no unit can start."""

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


def _check_run(box: Path, *extra_vars: str) -> dict[str, dict]:
    """Run the playbook with --check --diff; return each task's localhost result by name."""
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", str(box / "box.yml"),
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
    gears = tasks["Write the gears' systemd units"]
    gateway = tasks["Write the gateway's systemd unit"]
    assert gears["changed"] is True
    assert gears["changed_units"] == ["lobes-localhost-gear-cortex.service"]
    assert gateway["changed_units"] == ["lobes-localhost-gateway.service"]
    assert f"WorkingDirectory={box / 'box'}" in gateway["diff"]["after"]
    assert f"EnvironmentFile={box / 'box' / '.env'}" in gateway["diff"]["after"]
    assert "Run the gears as supervised processes" not in tasks
    assert not (box / "units").exists()


def test_auto_without_systemd_keeps_the_supervisor(box: Path) -> None:
    tasks = _check_run(box)
    assert "Run the gears as supervised processes" in tasks
    assert "Run the gateway as a supervised process" in tasks
    assert "Write the gears' systemd units" not in tasks
