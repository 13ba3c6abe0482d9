"""lobes.fleet.supervise through ansible itself: check mode, diff, idempotence, stop."""

from __future__ import annotations

import json
import sys

from .conftest import GATEWAY_SRC, ansible_module, supervisor

SLEEPER = "import time;time.sleep(600)"


def _ansible(*module_args: str, check: bool = False) -> dict:
    return ansible_module("lobes.fleet.supervise", " ".join(module_args), check=check)


def test_module_starts_in_order_and_is_idempotent_and_check_mode_changes_nothing(
    tmp_path, state_dir
):
    services = tmp_path / "services.json"
    services.write_text(
        json.dumps(
            {
                "services": [
                    {"name": "gateway", "argv": [sys.executable, "-c", SLEEPER]},
                    {"name": "gear-cortex", "argv": [sys.executable, "-c", SLEEPER]},
                ]
            }
        )
    )
    common = (f"services_file={services}", f"state_dir={state_dir}", f"source_dir={GATEWAY_SRC}")

    planned = _ansible(*common, "exclude=gateway", check=True)
    assert planned["changed"] is True
    assert planned["actions"] == [{"name": "gear-cortex", "action": "started"}]
    assert "gear-cortex: started" in planned["diff"]["after"]
    assert supervisor(state_dir, "status")["status"] == []

    gears = _ansible(*common, "exclude=gateway")
    assert gears["changed"] is True
    assert [row["name"] for row in gears["running"]] == ["gear-cortex"]

    everything = _ansible(*common)
    assert everything["actions"] == [
        {"name": "gateway", "action": "started"},
        {"name": "gear-cortex", "action": "unchanged"},
    ]
    assert _ansible(*common)["changed"] is False

    stopped = _ansible(f"state_dir={state_dir}", f"source_dir={GATEWAY_SRC}", "state=stopped")
    assert stopped["changed"] is True
    assert stopped["running"] == []
    assert (
        _ansible(f"state_dir={state_dir}", f"source_dir={GATEWAY_SRC}", "state=stopped")["changed"]
        is False
    )


def test_stopping_a_box_never_deployed_changes_nothing(tmp_path):
    result = _ansible(f"state_dir={tmp_path}/none", f"source_dir={tmp_path}", "state=stopped")

    assert result["changed"] is False
    assert result["running"] == []


def test_module_fails_clearly_without_the_supervisor_source(tmp_path, state_dir):
    services = tmp_path / "services.json"
    services.write_text(json.dumps({"services": []}))
    result = _ansible(
        f"services_file={services}", f"state_dir={state_dir}", f"source_dir={tmp_path}"
    )

    assert result["failed"] is True
    assert "holds no lobes_supervisor package" in result["msg"]
