"""Pressure shedding driven through a fake LOBES_PROC_ROOT, and GATEWAY_FORCE_STRICT_TOOLS."""

import json
import os
import threading
import time

import pytest

from tests.support.client import call, chat, wired
from tests.support.gateway_proc import start_gateway
from tests.support.sim_proc import start_sim
from tests.support.wait import wait_until


def write_proc(root, swap_used_percent: float, iowait: int = 0, other: int = 0,
               mem_available_percent: float = 50.0, psi_full: float | None = None) -> None:
    """Replace meminfo, stat and pressure/memory atomically, so the sampler never reads half a
    file; without psi_full the kernel has no PSI (no pressure/memory file)."""
    free = int(1000 * (100 - swap_used_percent) / 100)
    available = int(100000 * mem_available_percent / 100)
    files = {"meminfo": f"MemTotal: 100000 kB\nMemAvailable: {available} kB\n"
                        f"SwapTotal: 1000 kB\nSwapFree: {free} kB\n",
             "stat": f"cpu  {other} 0 0 0 {iowait} 0 0 0 0 0\n"}
    (root / "pressure").mkdir(exist_ok=True)
    if psi_full is None:
        (root / "pressure" / "memory").unlink(missing_ok=True)
    else:
        files["pressure/memory"] = (f"some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
                                    f"full avg10={psi_full:.2f} avg60=0.00 avg300=0.00 total=0\n")
    for name, text in files.items():
        staged = root / f"{name}.new"
        staged.write_text(text)
        os.replace(staged, root / name)


def wait_pressure(gateway, message: str, holds) -> dict:
    """The /status pressure block once `holds(block)` is true (within 5 s)."""
    def block() -> dict | None:
        current = gateway.get_json("/status")["pressure"]
        return current if holds(current) else None

    return wait_until(block, timeout=5, interval=0.02, message=message)


def wait_mode(gateway, mode: str) -> dict:
    """The /status pressure block once its mode is `mode`."""
    return wait_pressure(gateway, f"pressure mode {mode}", lambda block: block["mode"] == mode)


@pytest.fixture(scope="module")
def pressured(tmp_path_factory):
    root = tmp_path_factory.mktemp("proc")
    write_proc(root, 10)
    with start_sim("instant") as primary, start_sim("instant", served_name="small") as minor:
        env = {**wired(primary), **wired(minor, "MINOR", "small"), "LOBES_PROC_ROOT": str(root),
               "LOBES_PRESSURE_SAMPLE_S": "0.02"}
        with start_gateway(env) as gateway:
            yield gateway, root


@pytest.fixture
def busy(pressured):
    gateway, root = pressured
    write_proc(root, 80)
    assert wait_mode(gateway, "busy")["pressure"]["swap_used_percent"] == 80.0
    yield gateway
    write_proc(root, 10)
    assert wait_mode(gateway, "warm")["mode"] == "warm"


@pytest.mark.parametrize("model", ["main", "cortex", "hard", "senses"])
def test_full_tiers_are_shed_with_429_busy(busy, model):
    reply = chat(busy.url, {"model": model})
    assert reply.status == 429
    assert reply.headers["retry-after"] == "5"
    assert reply.headers["x-lobes-tier-reason"] == "busy"
    assert reply.error == {"type": "server_busy", "code": "busy", "param": None,
                           "message": reply.error["message"]}


def test_minor_is_always_served(busy):
    reply = chat(busy.url, {"model": "minor"})
    assert reply.status == 200
    assert reply.headers["x-lobes-tier"] == "minor"


def test_override_header_bypasses(busy):
    reply = chat(busy.url, {"model": "main"}, {"X-Lobes-Override": "true"})
    assert reply.status == 200
    assert reply.headers["x-lobes-tier"] == "main"
    assert reply.headers["x-lobes-tier-reason"] == "manual_override"


def test_status_reports_the_pressure_block(busy):
    block = busy.get_json("/status")["pressure"]
    assert block["mode"] == "busy" and block["shed"] is True
    assert block["servable_tier"] == "minor" and block["retry_after"] == 5
    assert block["model"] == "small"  # the minor gear's served name
    assert block["reason"] == "pressure"  # swap, not memory: MemAvailable is at 50 %
    assert block["thresholds"]["memavailable_degraded"] == 5.0
    assert block["thresholds"]["psi_memory_full"] == 10.0


def test_threshold_is_strictly_greater(pressured):
    gateway, root = pressured
    write_proc(root, 75)
    sampled = wait_pressure(gateway, "a pressure sample of 75 % swap",
                            lambda block: block["pressure"]["swap_used_percent"] == 75.0)
    assert sampled["mode"] == "warm"
    assert chat(gateway.url, {"model": "main"}).status == 200


def test_iowait_sheds_as_a_delta(pressured):
    gateway, root = pressured
    stop = threading.Event()

    def advance(iowait_share: float) -> None:
        """Keep the jiffies moving like a live /proc/stat, with this share spent in iowait."""
        iowait = other = 0
        while not stop.is_set():
            iowait += int(100 * iowait_share)
            other += 100 - int(100 * iowait_share)
            write_proc(root, 10, iowait=iowait, other=other)
            time.sleep(0.005)  # the tick of a live /proc/stat, not a wait for an event

    for share, mode in ((0.6, "busy"), (0.5, "warm")):
        stop.clear()
        writer = threading.Thread(target=advance, args=(share,))
        writer.start()
        try:
            block = wait_mode(gateway, mode)
            assert block["mode"] == mode, block
            status = chat(gateway.url, {"model": "main"}).status
            assert status == (429 if mode == "busy" else 200)
        finally:
            stop.set()
            writer.join()


@pytest.mark.parametrize(("available", "psi", "mode"), [
    (5.0, None, "warm"),   # MemAvailable exactly at its threshold (5 %): not shed
    (5.1, None, "warm"),   # just above it
    (4.9, None, "busy"),   # just under it
    (50.0, 10.0, "warm"),  # PSI full avg10 exactly at its threshold (10): not shed
    (50.0, 9.9, "warm"),   # just under it
    (50.0, 10.1, "busy"),  # just over it
])
def test_memory_sheds_strictly_past_its_thresholds_with_its_own_reason(
        pressured, available, psi, mode):
    gateway, root = pressured
    write_proc(root, 10, mem_available_percent=available, psi_full=psi)
    block = wait_pressure(
        gateway, f"a sample of MemAvailable {available} % and PSI {psi}",
        lambda block: block["pressure"]["mem_available_percent"] == available
        and block["pressure"]["psi_memory_full_avg10"] == psi)
    assert block["mode"] == mode, block
    reply = chat(gateway.url, {"model": "main"})
    if mode == "warm":
        assert reply.status == 200 and block["reason"] == "none"
    else:
        assert block["reason"] == "memory" and block["shed"] is True
        assert reply.status == 429 and reply.headers["retry-after"] == "5"
        assert reply.headers["x-lobes-tier-reason"] == "memory"
        assert "low available memory" in reply.error["message"]
        assert chat(gateway.url, {"model": "minor"}).status == 200
    write_proc(root, 10)
    wait_mode(gateway, "warm")


def test_embeddings_are_never_shed(busy):
    # No tier: the embed lane ignores pressure (and is not wired here: 503 not 429).
    assert call(busy.url, "POST", "/v1/embeddings", {"input": "x"}).status == 503


TOOLS = [{"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "b", "strict": False,
                                           "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def strict():
    with start_sim("instant") as primary, start_sim("instant", served_name="mm") as senses:
        env = {**wired(primary), **wired(senses, "MULTIMODAL", "mm"),
               "GATEWAY_FORCE_STRICT_TOOLS": "true"}
        with start_gateway(env) as gateway:
            yield gateway, primary, senses


def forwarded(sim) -> list[dict]:
    return [json.loads(r["body"]) for r in sim.requests() if r["method"] == "POST"]


def test_strict_injected_on_primary_chat_and_callers_strict_wins(strict):
    gateway, primary, _ = strict
    primary.clear_requests()
    assert chat(gateway.url, {"model": "main", "tools": TOOLS}).status == 200
    tools = forwarded(primary)[-1]["tools"]
    assert [t["function"].get("strict") for t in tools] == [True, False]


def test_strict_not_injected_elsewhere(strict):
    gateway, primary, senses = strict
    senses.clear_requests()
    primary.clear_requests()
    assert chat(gateway.url, {"model": "senses", "tools": TOOLS}).status == 200
    assert "strict" not in forwarded(senses)[-1]["tools"][0]["function"]
    reply = call(gateway.url, "POST", "/v1/completions",
                 {"model": "main", "prompt": "x", "max_tokens": 2, "tools": TOOLS})
    assert reply.status == 200
    assert "strict" not in forwarded(primary)[-1]["tools"][0]["function"]


def test_compile_failure_retries_once_without_strict(strict):
    gateway, primary, _ = strict
    primary.set_faults({"reject_strict_tools": True})
    primary.clear_requests()
    try:
        reply = chat(gateway.url, {"model": "main", "tools": TOOLS[:1]})
        assert reply.status == 200, reply.body
        first, second = forwarded(primary)
        assert first["tools"][0]["function"]["strict"] is True
        assert "strict" not in second["tools"][0]["function"]
        # A caller's own strict:true is not stripped: its 400 comes back as it is, once.
        primary.clear_requests()
        own = [{"type": "function", "function": {"name": "a", "strict": True}}]
        reply = chat(gateway.url, {"model": "main", "tools": own})
        assert reply.status == 400 and len(forwarded(primary)) == 1
    finally:
        primary.set_faults({})
