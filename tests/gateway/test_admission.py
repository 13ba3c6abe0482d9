"""Admission with real processes: a one-slot simulated gear behind a gateway with named keys.

The order in which requests reach the simulator is the order the gateway released them; each
request carries a marker in its message so the recorder tells them apart. Requests are queued
one at a time, each after /status shows the one before it waiting, so the queue's order is
the test's, not the threads'.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.admission import assert_two_agents_and_one_person_queued, leave_while_queued
from tests.support.client import Reply, call, chat, wired
from tests.support.gateway_proc import start_gateway
from tests.support.metrics import Scrape
from tests.support.senders import Sender
from tests.support.sim_proc import start_sim
from tests.support.wait import wait_until

from .test_pressure_strict import wait_mode, write_proc

BOX_KEY = "box-key"
KEYS = {"box": BOX_KEY, "person": "k-person", "agents": "k-agents", "evals": "k-evals",
        "solo": "k-solo"}
CLIENT_KEYS = ("person=k-person:interactive,agents=k-agents:batch,evals=k-evals:batch,"
               "solo=k-solo:standard:1")
ROLE = "cortex"
# spark-cortex at time scale 10: ~2 ms a token, so the 800-token holder runs ~1.7 s.
HOLD_TOKENS = 800


def auth(name: str, **headers: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}", **headers}


def ask(url: str, marker: str, name: str, tokens: int = 8, model: str = "main",
        **headers: str) -> Reply:
    payload = {"model": model, "max_tokens": tokens, "ignore_eos": True,
               "messages": [{"role": "user", "content": marker}]}
    return chat(url, payload, auth(name, **headers), timeout=60)


@pytest.fixture(scope="module")
def access_log(tmp_path_factory):
    return tmp_path_factory.mktemp("admission") / "access.log"


@pytest.fixture(scope="module")
def pair(access_log):
    env = {"GATEWAY_API_KEY": BOX_KEY, "GATEWAY_CLIENT_KEYS": CLIENT_KEYS,
           "PRIMARY_MAX_ACTIVE": "1", "GATEWAY_ACCESS_LOG": str(access_log)}
    with start_sim("spark-cortex", time_scale=10, extra_args=["--max-num-seqs", "1"]) as sim, \
            start_gateway({**wired(sim, served="unsloth/Qwen3.8-27B-NVFP4"), **env}) as gateway:
        yield gateway, sim


@pytest.fixture
def gear(pair):
    gateway, sim = pair
    wait_until(lambda: admission(gateway)["running"] == 0, timeout=30, interval=0.05,
               message="the previous test's requests to end")
    sim.clear_requests()
    return pair


def admission(gateway) -> dict:
    return gateway.get_json("/status")["admission"][ROLE]


def hold_then_queue(gateway, sim, requests: list[tuple[str, str, dict[str, str]]]) -> Sender:
    """Occupy the one slot with a long request, then queue `requests` (marker, key, headers)
    in order, each once the queue shows it waiting."""
    sender = Sender(gateway.url, ask)
    sender.send("holder", "agents", HOLD_TOKENS)
    wait_until(lambda: "holder" in reached(sim), timeout=10, interval=0.02,
               message="the holder to start")
    for count, (marker, name, headers) in enumerate(requests, start=1):
        sender.send(marker, name, **headers)
        wait_until(lambda n=count: sum(admission(gateway)["queued"].values()) == n, timeout=10,
                   interval=0.02, message=f"{marker} to wait in the queue")
    return sender


def reached(sim) -> list[str]:
    """The markers of the chat requests the simulator received, in order."""
    return [json.loads(r["body"])["messages"][0]["content"] for r in sim.requests()
            if r["method"] == "POST"]


def test_an_interactive_key_goes_before_a_queued_batch_flood(gear):
    gateway, sim = gear
    flood = [(f"agents-{n}", "agents", {}) for n in range(4)]
    sender = hold_then_queue(gateway, sim, [*flood, ("person", "person", {})])
    replies = sender.join()
    assert all(reply.status == 200 for reply in replies.values())
    assert reached(sim) == ["holder", "person", "agents-0", "agents-1", "agents-2", "agents-3"]


def test_keys_share_a_class_fairly(gear):
    gateway, sim = gear
    flood = [(f"agents-{n}", "agents", {}) for n in range(4)]
    evals = [(f"evals-{n}", "evals", {}) for n in range(2)]
    hold_then_queue(gateway, sim, [*flood, *evals]).join()
    # The second key's requests alternate with the flood instead of waiting behind it.
    assert reached(sim) == ["holder", "agents-0", "evals-0", "agents-1", "evals-1", "agents-2",
                            "agents-3"]


def test_a_header_lowers_the_class_and_never_raises_it(gear):
    gateway, sim = gear
    sender = hold_then_queue(gateway, sim, [
        ("agents-asks-interactive", "agents", {"X-Lobes-Priority": "interactive"}),
        ("person-asks-batch", "person", {"X-Lobes-Priority": "batch"}),
        ("box-standard", "box", {}),
    ])
    sender.join()
    # The box key runs standard; the agent stays batch whatever it asks, and the person's
    # own batch request queues with the agent's, in arrival order.
    assert reached(sim) == ["holder", "box-standard", "agents-asks-interactive",
                            "person-asks-batch"]


def test_an_unknown_class_or_deadline_is_a_400_naming_the_fix(gear):
    gateway, sim = gear
    bad_class = ask(gateway.url, "x", "person", **{"X-Lobes-Priority": "urgent"})
    bad_deadline = ask(gateway.url, "x", "person", **{"X-Lobes-Deadline-S": "soon"})
    for reply, named in ((bad_class, "interactive, standard, batch"),
                         (bad_deadline, "greater than 0")):
        assert reply.status == 400
        assert reply.error["type"] == "invalid_request_error"
        assert named in reply.error["message"]
    assert reached(sim) == []


def test_a_deadline_the_queue_cannot_meet_is_refused_at_once(gear):
    gateway, sim = gear
    ask(gateway.url, "warm-up", "person", 200)  # teaches the queue the gear's rate
    sender = hold_then_queue(gateway, sim, [])
    started = time.monotonic()
    refused = ask(gateway.url, "hurried", "person", **{"X-Lobes-Deadline-S": "0.2"})
    waited = time.monotonic() - started
    patient = ask(gateway.url, "patient", "person", **{"X-Lobes-Deadline-S": "60"})
    sender.join()
    assert refused.status == 429
    assert refused.error["code"] == "deadline_unmeetable"
    assert int(refused.headers["retry-after"]) >= 1
    assert waited < 1.0  # refused on arrival, not after waiting for the holder
    assert patient.status == 200
    assert reached(sim) == ["warm-up", "holder", "patient"]


def test_a_declared_rate_refuses_an_unmeetable_deadline_at_once(gateway_factory, sim_factory):
    # No request has finished on this fresh gateway: P_RATE (spark-cortex's 48.9 tok/s at
    # time scale 10) prices the holder's ~1.6 s, so a 0.2 s deadline is refused on arrival.
    sim = sim_factory("spark-cortex", time_scale=10, extra_args=["--max-num-seqs", "1"])
    gateway = gateway_factory({**wired(sim, served="unsloth/Qwen3.8-27B-NVFP4"),
                               "GATEWAY_API_KEY": BOX_KEY, "GATEWAY_CLIENT_KEYS": CLIENT_KEYS,
                               "PRIMARY_MAX_ACTIVE": "1", "PRIMARY_RATE": "489"})
    sender = hold_then_queue(gateway, sim, [])
    started = time.monotonic()
    refused = ask(gateway.url, "hurried", "person", **{"X-Lobes-Deadline-S": "0.2"})
    waited = time.monotonic() - started
    sender.join()
    assert refused.status == 429 and refused.error["code"] == "deadline_unmeetable"
    assert waited < 1.0  # on arrival, not when the holder's ~1.6 s ended
    assert reached(sim) == ["holder"]
    scrape = Scrape.of(gateway.url)
    assert scrape.value("lobes_gateway_admission_total", role=ROLE,
                        outcome="deadline_unmeetable", **{"class": "interactive"}) == 1


def test_a_request_still_waiting_at_its_deadline_is_refused_never_started(gateway_factory,
                                                                          sim_factory):
    # A fresh gateway has learned no rate: it cannot estimate, so the request waits, and its
    # deadline ends the wait.
    sim = sim_factory("spark-cortex", time_scale=10, extra_args=["--max-num-seqs", "1"])
    gateway = gateway_factory({**wired(sim, served="unsloth/Qwen3.8-27B-NVFP4"),
                               "GATEWAY_API_KEY": BOX_KEY, "GATEWAY_CLIENT_KEYS": CLIENT_KEYS,
                               "PRIMARY_MAX_ACTIVE": "1"})
    sender = hold_then_queue(gateway, sim, [])
    refused = ask(gateway.url, "late", "person", **{"X-Lobes-Deadline-S": "0.3"})
    sender.join()
    assert refused.status == 429 and refused.error["code"] == "deadline_unmeetable"
    assert reached(sim) == ["holder"]
    scrape = Scrape.of(gateway.url)
    assert scrape.value("lobes_gateway_admission_total", role=ROLE, outcome="deadline_passed",
                        **{"class": "interactive"}) == 1


def test_a_client_that_leaves_while_queued_never_reaches_the_gear(gear):
    gateway, sim = gear
    sender = hold_then_queue(gateway, sim, [])
    before = Scrape.of(gateway.url).value("lobes_gateway_admission_total", outcome="client_gone")
    leave_while_queued(gateway.port, "main", KEYS["evals"],
                       lambda: admission(gateway)["queued_by_client"])
    sender.join()
    after = Scrape.of(gateway.url).value("lobes_gateway_admission_total", outcome="client_gone")
    assert after == before + 1
    assert reached(sim) == ["holder"]


def test_the_queue_shows_on_status_and_metrics_by_class_and_key_name(gear, access_log):
    gateway, sim = gear
    sender = hold_then_queue(gateway, sim, [("a", "agents", {}), ("b", "agents", {}),
                                            ("p", "person", {})])
    status = admission(gateway)
    scrape = Scrape.of(gateway.url)
    sender.join()
    assert status["slots"] == 1 and status["running"] == 1
    assert_two_agents_and_one_person_queued(status, scrape, ROLE)
    assert all(KEYS["agents"] not in line for line in scrape.text.splitlines())
    after = Scrape.of(gateway.url)
    assert after.value("lobes_gateway_client_requests_total", client="person", code="200") >= 1
    wait_until(lambda: access_log.exists() and '"client":"person"' in access_log.read_text(),
               timeout=5, interval=0.05, message="the access log to name the key")
    assert KEYS["person"] not in access_log.read_text()


def test_a_named_key_has_its_own_in_flight_limit(gear):
    gateway, sim = gear
    sender = Sender(gateway.url, ask)
    sender.send("solo-1", "solo", HOLD_TOKENS)
    wait_until(lambda: reached(sim), timeout=10, interval=0.02, message="solo-1 to start")
    second = ask(gateway.url, "solo-2", "solo")
    sender.join()
    assert second.status == 429
    assert "GATEWAY_CLIENT_KEYS" in second.error["message"]
    assert call(gateway.url, "GET", "/health").status == 200


def test_what_never_waits_minor_pressure_sheds_and_other_boxes_arrivals(gateway_factory,
                                                                        sim_factory, tmp_path):
    write_proc(tmp_path, 10)
    sim = sim_factory("spark-cortex", time_scale=10, extra_args=["--max-num-seqs", "1"])
    minor = sim_factory("instant", served_name="small")
    gateway = gateway_factory({**wired(sim, served="unsloth/Qwen3.8-27B-NVFP4"),
                               **wired(minor, "MINOR", "small"), "MINOR_MAX_ACTIVE": "1",
                               **wired(minor, "EMBED", "small"), "EMBED_MAX_ACTIVE": "1",
                               "GATEWAY_API_KEY": BOX_KEY, "GATEWAY_CLIENT_KEYS": CLIENT_KEYS,
                               "PRIMARY_MAX_ACTIVE": "1", "LOBES_PROC_ROOT": str(tmp_path),
                               "LOBES_PRESSURE_SAMPLE_S": "0.02"})
    # Only the generate roles served here wait; minor is the floor, embeddings never wait.
    assert set(gateway.get_json("/status")["admission"]) == {ROLE}
    sender = hold_then_queue(gateway, sim, [])
    # Another box admitted this one: it takes a slot here without waiting again.
    sender.send("from-a-peer", "person", **{"X-Lobes-Proxied": "cortex"})
    wait_until(lambda: reached(sim) == ["holder", "from-a-peer"], timeout=10, interval=0.02,
               message="the proxied arrival to reach the gear while the holder runs")
    assert admission(gateway)["running"] == 2
    assert ask(gateway.url, "small", "agents", model="minor").status == 200  # the floor
    write_proc(tmp_path, 80)
    wait_mode(gateway, "busy")
    shed = ask(gateway.url, "shed", "person")
    assert shed.status == 429 and shed.error["code"] == "busy"  # at once, not after waiting
    assert sum(admission(gateway)["queued"].values()) == 0
    assert all(reply.status == 200 for reply in sender.join().values())
    assert "shed" not in reached(sim)
