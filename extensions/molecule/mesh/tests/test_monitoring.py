"""The monitoring role on the mesh: the entry box's Prometheus scrapes every box's gateway and,
through each gateway, every gear of the mesh; a partitioned box shows as its gateway down, once,
not as each of its gears."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import Any

import pytest
from fleet_mesh import ONE_PROBE_INTERVAL_S, Mesh, partitioned

from tests.support.client import call
from tests.support.wait import wait_until

PROMETHEUS_PORT = 9090
# Two scrape intervals of the scenario's 2 s, and the scrape's own timeout, with room.
SCRAPES_S = 30.0


@pytest.fixture(scope="module")
def prometheus(mesh: Mesh) -> str:
    assert mesh.monitoring_host, "the mesh scenario names a fleet_monitoring_host"
    return f"http://{mesh[mesh.monitoring_host].address}:{PROMETHEUS_PORT}"


def api(prometheus: str, endpoint: str, **params: str) -> Any:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{prometheus}/api/v1/{endpoint}{query}", timeout=5) as reply:
        answer = json.load(reply)
    assert answer["status"] == "success", answer
    return answer["data"]


def targets(prometheus: str) -> dict[tuple[str, str, str], str]:
    """(job, box, role or '') -> health of every active target."""
    return {(t["labels"]["job"], t["labels"]["box"], t["labels"].get("role", "")): t["health"]
            for t in api(prometheus, "targets")["activeTargets"]}


def expected_targets(mesh: Mesh) -> set[tuple[str, str, str]]:
    """Every box's gateway and every gear the plan runs."""
    expected = {("lobes-gateway", name, "") for name in mesh.boxes}
    expected |= {("lobes-gear", name, role) for name, box in mesh.boxes.items()
                 for role, spec in box.plan["roles"].items() if spec["gear"]}
    return expected


def test_every_gateway_and_every_gear_of_the_mesh_is_scraped(mesh: Mesh, prometheus: str) -> None:
    expected = expected_targets(mesh)
    assert {key[0] for key in expected} == {"lobes-gateway", "lobes-gear"}
    wait_until(lambda: targets(prometheus) == dict.fromkeys(expected, "up"),
               message="every gateway and gear target up", timeout=SCRAPES_S, interval=0.5)
    # The gears' own series (the simulator's vLLM names) come from every box, by role.
    running = api(prometheus, "query", query="vllm:num_requests_running")["result"]
    assert {(s["metric"]["box"], s["metric"]["role"]) for s in running} == {
        (box, role) for job, box, role in expected if job == "lobes-gear"}


def test_the_gateways_report_their_own_version(mesh: Mesh, prometheus: str) -> None:
    versions = {name: call(box.origin, "GET", "/health", timeout=5.0).json()["version"]
                for name, box in mesh.boxes.items()}
    built = api(prometheus, "query", query="lobes_gateway_build_info")["result"]
    assert {s["metric"]["box"]: s["metric"]["version"] for s in built} == versions


def test_the_shipped_rules_are_loaded_and_evaluate(prometheus: str) -> None:
    rules = [(group["name"], rule["health"]) for group in api(prometheus, "rules")["groups"]
             for rule in group["rules"]]
    assert rules and set(rules) == {("lobes-fleet", "ok")}


def _alerts(prometheus: str, box: str) -> set[str]:
    return {alert["labels"]["alertname"] for alert in api(prometheus, "alerts")["alerts"]
            if alert["labels"].get("box") == box}


def test_a_partitioned_box_is_its_gateway_down_not_each_gear(mesh: Mesh, prometheus: str) -> None:
    thor, orin = mesh["agx-thor"], mesh["agx-orin"]
    thors = {key for key in expected_targets(mesh) if key[1] == thor.name}
    with partitioned(thor):
        wait_until(lambda: {key: health for key, health in targets(prometheus).items()
                            if key[1] == thor.name} == dict.fromkeys(thors, "down"),
                   message="the Thor's gateway and gears down", timeout=SCRAPES_S, interval=0.5)
        wait_until(lambda: "LobesGatewayDown" in _alerts(prometheus, thor.name),
                   message="LobesGatewayDown pending for the Thor", timeout=SCRAPES_S,
                   interval=0.5)
        assert "LobesGearDown" not in _alerts(prometheus, thor.name)
    wait_until(lambda: targets(prometheus) == dict.fromkeys(expected_targets(mesh), "up"),
               message="every target up again", timeout=SCRAPES_S, interval=0.5)
    # The replays after this one find the Orin's pool whole again.
    wait_until(lambda: all(row["ready"] for row in orin.advertised("cortex")["replicas"]),
               message="the Orin's cortex replicas ready again",
               timeout=ONE_PROBE_INTERVAL_S * 2, interval=0.2)
