"""Acting on an answer while the engine is still generating it.

A test that breaks a stream mid-answer (a client that hangs up, an engine hung or killed) must
know the answer was not finished when it acted. On a busy 2-core host neither the test's reader
nor a scrape can tell: vLLM's CPU build generates the tiny model's answer in a few seconds, and
its API server answers no other request while it streams (a scrape sent at the start returns
at the end). So the engine core is held (SIGSTOP) while the test looks and acts: the answer
cannot run on, and the API server, with nothing left to send, answers at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator

from tests.conformance.servers import DIRECT, VLLM_CPU, Engine, target
from tests.support.metrics import Scrape
from tests.support.wait import wait_until

# Between two scrapes that must agree before a held engine's counters are taken as settled.
SETTLE_GAP_S = 0.2
# A paced core runs RUN_S of every PACE_PERIOD_S: a tenth of its speed, so that a reader
# starved of the CPU still sees an answer's first events long before its end.
RUN_S = 0.005
PACE_PERIOD_S = 0.05
# How long a request left running by an earlier test or trial may take to end.
QUIET_TIMEOUT_S = 120.0


def _engine_core(engine: Engine) -> int | None:
    """The pid of vLLM's engine core; None for the simulator (one process, never stopped)."""
    return engine.chat.process_named("VLLM::EngineCor") if engine.kind == VLLM_CPU else None


@contextlib.contextmanager
def generation_held(engine: Engine) -> Iterator[None]:
    """vLLM's engine core stopped for the block, its API server running; the simulator
    generates and serves in one event loop, which answers a scrape mid-stream, and is left
    running."""
    core = _engine_core(engine)
    if core is not None:
        os.kill(core, signal.SIGSTOP)
    try:
        yield
    finally:
        if core is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(core, signal.SIGCONT)


@contextlib.contextmanager
def generation_paced(engine: Engine) -> Iterator[Callable[[], None]]:
    """vLLM's engine core let run RUN_S of every PACE_PERIOD_S for the block, and held from
    the call of the function it yields (the pacing ends, the core stays stopped) to the end of
    the block. Unpaced, the tiny model's answer can be whole before a busy host's reader sees
    its fifth event (a CI run missed three trials in a row); the simulator runs unpaced."""
    core = _engine_core(engine)
    held = threading.Event()

    def pace() -> None:
        while not held.is_set():
            os.kill(core, signal.SIGSTOP)
            if held.wait(PACE_PERIOD_S - RUN_S):
                return
            os.kill(core, signal.SIGCONT)
            held.wait(RUN_S)

    def hold() -> None:
        held.set()
        if core is not None:
            pacer.join()
            os.kill(core, signal.SIGSTOP)

    pacer = threading.Thread(target=pace, daemon=True)
    if core is not None:
        pacer.start()
    try:
        yield hold
    finally:
        hold()
        if core is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(core, signal.SIGCONT)


def quiet(engine: Engine) -> Scrape:
    """The chat gear's /metrics once it runs and queues no request: an answer left running by
    an earlier test or trial would finish while the next one looks, and read as its own."""

    def idle() -> Scrape | None:
        scrape = target(engine, DIRECT).metrics()
        busy = (scrape.value("vllm:num_requests_running")
                + scrape.value("vllm:num_requests_waiting"))
        return scrape if busy == 0 else None

    return wait_until(idle, interval=SETTLE_GAP_S, timeout=QUIET_TIMEOUT_S,
                      message="the gear to run and queue no request")


def settled(engine: Engine) -> Scrape:
    """The chat gear's /metrics as of now. For vLLM, held: once its API server has taken in all
    the core sent, two scrapes in a row with the same count of generated tokens; the
    simulator's scrape is current as it comes."""
    gear = target(engine, DIRECT)
    if engine.kind != VLLM_CPU:
        return gear.metrics()
    scrapes: list[Scrape] = []

    def same_twice() -> Scrape | None:
        scrapes.append(gear.metrics())
        if len(scrapes) < 2:
            return None
        earlier, last = scrapes[-2:]
        generated = "vllm:generation_tokens_total"
        return last if last.value(generated) == earlier.value(generated) else None

    return wait_until(same_twice, interval=SETTLE_GAP_S, timeout=30,
                      message="the held engine's counters to settle")


def finished_since(before: Scrape, after: Scrape) -> float:
    """Requests the engine finished (any reason) between two scrapes."""
    return (after.value("vllm:request_success_total")
            - before.value("vllm:request_success_total"))


def act_mid_answer(engine: Engine, before: Scrape, act: Callable[[], None]) -> bool:
    """With the engine held, `act` (a fault) if no answer has finished since `before`:
    whether it acted."""
    with generation_held(engine):
        unfinished = finished_since(before, settled(engine)) == 0
        if unfinished:
            act()
    return unfinished
