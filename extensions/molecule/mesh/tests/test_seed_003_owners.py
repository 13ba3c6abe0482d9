"""Seed 003 on the deployed mesh: the scenario's entry box forwards cortex to the boxes that own
it, in its declared order, under the fleet key (tailnet declares no owners role)."""

from __future__ import annotations

from fleet_mesh import ONE_PROBE_INTERVAL_S, Box, Mesh, gateway_stopped
from seed_requests import cortex_request, new_tag, tagged

from tests.support.client import Reply, chat
from tests.support.wait import wait_until


def owners(mesh: Mesh, entry: Box) -> list[Box]:
    return [mesh.by_origin(peer["origin"]) for peer in entry.plan["roles"]["cortex"]["peers"]]


def forwarded(entry: Box) -> tuple[Reply, str]:
    tag = new_tag()
    return chat(entry.origin, cortex_request(tag), entry.auth), tag


def assert_answered_by(reply: Reply, tag: str, owner: Box, entry: Box) -> None:
    """The owner answered, and its gear got the request marked as forwarded by the entry and
    with no key (the owner's gate took the fleet key and kept it)."""
    assert (reply.status, reply.headers.get("x-lobes-proxied-by")) == (200, owner.origin)
    (received,) = tagged(owner.gear_requests("cortex"), tag)
    assert received["headers"]["x-lobes-forwarded-by"] == entry.origin
    assert "authorization" not in received["headers"]


def wait_every_owner_ready(entry: Box) -> None:
    """The entry's probes see every owner ready (an earlier test may have stopped, cut off or
    replaced one, and the entry learns of its return only at its next probe)."""
    wait_until(lambda: all(row["ready"] and row["compatible"]
                           for row in entry.advertised("cortex")["owners"]),
               message="every owner ready again on the entry", timeout=ONE_PROBE_INTERVAL_S,
               interval=0.2)


def test_the_first_owner_answers_a_forwarded_request(mesh: Mesh) -> None:
    entry = mesh["entry"]
    first, _elapsed = owners(mesh, entry)
    wait_every_owner_ready(entry)
    reply, tag = forwarded(entry)
    assert_answered_by(reply, tag, first, entry)


def test_a_stopped_first_owner_fails_over_to_the_next_one_in_order(mesh: Mesh) -> None:
    entry = mesh["entry"]
    first, second = owners(mesh, entry)
    # The second owner runs a gate and the entry holds none of its keys: only the fleet key
    # lets the forwarded request in.
    assert second.api_key and second.name not in entry.plan["key_hosts"]

    with gateway_stopped(first):
        reply, tag = forwarded(entry)
        assert_answered_by(reply, tag, second, entry)

    wait_every_owner_ready(entry)
    reply, tag = forwarded(entry)
    assert_answered_by(reply, tag, first, entry)
