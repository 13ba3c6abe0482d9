"""GET /metrics on a real gateway: known traffic counted exactly, parsed by prometheus_client's
parser, checked by promtool, label values bounded whatever model names callers send."""

from __future__ import annotations

import json
import os
import threading

import pytest

from tests.gateway.test_pressure_strict import wait_mode, wait_pressure, write_proc
from tests.support.client import call, chat, sse_events
from tests.support.gateway_proc import start_gateway
from tests.support.metrics import PROMTOOL, PROMTOOL_MISSING, Scrape
from tests.support.sim_proc import start_sim
from tests.support.wait import wait_until

KEY = "sk-metrics-gate"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"role": "cortex", "lane": "chat", "route_reason": "none"}


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    root = tmp_path_factory.mktemp("proc")
    write_proc(root, 10)
    with start_sim("instant", served_name="primary-served") as primary, \
            start_sim("instant", served_name="fb-served") as fallback:
        env = {"PRIMARY_BASE_URL": primary.url, "PRIMARY_SERVED_NAME": "primary-served",
               "FALLBACK_URL": fallback.url, "FALLBACK_SERVED_NAME": "fb-served",
               "GATEWAY_API_KEY": KEY, "GATEWAY_UPSTREAM_TIMEOUT_S": "2",
               "LOBES_PROC_ROOT": str(root), "LOBES_PRESSURE_SAMPLE_S": "0.02"}
        with start_gateway(env) as gateway:
            yield gateway, primary, fallback, root


@pytest.fixture
def gateway(box):
    gateway, primary, fallback, _ = box
    primary.set_faults({})
    fallback.set_faults({})
    return gateway


def delta(before: Scrape, after: Scrape, name: str, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


def usage_tokens(reply) -> int:
    """completion_tokens of a JSON answer, or of a stream's usage chunk."""
    if reply.headers["content-type"].startswith("text/event-stream"):
        chunks = [json.loads(e) for e in sse_events(reply.body) if e != "[DONE]"]
        return sum((c.get("usage") or {}).get("completion_tokens", 0) for c in chunks)
    return reply.json()["usage"]["completion_tokens"]


def test_known_traffic_is_counted_exactly(gateway):
    before = Scrape.of(gateway.url)
    replies = [chat(gateway.url, {"model": "main"}, AUTH) for _ in range(3)]
    replies += [chat(gateway.url, {"model": "main", "stream": True,
                                   "stream_options": {"include_usage": True}}, AUTH)
                for _ in range(2)]
    assert [r.status for r in replies] == [200] * 5
    assert call(gateway.url, "POST", "/v1/chat/completions", b"{not json", AUTH).status == 400
    assert chat(gateway.url, {"model": "main"}, {"Authorization": "Bearer wrong"}).status == 401
    not_wired = call(gateway.url, "POST", "/v1/embeddings", {"input": "x"}, AUTH)
    assert not_wired.status == 503
    after = Scrape.of(gateway.url)

    requests = "lobes_gateway_requests_total"
    assert delta(before, after, requests, **CHAT, code="200") == 5
    assert delta(before, after, requests, role="none", lane="chat", code="400") == 1
    assert delta(before, after, requests, role="none", lane="chat", code="401") == 1
    assert delta(before, after, requests, role="embedder", lane="embeddings", code="503") == 1
    assert delta(before, after, requests, role="none", lane="metrics", code="200") == 1
    for histogram in ("lobes_gateway_request_duration_seconds",
                      "lobes_gateway_time_to_first_byte_seconds"):
        assert delta(before, after, f"{histogram}_count", role="cortex", lane="chat") == 5
    assert delta(before, after, "lobes_gateway_upstream_attempts_total",
                 target="cortex", outcome="answered") == 5
    assert delta(before, after, "lobes_gateway_upstream_attempts_total",
                 target="fallback") == 0
    assert delta(before, after, "lobes_gateway_completion_tokens_total",
                 role="cortex", replica="cortex") == sum(usage_tokens(r) for r in replies)
    assert after.value("lobes_gateway_in_flight_requests", role="cortex") == 0
    assert after.content_type.startswith("text/plain; version=0.0.4")


def test_an_answer_too_large_to_hold_still_counts_its_tokens(gateway):
    """Over 256 KiB a JSON answer is relayed as it comes, not held; its usage (at its end) is
    still counted, as it teaches a pool replica's rate."""
    before = Scrape.of(gateway.url)
    reply = chat(gateway.url, {"model": "main", "max_tokens": 60_000, "ignore_eos": True}, AUTH)
    after = Scrape.of(gateway.url)
    assert reply.status == 200
    assert len(reply.body) > 256 * 1024
    assert reply.json()["usage"]["completion_tokens"] == 60_000
    assert delta(before, after, "lobes_gateway_completion_tokens_total",
                 role="cortex", replica="cortex") == 60_000


def test_histograms_are_cumulative_and_end_in_their_count(gateway):
    chat(gateway.url, {"model": "main"}, AUTH)
    scrape = Scrape.of(gateway.url)
    name = "lobes_gateway_request_duration_seconds"
    buckets = [(labels["le"], value) for sample, labels, value in scrape.samples
               if sample == f"{name}_bucket" and labels["role"] == "cortex"
               and labels["lane"] == "chat"]
    assert [le for le, _ in buckets][:2] == ["0.001", "0.0025"]
    assert [le for le, _ in buckets][-2:] == ["300.0", "+Inf"]
    counts = [value for _, value in buckets]
    assert counts == sorted(counts)
    assert counts[-1] == scrape.value(f"{name}_count", role="cortex", lane="chat") > 0


def test_the_exposition_passes_promtool(gateway):
    chat(gateway.url, {"model": "main"}, AUTH)
    scrape = Scrape.of(gateway.url)
    names = {name for name, _, _ in scrape.samples}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds",
            "process_start_time_seconds", "lobes_gateway_pressure_swap_used_ratio"} <= names
    if PROMTOOL is None:
        pytest.skip(PROMTOOL_MISSING)
    assert scrape.promtool_problems() == ""


@pytest.mark.parametrize(("fault", "outcome"), [({"refuse": True}, "unreachable"),
                                                ({"error_status": 503}, "server_error")])
def test_a_failover_is_counted_on_the_target_it_left(box, gateway, fault, outcome):
    _, primary, _, _ = box
    chat(gateway.url, {"model": "main"}, AUTH)  # a pooled connection to the primary
    primary.set_faults(fault)
    before = Scrape.of(gateway.url)
    reply = chat(gateway.url, {"model": "main"}, AUTH)
    after = Scrape.of(gateway.url)
    assert reply.status == 200
    attempts, failovers = ("lobes_gateway_upstream_attempts_total",
                           "lobes_gateway_upstream_failovers_total")
    assert delta(before, after, attempts, target="cortex", outcome=outcome) == 1
    assert delta(before, after, failovers, target="cortex", outcome=outcome) == 1
    assert delta(before, after, attempts, target="fallback", outcome="answered") == 1
    assert delta(before, after, failovers) == 1
    assert delta(before, after, "lobes_gateway_requests_total", **CHAT, code="200") == 1
    assert delta(before, after, "lobes_gateway_completion_tokens_total",
                 role="cortex", replica="fallback") == usage_tokens(reply)


def test_a_request_shed_by_pressure_is_counted(box, gateway):
    _, _, _, root = box
    write_proc(root, 80)
    try:
        wait_mode(gateway, "busy")
        before = Scrape.of(gateway.url)
        assert chat(gateway.url, {"model": "main"}, AUTH).status == 429
        after = Scrape.of(gateway.url)
    finally:
        write_proc(root, 10)
        wait_mode(gateway, "warm")
    assert delta(before, after, "lobes_gateway_shed_requests_total", reason="pressure") == 1
    assert delta(before, after, "lobes_gateway_requests_total", **CHAT, code="429") == 1
    assert delta(before, after, "lobes_gateway_upstream_attempts_total") == 0
    assert after.value("lobes_gateway_pressure_shedding") == 1
    assert after.value("lobes_gateway_pressure_swap_used_ratio") == pytest.approx(0.8)


def test_a_request_shed_for_memory_is_counted_under_its_own_reason(box, gateway):
    _, _, _, root = box
    before = Scrape.of(gateway.url)
    assert before.value("lobes_gateway_shed_requests_total", reason="memory") == 0  # from zero
    write_proc(root, 10, mem_available_percent=3.0, psi_full=12.5)
    try:
        # Both readings sampled (write_proc replaces the files one after another, so a sample
        # between them is already busy on MemAvailable alone, without the PSI line).
        wait_pressure(gateway, "busy on both memory readings",
                      lambda block: block["mode"] == "busy"
                      and block["pressure"]["psi_memory_full_avg10"] == 12.5)
        assert chat(gateway.url, {"model": "main"}, AUTH).status == 429
        after = Scrape.of(gateway.url)
    finally:
        write_proc(root, 10)
        wait_mode(gateway, "warm")
    assert delta(before, after, "lobes_gateway_shed_requests_total", reason="memory") == 1
    assert delta(before, after, "lobes_gateway_shed_requests_total", reason="pressure") == 0
    assert after.value("lobes_gateway_pressure_mem_available_ratio") == pytest.approx(0.03)
    assert after.value("lobes_gateway_pressure_psi_memory_full_avg10") == pytest.approx(12.5)
    assert after.value("lobes_gateway_pressure_memavailable_degraded_threshold_ratio") == \
        pytest.approx(0.05)


def test_distinct_unknown_model_names_add_no_series(gateway):
    chat(gateway.url, {"model": "main"}, AUTH)
    Scrape.of(gateway.url)  # the scrapes' own series exist from here on
    before = Scrape.of(gateway.url)
    for n in range(40):
        assert chat(gateway.url, {"model": f"caller-model-{n}"}, AUTH).status == 200
    after = Scrape.of(gateway.url)
    assert after.series() == before.series()
    assert "caller-model" not in after.text
    assert delta(before, after, "lobes_gateway_requests_total", **CHAT, code="200") == 40


def test_the_key_in_flight_limit_is_a_counted_shed():
    with start_sim("instant") as sim:
        env = {"PRIMARY_BASE_URL": sim.url, "PRIMARY_SERVED_NAME": "sim-instant",
               "GATEWAY_API_KEY": KEY, "GATEWAY_MAX_INFLIGHT_PER_KEY": "1"}
        with start_gateway(env) as gateway:
            sim.set_faults({"hang_s": 3})
            held = threading.Thread(target=chat, args=(gateway.url, {"model": "main"}, AUTH))
            held.start()
            wait_until(lambda: Scrape.of(gateway.url).value(
                "lobes_gateway_in_flight_requests", role="cortex") == 1,
                message="the held request in flight")
            assert chat(gateway.url, {"model": "main"}, AUTH).status == 429
            scrape = Scrape.of(gateway.url)
            held.join()
    assert scrape.value("lobes_gateway_shed_requests_total", reason="key_in_flight_limit") == 1
    assert scrape.value("lobes_gateway_requests_total", role="none", code="429") == 1


def test_a_gear_s_own_metrics_are_relayed_keyless(box, gateway):
    """/metrics/gears/<role> is the box's own gear's /metrics, fetched now (a Prometheus on
    another box scrapes gears that listen only inside this one)."""
    _, primary, _, _ = box
    chat(gateway.url, {"model": "main"}, AUTH)
    relayed = call(gateway.url, "GET", "/metrics/gears/cortex")
    direct = call(primary.url, "GET", "/metrics")
    assert relayed.status == 200
    assert relayed.headers["content-type"].startswith("text/plain")
    relayed_counts = [line for line in relayed.body.decode().splitlines()
                      if line.startswith("vllm:request_success_total")]
    assert relayed_counts
    assert relayed_counts == [line for line in direct.body.decode().splitlines()
                              if line.startswith("vllm:request_success_total")]


def test_gear_metrics_of_a_role_without_a_gear_here_is_a_404_naming_those_with_one(gateway):
    reply = call(gateway.url, "GET", "/metrics/gears/embedder")
    assert reply.status == 404
    assert reply.error["code"] == "not_found"
    assert "embedder" in reply.error["message"]
    assert "cortex" in reply.error["message"]


def test_gear_metrics_of_a_gear_that_is_down_is_a_502_naming_it(box, gateway):
    _, primary, _, _ = box
    primary.set_faults({"refuse": True})
    reply = call(gateway.url, "GET", "/metrics/gears/cortex")
    assert reply.status == 502
    assert b"gear cortex" in reply.body and primary.url.encode() in reply.body


def _started_per_proc(pid: int) -> float:
    """A process's start time from /proc, computed here independently of the gateway."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        ticks = int(fh.read().split(") ", 1)[1].split()[19])
    with open("/proc/stat", encoding="ascii") as fh:
        boot = next(int(line.split()[1]) for line in fh if line.startswith("btime"))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def test_process_start_time_is_the_process_s_own_from_proc(gateway):
    """Not the moment the gateway object was built: that comes after seconds of imports on a
    loaded host, and a restart seen by Prometheus must match the process's own start."""
    started = Scrape.of(gateway.url).value("process_start_time_seconds")
    assert started == pytest.approx(_started_per_proc(gateway.pid), abs=0.011)
