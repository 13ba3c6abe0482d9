"""One bad peer cannot stop the mesh.

A pool front gateway with two replicas: an honest peer gateway (in front of a fake gear) and a
scriptable hostile peer that copies the honest one's adverts and breaks them one way at a time
(tests/support/fake_gear.py, its probes answered from the honest gateway's, altered). The bad
peer is declared FIRST, where the first ready peer used to become the reference. Whatever it
advertises or answers, the honest replica stays probed, ready and serving, the bad one is
marked with a reason, and probing goes on (the bad peer is selectable again once it is honest
again). The same holds where the peers are owners (owner forwarding).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.client import chat
from tests.support.fake_gear import (
    SERVED,
    FakeGear,
    Received,
    chat_answer,
    echo_script,
    json_answer,
    stream_answer,
    wired_to,
)
from tests.support.gateway_proc import GatewayProcess, start_gateway
from tests.support.metrics import Scrape
from tests.support.wait import wait_until

FLEET = "fleet-secret"
DEEP = b"[" * 100_000 + b"]" * 100_000


def _honest_probe(honest: GatewayProcess) -> Callable[[Received], list[bytes]]:
    """The hostile peer's GETs answered as the honest gateway answers them."""
    def answer(request: Received) -> list[bytes]:
        with urllib.request.urlopen(honest.url + request.target, timeout=5) as reply:
            return [json_answer(json.loads(reply.read()))]
    return answer


def _altered(honest: GatewayProcess,
             alterations: dict[str, Callable[[dict], object]]) -> Callable[[Received], list[bytes]]:
    """As the honest gateway answers, but each path's JSON altered (or replaced by raw
    bytes) as `alterations` says."""
    plain = _honest_probe(honest)

    def answer(request: Received) -> list[bytes]:
        alter = alterations.get(request.target)
        if alter is None:
            return plain(request)
        with urllib.request.urlopen(honest.url + request.target, timeout=5) as reply:
            altered = alter(json.loads(reply.read()))
        body = altered if isinstance(altered, bytes) else json.dumps(altered).encode()
        return [b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                % len(body) + body]
    return answer


def _cortex(capabilities: dict, **changes: object) -> dict:
    capabilities["roles"]["cortex"].update(changes)
    return capabilities


def _running(status: dict, value: str) -> bytes:
    """The status with the cortex backend's running count written as `value` (JSON text that
    Python would not write: Infinity, 1e999, 400 digits)."""
    for backend in status["backends"]:
        backend["metrics"] = {"running": "RUNNING", "waiting": 0}
    return json.dumps(status).replace('"RUNNING"', value).encode()


def _lists(models: dict, model: str) -> dict:
    for entry in models["data"]:
        entry["id"] = model
    return models


CASES: dict[str, dict[str, Callable[[dict], object]]] = {
    "capabilities-nested-100000-deep": {"/capabilities": lambda c: DEEP},
    "models-nested-100000-deep": {"/v1/models": lambda m: DEEP},
    "status-nested-100000-deep": {"/status": lambda s: DEEP},
    "served-name-a-list": {"/capabilities": lambda c: _cortex(c, served_name=[SERVED])},
    "served-name-an-object": {"/capabilities": lambda c: _cortex(c, served_name={"a": 1})},
    "load-infinity": {"/status": lambda s: _running(s, "Infinity")},
    "load-nan": {"/status": lambda s: _running(s, "NaN")},
    "load-1e999": {"/status": lambda s: _running(s, "1e999")},
    "load-10-to-the-400": {"/status": lambda s: _running(s, "1" + "0" * 400)},
    "max-active-10-to-the-100": {"/capabilities": lambda c: _cortex(c, max_active=10 ** 100)},
    "max-active-twenty-million": {"/capabilities": lambda c: _cortex(c, max_active=20_000_000)},
    "context-10-to-the-100": {"/capabilities": lambda c: _cortex(c, context=10 ** 100)},
    "models-window-10-to-the-100": {
        "/capabilities": lambda c: _cortex(c, context=None),
        "/v1/models": lambda m: {**m, "data": [{**e, "max_model_len": 10 ** 100}
                                               for e in m["data"]]}},
    # Consistently another model, declared first: it used to become the fingerprint reference
    # and the honest replica the odd one out.
    "another-model": {"/capabilities": lambda c: _cortex(c, served_name="another/model"),
                      "/v1/models": lambda m: _lists(m, "another/model")},
}


@pytest.fixture(params=["pool", "owners"])
def mesh(request) -> Iterator[tuple[GatewayProcess, GatewayProcess, FakeGear]]:
    """(front, honest peer gateway, hostile fake peer): the front pools both, or forwards to
    both as owners, the hostile one declared first."""
    gear = FakeGear()
    honest = start_gateway({**wired_to(gear), "PRIMARY_MAX_MODEL_LEN": "4096",
                            "PRIMARY_MAX_ACTIVE": "2", "GATEWAY_FLEET_KEY": FLEET})
    hostile = FakeGear(echo_script, probes=_honest_probe(honest))
    route = ({"PRIMARY_ROUTE": "pool", "GATEWAY_POOL_POLICY": "queue"}
             if request.param == "pool" else {"PRIMARY_ROUTE": "owners"})
    front = start_gateway({
        **route, "PRIMARY_FEASIBLE": "false", "PRIMARY_SERVED_NAME": SERVED,
        "PRIMARY_PEER_ORIGINS": f"{hostile.url},{honest.url}", "GATEWAY_FLEET_KEY": FLEET,
        "GATEWAY_PROBE_INTERVAL_S": "0.2", "GATEWAY_PROBE_TIMEOUT_S": "2"})
    try:
        yield front, honest, hostile
    finally:
        front.stop()
        honest.stop()
        hostile.close()
        gear.close()


def _rows(front: GatewayProcess) -> dict[str, dict]:
    cortex = front.get_json("/capabilities")["roles"]["cortex"]
    return {row["origin"]: row for row in cortex.get("replicas") or cortex.get("owners") or []}


def _selectable(row: dict) -> bool:
    return row["ready"] and row["compatible"]


def _selectable_in_metrics(front: GatewayProcess, peer: str) -> float:
    """What /metrics says of a peer: a pool replica's ready and compatible gauges, or an
    owner's selectable gauge."""
    scrape = Scrape.of(front.url)
    if ("lobes_gateway_peer_selectable", frozenset({("role", "cortex"), ("peer", peer)})) in \
            scrape.series("lobes_gateway_peer_"):
        return scrape.value("lobes_gateway_peer_selectable", peer=peer)
    return (scrape.value("lobes_gateway_pool_replica_ready", replica=peer)
            * scrape.value("lobes_gateway_pool_replica_compatible", replica=peer))


def _marked(rows: dict[str, dict], honest: str, hostile: str) -> dict[str, dict] | None:
    """`rows` once the honest replica is selectable and the hostile one judged not."""
    judged = rows[hostile]["reason"] != "not probed yet"
    return rows if _selectable(rows[honest]) and judged and not _selectable(rows[hostile]) \
        else None


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_advert_marks_that_peer_alone_and_probing_goes_on(mesh, case):
    front, honest, hostile = mesh
    hostile.probes = _altered(honest, CASES[case])
    rows = wait_until(lambda: _marked(_rows(front), honest.url, hostile.url),
                      message="the honest replica selectable and the bad one marked")
    time.sleep(1.0)  # five probe passes later it still holds: a verdict, not a moment
    assert _marked(_rows(front), honest.url, hostile.url), _rows(front)
    assert rows[hostile.url]["reason"]  # named, not silent
    assert _selectable_in_metrics(front, hostile.url) == 0
    assert _selectable_in_metrics(front, honest.url) == 1
    answers = [chat(front.url, {"model": "cortex", "max_tokens": 4, "messages": [
        {"role": "user", "content": f"ask-{i}"}]}, timeout=20) for i in range(4)]
    assert [a.status for a in answers] == [200] * 4
    assert {a.headers["x-lobes-proxied-by"] for a in answers} == {honest.url}
    context = front.get_json("/capabilities")["roles"]["cortex"].get("context")
    assert context in (None, 4096)  # never a number only the bad peer advertised
    hostile.probes = _honest_probe(honest)  # probing went on: it is judged honest again
    wait_until(lambda: _selectable(_rows(front)[hostile.url]),
               message="the peer selectable again once its adverts are honest")


def test_a_peer_whose_answers_name_another_model_never_answers_a_caller(mesh):
    """It copies the honest fingerprint, so only its answers tell: each is refused before a
    byte reaches the caller, and the request is served by the honest peer."""
    front, honest, hostile = mesh

    def other_model(request: Received):
        said = request.json()["messages"][-1]["content"]
        if request.json().get("stream"):
            return [stream_answer([said], model="another/model")]
        return [json_answer(chat_answer(said, model="another/model"))]

    hostile.script = other_model
    wait_until(lambda: all(_selectable(r) for r in _rows(front).values()),
               message="both peers selectable (the bad one's adverts are honest)")

    def ask(index: int):
        return chat(front.url, {"model": "cortex", "max_tokens": 4, "messages": [
            {"role": "user", "content": f"ask-{index}"}]}, timeout=20)

    with ThreadPoolExecutor(3) as callers:  # at once: placement spreads them over both
        replies = list(callers.map(ask, range(9)))
    for reply in replies:
        assert reply.status == 200
        assert reply.json()["model"] == SERVED
        assert reply.headers["x-lobes-proxied-by"] == honest.url
    refused = Scrape.of(front.url).value("lobes_gateway_upstream_attempts_total",
                                         target=hostile.url, outcome="wrong_model")
    assert refused >= 1
