"""Routing over HTTP: model rewrite, aliases, tier headers, fallbacks, task lanes, streaming."""

import json
import urllib.request

import pytest

from tests.support.client import call, chat, sse_events


@pytest.fixture(scope="module")
def duo():
    """A gateway over a primary and a multimodal simulator, shared by the module."""
    from tests.support.gateway_proc import start_gateway
    from tests.support.sim_proc import start_sim

    with start_sim("instant", served_name="primary-served") as primary, \
            start_sim("instant", served_name="mm-served") as senses:
        env = {"PRIMARY_BASE_URL": primary.url, "PRIMARY_SERVED_NAME": "primary-served",
               "MULTIMODAL_BASE_URL": senses.url, "MULTIMODAL_SERVED_NAME": "mm-served",
               "GATEWAY_ALIASES": "gpt-4o=senses"}
        with start_gateway(env) as gateway:
            yield gateway, primary, senses


def last_body(sim) -> dict:
    return json.loads(sim.requests()[-1]["body"])


@pytest.mark.parametrize(("model", "backend", "tier"), [
    ("main", 0, "main"), ("hard", 0, "main"), ("cortex", 0, "main"), (None, 0, "main"),
    ("no-such-model", 0, "main"), ("multimodal", 1, "multimodal"), ("normal", 1, "multimodal"),
    ("senses", 1, "multimodal"), ("gpt-4o", 1, "multimodal"), ("minor", 0, "main"),
])
def test_model_routes_and_is_rewritten(duo, model, backend, tier):
    gateway, *sims = duo
    sim = sims[backend]
    sim.clear_requests()
    payload = {} if model is None else {"model": model}
    reply = chat(gateway.url, payload)
    assert reply.status == 200, reply.body
    assert reply.headers["x-lobes-tier"] == tier
    assert reply.headers["x-lobes-tier-reason"] == "default"
    assert "x-lobes-served-by" not in reply.headers  # GATEWAY_SELF_ORIGIN is not set
    forwarded = last_body(sim)
    assert forwarded["model"] == ("primary-served", "mm-served")[backend]
    assert forwarded["messages"] == [{"role": "user", "content": "hello"}]
    assert reply.json()["model"] == forwarded["model"]


def test_json_is_buffered_with_content_length(duo):
    reply = chat(duo[0].url, {"model": "main"})
    assert int(reply.headers["content-length"]) == len(reply.body)
    assert "transfer-encoding" not in reply.headers


def test_completions_route_by_model(duo):
    gateway, _, senses = duo
    reply = call(gateway.url, "POST", "/v1/completions",
                 {"model": "senses", "prompt": "hi", "max_tokens": 4})
    assert reply.status == 200 and reply.json()["object"] == "text_completion"
    assert last_body(senses)["model"] == "mm-served"


def test_streaming_relays_every_event_in_order(duo):
    gateway, primary, _ = duo
    reply = chat(gateway.url, {"model": "main", "stream": True, "max_tokens": 12,
                               "stream_options": {"include_usage": True}})
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert reply.headers["x-lobes-tier"] == "main"
    events = sse_events(reply.body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] >= 1
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    direct = urllib.request.Request(
        primary.url + "/v1/chat/completions", method="POST",
        data=json.dumps({"model": "primary-served", "stream": True, "max_tokens": 12,
                         "messages": [{"role": "user", "content": "hello"}]}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(direct) as resp:
        direct_events = sse_events(resp.read())
    direct_text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "")
                          for e in direct_events[:-1] if json.loads(e)["choices"])
    assert text == direct_text  # byte-faithful relay: same deterministic output


def test_keep_alive_serves_many_requests_on_one_connection(duo):
    import http.client

    gateway = duo[0]
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=5)
    body = json.dumps({"model": "main", "max_tokens": 2,
                       "messages": [{"role": "user", "content": "x"}]})
    for stream in (False, True, False):
        payload = json.loads(body) | {"stream": stream}
        conn.request("POST", "/v1/chat/completions", json.dumps(payload),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        resp.read()
        assert not resp.will_close
    conn.close()


def test_chunked_request_body(duo):
    import http.client

    gateway, primary, _ = duo
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=5)
    payload = json.dumps({"model": "main", "max_tokens": 2,
                          "messages": [{"role": "user", "content": "chunked"}]}).encode()
    conn.request("POST", "/v1/chat/completions", iter([payload[:10], payload[10:]]),
                 {"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
                 encode_chunked=True)
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    resp.read()
    conn.close()
    assert last_body(primary)["messages"][0]["content"] == "chunked"


CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]

# Each row: a request the duo refuses, the status, the error fields (a subset of the error
# object), fragments of its message, and headers the answer must carry.
REFUSALS = [
    # vLLM's own body, not rewritten.
    pytest.param("POST", CHAT, {"model": "main", "messages": []}, 400,
                 {"type": "BadRequestError"}, [], {}, id="backend-4xx-verbatim"),
    pytest.param("POST", CHAT, {"model": "muse", "messages": HELLO, "max_tokens": 8}, 404,
                 {"type": "role_infeasible", "code": "role_infeasible"}, [], {},
                 id="unwired-opt-in-muse"),
    pytest.param("POST", CHAT, {"model": "worker", "messages": HELLO, "max_tokens": 8}, 404,
                 {"type": "role_infeasible", "code": "role_infeasible"}, [], {},
                 id="unwired-opt-in-worker"),
    pytest.param("POST", "/v1/embeddings", {"input": "x"}, 503, {}, ["EMBED_BASE_URL"], {},
                 id="unwired-lane"),
    pytest.param("GET", "/nope", None, 404, None, [], {}, id="unknown-path"),
    pytest.param("GET", CHAT, None, 405, None, [], {"allow": "POST"}, id="wrong-method"),
    pytest.param("POST", "/v1/nope", {}, 404, None, [], {}, id="unknown-v1-path"),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "error", "fragments", "headers"),
                         REFUSALS)
def test_refusals(duo, method, path, body, status, error, fragments, headers):
    """error None: only the status and headers are checked, not the body."""
    reply = call(duo[0].url, method, path, body)
    assert reply.status == status, reply.body
    for name, value in headers.items():
        assert reply.headers[name] == value
    if error is None:
        return
    assert reply.error | error == reply.error
    for fragment in fragments:
        assert fragment in reply.error["message"]


def test_infeasible_role_refers_to_hosted_by(gateway_factory, sim_factory):
    primary = sim_factory("instant")
    gateway = gateway_factory({"PRIMARY_BASE_URL": primary.url,
                               "MULTIMODAL_FEASIBLE": "false",
                               "MULTIMODAL_PEER_ORIGIN": "http://spark.example:8000"})
    reply = chat(gateway.url, {"model": "senses"})
    assert reply.status == 404
    assert reply.error["type"] == "role_infeasible"
    assert "http://spark.example:8000" in reply.error["message"]
    # A program follows the referral from a field, not the prose.
    assert reply.error["hosted_by"] == "http://spark.example:8000"
    # Background probes (GET /health, /v1/models) may visit; no request was forwarded.
    assert [r for r in primary.requests() if r["method"] != "GET"] == []


def test_each_event_reaches_the_client_while_the_backend_still_generates(gateway_factory,
                                                                         sim_factory):
    import http.client

    primary = sim_factory("minor", served_name="slow")
    gateway = gateway_factory({"PRIMARY_BASE_URL": primary.url, "PRIMARY_SERVED_NAME": "slow"})
    primary.set_faults({"slow_factor": 25.0})  # ~0.2 s per token
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    conn.request("POST", "/v1/chat/completions", json.dumps(
        {"model": "main", "stream": True, "max_tokens": 30,
         "messages": [{"role": "user", "content": "count"}]}),
        {"Content-Type": "application/json"})
    resp = conn.getresponse()
    first = resp.fp.readline()  # the first chunk-size line, then the first event
    assert int(first, 16) > 0
    event = resp.fp.readline()
    assert event.startswith(b"data: ")
    with urllib.request.urlopen(primary.url + "/metrics") as metrics:
        text = metrics.read().decode()
    running = [line for line in text.splitlines()
               if line.startswith("vllm:num_requests_running")]
    assert running and float(running[0].rsplit(" ", 1)[1]) == 1.0  # still generating
    primary.set_faults({})
    conn.close()


def test_self_origin_stamps_served_by_on_local_answers(gateway_factory, sim_factory):
    primary = sim_factory("instant")
    gateway = gateway_factory({"PRIMARY_BASE_URL": primary.url,
                               "PRIMARY_SERVED_NAME": "sim-instant",
                               "GATEWAY_SELF_ORIGIN": "http://orin.example:8000/"})
    reply = chat(gateway.url, {"model": "main"})
    assert reply.status == 200
    assert reply.headers["x-lobes-served-by"] == "http://orin.example:8000"
    refused = chat(gateway.url, {"model": "muse"})
    assert refused.status == 404 and "x-lobes-served-by" not in refused.headers
