"""Fault knobs and the request recorder, each seen from the client's side of the wire."""

from __future__ import annotations

import hashlib
import socket
import time

import pytest

from .client import chat_payload, post, request, stream

CHAT = "/v1/chat/completions"


@pytest.fixture
def sim(sim_factory):
    return sim_factory("instant")


def test_refuse_stops_listening_and_clearing_resumes(sim):
    sim.set_faults({"refuse": True})
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", sim.port), timeout=2).close()
    sim.set_faults({})
    assert request(sim.url, "GET", "/health").status == 200


def test_refuse_at_start_leaves_the_port_closed_until_cleared(sim_factory):
    sim = sim_factory("instant", extra_args=["--fault-refuse"])
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", sim.port), timeout=2).close()
    sim.set_faults({})
    assert request(sim.url, "GET", "/v1/models").status == 200


def test_error_status_answers_every_request_with_that_5xx(sim):
    sim.set_faults({"error_status": 503})
    reply = post(sim.url, CHAT, chat_payload())
    assert reply.status == 503
    assert reply.json()["error"]["code"] == 503
    sim.set_faults({})
    assert post(sim.url, CHAT, chat_payload()).status == 200


def test_error_status_from_the_command_line(sim_factory):
    sim = sim_factory("instant", extra_args=["--fault-status", "500"])
    assert sim.faults()["error_status"] == 500
    assert post(sim.url, CHAT, chat_payload()).status == 500


def test_hang_runs_into_the_client_timeout(sim):
    sim.set_faults({"hang": True})
    with pytest.raises(TimeoutError):
        post(sim.url, CHAT, chat_payload(), timeout=0.5)


def test_hang_s_delays_the_first_byte(sim_factory):
    sim = sim_factory("instant", time_scale=10)
    sim.set_faults({"hang_s": 4.0})  # 4 simulated seconds = 0.4 s at time-scale 10
    with pytest.raises(TimeoutError):
        post(sim.url, CHAT, chat_payload(), timeout=0.1)
    assert post(sim.url, CHAT, chat_payload(), timeout=5).status == 200


def test_die_after_chunks_truncates_the_stream(sim):
    sim.set_faults({"die_after_chunks": 3})
    reply = stream(sim.url, CHAT, chat_payload(max_tokens=10))
    assert reply.truncated and not reply.done
    assert len(reply.events) == 3
    sim.set_faults({})
    assert stream(sim.url, CHAT, chat_payload(max_tokens=10)).done


def test_die_mid_body_sends_a_head_and_half_a_json_body(sim):
    sim.set_faults({"die_mid_body": True})
    with socket.create_connection(("127.0.0.1", int(sim.url.rsplit(":", 1)[1])), timeout=5) as s:
        body = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}'
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                  b"\r\n%s" % (len(body), body))
        received = b""
        while chunk := s.recv(65536):
            received += chunk
    head, _sep, partial = received.partition(b"\r\n\r\n")
    declared = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")))
    assert head.startswith(b"HTTP/1.1 200 ") and 0 < len(partial) < declared
    assert request(sim.url, "GET", "/health").status == 200  # GETs are never cut
    sim.set_faults({})
    assert post(sim.url, CHAT, chat_payload()).status == 200


@pytest.mark.timing  # a ratio of two wall-clock durations, within 20 %
def test_slow_factor_lowers_the_token_rate(sim_factory):
    sim = sim_factory("spark-cortex", time_scale=4)
    payload = chat_payload(max_tokens=60, ignore_eos=True)
    started = time.monotonic()
    post(sim.url, CHAT, payload)
    normal = time.monotonic() - started
    sim.set_faults({"slow_factor": 3.0})
    started = time.monotonic()
    post(sim.url, CHAT, payload)
    slowed = time.monotonic() - started
    assert 2.4 < slowed / normal < 3.6


def test_strict_tools_get_vllms_grammar_400_only_with_the_knob(sim):
    tool = {"type": "function",
            "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}}
    payload = chat_payload(tools=[tool])
    assert post(sim.url, CHAT, payload).status == 200
    sim.set_faults({"reject_strict_tools": True})
    reply = post(sim.url, CHAT, payload)
    assert reply.status == 400
    error = reply.json()["error"]
    assert error["type"] == "BadRequestError"
    assert "xgrammar" in error["message"]
    relaxed = {**tool, "function": {**tool["function"], "strict": False}}
    assert post(sim.url, CHAT, chat_payload(tools=[relaxed])).status == 200


def test_a_bad_fault_set_is_refused_naming_the_knobs(sim):
    reply = request(sim.admin_url, "POST", "/admin/faults", {"explode": True})
    assert reply.status == 400
    assert "explode" in reply.json()["error"]["message"]
    assert "refuse" in reply.json()["error"]["message"]
    reply = request(sim.admin_url, "POST", "/admin/faults", {"error_status": 404})
    assert reply.status == 400


def test_recorder_keeps_method_path_lowercased_headers_and_body(sim):
    sim.clear_requests()
    body = b'{"messages":[{"role":"user","content":"hi"}]}'
    request(sim.url, "POST", CHAT + "?x=1", raw=body,
            headers={"Authorization": "Bearer k", "X-Lobes-Proxied": "1"})
    [entry] = sim.requests()
    assert entry["method"] == "POST"
    assert entry["path"] == CHAT + "?x=1"
    assert entry["headers"]["authorization"] == "Bearer k"
    assert entry["headers"]["x-lobes-proxied"] == "1"
    assert entry["body"] == body.decode()
    sim.clear_requests()
    assert sim.requests() == []


def test_recorder_fingerprints_binary_bodies_byte_for_byte(sim):
    sim.clear_requests()
    payload = bytes(range(256)) * 3
    request(sim.url, "POST", "/v1/audio/transcriptions", raw=payload,
            headers={"Content-Type": "application/octet-stream"})
    [entry] = sim.requests()
    assert entry["body_length"] == len(payload)
    assert entry["body_sha256"] == hashlib.sha256(payload).hexdigest()


def test_recorder_records_requests_answered_by_a_fault(sim):
    sim.clear_requests()
    sim.set_faults({"error_status": 502})
    post(sim.url, CHAT, chat_payload())
    assert [e["path"] for e in sim.requests()] == [CHAT]


def test_recorder_keeps_the_last_200(sim):
    sim.clear_requests()
    for index in range(205):
        request(sim.url, "GET", f"/health?n={index}")
    entries = sim.requests()
    assert len(entries) == 200
    assert entries[0]["path"] == "/health?n=5"
