"""The pure rules of dispatch: when an attempt moves on, what peers see, what is counted."""

import json

import pytest
from lobes_gateway.app.dispatch import (
    LAST,
    LOCAL,
    OWNER,
    PEER,
    REPLICA,
    TO_PROXY_PEER,
    Failure,
    distinct_boxes,
    exhausted,
    forward_headers,
    moves_on,
    peer_headers,
)
from lobes_gateway.app.meter import completion_tokens
from lobes_gateway.policy.answer_size import DEFAULT_EXPECTED_TOKENS, expected_tokens
from lobes_gateway.policy.prefix import request_shape
from lobes_gateway.transport.http import Request, parse_head
from lobes_gateway.transport.trace import Trace

# (rule, status, moves on): seed 003 for owners, and for replicas but a 429 (a busy replica's
# request never started: another one may take it), seed 004 for the one peer.
MOVING_ON = [
    *((OWNER, status, True) for status in (500, 502, 503, 508, 401, 403, 404)),
    *((OWNER, status, False) for status in (200, 400, 413, 422, 429)),
    *((REPLICA, status, True) for status in (500, 502, 503, 508, 401, 403, 404, 429)),
    *((REPLICA, status, False) for status in (200, 400, 413, 422)),
    *((LOCAL, status, True) for status in (500, 502, 503)),
    *((LOCAL, status, False) for status in (200, 400, 401, 404, 429)),
    *((LAST, status, False) for status in (200, 404, 500, 503)),
    *((PEER, status, True) for status in (500, 502, 503)),
    # A peer's 508 proxy_loop is a misdeclaration, relayed; its 404 is judged by the body.
    *((PEER, status, False) for status in (200, 401, 404, 508)),
]


@pytest.mark.parametrize(("rule", "status", "moves"), MOVING_ON,
                         ids=[f"{('local', 'last', 'peer', 'replica', 'owner')[r]}-{s}"
                              for r, s, _moves in MOVING_ON])
def test_which_statuses_move_on_under_each_rule(rule, status, moves):
    assert moves_on(rule, status) is moves


def _request(*header_lines: str) -> Request:
    """A parsed request, named by a trace as the gateway names each (its id: the caller's)."""
    lines = header_lines if any(h.lower().startswith("host:") for h in header_lines) \
        else ("Host: box:8000", *header_lines)
    head = "POST /v1/chat/completions HTTP/1.1\r\n" + "".join(f"{h}\r\n" for h in lines)
    request = parse_head((head + "\r\n").encode("latin-1"))
    Trace(lambda _data: None, 0.0, "own-id").identify(request, "chat")
    return request


CALLER = _request("Authorization: Bearer caller", "Content-Type: application/json",
                  "X-Lobes-Proxied: cortex", "x-lobes-FORWARDED-by: http://x:1",
                  "Host: box:8000", "Content-Length: 2", "X-Request-Id: r1")


def test_peer_headers_strip_the_callers_key_and_markers_and_attach_ours():
    headers = peer_headers(CALLER, "pairwise", [("X-Lobes-Proxied", "cortex")])
    assert headers == ("Content-Type: application/json\r\nX-Request-Id: r1\r\n"
                       "Authorization: Bearer pairwise\r\nX-Lobes-Proxied: cortex\r\n")


def test_a_proxy_keeps_the_owner_forwarding_mark():
    headers = peer_headers(CALLER, None, [], TO_PROXY_PEER)
    assert headers == ("Content-Type: application/json\r\nx-lobes-FORWARDED-by: http://x:1\r\n"
                       "X-Request-Id: r1\r\n")


def test_peer_headers_without_a_key_send_none():
    headers = peer_headers(_request("authorization: Bearer caller"), None, [])
    assert headers == "X-Request-Id: own-id\r\n"  # the request's id, and no key


def test_local_forwarding_drops_hop_headers_and_the_callers_key():
    assert forward_headers(CALLER) == (
        "Content-Type: application/json\r\n"
        "X-Lobes-Proxied: cortex\r\nx-lobes-FORWARDED-by: http://x:1\r\nX-Request-Id: r1\r\n")


@pytest.mark.parametrize(
    ("payload", "tokens"),
    [({"max_tokens": 160}, 160), ({"max_completion_tokens": 64, "max_tokens": 9}, 64),
     ({}, None), (None, None), ({"max_tokens": True}, None), ({"max_tokens": 0}, None)],
)
def test_the_answer_budget_comes_from_the_request(payload, tokens):
    assert expected_tokens(payload) == (tokens or DEFAULT_EXPECTED_TOKENS)
    assert request_shape(payload, with_blocks=False).max_tokens == tokens


@pytest.mark.parametrize(
    ("body", "tokens"),
    [(json.dumps({"usage": {"completion_tokens": 154}}).encode(), 154),
     (b'{"usage": null}', 0), (b"not json", 0), (b"[1, 2]", 0),
     # a key quoted inside a string is not the answer's usage
     (json.dumps({"choices": [{"message": {"content": '{"completion_tokens": 99}'}}],
                  "usage": {"completion_tokens": 3}}).encode(), 3),
     (json.dumps({"content": '"completion_tokens": 99'}).encode(), 0)],
)
def test_completion_tokens_are_read_from_usage(body, tokens):
    assert completion_tokens(body) == tokens


def test_all_declined_is_a_404_naming_each():
    declined = [Failure("http://a:1", 401), Failure("http://b:1", 404)]
    error = exhausted("every owner of cortex", declined, 5)
    assert (error.status, error.type) == (404, "role_infeasible")
    assert "http://a:1 (401), http://b:1 (404)" in error.message


def test_any_unreachable_or_5xx_makes_it_a_retryable_503():
    error = exhausted("every replica of the cortex pool",
                      [Failure("http://a:1", None), Failure("http://b:1", 404)], 5)
    assert (error.status, error.code) == (503, "backend_unavailable")
    assert ("Retry-After", "5") in error.headers
    assert "http://a:1 (unreachable)" in error.message


def test_every_replica_busy_is_a_429_and_one_busy_among_others_a_503():
    busy = [Failure("http://a:1", 429), Failure("http://b:1", 429)]
    error = exhausted("every replica of the cortex pool", busy, 5)
    assert (error.status, error.code, error.message.count("(429)")) == (429, "busy", 2)
    assert ("Retry-After", "5") in error.headers
    mixed = exhausted("every replica of the cortex pool", [*busy[:1], Failure("http://b:1", 503)],
                      5)
    assert (mixed.status, mixed.code) == (503, "backend_unavailable")
    assert Failure("http://a:1", 429).outcome == "busy"


def test_a_box_declared_twice_is_asked_once_in_routing_order():
    assert distinct_boxes(("http://b:1", "http://a:1", "http://b:1")) == [
        "http://b:1", "http://a:1"]
