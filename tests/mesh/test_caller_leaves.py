"""A caller that leaves gives its place back at once, on every route mode.

The gear (or the peer gateway's gear) takes the request and stays silent, as a long prefill
does. The caller hangs up. Before, the gateway noticed only when the upstream answered (or at
GATEWAY_UPSTREAM_TIMEOUT_S): the slot, the placement and the peer count stayed taken. Now the
upstream attempt is aborted when the caller's socket closes: the gear sees its connection
closed, and every count that held the request is back to zero.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from tests.support.fake_gear import HANG, SERVED, FakeGear, Received, wired_to
from tests.support.gateway_proc import GatewayProcess, start_gateway
from tests.support.metrics import Scrape
from tests.support.wait import wait_until

FLEET = "fleet-secret"


def _silent(_request: Received):
    return [HANG]


def _silent_stream_after_head(_request: Received):
    return [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked"
            b"\r\n\r\n", HANG]


def _leave(gateway: GatewayProcess, stream: bool) -> None:
    """Send a chat request, wait until it is surely placed, and hang up."""
    body = json.dumps({"model": "cortex", "stream": stream, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hello"}]}).encode()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                     b"\r\n" % len(body) + body)
        time.sleep(0.5)


def _held_local(gateway: GatewayProcess) -> int:
    return gateway.get_json("/status")["admission"]["cortex"]["running"]


def _held_pool(gateway: GatewayProcess) -> float:
    return Scrape.of(gateway.url).value("lobes_gateway_pool_replica_in_flight", role="cortex")


def _held_peer(gateway: GatewayProcess) -> int:
    return gateway.get_json("/capabilities")["roles"]["cortex"].get("in_flight", 0)


@pytest.fixture
def gear() -> Iterator[FakeGear]:
    with FakeGear(_silent) as fake:
        yield fake


def _local(gear: FakeGear) -> tuple[list[GatewayProcess], Callable[[GatewayProcess], float]]:
    return [start_gateway({**wired_to(gear), "PRIMARY_MAX_ACTIVE": "1"})], _held_local


MODES = {
    "local": _local,
    "proxy": lambda gear: _with_peer(gear, "proxy", _held_peer),
    "pool": lambda gear: _with_peer(gear, "pool", _held_pool),
    "owners": lambda gear: _with_peer(gear, "owners", _held_peer),
}


def _with_peer(gear: FakeGear, mode: str, held: Callable[[GatewayProcess], float]):
    back = start_gateway({**wired_to(gear), "GATEWAY_FLEET_KEY": FLEET, "PRIMARY_MAX_ACTIVE": "4"})
    route = {"PRIMARY_ROUTE": mode, "PRIMARY_FEASIBLE": "false", "PRIMARY_SERVED_NAME": SERVED,
             "GATEWAY_FLEET_KEY": FLEET, "GATEWAY_PROBE_INTERVAL_S": "0.2"}
    if mode == "proxy":
        route["PRIMARY_PEER_ORIGIN"] = back.url
    else:
        route["PRIMARY_PEER_ORIGINS"] = back.url
    front = start_gateway(route)
    wait_until(lambda: front.get_json("/capabilities")["roles"]["cortex"]["ready"],
               message="the peer route ready")
    return [front, back], held


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("mode", list(MODES))
def test_a_caller_that_hangs_up_gives_back_its_place_at_once(gear, mode, stream):
    if stream:
        gear.script = _silent_stream_after_head
    gateways, held = MODES[mode](gear)
    front = gateways[0]
    try:
        _leave(front, stream)
        # The gear saw its connection closed: the attempt was aborted, not left to time out
        # (GATEWAY_UPSTREAM_TIMEOUT_S is 600 s here).
        wait_until(lambda: gear.closed_on_hang, timeout=5,
                   message="the gear's connection closed by the gateway")
        wait_until(lambda: held(front) == 0, timeout=5,
                   message=f"the {mode} route's count back to zero")
    finally:
        for gateway in gateways:
            gateway.stop()
