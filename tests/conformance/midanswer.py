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
from collections.abc import Callable, Iterator

from tests.conformance.servers import DIRECT, VLLM_CPU, Engine, target
from tests.support.metrics import Scrape
from tests.support.wait import wait_until

# Between two scrapes that must agree before a held engine's counters are taken as settled.
SETTLE_GAP_S = 0.2


@contextlib.contextmanager
def generation_held(engine: Engine) -> Iterator[None]:
    """vLLM's engine core stopped for the block, its API server running; the simulator
    generates and serves in one event loop, which answers a scrape mid-stream, and is left
    running."""
    core = engine.chat.process_named("VLLM::EngineCor") if engine.kind == VLLM_CPU else None
    if core is not None:
        os.kill(core, signal.SIGSTOP)
    try:
        yield
    finally:
        if core is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(core, signal.SIGCONT)


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
