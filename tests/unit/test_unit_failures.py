"""lobes.fleet.unit_failures: which systemd units of a box's services are not active, and why.

systemd cannot run as PID 1 here, so `systemctl show` is stood in for by a script printing what
systemctl prints for several units (man systemctl: the properties as Key=Value lines, one block
per unit in the order named, blocks separated by an empty line): a gateway that exited with 2
and was restarted five times, a gear still activating, a gear running. The units, logs and
secrets are the box's own (the systemd golden services.json).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from ansible_collections.lobes.fleet.plugins.module_utils.service_files import MASK
from ansible_collections.lobes.fleet.plugins.modules import unit_failures

from tests.unit.modules import run_module

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "systemd"

# In services.json's order: gear-cortex, gear-senses, gateway.
SHOWN = """LoadState=loaded
ActiveState=active
SubState=running
Result=success
ExecMainStatus=0
NRestarts=0

LoadState=loaded
ActiveState=activating
SubState=start-post
Result=success
ExecMainStatus=0
NRestarts=0

LoadState=loaded
ActiveState=failed
SubState=failed
Result=exit-code
ExecMainStatus=2
NRestarts=5
"""
UNITS = ["lobes-spark1-gear-cortex.service", "lobes-spark1-gear-senses.service",
         "lobes-spark1-gateway.service"]


def test_the_units_not_active_are_those_failed_or_still_starting():
    down = unit_failures.not_active(UNITS, unit_failures.shown_units(SHOWN))

    assert [(unit, properties["ActiveState"]) for unit, properties in down] == [
        ("lobes-spark1-gear-senses.service", "activating"),
        ("lobes-spark1-gateway.service", "failed")]


def test_a_unit_systemd_does_not_know_is_not_active():
    shown = unit_failures.shown_units("LoadState=not-found\nActiveState=inactive\n"
                                      "SubState=dead\nResult=success\n")

    assert unit_failures.not_active(UNITS[:1], shown) == [(UNITS[0], shown[0])]


def test_the_summary_names_each_unit_how_it_ended_and_its_logs_end():
    failed = {"unit": UNITS[2], "service": "gateway", "load_state": "loaded", "state": "failed",
              "sub_state": "failed", "result": "exit-code", "exit_status": "2", "restarts": "5",
              "log": "/srv/lobes/state/log/gateway.log",
              "tail": "lobes_gateway: PRIMARY_MAX_ACTIVE must be an integer"}
    starting = {"unit": UNITS[1], "service": "gear-senses", "load_state": "loaded",
                "state": "activating", "sub_state": "start-post", "result": "success",
                "exit_status": "0", "restarts": "0",
                "log": "/srv/lobes/state/log/gear-senses.log", "tail": ""}
    missing = {**starting, "unit": UNITS[0], "service": "gear-cortex",
               "load_state": "not-found", "state": "inactive", "sub_state": "dead",
               "log": "/srv/lobes/state/log/gear-cortex.log"}

    summary = unit_failures.summarise([failed, starting, missing])

    assert summary.splitlines() == [
        "lobes-spark1-gateway.service (gateway): failed, result exit-code, exit status 2, "
        "restarted 5 times; its log /srv/lobes/state/log/gateway.log ends:",
        "lobes_gateway: PRIMARY_MAX_ACTIVE must be an integer",
        "lobes-spark1-gear-senses.service (gear-senses): activating (start-post); its log "
        "/srv/lobes/state/log/gear-senses.log is empty or missing",
        "lobes-spark1-gear-cortex.service (gear-cortex): inactive (dead), unit not-found; its "
        "log /srv/lobes/state/log/gear-cortex.log is empty or missing"]
    assert unit_failures.summarise([]) == "every unit is active"


@pytest.fixture
def box(tmp_path: Path) -> Path:
    """A deployed box: services.json, the gateway's .env with a key, the gateway's log."""
    shutil.copy(GOLDEN / "services.json", tmp_path / "services.json")
    (tmp_path / ".env").write_text("GATEWAY_API_KEY=sk-box-secret\nGATEWAY_PORT=8000\n")
    (tmp_path / "state" / "log").mkdir(parents=True)
    (tmp_path / "state" / "log" / "gateway.log").write_text(
        "starting with key sk-box-secret\nlobes_gateway: PRIMARY_MAX_ACTIVE must be an integer\n")
    return tmp_path


def _systemctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> Path:
    """A `systemctl` first on PATH, running `script`; the arguments it got land in args.txt."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "systemctl"
    fake.write_text(f'#!/bin/sh\necho "$@" > "{tmp_path}/args.txt"\n{script}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "args.txt"


def _args(box: Path, **extra: object) -> dict:
    return {"services_file": str(box / "services.json"), "state_dir": str(box / "state"),
            "prefix": "lobes-spark1", **extra}


def test_the_module_quotes_the_failed_units_log_with_its_key_masked(box, tmp_path, monkeypatch):
    (tmp_path / "shown.txt").write_text(SHOWN)
    asked = _systemctl(tmp_path, monkeypatch, f'cat "{tmp_path}/shown.txt"')

    result = run_module(unit_failures.main, _args(box))

    assert asked.read_text().split() == [
        "show", "--property=" + ",".join(unit_failures.PROPERTIES), "--", *UNITS]
    assert not result["changed"]
    assert [(f["service"], f["state"]) for f in result["failures"]] == [
        ("gear-senses", "activating"), ("gateway", "failed")]
    gateway = result["failures"][1]
    assert gateway["tail"] == (f"starting with key {MASK}\n"
                               "lobes_gateway: PRIMARY_MAX_ACTIVE must be an integer")
    assert "sk-box-secret" not in result["summary"]
    assert "exit status 2, restarted 5 times" in result["summary"]


def test_the_module_asks_only_for_the_selected_services(box, tmp_path, monkeypatch):
    (tmp_path / "shown.txt").write_text(SHOWN.split("\n\n")[2])
    asked = _systemctl(tmp_path, monkeypatch, f'cat "{tmp_path}/shown.txt"')

    result = run_module(unit_failures.main, _args(box, names=["gateway"]))

    assert asked.read_text().split()[-1] == "lobes-spark1-gateway.service"
    assert [f["unit"] for f in result["failures"]] == ["lobes-spark1-gateway.service"]


def test_systemd_not_answering_is_reported_not_raised(box, tmp_path, monkeypatch):
    _systemctl(tmp_path, monkeypatch,
               'echo "System has not been booted with systemd as init system (PID 1)." >&2\n'
               "exit 1")

    result = run_module(unit_failures.main, _args(box))

    assert result["failures"] == []
    assert result["summary"] == ("the units' state could not be read: System has not been "
                                 "booted with systemd as init system (PID 1).")
