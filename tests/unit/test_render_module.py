"""lobes.fleet.render as a module: check mode, diff, idempotence, modes, secrets, errors."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import jsonschema
import pytest
import yaml
from ansible_collections.lobes.fleet.plugins.module_utils.plan import plan_mesh
from ansible_collections.lobes.fleet.plugins.modules import render as render_module

from tests.unit.compose_spec import compose_spec
from tests.unit.mesh import seed_mesh
from tests.unit.modules import run_module

SPARK_KEY = "spark-inbound-secret-1"
ORIN_KEY = "orin-inbound-secret-2"


def orin_args(dest, **secrets) -> dict:
    plan = plan_mesh(seed_mesh())["boxes"]["orin"]
    given = {"gateway_api_key": ORIN_KEY, "peer_keys": {"spark": SPARK_KEY}, **secrets}
    return {"plan": plan, "dest": str(dest), "secrets": given}


def test_check_mode_reports_the_change_writes_nothing_and_masks_secrets(tmp_path):
    dest = tmp_path / "orin"
    result = run_module(render_module.main, orin_args(dest), check_mode=True, diff=True)
    assert result["changed"] is True and not dest.exists()
    text = json.dumps(result)
    assert SPARK_KEY not in text and ORIN_KEY not in text
    env_diff = next(item for item in result["diff"] if item["after_header"].endswith(".env"))
    assert "PRIMARY_PEER_API_KEY=********" in env_diff["after"]
    assert "GATEWAY_API_KEY=********" in env_diff["after"]
    assert "PRIMARY_PEER_ORIGINS=http://spark.tail0be7e0.ts.net:8001," in env_diff["after"]


def test_writes_then_is_idempotent(tmp_path):
    dest = tmp_path / "orin"
    first = run_module(render_module.main, orin_args(dest))
    assert first["changed"] is True
    paths = [item["path"] for item in first["files"]]
    assert paths == [str(dest / ".env"), str(dest / "compose.yaml")]
    assert stat.S_IMODE((dest / ".env").stat().st_mode) == 0o600
    assert f"PRIMARY_PEER_API_KEY={SPARK_KEY}" in (dest / ".env").read_text()
    second = run_module(render_module.main, orin_args(dest), diff=True)
    assert second["changed"] is False and second["diff"] == []


def test_a_changed_plan_diffs_only_the_changed_lines_with_old_secrets_masked(tmp_path):
    dest = tmp_path / "orin"
    run_module(render_module.main, orin_args(dest))
    mesh = seed_mesh()
    mesh["orin"]["fleet_roles"]["cortex"]["rates"] = {"spark": 50.0, "thor": 12.0}
    args = orin_args(dest)
    args["plan"] = plan_mesh(mesh)["boxes"]["orin"]
    result = run_module(render_module.main, args, check_mode=True, diff=True)
    assert [item["path"] for item in result["files"] if item["changed"]] == [str(dest / ".env")]
    (env_diff,) = result["diff"]
    assert "PRIMARY_PEER_RATES=48.9,11.0" in env_diff["before"]
    assert "PRIMARY_PEER_RATES=50.0,12.0" in env_diff["after"]
    assert SPARK_KEY not in json.dumps(result)
    assert "48.9,11.0" in (dest / ".env").read_text()  # check mode wrote nothing


def test_a_mode_drift_is_repaired(tmp_path):
    dest = tmp_path / "orin"
    run_module(render_module.main, orin_args(dest))
    (dest / ".env").chmod(0o644)
    result = run_module(render_module.main, orin_args(dest))
    assert result["changed"] is True
    assert stat.S_IMODE((dest / ".env").stat().st_mode) == 0o600


def test_a_missing_peer_key_fails_naming_host_role_and_field(tmp_path):
    result = run_module(render_module.main, orin_args(tmp_path, peer_keys={}))
    assert result["failed"] is True
    assert "host orin, role cortex, field fleet_gateway_api_key: spark runs an inbound gate" \
        in result["msg"]
    assert not (tmp_path / ".env").exists()


def test_a_missing_own_key_fails_naming_the_variable(tmp_path):
    result = run_module(render_module.main, orin_args(tmp_path, gateway_api_key=""))
    assert "host orin, field fleet_gateway_api_key: the plan needs this key" in result["msg"]


def test_process_runtime_writes_services_json(tmp_path):
    mesh = {"local": {"fleet_hardware": "sim", "fleet_runtime": "process",
                      "fleet_gateway_host": "127.0.0.1", "fleet_gear_port_base": 19100,
                      "fleet_roles": {"cortex": {}, "embedder": {}}}}
    plan = plan_mesh(mesh)["boxes"]["local"]
    result = run_module(render_module.main, {"plan": plan, "dest": str(tmp_path)})
    assert result["services"] == ["gear-cortex", "gear-embedder", "gateway"]
    services = json.loads((tmp_path / "services.json").read_text())["services"]
    assert services[0]["argv"][services[0]["argv"].index("--port") + 1] == "19100"
    env = (tmp_path / ".env").read_text()
    assert "PRIMARY_BASE_URL=http://127.0.0.1:19100" in env
    assert "EMBED_BASE_URL=http://127.0.0.1:19106" in env
    assert "GATEWAY_HOST=127.0.0.1" in env
    assert not (tmp_path / "compose.yaml").exists()


def test_compose_labels_the_gateway_with_its_source_digest(tmp_path):
    source = tmp_path / "gateway" / "lobes_gateway"
    source.mkdir(parents=True)
    (source / "__init__.py").write_text('__version__ = "0.1.0"\n')
    run_module(render_module.main, orin_args(tmp_path))
    first = (tmp_path / "compose.yaml").read_text()
    assert "lobes.fleet.gateway-source:" in first
    jsonschema.validate(yaml.safe_load(first), compose_spec(),
                        cls=jsonschema.Draft201909Validator)
    assert run_module(render_module.main, orin_args(tmp_path))["changed"] is False
    (source / "routing.py").write_text("ROUTES = {}\n")
    result = run_module(render_module.main, orin_args(tmp_path))
    assert [item["changed"] for item in result["files"]] == [False, True]
    assert (tmp_path / "compose.yaml").read_text() != first


SOURCE = Path(__file__).resolve().parents[2] / "gateway"


def sim_compose_args(dest) -> dict:
    """A simulated box on compose: its gears and gateway run from the mounted gateway source."""
    plan = plan_mesh({"box": {
        "fleet_hardware": "sim", "fleet_runtime": "compose", "fleet_gateway_port": 18000,
        "fleet_gateway_api_key": "box-key",
        "fleet_roles": {"cortex": {"sim_profile": "spark-cortex"}, "embedder": {}},
    }})["boxes"]["box"]
    return {"plan": plan, "dest": str(dest), "secrets": {"gateway_api_key": "box-key"}}


def source_labels(dest) -> dict:
    """Each compose service's source label: compose recreates a container whose label changed."""
    services = yaml.safe_load((dest / "compose.yaml").read_text())["services"]
    return {name: service.get("labels", {}).get("lobes.fleet.gateway-source")
            for name, service in services.items()}


# An upgrade of the collection changes some files of the deployed source: the containers that
# run none of them must keep running.
@pytest.mark.parametrize(("changed", "recreated"), [
    ("lobes_model_serve.py", "none"),
    ("lobes_supervisor/census.py", "none"),
    ("lobes_engine/__init__.py", "none"),
    ("lobes_gateway/routing.py", "gateway"),
    ("lobes_sim/cli.py", "gears"),
    ("lobes_contract.py", "all"),
])
def test_compose_recreates_only_the_containers_that_run_the_changed_source(
        tmp_path, changed, recreated):
    shutil.copytree(SOURCE, tmp_path / "gateway", ignore=shutil.ignore_patterns("__pycache__"))
    run_module(render_module.main, sim_compose_args(tmp_path))
    before = source_labels(tmp_path)
    assert before["gateway"] and before["vllm-cortex"]
    with (tmp_path / "gateway" / changed).open("a") as handle:
        handle.write("\n# the upgrade's change\n")
    run_module(render_module.main, sim_compose_args(tmp_path))
    after = source_labels(tmp_path)
    gears = {name for name in before if name != "gateway"}
    expected = {"none": set(), "gateway": {"gateway"}, "gears": gears,
                "all": gears | {"gateway"}}[recreated]
    assert {name for name in before if before[name] != after[name]} == expected
