"""Free memory from meminfo, the memory gate's refusal with its numbers, and which gears hold
the box's memory (the rule the gate and the rendered gateway both count by)."""

from __future__ import annotations

import pytest
from ansible_collections.lobes.fleet.plugins.module_utils.engines import SIM, VLLM, VLLM_CPU
from ansible_collections.lobes.fleet.plugins.module_utils.memory import (
    headroom,
    parse_meminfo,
    refusal,
)
from ansible_collections.lobes.fleet.plugins.module_utils.plan import (
    holds_memory,
    memory_gated,
    plan_mesh,
)
from ansible_collections.lobes.fleet.plugins.modules import memory_gate

from tests.support.ports import free_port
from tests.unit.modules import run_module

MEMINFO = """\
MemTotal:       125829120 kB
MemFree:         20971520 kB
MemAvailable:    52428800 kB
Cached:          31457280 kB
Shmem:            1048576 kB
SReclaimable:     2097152 kB
SwapTotal:       16777216 kB
SwapFree:        15728640 kB
"""


def test_meminfo_reads_available_page_cache_and_swap_in_gib():
    reading = parse_meminfo(MEMINFO)
    assert reading.as_dict() == {"total_gib": 120.0, "available_gib": 50.0,
                                 "page_cache_gib": 31.0, "swap_free_gib": 15.0}


def test_gears_that_fit_are_let_through_at_exactly_the_available_memory():
    assert refusal("spark", parse_meminfo(MEMINFO), {"vllm-cortex": 38.4, "vllm-senses": 11.6}) \
        is None


def test_gears_that_do_not_fit_are_refused_naming_host_gears_and_numbers():
    message = refusal("spark", parse_meminfo(MEMINFO), {"vllm-cortex": 38.4, "vllm-senses": 17.9})
    assert message.startswith("host spark: the gears to start, vllm-cortex (38.4 GiB), "
                              "vllm-senses (17.9 GiB), need 56.3 GiB but 50.0 GiB is available")
    assert "page cache 31.0 GiB, swap free 15.0 GiB" in message
    assert "fleet_drop_caches_before_start" in message


def test_headroom_names_each_gear_its_share_and_whether_it_runs():
    line = headroom(parse_meminfo(MEMINFO), [("vllm-cortex", 38.4, True),
                                             ("vllm-senses", 17.92, False)])
    assert line == ("50.0 of 120.0 GiB available (page cache 31.0, swap free 15.0); gears' "
                    "shares 56.3 GiB: vllm-cortex 38.4 running, vllm-senses 17.9 stopped")


def test_headroom_of_simulated_gears_says_whose_budget_the_shares_are():
    line = headroom(parse_meminfo(MEMINFO), [("sim-cortex", 71.7, True)],
                    "the NVIDIA DGX Spark (GB10, 128 GB unified) they stand in for")
    assert line.endswith("gears' shares 71.7 GiB: sim-cortex 71.7 running (simulated gears: the "
                         "shares are budgeted for the NVIDIA DGX Spark (GB10, 128 GB unified) "
                         "they stand in for and hold none of this machine's 120.0 GiB)")


@pytest.mark.parametrize(("hardware", "fake_proc", "gated"), [
    ({"has_gpu": True}, False, True),
    ({"has_gpu": False}, True, True),
    ({"has_gpu": False}, False, False),
    (None, False, False),  # a hand-written plan without hardware has no GPU
    (None, True, True),
])
def test_a_box_is_gated_with_a_gpu_or_a_fake_proc(hardware, fake_proc, gated):
    assert memory_gated({"hardware": hardware}, fake_proc) is gated
    assert memory_gated({}, fake_proc) is fake_proc


@pytest.mark.parametrize(("engine", "gated", "holds"), [
    (SIM, True, True),
    (VLLM, True, True),
    (VLLM_CPU, True, True),
    (SIM, False, False),  # simulated gears on a box without a GPU hold none of its memory
    (VLLM, False, False),
    (VLLM_CPU, False, True),  # vLLM's CPU build holds its KV cache on any box
])
def test_a_gear_holds_the_box_memory_on_a_gated_box_or_on_the_cpu_build(engine, gated, holds):
    assert holds_memory({"engine": engine, "memory_gib": 8.0}, gated) is holds


def without_hardware(plan: dict, how: str) -> dict:
    """The box plan with its hardware profile null or left out, as a hand-written plan has it;
    every gear on a port nothing answers, so each reads as one to start."""
    if how == "null":
        plan["hardware"] = None
    else:
        del plan["hardware"]
    for role in plan["roles"].values():
        role["gear"]["port"] = free_port()
    return plan


def gate_box(roles: dict, how: str, tmp_path) -> dict:
    """memory_gate's result, against this machine's /proc, for a process box without a GPU
    whose plan names no hardware profile."""
    hostvars = {"fleet_hardware": "sim", "fleet_runtime": "process",
                "fleet_gateway_host": "127.0.0.1", "fleet_roles": roles}
    plan = without_hardware(plan_mesh({"box": hostvars})["boxes"]["box"], how)
    return run_module(memory_gate.main, {"plan": plan, "deploy_dir": str(tmp_path),
                                         "enforce": False})


@pytest.mark.parametrize("how", ["null", "absent"])
def test_simulated_gears_of_a_plan_without_hardware_are_not_gated(how, tmp_path):
    result = gate_box({"cortex": {}}, how, tmp_path)
    assert result.get("failed") is not True, result
    assert result["gated"] is False and result["refusal"] is None
    assert result["to_start"] == [] and [gear["name"] for gear in result["gears"]] == [
        "gear-cortex"]
    # No profile, so no box the simulated gears stand in for.
    assert "stand in for" not in result["headroom"] and "simulated" not in result["headroom"]


@pytest.mark.parametrize("how", ["null", "absent"])
def test_a_cpu_engine_gear_of_a_plan_without_hardware_is_gated(how, tmp_path):
    roles = {"cortex": {"engine": "vllm-cpu", "checkpoint": "lobes/tiny-chat", "context": 2048,
                        "kv_cache_gib": 2}}
    result = gate_box(roles, how, tmp_path)
    assert result.get("failed") is not True, result
    assert result["gated"] is True and result["to_start"] == ["gear-cortex"]
    assert result["need_gib"] > 2
    assert "stand in for" not in result["headroom"]
