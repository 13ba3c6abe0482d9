"""The tailnet compose.yaml golden files are valid Compose and say what the issue asks."""

from __future__ import annotations

import jsonschema
import pytest
import yaml
from ansible_collections.lobes.fleet.plugins.module_utils.plan import plan_mesh
from ansible_collections.lobes.fleet.plugins.module_utils.render import render_compose

from tests.unit.compose_spec import compose_spec
from tests.unit.mesh import seed_mesh
from tests.unit.rendering import GOLDEN

BOXES = ("agx-orin", "agx-thor", "spark")


@pytest.fixture(scope="module")
def validator():
    schema = compose_spec()
    assert schema["$schema"].startswith("http://json-schema.org/draft/2019-09")
    return jsonschema.Draft201909Validator(schema)


def load(box: str) -> dict:
    return yaml.safe_load((GOLDEN / "tailnet" / box / "compose.yaml").read_text())


@pytest.mark.parametrize("box", BOXES)
def test_golden_compose_is_valid_against_the_compose_spec(validator, box):
    errors = sorted(validator.iter_errors(load(box)), key=str)
    assert not errors, "\n".join(error.message for error in errors)


def test_the_validator_rejects_what_compose_rejects(validator):
    broken = load("spark")
    broken["services"]["gateway"]["ports"] = [{"published": "not-a-port", "bogus": 1}]
    assert list(validator.iter_errors(broken))


@pytest.mark.parametrize("box", BOXES)
def test_only_the_gateway_is_published(box):
    services = load(box)["services"]
    assert [name for name, service in services.items() if "ports" in service] == ["gateway"]


def test_the_gateway_runs_the_collections_own_source():
    gateway = load("spark")["services"]["gateway"]
    assert gateway["entrypoint"][-3:] == ["python3", "-m", "lobes_gateway"]
    assert "./gateway:/opt/lobes/gateway:ro" in gateway["volumes"]
    assert gateway["env_file"] == [".env"] and gateway["ports"] == ["0.0.0.0:8001:8001"]
    assert gateway["depends_on"] == ["vllm-cortex", "vllm-embedder", "vllm-reranker",
                                     "vllm-senses"]


def flags(command: list) -> dict:
    return {command[i]: command[i + 1] if i + 1 < len(command) else None
            for i in range(1, len(command)) if command[i].startswith("--")}


def test_spark_cortex_gear_flags():
    cortex = load("spark")["services"]["vllm-cortex"]
    assert cortex["command"][0] == "sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP"
    given = flags(cortex["command"])
    assert given["--served-model-name"] == "sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP"
    assert given["--max-model-len"] == "262144"
    assert given["--gpu-memory-utilization"] == "0.3"
    assert given["--max-num-seqs"] == "2"
    assert given["--quantization"] == "modelopt_fp4"
    assert given["--tool-call-parser"] == "qwen3_coder"
    assert given["--speculative-config"] == '{"method": "mtp", "num_speculative_tokens": 2}'
    assert given["--hf-overrides"] == ('{"rope_scaling": {"factor": 2.0, '
                                       '"original_max_position_embeddings": 131072, '
                                       '"rope_type": "yarn"}}')


def test_thor_cortex_has_yarn_and_no_mtp():
    given = flags(load("agx-thor")["services"]["vllm-cortex"]["command"])
    assert "--speculative-config" not in given
    assert '"factor": 2.0' in given["--hf-overrides"]
    assert given["--gpu-memory-utilization"] == "0.6"


def test_orin_serves_its_associate_as_worker_and_no_cortex_gear():
    services = load("agx-orin")["services"]
    assert sorted(services) == ["gateway", "vllm-worker"]
    command = services["vllm-worker"]["command"]
    assert command[0] == "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"
    assert "--quantization" not in command  # a custom checkpoint: vLLM detects it


@pytest.mark.parametrize("box", BOXES)
def test_every_container_appends_its_output_to_the_boxs_log_directory(box):
    for name, service in load(box)["services"].items():
        assert service["entrypoint"][:5] == ["python3", "-m", "lobes_supervisor.logwrap",
                                             f"/var/log/lobes/{name}.log", "--"], name
        assert "./state/log:/var/log/lobes" in service["volumes"], name


def simulated_spark(engine_field: tuple) -> dict:
    mesh = seed_mesh()
    target = mesh["spark"]
    for key in engine_field[:-1]:
        target = target[key]
    target[engine_field[-1]] = "sim"
    plan = plan_mesh(mesh)["boxes"]["spark"]
    return render_compose(plan, {"gateway": "abc123", "sim": "def456"})["services"]


def test_a_box_switched_to_the_simulator_runs_lobes_sim_in_each_gears_place(validator):
    services = simulated_spark(("fleet_gear_engine",))
    assert not list(validator.iter_errors({"services": services}))
    cortex = services["vllm-cortex"]
    assert cortex["entrypoint"][-3:] == ["python3", "-m", "lobes_sim"]
    assert flags(["sim", *cortex["command"]])["--profile"] == "spark-cortex"
    assert flags(["sim", *cortex["command"]])["--port"] == "8000"
    assert "runtime" not in cortex and cortex["image"] == "python:3.12-slim"
    assert cortex["healthcheck"]["test"][:2] == ["CMD", "python3"]
    # Simulated gears run the mounted source: a change of what they run of it recreates them,
    # as a change of what the gateway runs recreates the gateway.
    assert cortex["labels"] == {"lobes.fleet.gateway-source": "def456"}
    assert services["gateway"]["labels"] == {"lobes.fleet.gateway-source": "abc123"}
    assert [name for name, service in services.items() if "ports" in service] == ["gateway"]


def test_one_role_switched_to_the_simulator_leaves_the_others_on_vllm():
    services = simulated_spark(("fleet_roles", "senses", "engine"))
    assert services["vllm-senses"]["entrypoint"][-1] == "lobes_sim"
    assert services["vllm-cortex"]["entrypoint"][-2:] == ["vllm", "serve"]
    assert services["vllm-cortex"]["runtime"] == "nvidia" and "labels" not in services[
        "vllm-cortex"]


def test_gears_start_largest_first_each_after_the_one_before_is_healthy():
    services = load("spark")["services"]
    chain = [(name, service.get("depends_on")) for name, service in services.items()
             if name.startswith("vllm-")]
    assert chain == [
        ("vllm-cortex", None),  # 0.30 of the box's memory
        ("vllm-senses", {"vllm-cortex": {"condition": "service_healthy"}}),  # 0.14
        ("vllm-embedder", {"vllm-senses": {"condition": "service_healthy"}}),  # 0.06
        ("vllm-reranker", {"vllm-embedder": {"condition": "service_healthy"}}),  # 0.06
    ]
