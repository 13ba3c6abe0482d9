"""lobes.fleet.memory_gate through ansible, against a fake /proc in which real simulated gears
hold their memory shares while they run (issue 15): the gate refuses, naming the gears and the
numbers, the gears whose shares are not free, and counts a running gear's share as held."""

from __future__ import annotations

import json

import pytest
from ansible_collections.lobes.fleet.plugins.module_utils.plan import plan_mesh

from tests.support.sim_proc import start_sim
from tests.support.wait import wait_until

from .conftest import ansible_module

GIB = 1024 * 1024


def write_meminfo(proc, available_gib: float) -> None:
    proc.mkdir(exist_ok=True)
    (proc / "meminfo").write_text(
        f"MemTotal:       {128 * GIB} kB\nMemFree:        {int(available_gib * GIB)} kB\n"
        f"MemAvailable:   {int(available_gib * GIB)} kB\nCached:         {2 * GIB} kB\n"
        f"SwapTotal:      0 kB\nSwapFree:       0 kB\n")


def available_gib(proc) -> float:
    for line in (proc / "meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return round(int(line.split()[1]) / GIB, 2)
    raise AssertionError("no MemAvailable")


@pytest.fixture
def box(tmp_path):
    """A Spark (0.30 cortex, 0.14 senses of 128 GiB) whose /proc is tmp_path/proc."""
    proc = tmp_path / "proc"
    hostvars = {"fleet_hardware": "gb10", "fleet_runtime": "process", "fleet_proc_root": str(proc),
                "fleet_gateway_host": "127.0.0.1",
                "fleet_roles": {"cortex": {"context": 131072, "gpu_memory_utilization": 0.30},
                                "senses": {"gpu_memory_utilization": 0.14}}}
    return proc, plan_mesh({"spark": hostvars})["boxes"]["spark"], tmp_path


def gate(plan: dict, deploy_dir) -> dict:
    args = json.dumps({"plan": plan, "deploy_dir": str(deploy_dir),
                       "proc_root": plan["proc_root"] or "/proc"})
    return ansible_module("lobes.fleet.memory_gate", args)


def with_ports(plan: dict, cortex_port: int, senses_port: int) -> dict:
    plan["roles"]["cortex"]["gear"]["port"] = cortex_port
    plan["roles"]["senses"]["gear"]["port"] = senses_port
    return plan


def test_gears_whose_shares_are_not_free_are_refused_with_the_numbers(box):
    proc, plan, deploy = box
    write_meminfo(proc, 50.0)
    result = gate(plan, deploy)
    assert result["failed"] is True
    assert result["msg"].startswith(
        "host spark: the gears to start, gear-cortex (38.4 GiB), gear-senses (17.9 GiB), ")
    assert "need 56.3 GiB but 50.0 GiB is available now" in result["msg"]
    assert result["to_start"] == ["gear-cortex", "gear-senses"]


def test_a_running_gear_holds_its_share_and_only_the_others_must_fit(box):
    proc, plan, deploy = box
    write_meminfo(proc, 60.0)
    share = plan["roles"]["cortex"]["gear"]["memory_gib"]
    with start_sim("spark-cortex", time_scale=20,
                   extra_args=["--proc-root", str(proc), "--hold-memory-gib", str(share)]) as sim:
        assert available_gib(proc) == round(60.0 - share, 2)
        result = gate(with_ports(plan, sim.port, 1), deploy)
        # 21.6 GiB left for senses' 17.92: it fits, and cortex already runs.
        assert result.get("failed") is not True, result
        assert result["to_start"] == ["gear-senses"] and result["need_gib"] == 17.92
        assert [(gear["name"], gear["running"]) for gear in result["gears"]] == [
            ("gear-cortex", True), ("gear-senses", False)]
        write_meminfo(proc, 60.0 - share - 5.0)
        refused = gate(with_ports(plan, sim.port, 1), deploy)
        assert refused["failed"] is True and "the gears to start, gear-senses (17.9 GiB)" in \
            refused["msg"]
    wait_until(lambda: available_gib(proc) == round(55.0, 2),
               message="the stopped gear gives its share back")


def test_a_box_without_a_gpu_on_the_real_proc_is_not_gated(tmp_path):
    plan = plan_mesh({"local": {"fleet_hardware": "sim", "fleet_runtime": "process",
                                "fleet_gateway_host": "127.0.0.1",
                                "fleet_roles": {"cortex": {}}}})["boxes"]["local"]
    result = gate(plan, tmp_path)
    assert result.get("failed") is not True and result["gated"] is False
    # The shares are the Spark's budget, not this machine's memory: the line says so.
    assert result["headroom"].endswith(
        "(simulated gears: the shares are budgeted for the NVIDIA DGX Spark (GB10, 128 GB "
        f"unified) they stand in for and hold none of this machine's "
        f"{result['memory']['total_gib']:.1f} GiB)"), result["headroom"]


def test_a_box_with_a_gpu_says_nothing_of_simulated_gears(box):
    proc, plan, deploy = box
    write_meminfo(proc, 100.0)
    assert "simulated" not in gate(plan, deploy)["headroom"]


def test_a_cpu_engine_gear_is_gated_against_the_real_proc_of_a_box_without_a_gpu(tmp_path):
    """vLLM's CPU build holds real memory: its share is checked against the box's own meminfo
    even where simulated gears beside it are not (no GPU, no fake /proc)."""
    hostvars = {"fleet_hardware": "sim", "fleet_runtime": "process",
                "fleet_gateway_host": "127.0.0.1",
                "fleet_roles": {"cortex": {"engine": "vllm-cpu", "checkpoint": "lobes/tiny-chat",
                                           "context": 2048, "kv_cache_gib": 80},
                                "embedder": {}}}
    plan = plan_mesh({"box": hostvars})["boxes"]["box"]
    result = gate(plan, tmp_path)
    assert result["failed"] is True
    assert result["gated"] is True
    assert result["to_start"] == ["gear-cortex"]
    # More than this machine holds, within the budget of the sim profile's 128 GiB.
    assert result["msg"].startswith("host box: the gears to start, gear-cortex (82.5 GiB), ")
