"""Failover to FALLBACK_*: refused or 5xx before a body moves on; 4xx and started bodies do not."""

import json

import pytest

from tests.support.client import chat, sse_events
from tests.support.gateway_proc import start_gateway
from tests.support.sim_proc import start_sim
from tests.support.wait import wait_until


@pytest.fixture(scope="module")
def shared_pair():
    with start_sim("instant", served_name="primary-served") as primary, \
            start_sim("instant", served_name="fb-served") as fallback:
        env = {"PRIMARY_BASE_URL": primary.url, "PRIMARY_SERVED_NAME": "primary-served",
               "FALLBACK_URL": fallback.url, "FALLBACK_SERVED_NAME": "fb-served",
               "GATEWAY_UPSTREAM_TIMEOUT_S": "1"}
        with start_gateway(env) as gateway:
            yield gateway, primary, fallback


@pytest.fixture
def pair(shared_pair):
    _, primary, fallback = shared_pair
    for sim in (primary, fallback):
        sim.set_faults({})
        sim.clear_requests()
    return shared_pair


def posts(sim) -> list[dict]:
    return [r for r in sim.requests() if r["method"] == "POST"]


@pytest.mark.parametrize("fault", [{"refuse": True}, {"error_status": 503},
                                   {"error_status": 500}, {"hang": True}])
def test_primary_down_fails_over_to_fallback(pair, fault):
    gateway, primary, fallback = pair
    assert chat(gateway.url, {"model": "main"}).status == 200  # warm a pooled connection
    primary.set_faults(fault)
    reply = chat(gateway.url, {"model": "main"})
    assert reply.status == 200, reply.body
    assert reply.headers["x-lobes-tier"] == "main"
    assert json.loads(posts(fallback)[-1]["body"])["model"] == "fb-served"


def test_4xx_is_returned_verbatim_without_failover(pair):
    gateway, _, fallback = pair
    reply = chat(gateway.url, {"model": "main", "messages": []})
    assert reply.status == 400 and reply.error["type"] == "BadRequestError"
    assert posts(fallback) == []


def test_both_refused_is_502_upstream_unavailable(pair):
    gateway, primary, fallback = pair
    primary.set_faults({"refuse": True})
    fallback.set_faults({"refuse": True})
    reply = chat(gateway.url, {"model": "main"})
    assert reply.status == 502
    assert reply.error["type"] == "upstream_unavailable"


def test_last_5xx_is_relayed_when_every_backend_fails(pair):
    gateway, primary, fallback = pair
    primary.set_faults({"error_status": 503})
    fallback.set_faults({"error_status": 500})
    assert chat(gateway.url, {"model": "main"}).status == 500


def test_no_retry_once_a_stream_has_started(pair):
    gateway, primary, fallback = pair
    primary.set_faults({"die_after_chunks": 2})
    reply = chat(gateway.url, {"model": "main", "stream": True, "max_tokens": 20})
    assert reply.status == 200
    events = sse_events(reply.body)
    assert "[DONE]" not in events
    assert len(events) >= 2
    # The stream ends cleanly with an OpenAI-shaped error event instead of a hang or a reset.
    assert json.loads(events[-1])["error"]["code"] == "stream_interrupted"
    assert posts(fallback) == []
    assert gateway.alive()


def test_a_backend_dying_mid_body_is_a_502_not_a_silent_close(pair):
    """Head and half a JSON body, then the backend closes: nothing reached the client yet."""
    gateway, primary, fallback = pair
    primary.set_faults({"die_mid_body": True})
    reply = chat(gateway.url, {"model": "main"})
    assert reply.status == 502
    assert reply.error["type"] == "upstream_unavailable"
    assert reply.error["code"] == "upstream_interrupted"
    assert reply.headers["connection"] == "close"
    assert posts(fallback) == []  # the request reached the primary: it is not sent twice
    primary.set_faults({})
    assert chat(gateway.url, {"model": "main"}).status == 200


def test_single_backend_refused_is_503_with_retry_after(gateway_factory, sim_factory):
    primary = sim_factory("instant")
    gateway = gateway_factory({"PRIMARY_BASE_URL": primary.url})
    primary.set_faults({"refuse": True})
    reply = chat(gateway.url, {"model": "main"})
    assert reply.status == 503
    assert reply.error["type"] == "backend_unavailable"
    assert reply.headers["retry-after"] == "5"


def test_single_backend_5xx_is_relayed(gateway_factory, sim_factory):
    primary = sim_factory("instant")
    gateway = gateway_factory({"PRIMARY_BASE_URL": primary.url})
    primary.set_faults({"error_status": 502})
    assert chat(gateway.url, {"model": "main"}).status == 502


def test_multimodal_never_fails_over_to_the_fallback(gateway_factory, sim_factory):
    primary, senses, fallback = (sim_factory("instant") for _ in range(3))
    gateway = gateway_factory({"PRIMARY_BASE_URL": primary.url,
                               "MULTIMODAL_BASE_URL": senses.url,
                               "MULTIMODAL_SERVED_NAME": "sim-instant",
                               "FALLBACK_URL": fallback.url})
    senses.set_faults({"refuse": True})
    assert chat(gateway.url, {"model": "senses"}).status == 503
    assert posts(fallback) == [] and posts(primary) == []


def test_client_leaving_mid_stream_aborts_upstream_and_nothing_crashes(gateway_factory,
                                                                       sim_factory):
    import http.client
    import urllib.request

    primary = sim_factory("minor", served_name="slow")
    gateway = gateway_factory({"PRIMARY_BASE_URL": primary.url, "PRIMARY_SERVED_NAME": "slow"})
    primary.set_faults({"slow_factor": 10.0})  # ~0.08 s per token

    def running() -> float:
        with urllib.request.urlopen(primary.url + "/metrics") as resp:
            lines = resp.read().decode().splitlines()
        return float(next(line for line in lines
                          if line.startswith("vllm:num_requests_running")).rsplit(" ", 1)[1])

    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    conn.request("POST", "/v1/chat/completions", json.dumps(
        {"model": "main", "stream": True, "max_tokens": 60,
         "messages": [{"role": "user", "content": "long"}]}), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.fp.readline() and resp.fp.readline().startswith(b"data: ")
    assert running() == 1.0
    conn.sock.close()
    conn.close()
    wait_until(lambda: running() == 0.0, timeout=5,
               message="the backend to stop generating for a gone client")
    assert gateway.alive()
    assert chat(gateway.url, {"model": "main", "max_tokens": 2}).status == 200
