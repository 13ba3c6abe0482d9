"""The prober: what each peer's /capabilities, /v1/models and /status make of its state.

fetch is injected, so these tests drive every answer a peer can give without sockets.
"""

import asyncio
import json

from lobes_gateway.mesh.replicas import (
    REFERENCE_REASON,
    Prober,
    ProbeTarget,
    ReplicaSet,
    ReplicaSpec,
    probe_replica,
)

SERVED = "unsloth/Qwen3.8-27B-NVFP4"
SPARK = "http://spark:8001"
THOR = "http://thor:8000"
LOCAL_URL = "http://127.0.0.1:8101"


class FakeFetch:
    """Answers (origin, path) from a table; records every call with the key it carried."""

    def __init__(self, table):
        self.table = table
        self.calls = []

    async def __call__(self, origin, path, api_key):
        self.calls.append((origin, path, api_key))
        answer = self.table.get((origin, path), (404, b"{}"))
        if isinstance(answer, BaseException):
            raise answer
        if answer == "hang":
            await asyncio.sleep(60)
        status, body = answer
        return status, body if isinstance(body, bytes) else json.dumps(body).encode()


def capabilities(ready=True, feasible=True, context=262144, **extra):
    entry = {"feasible": feasible, "ready": ready, "context": context, "served_name": SERVED}
    entry.update(extra)
    return 200, {"roles": {"cortex": entry}}


def models(*ids, max_model_len=262144):
    return 200, {"object": "list", "data": [{"id": i, "max_model_len": max_model_len} for i in ids]}


def status(running, waiting):
    metrics = {"running": running, "waiting": waiting}
    return 200, {"backends": [{"name": "primary", "served_name": SERVED, "metrics": metrics}]}


def healthy_peer(origin, **caps):
    return {
        (origin, "/capabilities"): capabilities(**caps),
        (origin, "/v1/models"): models(SERVED, "cortex"),
        (origin, "/status"): status(1, 2),
    }


def probe(table, spec=None, target=None, timeout_s=1.0):
    fetch = FakeFetch(table)
    spec = spec or ReplicaSpec(origin=SPARK, api_key="pairwise")
    target = target or ProbeTarget("cortex")
    return asyncio.run(probe_replica(fetch, spec, target, timeout_s)), fetch


def test_a_healthy_peer_is_ready_with_its_fingerprint_listing_and_load():
    result, fetch = probe(healthy_peer(SPARK))
    assert result.ready and result.reason == ""
    assert result.fingerprint.served_id == SERVED and result.fingerprint.context == 262144
    assert result.listed_ids == {SERVED, "cortex"}
    assert result.load == 3
    assert {key for _, _, key in fetch.calls} == {"pairwise"}


def test_the_probe_carries_the_pairwise_key_and_no_other():
    _, fetch = probe(healthy_peer(SPARK), spec=ReplicaSpec(origin=SPARK, api_key=None))
    assert [key for _, _, key in fetch.calls] == [None, None, None]


def test_an_unreachable_peer_is_not_ready():
    result, _ = probe({(SPARK, "/capabilities"): ConnectionRefusedError()})
    assert not result.ready and result.reason == "peer gateway unreachable"


def test_a_peer_that_hangs_times_out_as_unreachable():
    result, _ = probe({(SPARK, "/capabilities"): "hang"}, timeout_s=0.05)
    assert not result.ready and result.reason == "peer gateway unreachable"


def test_a_rejected_pairwise_key_is_named():
    table = healthy_peer(SPARK)
    table[(SPARK, "/v1/models")] = (401, {"error": {"type": "invalid_api_key"}})
    result, _ = probe(table)
    assert not result.ready and result.reason == "peer rejected the pairwise key (HTTP 401)"


def test_a_peer_that_does_not_list_the_served_id_is_not_ready():
    table = healthy_peer(SPARK)
    table[(SPARK, "/v1/models")] = models("something/else")
    result, _ = probe(table)
    assert not result.ready and result.reason == f"peer does not list {SERVED}"


def test_a_peer_that_reports_the_role_not_ready_or_not_hosted():
    result, _ = probe(healthy_peer(SPARK, ready=False))
    assert result.reason == "peer reports cortex not ready"
    result, _ = probe(healthy_peer(SPARK, feasible=False))
    assert result.reason == "peer does not host cortex (feasible=false)"
    result, _ = probe({(SPARK, "/capabilities"): (200, {"roles": {}})})
    assert result.reason == "peer does not declare cortex"


def test_a_broken_status_endpoint_only_loses_the_load():
    table = healthy_peer(SPARK)
    table[(SPARK, "/status")] = ConnectionResetError()
    result, _ = probe(table)
    assert result.ready and result.load is None


def test_window_falls_back_to_the_models_listing_and_runtime_is_read():
    table = healthy_peer(SPARK, context=None, quantization="nvfp4", max_active=4)
    result, _ = probe(table)
    assert result.fingerprint.context == 262144
    assert result.fingerprint.runtime == "nvfp4"
    assert result.slots == 4


def test_an_audio_role_is_judged_from_capabilities_alone():
    table = {(SPARK, "/capabilities"): (200, {"roles": {"tts": {"ready": True}}})}
    result, fetch = probe(table, target=ProbeTarget("tts", audio=True))
    assert result.ready
    assert [path for _, path, _ in fetch.calls] == ["/capabilities"]


def test_the_local_replica_is_probed_on_its_backend_by_served_name():
    spec = ReplicaSpec(origin="http://thor:8000", local_url=LOCAL_URL)
    table = {(LOCAL_URL, "/v1/models"): models(SERVED, max_model_len=131072)}
    result, fetch = probe(table, spec=spec, target=ProbeTarget("cortex", served_id=SERVED))
    assert result.ready and result.fingerprint.context == 131072
    assert fetch.calls == [(LOCAL_URL, "/v1/models", None)]
    result, _ = probe({}, spec=spec, target=ProbeTarget("cortex", served_id=SERVED))
    assert not result.ready and result.reason == "local backend /v1/models answered HTTP 404"


def test_a_probe_pass_judges_the_whole_pool_and_a_dark_peer_drops_out():
    pool = ReplicaSet("cortex", (ReplicaSpec(origin=SPARK), ReplicaSpec(origin=THOR)))
    table = {**healthy_peer(SPARK), **healthy_peer(THOR)}
    prober = Prober([(pool, ProbeTarget("cortex"))], FakeFetch(table), clock=lambda: 7.0)
    asyncio.run(prober.probe_once())
    assert [(s.ready, s.compatible) for s in pool.states] == [(True, True), (True, True)]
    assert pool.states[0].reason == REFERENCE_REASON and pool.states[0].judged_at == 7.0
    table[(THOR, "/capabilities")] = ConnectionRefusedError()
    asyncio.run(prober.probe_once())
    assert [(s.ready, s.compatible) for s in pool.states] == [(True, True), (False, False)]


def test_the_run_loop_keeps_probing_until_cancelled():
    pool = ReplicaSet("cortex", (ReplicaSpec(origin=SPARK),))
    fetch = FakeFetch(healthy_peer(SPARK))
    prober = Prober([(pool, ProbeTarget("cortex"))], fetch, interval_s=0.001)

    async def run_briefly():
        task = asyncio.create_task(prober.run())
        while sum(path == "/capabilities" for _, path, _ in fetch.calls) < 3:
            await asyncio.sleep(0.001)
        task.cancel()

    asyncio.run(run_briefly())
    assert pool.ready
