"""The tailnet compose.yaml golden files are valid Compose and say what the issue asks."""

from __future__ import annotations

import jsonschema
import pytest
import yaml

from tests.unit.compose_spec import compose_spec
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
    assert gateway["command"] == ["python3", "-m", "lobes_gateway"]
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
