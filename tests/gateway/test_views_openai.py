"""/health, /v1/models(/supported), /status, /capabilities, and the official openai client."""

import threading
import uuid

import openai
import pytest
from lobes_gateway import __version__

from tests.support.client import call, wired
from tests.support.gateway_proc import start_gateway
from tests.support.ports import dead_origin
from tests.support.sim_proc import start_sim
from tests.support.wait import wait_until

KEY = "client-key"


@pytest.fixture(scope="module")
def box():
    # minor: a real decode step, so a slowed request stays visibly running in /metrics.
    with start_sim("minor", served_name="sim-instant",
                   extra_args=["--max-model-len", "65536"]) as primary, \
            start_sim("instant", served_name="e5",
                      extra_args=["--max-model-len", "8192"]) as embed:
        env = {**wired(primary), "PRIMARY_MAX_MODEL_LEN": "65536",
               "EMBED_BASE_URL": embed.url, "EMBED_SERVED_NAME": "e5",
               "MULTIMODAL_FEASIBLE": "false", "MULTIMODAL_PEER_ORIGIN": "http://spark:8000",
               "GATEWAY_API_KEY": KEY, "GATEWAY_MAX_INFLIGHT_PER_KEY": "1"}
        with start_gateway(env) as gateway:
            yield gateway, primary, embed


AUTH = {"Authorization": f"Bearer {KEY}"}


def test_health_reports_version(box):
    assert box[0].get_json("/health") == {"status": "ok", "version": __version__}


def test_models_lists_only_backends_that_answered_their_last_probe():
    """Seed 004: advertised implies reachable. A wired gear that refuses is not listed, and one
    that stops answering leaves the list within a probe interval, and comes back with it."""
    with start_sim("instant") as primary, start_sim("instant", served_name="e5") as embed:
        env = {**wired(primary), "EMBED_BASE_URL": dead_origin(), "EMBED_SERVED_NAME": "e5",
               "RERANK_BASE_URL": embed.url, "RERANK_SERVED_NAME": "e5",
               "GATEWAY_PROBE_INTERVAL_S": "0.1"}
        with start_gateway(env) as gateway:
            def listed() -> set[str]:
                return {m["lobes_role"] for m in gateway.get_json("/v1/models")["data"]}

            assert listed() == {"cortex", "reranker"}
            embed.set_faults({"refuse": True})
            wait_until(lambda: listed() == {"cortex"}, message="the refusing reranker unlisted")
            embed.set_faults({})
            wait_until(lambda: listed() == {"cortex", "reranker"},
                       message="the reranker listed again once it answers")


def test_models_lists_loaded_backends(box):
    data = box[0].get_json("/v1/models", AUTH)["data"]
    windows = {m["id"]: m.get("max_model_len") for m in data}
    assert windows == {"sim-instant": 65536, "e5": 8192}


def test_supported_catalog_flags(box):
    data = box[0].get_json("/v1/models/supported", AUTH)["data"]
    by_role = {m["role"]: m for m in data}
    assert by_role["cortex"]["status"] == "load-tested"
    assert by_role["cortex"]["default"] is True and by_role["cortex"]["loaded"] is True
    assert by_role["minor"]["tags"] == ["configured"] and by_role["minor"]["loaded"] is False
    assert by_role["embedder"]["loaded"] is True
    assert any(m["role"] is None and "coder" in m["id"] for m in data)
    assert len(data) == 12


def test_status_aggregate(box):
    gateway, primary, _ = box
    primary.set_faults({"slow_factor": 100.0})
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0)
    worker = threading.Thread(target=client.chat.completions.create,
                              kwargs={"model": "main", "max_tokens": 2,
                                      "messages": [{"role": "user", "content": "x"}]})
    worker.start()
    try:
        def counted() -> dict | None:
            status = gateway.get_json("/status")
            return status if status["busy"]["running"] + status["busy"]["waiting"] >= 1 else None

        status = wait_until(counted, timeout=5,
                            message="/status to count the slowed request as busy")
    finally:
        primary.set_faults({})
        worker.join()
    assert status["object"] == "lobes.fleet_status"
    assert status["default_model"] == "sim-instant"
    names = {b["name"]: b for b in status["backends"]}
    assert names["cortex"]["health"] == "ok" and names["embedder"]["health"] == "ok"
    assert "running" in names["cortex"]["metrics"]
    assert "/v1/embeddings" in status["endpoints"]
    assert "/v1/audio/speech" not in status["endpoints"]
    assert status["pressure"]["mode"] == "warm"


def test_capabilities(box):
    gateway, _, embed = box
    roles = gateway.get_json("/capabilities")["roles"]
    expected = {"feasible": True, "ready": True, "context": 65536, "proxied": False,
                "hosted_by": None}
    assert {key: roles["cortex"][key] for key in expected} == expected
    assert roles["senses"]["feasible"] is False and roles["senses"]["ready"] is False
    assert roles["senses"]["hosted_by"] == "http://spark:8000"
    assert roles["muse"]["feasible"] is False
    assert roles["embedder"]["ready"] is True
    embed.set_faults({"refuse": True})
    try:
        assert gateway.get_json("/capabilities")["roles"]["embedder"]["ready"] is False
    finally:
        embed.set_faults({})


def test_capabilities_name_the_model_that_answers_an_unwired_tier(box):
    roles = box[0].get_json("/capabilities")["roles"]
    assert roles["minor"]["served_by"] == "cortex"
    assert roles["minor"]["served_name"] == "sim-instant"
    assert roles["cortex"]["served_name"] == "sim-instant"


def test_openai_client_chat_stream_and_errors(box):
    gateway, primary, _ = box
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0)
    reply = client.chat.completions.create(model="main", max_tokens=4,
                                           messages=[{"role": "user", "content": "hi"}])
    assert reply.model == "sim-instant" and reply.choices[0].message.content
    stream = client.chat.completions.create(model="cortex", max_tokens=6, stream=True,
                                            messages=[{"role": "user", "content": "hi"}])
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta]
    assert "".join(p for p in pieces if p)
    with pytest.raises(openai.AuthenticationError) as info:
        openai.OpenAI(base_url=gateway.url + "/v1", api_key="wrong",
                      max_retries=0).models.list()
    assert info.value.status_code == 401
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="senses", max_tokens=1,
                                       messages=[{"role": "user", "content": "x"}])
    # Held long enough that a loaded machine still sends the second request inside it.
    primary.set_faults({"hang_s": 3.0})
    # A marker no other request of the module carries: the wait below must see this one.
    marker = f"held-{uuid.uuid4().hex}"
    holder = threading.Thread(target=client.chat.completions.create,
                              kwargs={"model": "main", "max_tokens": 2,
                                      "messages": [{"role": "user", "content": marker}]})
    holder.start()
    try:
        wait_until(lambda: [r for r in primary.requests() if r["method"] == "POST" and
                            marker in r["body"]],
                   timeout=5, interval=0.02, message="the held request to reach the backend")
        with pytest.raises(openai.RateLimitError) as limited:
            client.chat.completions.create(model="main", max_tokens=1,
                                           messages=[{"role": "user", "content": "x"}])
        assert limited.value.body["type"] == "rate_limit_exceeded"
    finally:
        holder.join()
        primary.set_faults({})


def test_keyless_paths_without_key(box):
    for path in ("/health", "/status", "/capabilities"):
        assert call(box[0].url, "GET", path).status == 200
