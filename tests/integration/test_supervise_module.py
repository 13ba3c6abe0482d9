"""lobes.fleet.supervise through ansible itself: check mode, diff, idempotence, stop."""

from __future__ import annotations

import json
import socket
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


def test_a_gateway_that_cannot_listen_fails_the_module_with_its_own_reason(tmp_path, state_dir):
    """The real gateway under the supervisor: its start-up error reaches the play, its key
    does not."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()  # never accepts: a health poll here is never answered
        port = holder.getsockname()[1]
        (tmp_path / ".env").write_text(
            f"GATEWAY_HOST=127.0.0.1\nGATEWAY_PORT={port}\nGATEWAY_API_KEY=sk-never-shown\n"
            "PRIMARY_BASE_URL=http://127.0.0.1:9\n")
        services = tmp_path / "services.json"
        services.write_text(json.dumps({"services": [{
            "name": "gateway", "argv": [sys.executable, "-m", "lobes_gateway"],
            "env": {"PYTHONPATH": str(GATEWAY_SRC)}, "env_file": ".env",
            "health": f"http://127.0.0.1:{port}/health", "health_timeout_s": 50}]}))

        result = _ansible(f"services_file={services}", f"state_dir={state_dir}",
                          f"source_dir={GATEWAY_SRC}")

    assert result["failed"] is True
    assert "service 'gateway' exited with 2 before it became healthy" in result["msg"]
    assert (f"lobes_gateway: cannot listen on 127.0.0.1:{port} (GATEWAY_HOST, GATEWAY_PORT): "
            "Address already in use") in result["msg"]
    assert "sk-never-shown" not in json.dumps(result)
