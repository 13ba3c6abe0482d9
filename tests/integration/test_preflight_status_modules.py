"""preflight and mesh_status through ansible, on this machine (no GPU, no Docker)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.support.ports import dead_origin

from .conftest import ansible_module


def test_preflight_on_a_sim_box_reports_facts():
    result = ansible_module("lobes.fleet.preflight", "hardware=sim runtime=process")

    facts = result["ansible_facts"]["lobes_preflight"]
    assert result.get("failed") is not True, result
    assert facts["memory_gib"] > 0
    assert facts["python_version"].startswith("3.")


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU")
def test_preflight_refuses_a_gpu_profile_on_a_box_without_one_naming_the_field():
    result = ansible_module("lobes.fleet.preflight", "hardware=gb10 runtime=process")

    assert result["failed"] is True
    assert "fleet_hardware gb10 expects a GPU (sm_121)" in result["msg"]


def test_preflight_refuses_the_compose_runtime_without_a_docker_engine(tmp_path):
    # Whether or not this machine runs an engine, the module's docker finds none at this socket.
    result = ansible_module("lobes.fleet.preflight", "hardware=sim runtime=compose",
                            env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})

    assert result["failed"] is True
    assert "fleet_runtime compose needs a running Docker Engine" in result["msg"]
    assert "engine: unreachable" in result["msg"]


def test_preflight_refuses_an_unknown_profile_and_a_missing_python():
    unknown = ansible_module("lobes.fleet.preflight", "hardware=tpu runtime=process")
    assert "fleet_hardware 'tpu' is not a hardware profile" in unknown["msg"]

    missing = ansible_module(
        "lobes.fleet.preflight", "hardware=sim runtime=process python=no-such-python3"
    )
    assert "fleet_python 'no-such-python3' does not run on the box" in missing["msg"]


def test_mesh_status_reports_an_unreachable_box_without_failing():
    ghost = dead_origin()
    plan = {
        "boxes": {
            "ghost": {
                "origin": ghost,
                "hardware": {"name": "sim"},
                "roles": {
                    "cortex": {"mode": "serve", "peers": []},
                    "senses": {"mode": "pool", "peers": [
                        {"host": "a", "origin": "http://a:1"},
                        {"host": "b", "origin": "http://b:1"}]},
                    "minor": {"mode": "off", "peers": []},
                },
            }
        }
    }

    result = ansible_module("lobes.fleet.mesh_status", json.dumps({"plan": plan}))

    assert result["changed"] is False
    # A box that does not answer is data, not Ansible's own "unreachable" (which ends the play).
    assert not result.get("unreachable")
    assert "ghost" in result["unreachable_boxes"]
    assert 'color=red3' in result["dot"]
    assert [row["role"] for row in result["rows"]] == ["cortex", "senses"]
    assert result["rows"][1]["where"] == "pooled over a, b"
    assert result["table"][1].split() == ["ghost", "cortex", "here", "-", "-", "-"]
