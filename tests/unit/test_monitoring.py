"""The monitoring box's view of the mesh (module_utils/monitoring.py) and the prometheus_config
module: scrape targets from the plan, keyless, gears only where reachable, promtool-checked
files written only when valid, check mode and idempotence."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from ansible_collections.lobes.fleet.plugins.module_utils import monitoring, schema
from ansible_collections.lobes.fleet.plugins.module_utils.plan import plan_mesh
from ansible_collections.lobes.fleet.plugins.modules import prometheus_config

from tests.support.metrics import PROMTOOL_MISSING
from tests.unit.mesh import seed_mesh
from tests.unit.modules import run_module

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "roles" / "monitoring" / "files" / "lobes-fleet.rules.yml"
SETTINGS = {"scrape_interval": "5s", "evaluation_interval": "10s", "listen_address": "0.0.0.0:9191",
            "retention": "30d", "rule_files": ["rules/lobes-fleet.rules.yml"]}


def _plan(**spark: object) -> dict:
    hostvars = seed_mesh()
    hostvars["spark"].update(spark)
    return plan_mesh(hostvars)


def _addresses(targets: list, job: str) -> dict:
    return {target["address"]: target["labels"] for target in targets if target["job"] == job}


def test_every_gateway_is_scraped_at_its_origin_labelled_by_box() -> None:
    targets = monitoring.scrape_targets(_plan())
    assert _addresses(targets, monitoring.GATEWAY_JOB) == {
        "spark.tail0be7e0.ts.net:8001": {"box": "spark"},
        "orin.tail0be7e0.ts.net:8000": {"box": "orin"},
        "thor.tail0be7e0.ts.net:8000": {"box": "thor"},
    }


@pytest.mark.parametrize("runtime", ["compose", "process"])
def test_every_gear_is_scraped_through_its_box_s_gateway(runtime: str) -> None:
    """Gears listen only inside their box (loopback, or unpublished under compose): each is
    one target at its box's gateway origin, on the path the gateway relays it at."""
    plan = _plan(fleet_runtime=runtime)
    gears = [target for target in monitoring.scrape_targets(plan)
             if target["job"] == monitoring.GEAR_JOB]
    expected = []
    for host, box in sorted(plan["boxes"].items()):
        address = monitoring.origin_address(host, box["origin"])
        expected += [(address, {"box": host, "role": name,
                                "__metrics_path__": f"/metrics/gears/{name}"})
                     for name, role in sorted(box["roles"].items()) if role["gear"]]
    assert expected and [(t["address"], t["labels"]) for t in gears] == expected
    cortex = {"box": "spark", "role": "cortex", "__metrics_path__": "/metrics/gears/cortex"}
    assert ("spark.tail0be7e0.ts.net:8001", cortex) in expected


def test_a_box_without_gears_adds_only_its_gateway() -> None:
    plan = _plan()
    for role in plan["boxes"]["orin"]["roles"].values():
        role["gear"] = None
    targets = monitoring.scrape_targets(plan)
    boxes = {job: {t["labels"]["box"] for t in targets if t["job"] == job}
             for job in (monitoring.GATEWAY_JOB, monitoring.GEAR_JOB)}
    assert "orin" in boxes[monitoring.GATEWAY_JOB]
    assert "orin" not in boxes[monitoring.GEAR_JOB] and "spark" in boxes[monitoring.GEAR_JOB]


def test_an_origin_without_a_port_is_scraped_on_port_80() -> None:
    config = monitoring.prometheus_config(_plan(fleet_origin="http://spark.example"), SETTINGS)
    static = config["scrape_configs"][0]["static_configs"]
    assert {"targets": ["spark.example:80"], "labels": {"box": "spark"}} in static


def test_an_ipv6_origin_is_scraped_at_its_address_in_brackets() -> None:
    config = monitoring.prometheus_config(
        _plan(fleet_origin="http://[fd7a:115c:a1e0::11]:8001"), SETTINGS)
    static = config["scrape_configs"][0]["static_configs"]
    assert {"targets": ["[fd7a:115c:a1e0::11]:8001"], "labels": {"box": "spark"}} in static


def test_an_origin_with_a_path_is_refused_naming_host_and_field() -> None:
    with pytest.raises(monitoring.MonitoringError, match=r"host spark, field fleet_origin"):
        monitoring.origin_address("spark", "http://spark:8000/v1")


def test_the_config_has_no_credentials_though_boxes_are_gated() -> None:
    plan = _plan()
    assert plan["boxes"]["spark"]["gateway"]["auth"] and plan["boxes"]["orin"]["gateway"]["auth"]
    config = monitoring.prometheus_config(plan, SETTINGS)
    text = yaml.safe_dump(config)
    for word in ("authorization", "bearer", "basic_auth", "credentials"):
        assert word not in text.lower()
    assert config["global"] == {"scrape_interval": "5s", "evaluation_interval": "10s"}
    assert config["rule_files"] == ["rules/lobes-fleet.rules.yml"]


def test_the_service_runs_prometheus_from_its_directory_and_watches_its_config() -> None:
    service = monitoring.prometheus_service("/usr/bin/prometheus", SETTINGS)
    assert service["argv"] == ["/usr/bin/prometheus", "--config.file=prometheus.yml",
                               "--storage.tsdb.path=data", "--storage.tsdb.retention.time=30d",
                               "--web.listen-address=0.0.0.0:9191"]
    assert service["watch"] == ["prometheus.yml", "rules/lobes-fleet.rules.yml"]


LISTEN_CASES = [("0.0.0.0:9090", "127.0.0.1:9090"), (":9090", "127.0.0.1:9090"),
                ("[::]:9090", "[::1]:9090"), ("10.0.0.5:9090", "10.0.0.5:9090")]


@pytest.mark.parametrize(("listen", "local"), LISTEN_CASES)
def test_local_address_reaches_the_listener_from_the_box(listen: str, local: str) -> None:
    assert monitoring.local_address(listen) == local


@pytest.mark.parametrize("listen", ["0.0.0.0", "0.0.0.0:99999", "0.0.0.0:0", "bad host:9090",
                                    "0.0.0.0:٩٠٩٠"])
def test_a_listen_address_the_inventory_refuses_is_refused_here_too(listen: str) -> None:
    """The module reads the field with the inventory's own rule (a port out of range passed
    here before), so a value refused at one door is refused at the other."""
    with pytest.raises(schema.Refused):
        schema.ListenAddress().read(listen)
    with pytest.raises(monitoring.MonitoringError,
                       match=r"monitoring_listen_address.*not host:port"):
        monitoring.local_address(listen)


# ---------------------------------------------------------------- the module

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason=PROMTOOL_MISSING)


def _args(dest: Path, rules: str | None = None) -> dict:
    return {"plan": _plan(fleet_runtime="process"), "host": "spark", "dest": str(dest),
            "rules": {"lobes-fleet.rules.yml": rules if rules is not None else RULES.read_text()},
            "promtool": shutil.which("promtool") or "/usr/bin/promtool"}


@needs_promtool
def test_check_mode_validates_reports_a_diff_and_writes_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "monitoring"
    result = run_module(prometheus_config.main, _args(dest), check_mode=True, diff=True)
    assert result["changed"] and result["validated"] and not dest.exists()
    headers = [item["after_header"] for item in result["diff"]]
    assert headers == [str(dest / name) for name in
                       ("prometheus.yml", "rules/lobes-fleet.rules.yml", "services.json")]


@needs_promtool
def test_writes_then_is_idempotent(tmp_path: Path) -> None:
    dest = tmp_path / "monitoring"
    first = run_module(prometheus_config.main, _args(dest))
    assert first["changed"] and first["local_url"] == "http://127.0.0.1:9090"
    config = yaml.safe_load((dest / "prometheus.yml").read_text())
    assert [job["job_name"] for job in config["scrape_configs"]] == ["lobes-gateway", "lobes-gear"]
    again = run_module(prometheus_config.main, _args(dest))
    assert not again["changed"] and not again["validated"]
    assert [item["changed"] for item in again["files"]] == [False, False, False]


@needs_promtool
def test_rules_promtool_refuses_are_not_written(tmp_path: Path) -> None:
    dest = tmp_path / "monitoring"
    run_module(prometheus_config.main, _args(dest))
    before = (dest / "rules" / "lobes-fleet.rules.yml").read_text()
    broken = "groups:\n  - name: x\n    rules:\n      - alert: Broken\n        expr: up ==\n"
    result = run_module(prometheus_config.main, _args(dest, broken))
    assert result["failed"] and "nothing was written" in result["msg"]
    assert (dest / "rules" / "lobes-fleet.rules.yml").read_text() == before
