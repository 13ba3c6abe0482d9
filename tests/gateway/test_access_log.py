"""The JSON access log (GATEWAY_ACCESS_LOG) of a real gateway: one line per request with the
documented fields, the request id it sent upstream and returned, and never a key or a body."""

from __future__ import annotations

import json

import pytest
from lobes_gateway.app.access_log import LINE_FIELDS

from tests.support.client import call, chat, raw_exchange
from tests.support.gateway_proc import run_config_check, start_gateway
from tests.support.sim_proc import start_sim
from tests.support.wait import wait_until

KEY = "sk-access-log-secret"
AUTH = {"Authorization": f"Bearer {KEY}"}
SECRET_CONTENT = "a sentence only the request body holds"


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    path = tmp_path_factory.mktemp("box") / "state" / "log" / "access.log"  # made by the gateway
    with start_sim("instant") as sim:
        env = {"PRIMARY_BASE_URL": sim.url, "PRIMARY_SERVED_NAME": "sim-instant",
               "GATEWAY_API_KEY": KEY, "GATEWAY_ACCESS_LOG": str(path)}
        with start_gateway(env) as gateway:
            yield gateway, sim, path


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def logged_line(path, request_id: str) -> dict:
    """The line of `request_id`, once the writer has flushed it."""
    def find() -> dict | None:
        return next((line for line in lines(path) if line["request_id"] == request_id), None)

    return wait_until(find, message=f"the access log line of {request_id}")


def forwarded_id(sim) -> str:
    return sim.requests()[-1]["headers"]["x-request-id"]


def test_a_line_has_every_field_and_the_id_sent_upstream_and_returned(logged):
    gateway, sim, path = logged
    body = {"model": "main", "messages": [{"role": "user", "content": SECRET_CONTENT}]}
    reply = chat(gateway.url, body, AUTH)
    request_id = reply.headers["x-request-id"]
    assert forwarded_id(sim) == request_id
    line = logged_line(path, request_id)
    assert tuple(line) == LINE_FIELDS
    assert (line["method"], line["path"], line["lane"], line["role"]) == (
        "POST", "/v1/chat/completions", "chat", "cortex")
    assert (line["route_reason"], line["served_by"], line["status"]) == ("none", "cortex", 200)
    assert line["tokens"] == reply.json()["usage"]["completion_tokens"]
    assert 0 < line["ttfb_s"] <= line["duration_s"]
    assert line["time"].endswith("Z")


def test_bytes_are_what_the_client_received(logged):
    gateway, _, path = logged
    request = (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
               + b"\r\nX-Request-Id: raw-1\r\nConnection: close\r\n\r\n")
    answer = raw_exchange(gateway.url, request)
    assert b"\r\nX-Request-Id: raw-1\r\n" in answer
    line = logged_line(path, "raw-1")
    assert (line["status"], line["bytes"], line["lane"]) == (200, len(answer), "models")


def test_a_streamed_answers_bytes_are_what_the_client_received(logged):
    gateway, _, path = logged
    body = json.dumps({"model": "main", "stream": True, "max_tokens": 8,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
               + KEY.encode() + b"\r\nX-Request-Id: raw-stream\r\nContent-Type: application/json"
               + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    answer = raw_exchange(gateway.url, request)
    assert b"Transfer-Encoding: chunked" in answer and answer.endswith(b"0\r\n\r\n")
    line = logged_line(path, "raw-stream")
    assert (line["status"], line["bytes"], line["lane"]) == (200, len(answer), "chat")


def test_a_short_safe_caller_id_is_kept(logged):
    gateway, sim, path = logged
    reply = chat(gateway.url, {"model": "main"}, {**AUTH, "X-Request-Id": "trace-42.a_b:c"})
    assert reply.headers["x-request-id"] == "trace-42.a_b:c"
    assert forwarded_id(sim) == "trace-42.a_b:c"
    assert logged_line(path, "trace-42.a_b:c")["status"] == 200


@pytest.mark.parametrize("given", ["has space", "x" * 65, "quote\"d", "a,b"])
def test_an_unsafe_caller_id_is_replaced_everywhere(logged, given):
    gateway, sim, path = logged
    reply = chat(gateway.url, {"model": "main"}, {**AUTH, "X-Request-Id": given})
    made = reply.headers["x-request-id"]
    assert made != given
    sent = sim.requests()[-1]["headers"]
    assert sent["x-request-id"] == made
    assert given not in json.dumps(sent)
    assert logged_line(path, made)["status"] == 200


def test_refusals_are_logged_and_no_key_or_body_ever_is(logged):
    gateway, _, path = logged
    refused = chat(gateway.url, {"model": "main", "messages": [
        {"role": "user", "content": SECRET_CONTENT}]}, {"Authorization": "Bearer not-the-key"})
    assert refused.status == 401
    line = logged_line(path, refused.headers["x-request-id"])
    assert (line["status"], line["role"], line["tokens"]) == (401, "none", None)
    text = path.read_text()
    assert KEY not in text and "not-the-key" not in text and SECRET_CONTENT not in text


def test_dash_logs_to_stdout_and_off_logs_nothing():
    with start_sim("instant") as sim:
        wired = {"PRIMARY_BASE_URL": sim.url, "PRIMARY_SERVED_NAME": "sim-instant"}
        for setting, expected in (("-", 1), ("off", 0)):
            with start_gateway({**wired, "GATEWAY_ACCESS_LOG": setting}) as gateway:
                request_id = chat(gateway.url, {"model": "main"}).headers["x-request-id"]
                code, output = gateway.shutdown()
            assert code == 0
            assert output.count(f'"request_id":"{request_id}"') == expected, output


def test_an_unwritable_access_log_stops_start_up(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = run_config_check({"GATEWAY_ACCESS_LOG": str(blocker / "access.log")})
    assert done.returncode == 2
    assert "GATEWAY_ACCESS_LOG" in done.stderr


def test_metrics_are_keyless_and_counted_like_any_request(logged):
    gateway, _, path = logged
    reply = call(gateway.url, "GET", "/metrics")
    assert reply.status == 200
    assert logged_line(path, reply.headers["x-request-id"])["lane"] == "metrics"
