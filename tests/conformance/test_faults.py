"""An engine that fails mid-stream, as a client sees it direct and through the gateway: hung
(SIGSTOP, as a hung host looks), its engine core killed, stopped (SIGTERM).

Direct, both engines behave as vLLM does: a hung engine holds the stream open and silent; a
dead core or a stop ends every stream at once, without a finish reason (an error event, or a
bare [DONE]). Through the gateway each is a broken stream: it must end as the gateway ends a
stream cut off (a stream_interrupted error event, no [DONE]), never hang and never look
finished.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest

from tests.conformance.midanswer import act_mid_answer, settled
from tests.conformance.servers import (
    CHAT_NAME,
    DIRECT,
    GATEWAY,
    SIM,
    Engine,
    gateway_env,
    sim_chat,
    sim_embed,
    target,
    vllm_chat,
)
from tests.support.gateway_proc import start_gateway
from tests.support.wait import wait_until

# The engines a fault ends get the tiny model's whole window: a stream of thousands of tokens,
# seconds long, so a fault mostly comes mid-answer.
FAULT_WINDOW = 4096
# A fault comes only while the engine, held, has every answer unfinished (midanswer.py); a
# trial where a starved reader saw its third event after an answer's end is retried, not judged.
TRIALS = 5


def long_stream(window: int) -> dict:
    return {"model": CHAT_NAME, "max_tokens": window - 100, "ignore_eos": True,
            "temperature": 1.0, "seed": 5,
            "messages": [{"role": "user", "content": "go on for a while"}]}


# How long a client waits in silence before it calls the stream hung.
SILENCE_S = 12.0
# The gateway's stall limit in these tests: short, so a cut shows well within SILENCE_S.
STALL_S = "4"


@dataclass
class Read:
    """How a client's stream went: its events, and how it ended."""

    status: int = 0
    events: list[dict] = field(default_factory=list)
    ended: str = "open"  # done ([DONE]), eof (closed without it), silent (no byte for a while)
    opened: threading.Event = field(default_factory=threading.Event)

    @property
    def finish_reasons(self) -> list[str]:
        return [c["finish_reason"] for e in self.events for c in e.get("choices") or ()
                if c.get("finish_reason")]

    @property
    def errors(self) -> list[dict]:
        return [e["error"] for e in self.events if "error" in e]

    def cut_by_gateway(self, code: str = "stream_interrupted") -> bool:
        """Ended by the gateway as a cut stream: one error event (`code`: stream_interrupted
        for a stream broken off, stream_stalled for one gone silent), no [DONE], no finish."""
        return (self.status == 200 and self.ended == "eof" and not self.finish_reasons
                and [e.get("code") for e in self.errors] == [code])


def read_stream(url: str, read: Read, body: dict, silence_s: float = SILENCE_S,
                on_opened: Callable[[], None] | None = None) -> Read:
    """Stream `body` from `url` into `read` to its end, or until `silence_s` pass without a
    byte; `read.opened` is set once three events came (or the stream ended before), and
    `on_opened` runs then, in this thread, before another byte is read."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=silence_s)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": True}),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        read.status = response.status
        read.ended = "eof"
        for line in response:
            if line.startswith(b"data: [DONE]"):
                read.ended = "done"
                break
            if line.startswith(b"data: "):
                read.events.append(json.loads(line[6:]))
                if len(read.events) == 3:
                    read.opened.set()
                    if on_opened is not None:
                        on_opened()
    except TimeoutError:
        read.ended = "silent"
    except (http.client.IncompleteRead, ConnectionError):
        read.ended = "eof"
    finally:
        read.opened.set()
        conn.close()
    return read


def streams_under(engine: Engine, fault: Callable[[], None]) -> dict[str, Read] | None:
    """A stream direct and one through the gateway, each under way, then the fault: how each
    stream ended; None where the engine had finished one before the fault could come (it
    does not)."""
    targets = {DIRECT: target(engine, DIRECT), GATEWAY: target(engine, GATEWAY)}
    reads = {path: Read() for path in targets}
    threads = [threading.Thread(target=read_stream, daemon=True,
                                args=(each.url, reads[path], long_stream(FAULT_WINDOW)))
               for path, each in targets.items()]
    before = settled(engine)
    for thread in threads:
        thread.start()
    for read in reads.values():
        assert read.opened.wait(timeout=60), "a stream did not start"
    mid_answer = act_mid_answer(engine, before, fault)
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), reads
    return reads if mid_answer else None


def server_pid(server: object) -> int:
    """The serving process: the API server of vLLM, the simulator's only process."""
    return server.pid if hasattr(server, "pid") else server.process.pid


def _fresh_engine(kind: str, request: pytest.FixtureRequest) -> Engine:
    """A chat gear and a gateway of their own (a stall limit of STALL_S): the fault ends them."""
    chat = (sim_chat(FAULT_WINDOW) if kind == SIM
            else vllm_chat(request.getfixturevalue("install"), FAULT_WINDOW))
    embed = sim_embed()
    gateway = start_gateway(gateway_env(chat.url, embed.url, FAULT_WINDOW,
                                        GATEWAY_STREAM_STALL_S=STALL_S))
    return Engine(kind, chat, embed, gateway)


def _kill_core(engine: Engine) -> None:
    if engine.kind == SIM:
        engine.chat.set_faults({"engine_dead": True})
    else:
        os.kill(engine.chat.process_named("VLLM::EngineCor"), signal.SIGKILL)


def _stop_engine(engine: Engine) -> None:
    os.kill(server_pid(engine.chat), signal.SIGTERM)


FAULTS = {"core-killed": _kill_core, "stopped": _stop_engine}


@pytest.fixture(scope="module", params=list(FAULTS))
def broken(engine_kind: str, request: pytest.FixtureRequest) -> Iterator[dict[str, Read]]:
    """A stream direct and one through the gateway, then the fault: how each ended."""
    engine = _fresh_engine(engine_kind, request)
    try:
        for _trial in range(TRIALS):
            reads = streams_under(engine, lambda: FAULTS[request.param](engine))
            if reads is not None:
                break
        else:
            pytest.fail(f"in {TRIALS} trials the engine had finished an answer before the "
                        "readers saw three events: the host is too busy for this test")
        yield reads
    finally:
        engine.stop()


def test_a_dead_engine_never_ends_the_stream_as_an_answer(broken):
    # vLLM ends it several ways, run to run: an error event and [DONE], a bare [DONE] after a
    # content event, finish_reason "abort" and [DONE], or (stopped) no end at all while its
    # HTTP server waits for the connection to close. Never as a finished answer.
    read = broken[DIRECT]
    assert read.status == 200
    assert set(read.finish_reasons) <= {"abort"}, read.finish_reasons
    for error in read.errors:
        assert error["type"] == "InternalServerError" and error["code"] == 500


def test_through_the_gateway_a_dead_engine_ends_the_stream_as_cut(broken):
    # However the engine ends it: interrupted; or, left open and silent (stopped, its server
    # waiting for the connection to close), stalled once GATEWAY_STREAM_STALL_S passes.
    read = broken[GATEWAY]
    assert read.cut_by_gateway() or read.cut_by_gateway("stream_stalled"), (read.ended,
                                                                            read.events[-2:])


@pytest.fixture(scope="module")
def long_engine(engine_kind: str, request: pytest.FixtureRequest) -> Iterator[Engine]:
    """An engine of the long window, with its gateway (a stall limit of STALL_S), that the
    tests of a hung engine stop and start again."""
    engine = _fresh_engine(engine_kind, request)
    try:
        yield engine
    finally:
        engine.stop()


def test_a_hung_engine_holds_the_stream_open_and_silent(long_engine: Engine):
    read = _hung(long_engine, DIRECT)
    assert read.ended == "silent"
    assert not read.finish_reasons


def test_through_the_gateway_a_hung_engine_stream_is_cut(long_engine: Engine):
    read = _hung(long_engine, GATEWAY)
    assert read.cut_by_gateway("stream_stalled"), (read.ended, read.events[-2:])


def _hung(engine: Engine, path: str) -> Read:
    """A stream under way, then the engine's server stopped (SIGSTOP) by the reader itself at
    its third event, if the answer was unfinished then."""
    missed = []
    for _trial in range(TRIALS):
        read, stopped = _hung_once(engine, path)
        if stopped:
            return read
        missed.append(f"{read.ended} after {len(read.events)} events {read.errors}")
    pytest.fail(f"in {TRIALS} trials the stream was not under way when the reader saw its "
                f"third event (finished, or ended before): {missed}")


def _hung_once(engine: Engine, path: str) -> tuple[Read, bool]:
    """One trial: how the stream ended, and whether the server was stopped mid-answer. The
    server runs on afterwards (SIGCONT) and ends the stream."""
    pid = server_pid(engine.chat)
    before = settled(engine)
    stopped = threading.Event()

    def stop_mid_answer() -> None:
        if act_mid_answer(engine, before, lambda: os.kill(pid, signal.SIGSTOP)):
            stopped.set()

    read = Read()
    thread = threading.Thread(target=read_stream, daemon=True,
                              args=(target(engine, path).url, read, long_stream(FAULT_WINDOW)),
                              kwargs={"on_opened": stop_mid_answer})
    try:
        thread.start()
        thread.join(timeout=60)
        assert not thread.is_alive(), read
        return read, stopped.is_set()
    finally:
        os.kill(pid, signal.SIGCONT)
        wait_until(lambda: target(engine, DIRECT).metrics().value(
            "vllm:num_requests_running") == 0, timeout=60, message="the streams to end")
