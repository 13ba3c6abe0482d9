"""The body's door, through a real gateway: a JSON body is read once and strictly, refused with
an OpenAI-shaped 400, 413 or 415 that names what is wrong (never a dropped connection), and
what reaches the gear is the caller's bytes with only the members the gateway must change
written anew. A key's class bounds the body's `priority` exactly as it bounds the header."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.support.client import call, raw_exchange
from tests.support.fake_gear import FakeGear, wired_to
from tests.support.gateway_proc import start_gateway

BOX_KEY = "box-key"
AUTH = {"Authorization": f"Bearer {BOX_KEY}"}
CLIENT_KEYS = "person=k-person:interactive,agents=k-agents:batch"


@pytest.fixture(scope="module")
def door():
    with FakeGear() as gear, start_gateway({
            **wired_to(gear), "GATEWAY_API_KEY": BOX_KEY, "GATEWAY_CLIENT_KEYS": CLIENT_KEYS,
            "PRIMARY_PRIORITY_SCHEDULING": "true"}) as gateway:
        yield gateway, gear


def post(gateway, raw: bytes, headers: dict[str, str] | None = None, key: str = BOX_KEY):
    all_headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}",
                   **(headers or {})}
    return call(gateway.url, "POST", "/v1/chat/completions", raw, all_headers, timeout=20)


def message(content: str = "hi") -> bytes:
    return b'"messages": [{"role": "user", "content": "%s"}]' % content.encode()


@pytest.mark.parametrize(("raw", "param"), [
    (b'{"model": NaN, ' + message() + b"}", None),
    (b'{"model": "main", "temperature": Infinity, ' + message() + b"}", None),
    (b'{"model": "main", "temperature": 1e400, ' + message() + b"}", None),
    (b'{"model": 42, ' + message() + b"}", "model"),
    (b'{"model": ["main"], ' + message() + b"}", "model"),
    (b'{"model": {"name": "main"}, ' + message() + b"}", "model"),
    (b'{"model": true, ' + message() + b"}", "model"),
    (b'{"model": "main", "model": "senses", ' + message() + b"}", "model"),
    (b'{"model": "main", "priority": "high", ' + message() + b"}", "priority"),
    (b'{"model": "main", "priority": true, ' + message() + b"}", "priority"),
    (b'{"model": "main", "x": ' + b"[" * 3000 + b"]" * 3000 + b", " + message() + b"}", None),
], ids=["nan", "infinity", "1e400", "model-number", "model-list", "model-object",
        "model-bool", "duplicate-model", "priority-string", "priority-bool", "nested-3000-deep"])
def test_a_body_the_gateway_will_not_read_is_a_400_naming_why(door, raw, param):
    gateway, gear = door
    before = len(gear.posts())
    reply = post(gateway, raw)
    assert reply.status == 400, reply.body[:300]
    assert set(reply.error) >= {"message", "type", "param", "code"}
    assert reply.error["param"] == param
    assert len(gear.posts()) == before


def test_a_compressed_body_is_a_415_that_names_the_encoding(door):
    gateway, _gear = door
    raw = gzip.compress(b'{"model": "main", ' + message() + b"}")
    reply = post(gateway, raw, {"Content-Encoding": "gzip"})
    assert reply.status == 415 and "gzip" in reply.error["message"]


def test_a_lone_surrogate_reaches_the_gear_as_the_caller_escaped_it(door):
    """The alias is rewritten to the served name; re-encoding the whole body raised on the
    surrogate and dropped the connection."""
    gateway, gear = door
    raw = b'{"model": "cortex",  "max_tokens": 4, ' + message("\\ud800") + b"}"
    reply = post(gateway, raw)
    assert reply.status == 200
    assert gear.posts()[-1].body == raw.replace(b'"cortex"', b'"%s"' % gear.served.encode())


def test_everything_but_the_changed_member_is_the_callers_own_bytes(door):
    gateway, gear = door
    raw = b'{ "temperature" : 0.70,"model":"main", "top_p": 1.0E0, ' + message("caf\xc3\xa9") + b"}"
    assert post(gateway, raw).status == 200
    assert gear.posts()[-1].body == raw.replace(b'"main"', b'"%s"' % gear.served.encode())


@pytest.mark.parametrize("served", [True, False], ids=["model-unchanged", "alias-rewritten"])
def test_a_byte_order_mark_never_reaches_the_gear_on_any_path(door, served):
    gateway, gear = door
    model = gear.served if served else "cortex"
    raw = b'\xef\xbb\xbf{"model": "%s", ' % model.encode() + message() + b"}"
    assert post(gateway, raw).status == 200
    assert gear.posts()[-1].body == b'{"model": "%s", ' % gear.served.encode() + message() + b"}"


@pytest.mark.parametrize(("key", "priority", "sent"), [
    (BOX_KEY, -100, 0), (BOX_KEY, 7, 1), ("k-agents", -5, 1), ("k-person", -5, -1),
    ("k-person", 3, 1), ("k-agents", 0, 1),
])
def test_the_body_priority_is_bounded_by_the_keys_class_as_the_header_is(
        door, key, priority, sent):
    gateway, gear = door
    raw = b'{"model": "main", "priority": %d, ' % priority + message() + b"}"
    assert post(gateway, raw, key=key).status == 200
    assert json.loads(gear.posts()[-1].body)["priority"] == sent


def test_a_body_too_large_is_answered_413_and_a_lost_connection_never(door):
    gateway, _gear = door
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + BOX_KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n" % (64 << 20))
    reply = raw_exchange(gateway.url, head, timeout=5)
    assert reply.startswith(b"HTTP/1.1 413 ")
