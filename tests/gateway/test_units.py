"""Pure rooms: pressure sampling and decision, the bearer gate, in-flight limits, strict tools,
learned estimates."""


import pytest
from lobes_gateway.app.dispatch import encode_for, inject_strict, is_compile_failure
from lobes_gateway.app.views import parse_metrics
from lobes_gateway.policy.auth import (
    CLIENT,
    FLEET,
    MAX_KNOWN_AUTHORIZATIONS,
    Caller,
    Gate,
    InflightLimits,
)
from lobes_gateway.policy.config import PressureConfig
from lobes_gateway.policy.estimate import Estimate
from lobes_gateway.policy.pressure import PressureMonitor
from lobes_gateway.transport.http import parse_head
from lobes_gateway.transport.json_body import parse_body


def write_proc(root, swap_total=1000, swap_free=1000, iowait=0, total_other=0):
    (root / "meminfo").write_text(
        f"MemTotal: 100 kB\nSwapTotal: {swap_total} kB\nSwapFree: {swap_free} kB\n")
    (root / "stat").write_text(f"cpu  {total_other} 0 0 0 {iowait} 0 0 0 0 0\ncpu0 1 1 1 1\n")


def monitor(root, **thresholds) -> PressureMonitor:
    return PressureMonitor(PressureConfig(proc_root=str(root), **thresholds))


def test_swap_threshold_is_strictly_greater(tmp_path):
    m = monitor(tmp_path)
    write_proc(tmp_path, swap_total=1000, swap_free=250)  # exactly 75 %
    m.take_sample()
    assert m.sample.swap_used_percent == 75.0 and not m.busy
    write_proc(tmp_path, swap_total=1000, swap_free=249)
    m.take_sample()
    assert m.busy


def test_iowait_is_a_delta_between_samples(tmp_path):
    m = monitor(tmp_path)
    write_proc(tmp_path, iowait=10_000, total_other=0)  # since boot: all iowait
    m.take_sample()
    assert not m.busy  # the first sample only primes the delta
    write_proc(tmp_path, iowait=10_051, total_other=49)  # 51 % of the new jiffies
    m.take_sample()
    assert m.sample.iowait_percent == pytest.approx(51.0) and m.busy
    write_proc(tmp_path, iowait=10_101, total_other=99)  # exactly 50 %
    m.take_sample()
    assert not m.busy


def test_thresholds_come_from_config(tmp_path):
    m = monitor(tmp_path, swap_degraded=10.0)
    write_proc(tmp_path, swap_total=100, swap_free=80)
    m.take_sample()
    assert m.busy


def test_unreadable_proc_means_no_pressure_and_reports_why(tmp_path):
    m = monitor(tmp_path / "missing")
    m.take_sample()
    assert not m.busy and "cannot read" in m.block(None)["error"]


def test_shed_decision(tmp_path):
    m = monitor(tmp_path)
    m.busy = True
    assert m.sheds("main", "main") and m.sheds("muse", "muse") and m.sheds("worker", "worker")
    assert m.sheds("multimodal", "multimodal")
    assert not m.sheds("minor", "minor")
    assert not m.sheds("minor", "main")  # minor is the floor even when it falls up
    m.busy = False
    assert not m.sheds("main", "main")


def test_gate_off_identifies_everyone():
    gate = Gate(None, None)
    assert not gate.enabled
    assert gate.identify(None) == Caller("anonymous")


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", "Basic abc", "Bearer wrong",
                                    "bearer secret2", "Token secret"])
def test_gate_rejects(header):
    assert Gate("secret", None).identify(header) is None


def test_gate_accepts_client_and_fleet_keys():
    gate = Gate("secret", "fleet")
    assert gate.identify("Bearer secret").key_id == CLIENT
    assert gate.identify("bearer  secret").key_id == CLIENT
    assert gate.identify("Bearer fleet").key_id == FLEET


def test_gate_remembers_values_that_identified_a_caller_and_compares_the_rest(monkeypatch):
    gate = Gate("secret", "fleet")
    compared = []
    compare = gate._compared
    monkeypatch.setattr(gate, "_compared", lambda value: compared.append(value) or compare(value))
    for _request in range(3):
        assert gate.identify("Bearer secret").key_id == CLIENT
        assert gate.identify("Bearer wrong") is None
    # The key's value is compared once, then found; a wrong one is compared every time.
    assert compared == ["Bearer secret", "Bearer wrong", "Bearer wrong", "Bearer wrong"]
    for spelling in range(MAX_KNOWN_AUTHORIZATIONS + 10):  # spellings of the key: bounded
        assert gate.identify("Bearer" + " " * (spelling + 1) + "secret").key_id == CLIENT
    assert len(gate._known) == MAX_KNOWN_AUTHORIZATIONS


def test_inflight_limit_counts_client_key_and_exempts_fleet():
    limits = InflightLimits(2)
    client, fleet = Caller(CLIENT), Caller(FLEET)
    assert limits.acquire(client) and limits.acquire(client)
    assert not limits.acquire(client)
    assert all(limits.acquire(fleet) for _ in range(10))
    limits.release(client)
    assert limits.acquire(client)


def test_inflight_limit_zero_is_unlimited():
    limits = InflightLimits(0)
    assert all(limits.acquire(Caller(CLIENT)) for _ in range(100))


def test_inject_strict_respects_the_callers_own_strict():
    payload = {"model": "main", "tools": [
        {"type": "function", "function": {"name": "a", "parameters": {}}},
        {"type": "function", "function": {"name": "b", "strict": False}},
    ]}
    injected = inject_strict(payload)
    assert [t["function"].get("strict") for t in injected["tools"]] == [True, False]
    assert "strict" not in payload["tools"][0]["function"]  # the caller's payload is untouched
    assert inject_strict({"tools": [{"function": {"strict": True}}]}) is None
    assert inject_strict({"tools": []}) is None and inject_strict({}) is None


def test_encode_keeps_the_callers_bytes_and_writes_only_what_changes():
    raw = b'{"model": "served",  "x": 1.50, "s": "\\ud800"}'
    req = parse_head(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
    req.body, req.json = raw, parse_body(raw)
    payload = req.json.payload
    assert encode_for(req, payload, "served") is raw
    # Only the model is written anew: the spacing, 1.50 and the escaped surrogate stay.
    assert encode_for(req, payload, "other") == b'{"model": "other",  "x": 1.50, "s": "\\ud800"}'
    assert encode_for(req, None, "other") is raw


def test_compile_failure_detection():
    assert is_compile_failure(400, b'{"message": "Failed to compile JSON schema grammar"}')
    assert not is_compile_failure(400, b'{"message": "max_tokens too large"}')
    assert not is_compile_failure(500, b"grammar")


def test_parse_metrics_sums_label_sets():
    text = """# HELP vllm:num_requests_running x
vllm:num_requests_running{model_name="a"} 2.0
vllm:num_requests_waiting{model_name="a"} 3.0
vllm:request_success_total{finished_reason="stop",model_name="a"} 5.0
vllm:request_success_total{finished_reason="length",model_name="a"} 1.0
vllm:gpu_cache_usage_perc{model_name="a"} 0.25
other_metric 9
"""
    assert parse_metrics(text) == {"running": 2.0, "waiting": 3.0, "request_success_total": 6.0,
                                   "kv_cache_usage_perc": 0.25}


def test_an_estimate_averages_from_its_prior_or_starts_at_its_first_sample():
    averaged = Estimate(10.0, smoothing=0.5)
    averaged.observe(20.0)
    assert (averaged.value, averaged.samples) == (15.0, 1)
    declared = Estimate(10.0, smoothing=0.5, measured_replaces_prior=True)
    declared.observe(20.0)
    declared.observe(30.0)
    assert (declared.value, declared.samples) == (25.0, 2)  # 20 replaced the prior, then 30
    unknown = Estimate(None, smoothing=0.5)
    assert unknown.value is None
    unknown.observe(4.0)
    assert unknown.value == 4.0
