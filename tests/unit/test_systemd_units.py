"""systemd units from services.json: exact text, restart inputs, unit names, the module."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from ansible_collections.lobes.fleet.plugins.module_utils.service_files import ServicesError
from ansible_collections.lobes.fleet.plugins.module_utils.systemd import (
    UnitLayout,
    render_units,
    unit_name,
)
from ansible_collections.lobes.fleet.plugins.modules import systemd_units

from tests.support.tools import not_installed
from tests.unit.modules import run_module

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden" / "systemd"
# A base that never exists: the inputs fingerprint then covers only the input paths' names.
GOLDEN_BASE = "/opt/lobes-golden"


def _golden_document() -> dict:
    return json.loads((GOLDEN / "services.json").read_text())


def _layout(base: Path | str, prefix: str = "lobes-spark1") -> UnitLayout:
    return UnitLayout(base_dir=str(base), log_dir=f"{base}/state/log", prefix=prefix,
                      host="spark1")


@pytest.fixture
def box(tmp_path: Path) -> Path:
    """A deployed box: services.json, .env and the gateway source it watches."""
    shutil.copy(GOLDEN / "services.json", tmp_path / "services.json")
    (tmp_path / ".env").write_text("LOBES_PORT=8000\n")
    for package in ("lobes_gateway", "lobes_sim"):
        (tmp_path / "gateway" / package).mkdir(parents=True)
        (tmp_path / "gateway" / package / "__init__.py").write_text("VERSION = 1\n")
    return tmp_path


def _module_args(box: Path, **extra: object) -> dict:
    return {"services_file": str(box / "services.json"), "state_dir": str(box / "state"),
            "unit_dir": str(box / "units"), "prefix": "lobes-spark1", **extra}


def test_units_match_golden_text() -> None:
    units = render_units(_golden_document(), _layout(GOLDEN_BASE))
    assert sorted(units) == ["lobes-spark1-gateway.service", "lobes-spark1-gear-cortex.service",
                             "lobes-spark1-gear-senses.service"]
    for name, text in units.items():
        assert text == (GOLDEN / name).read_text(), name


def test_exec_start_escapes_specifiers_dollars_and_quotes() -> None:
    units = render_units(_golden_document(), _layout(GOLDEN_BASE))
    text = units["lobes-spark1-gear-cortex.service"]
    assert ('ExecStart=python3 -m lobes_sim --port 18100 --served-name "org/Model 27B" '
            '--note "100%% $$HOME \\"q\\""\n') in text


def test_new_env_or_source_changes_the_unit_but_bytecode_does_not(box: Path) -> None:
    def gateway_unit() -> str:
        return render_units(_golden_document(), _layout(box))["lobes-spark1-gateway.service"]

    first = gateway_unit()
    (box / ".env").write_text("LOBES_PORT=8001\n")
    after_env = gateway_unit()
    (box / "gateway" / "lobes_gateway" / "__init__.py").write_text("VERSION = 2\n")
    after_source = gateway_unit()
    (box / "gateway" / "lobes_gateway" / "__pycache__").mkdir()
    (box / "gateway" / "lobes_gateway" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert len({first, after_env, after_source}) == 3
    assert gateway_unit() == after_source


def test_an_env_file_setting_a_name_of_the_services_env_is_refused(box: Path) -> None:
    """systemd lets EnvironmentFile= win over Environment=, the supervisor and Compose the
    reverse: a name in both would run differently per runtime, so no unit is written for it."""
    (box / ".env").write_text("LOBES_PORT=8000\nPYTHONPATH=/elsewhere\n")
    with pytest.raises(ValueError, match=r"service 'gateway': field 'env_file': .*\.env sets "
                                         r"PYTHONPATH, which the service's env sets too"):
        render_units(_golden_document(), _layout(box))
    result = run_module(systemd_units.main, _module_args(box))
    assert result["failed"] is True and "PYTHONPATH" in result["msg"]
    assert not (box / "units").exists()


def test_a_gear_unit_starts_after_the_one_before_is_healthy() -> None:
    units = render_units(_golden_document(), _layout(GOLDEN_BASE))
    senses = units["lobes-spark1-gear-senses.service"].splitlines()
    assert "After=network-online.target lobes-spark1-gear-cortex.service" in senses
    assert "Requires=lobes-spark1-gear-cortex.service" in senses
    cortex = units["lobes-spark1-gear-cortex.service"].splitlines()
    assert ("ExecStartPost=python3 -m lobes_supervisor.health http://127.0.0.1:18100/health 60"
            in cortex)
    gateway = units["lobes-spark1-gateway.service"]
    assert "Requires=" not in gateway and "ExecStartPost=" not in gateway


def test_unit_names_are_per_box_and_sanitised() -> None:
    assert unit_name("lobes-spark1", "gateway") == "lobes-spark1-gateway.service"
    assert unit_name("lobes-orin/a b", "gateway") == "lobes-orin-a-b-gateway.service"
    other = render_units(_golden_document(), _layout(GOLDEN_BASE, prefix="lobes-spark2"))
    assert sorted(other) == ["lobes-spark2-gateway.service", "lobes-spark2-gear-cortex.service",
                             "lobes-spark2-gear-senses.service"]


def test_unknown_service_name_fails_naming_the_known_ones() -> None:
    with pytest.raises(ServicesError,
                       match=r"\['nope'\].*\['gateway', 'gear-cortex', 'gear-senses'\]"):
        render_units(_golden_document(), _layout(GOLDEN_BASE), names=["nope"])


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason=not_installed("systemd-analyze", "systemd"))
def test_systemd_analyze_verifies_the_rendered_units(box: Path) -> None:
    units = render_units(_golden_document(), _layout(box))
    (box / "units").mkdir()
    for name, text in units.items():
        (box / "units" / name).write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", *sorted((box / "units").iterdir())],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_module_writes_units_then_is_idempotent(box: Path) -> None:
    first = run_module(systemd_units.main, _module_args(box))
    assert first["changed"] is True
    assert first["changed_units"] == first["units"] == [
        "lobes-spark1-gateway.service", "lobes-spark1-gear-cortex.service",
        "lobes-spark1-gear-senses.service"]
    assert (box / "units" / "lobes-spark1-gateway.service").read_text() == render_units(
        _golden_document(), _layout(box))["lobes-spark1-gateway.service"]
    assert (box / "state" / "log").is_dir()
    again = run_module(systemd_units.main, _module_args(box))
    assert again["changed"] is False
    assert again["changed_units"] == []


def test_module_marks_only_the_unit_whose_inputs_changed(box: Path) -> None:
    run_module(systemd_units.main, _module_args(box, exclude=["gateway"]))
    run_module(systemd_units.main, _module_args(box, names=["gateway"]))
    (box / ".env").write_text("LOBES_PORT=8001\n")
    gears = run_module(systemd_units.main, _module_args(box, exclude=["gateway"]))
    gateway = run_module(systemd_units.main, _module_args(box, names=["gateway"]))
    assert gears["changed"] is False
    assert gateway["changed_units"] == ["lobes-spark1-gateway.service"]


def test_check_mode_reports_units_and_diff_and_writes_nothing(box: Path) -> None:
    result = run_module(systemd_units.main, _module_args(box), check_mode=True, diff=True)
    assert result["changed"] is True
    assert result["changed_units"] == ["lobes-spark1-gateway.service",
                                       "lobes-spark1-gear-cortex.service",
                                       "lobes-spark1-gear-senses.service"]
    assert "ExecStart=python3 -m lobes_gateway" in result["diff"]["after"]
    assert not (box / "units").exists()


def test_module_removes_units_no_longer_rendered_and_other_boxes_stay(box: Path) -> None:
    (box / "units").mkdir()
    (box / "units" / "lobes-spark1-gear-old.service").write_text("# prefix: lobes-spark1\n")
    # Another box whose prefix extends this one's: same name start, its own marker.
    (box / "units" / "lobes-spark1-a-gateway.service").write_text("# prefix: lobes-spark1-a\n")
    result = run_module(systemd_units.main, _module_args(box))
    assert result["removed_units"] == ["lobes-spark1-gear-old.service"]
    assert not (box / "units" / "lobes-spark1-gear-old.service").exists()
    assert (box / "units" / "lobes-spark1-a-gateway.service").exists()


def test_absent_removes_the_box_units_only(box: Path) -> None:
    run_module(systemd_units.main, _module_args(box))
    (box / "units" / "lobes-spark1-a-gateway.service").write_text("# prefix: lobes-spark1-a\n")
    args = {"state": "absent", "state_dir": str(box / "state"),
            "unit_dir": str(box / "units"), "prefix": "lobes-spark1"}
    gateway = run_module(systemd_units.main, {**args, "names": ["gateway"]})
    assert gateway["removed_units"] == ["lobes-spark1-gateway.service"]
    rest = run_module(systemd_units.main, args)
    assert rest["removed_units"] == ["lobes-spark1-gear-cortex.service",
                                     "lobes-spark1-gear-senses.service"]
    assert sorted(p.name for p in (box / "units").iterdir()) == ["lobes-spark1-a-gateway.service"]
    assert run_module(systemd_units.main, args)["changed"] is False


def test_check_mode_before_first_render_reports_a_change(tmp_path: Path) -> None:
    result = run_module(systemd_units.main, _module_args(tmp_path), check_mode=True)
    assert result["changed"] is True
    assert "not rendered yet" in result["msg"]
