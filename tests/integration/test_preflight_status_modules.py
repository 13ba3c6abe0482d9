"""preflight and mesh_status through ansible, on this machine (no GPU, no Docker)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import lobes_processes
import pytest

from tests.support.ports import dead_origin, free_port
from tests.support.wait import wait_until

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


def _preflight_ports(ports: list, deploy_dir) -> dict:
    args = {"hardware": "sim", "runtime": "process", "ports": ports,
            "deploy_dirs": [str(deploy_dir)]}
    return ansible_module("lobes.fleet.preflight", json.dumps(args))


def _listener(cwd) -> tuple[subprocess.Popen, int]:
    """A program listening on a free port, started from `cwd`."""
    port = free_port()
    program = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                                "127.0.0.1"], cwd=cwd, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    wait_until(lambda: lobes_processes.port_holders(port, "127.0.0.1")[0], timeout=20,
               message="the program to listen")
    return program, port


def test_preflight_names_a_program_that_holds_a_port_and_accepts_the_deployments_own(tmp_path):
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    stranger, taken = _listener(tmp_path)
    own, ours = _listener(deploy)
    try:
        result = _preflight_ports([
            {"port": taken, "address": "0.0.0.0", "service": "gateway",
             "field": "fleet_gateway_port"},
            {"port": ours, "address": "127.0.0.1", "service": "gear-cortex",
             "field": "fleet_gear_port_base"}], deploy)
    finally:
        for program in (stranger, own):
            program.terminate()
            program.wait()
    assert result["failed"] is True
    assert result["msg"] == (
        f"preflight failed: port {taken} (gateway) is held by pid {stranger.pid} "
        f"({sys.executable} -m http.server {taken} --bind 127.0.0.1), not by this deployment; "
        "stop it, or move the port (fleet_gateway_port)")


def test_preflight_refuses_a_bind_address_the_box_does_not_have(tmp_path):
    result = _preflight_ports([{"port": free_port(), "address": "192.0.2.1",
                                "service": "gateway", "field": "fleet_gateway_port"}], tmp_path)
    assert result["failed"] is True
    assert ("gateway binds 192.0.2.1 (fleet_gateway_host), which is not an address of this box"
            in result["msg"])


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
