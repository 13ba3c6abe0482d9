"""A box switched to another service manager whose deploy fails goes back to exactly what ran.

The local default runs on the bundled supervisor; the operator switches it to systemd units
(fleet_service_manager) together with a configuration change, and the units cannot start (no
systemd is the init here, as on a box where systemd was forced by mistake). The rollback must
leave the supervisor's services running on the files they ran from, and nothing of systemd:
no unit file, and a re-run of the reverted inventory changes nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.wait import wait_until

from .test_playbooks import LocalMesh, _ok, _recap


def _ready(role: dict) -> dict | None:
    return role if role.get("ready") else None


@pytest.mark.slow
def test_a_failed_switch_to_systemd_runs_the_supervisor_again(
        mesh: LocalMesh, tmp_path: Path) -> None:
    _ok(mesh.playbook("site.yml"))
    before = mesh.rendered()
    services = set(mesh.processes())
    units = tmp_path / "units"

    mesh.edit(fleet_service_manager="systemd", fleet_unit_dir=str(units))
    mesh.edit_role("senses", context=16384)
    failed = mesh.playbook("site.yml")

    assert failed.returncode != 0
    assert mesh.rendered() == before
    assert not list(units.glob("*.service")), "the units of the failed switch were left"
    assert set(mesh.processes()) == services
    # The restarted gateway publishes a gear's window once its probe finds the gear ready.
    senses = wait_until(lambda: _ready(mesh.get("/capabilities")["roles"]["senses"]),
                        message="senses ready again after the rollback", timeout=60, interval=0.5)
    assert senses["context"] == 32768
    assert mesh.chat("main")["object"] == "chat.completion"
    assert _recap(failed)["rescued"] == 1, failed.stdout[-4000:]
    assert "The box runs as it did before this run" in failed.stdout

    # The operator reverts the inventory: the box already is what it describes.
    mesh.edit(fleet_service_manager="auto")
    mesh.edit_role("senses", context=32768)
    assert _ok(mesh.playbook("site.yml"))["changed"] == 0
