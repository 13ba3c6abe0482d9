"""The gateway's event loop (transport/loop.py) against asyncio's own, the oracle.

LeanLoop does a turn of asyncio's selector loop in one frame; every test here runs the same
program on asyncio's epoll loop and on LeanLoop and asks for the same behaviour: callbacks in
the same order, timers due and cancelled alike, socket readiness, callback errors reported the
same way, wake-ups from other threads and from signals.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import signal
import socket
import threading
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lobes_gateway.transport import loop as event_loop

from tests.support.client import chat, wired
from tests.support.gateway_proc import start_gateway
from tests.support.sim_proc import start_sim

pytestmark = pytest.mark.skipif(not event_loop.FITS, reason="LeanLoop runs on CPython 3.11 "
                                "with epoll only; elsewhere the gateway runs asyncio's loop")

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": lambda: asyncio.SelectorEventLoop(selectors.EpollSelector()),
    "lean": event_loop.LeanLoop,
}


@pytest.fixture(params=list(LOOPS))
def each_loop(request):
    """asyncio's epoll loop, then LeanLoop: closed after the test."""
    loop = LOOPS[request.param]()
    yield loop
    loop.close()


# One step of a generated program, run inside a callback: what it schedules is labelled by its
# index, so two loops' logs compare label for label.
OPS = st.sampled_from(["soon", "later0", "past", "cancel", "send", "raise", "next_turn",
                       "remove_reader", "future_timer", "many_cancelled"])


class Program:
    """Runs a list of ops on a loop, logging every callback it scheduled as it runs."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ops: list[str]) -> None:
        self.loop, self.ops = loop, ops
        self.log: list[str] = []
        self.timed: list[str] = []  # timers with a real delay, as they fire
        self.due: list[tuple[float, int, str]] = []  # and when each was due
        self.handles: list[asyncio.Handle] = []
        self.pairs = [socket.socketpair(), socket.socketpair()]
        for index, (reading, _writing) in enumerate(self.pairs):
            reading.setblocking(False)
            loop.add_reader(reading.fileno(), self._readable, index)
        loop.set_exception_handler(self._error)

    def close(self) -> None:
        for reading, writing in self.pairs:
            self.loop.remove_reader(reading.fileno())
            reading.close()
            writing.close()

    def _readable(self, index: int) -> None:
        data = self.pairs[index][0].recv(64)
        self.log.append(f"read{index}:{len(data)}")

    def _error(self, _loop: asyncio.AbstractEventLoop, context: dict) -> None:
        self.log.append(f"error:{context['exception']}:{context['message'].split(' ')[0]}")

    def run_from(self, start: int) -> None:
        """Run ops from `start` in this callback, until one asks for the next turn."""
        loop = self.loop
        for index in range(start, len(self.ops)):
            op = self.ops[index]
            label = f"{op}{index}"
            if op == "soon":
                self.handles.append(loop.call_soon(self.log.append, label))
            elif op == "later0":
                self.handles.append(loop.call_later(0, self.log.append, label))
            elif op == "past":
                self.handles.append(loop.call_at(loop.time() - 1, self.log.append, label))
            elif op == "cancel" and self.handles:
                self.handles.pop().cancel()
            elif op == "send":
                self.pairs[index % 2][1].send(b"x")
            elif op == "raise":
                loop.call_soon(_raise, label)
            elif op == "remove_reader":
                loop.remove_reader(self.pairs[index % 2][0].fileno())
            elif op == "future_timer":
                timer = loop.call_later(0.002 * (1 + index % 5), self.timed.append, label)
                self.due.append((timer.when(), index, label))
            elif op == "many_cancelled":  # enough to make the loop sweep its heap at once
                for _count in range(150):
                    loop.call_later(3600, self.log.append, "never").cancel()
            elif op == "next_turn":
                loop.call_soon(self.run_from, index + 1)
                return


def _raise(label: str) -> None:
    raise ValueError(label)


def _run_program(make_loop: Callable[[], asyncio.AbstractEventLoop],
                 ops: list[str]) -> tuple[list[str], list[str], list[str]]:
    loop = make_loop()
    program = Program(loop, ops)
    try:
        loop.call_soon(program.run_from, 0)
        loop.run_until_complete(asyncio.sleep(0.02))
        for _wait in range(1000):  # a slow host: until every timer of the program fired
            if len(program.timed) == len(program.due):
                break
            loop.run_until_complete(asyncio.sleep(0.01))
    finally:
        program.close()
        loop.close()
    return program.log, program.timed, [label for _when, _index, label in sorted(program.due)]


@settings(max_examples=150, deadline=None)
@given(st.lists(OPS, max_size=30))
def test_a_generated_program_runs_its_callbacks_in_asyncios_order(ops):
    stock_log, stock_timed, stock_due = _run_program(LOOPS["asyncio"], ops)
    lean_log, lean_timed, lean_due = _run_program(LOOPS["lean"], ops)
    assert lean_log == stock_log
    # Timers with a delay fire in the order they come due (which the host's speed decides, in
    # both loops alike: when a later turn schedules one, its clock has moved on).
    assert stock_timed == stock_due
    assert lean_timed == lean_due


def test_a_callbacks_exception_is_reported_with_asyncios_context_and_the_turn_goes_on(each_loop):
    contexts: list[dict] = []
    after: list[str] = []
    each_loop.set_exception_handler(lambda _loop, context: contexts.append(context))
    each_loop.call_soon(_raise, "boom")
    each_loop.call_soon(after.append, "next")
    each_loop.run_until_complete(asyncio.sleep(0))
    assert after == ["next"]
    [context] = contexts
    assert isinstance(context["exception"], ValueError)
    assert context["message"].startswith("Exception in callback _raise('boom')")
    assert isinstance(context["handle"], asyncio.Handle)


def test_a_cancelled_reader_still_registered_is_dropped_and_not_run():
    ran: list[str] = []
    states = {}
    for name, make_loop in LOOPS.items():
        loop = make_loop()
        reading, writing = socket.socketpair()
        try:
            loop.add_reader(reading.fileno(), ran.append, name)
            # Its handle cancelled behind the loop's back, the registration left in place.
            loop._selector.get_key(reading.fileno()).data[0].cancel()
            writing.send(b"x")
            loop.run_until_complete(asyncio.sleep(0.01))
            states[name] = reading.fileno() in loop._selector.get_map()
        finally:
            reading.close()
            writing.close()
            loop.close()
    assert ran == []
    assert states == {"asyncio": False, "lean": False}


@pytest.mark.parametrize("name", LOOPS)
def test_a_writer_runs_when_its_socket_can_take_bytes(name):
    loop = LOOPS[name]()
    reading, writing = socket.socketpair()
    wrote: list[int] = []

    def write_once() -> None:
        wrote.append(writing.send(b"y"))
        loop.remove_writer(writing.fileno())

    try:
        loop.add_writer(writing.fileno(), write_once)
        loop.run_until_complete(asyncio.sleep(0.01))
        assert wrote == [1]
        assert reading.recv(8) == b"y"
    finally:
        reading.close()
        writing.close()
        loop.close()


def test_a_thread_wakes_a_loop_that_waits_with_no_timer(each_loop):
    done = each_loop.create_future()
    thread = threading.Timer(0.05, each_loop.call_soon_threadsafe, (done.set_result, "woken"))
    thread.start()
    # No timer of its own: only the thread's wake-up ends the poll (wait_for's is a bound that
    # fails the test, not a wake-up it could pass by).
    assert each_loop.run_until_complete(asyncio.wait_for(done, 10)) == "woken"
    thread.join()


def test_a_signal_handler_runs_on_the_loop(each_loop):
    got = each_loop.create_future()
    each_loop.add_signal_handler(signal.SIGUSR1, got.set_result, "signalled")
    each_loop.call_later(0.01, os.kill, os.getpid(), signal.SIGUSR1)
    assert each_loop.run_until_complete(asyncio.wait_for(got, 10)) == "signalled"
    each_loop.remove_signal_handler(signal.SIGUSR1)


def test_in_debug_mode_the_stock_turn_runs_and_warns_of_a_slow_callback(caplog):
    loop = event_loop.LeanLoop()
    loop.set_debug(True)
    loop.slow_callback_duration = 0.0
    try:
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()
    assert any("Executing" in record.getMessage() for record in caplog.records)


def test_run_serves_a_coroutine_on_the_lean_loop_and_puts_the_policy_back():
    async def loop_type() -> type:
        await asyncio.sleep(0.001)
        return type(asyncio.get_running_loop())

    policy = asyncio.get_event_loop_policy()
    assert event_loop.run(loop_type()) is event_loop.LeanLoop
    assert asyncio.get_event_loop_policy() is policy


def test_the_gateway_process_serves_on_the_lean_loop():
    with start_sim("instant") as sim, start_gateway(wired(sim)) as gateway:
        answer = chat(gateway.url, {"model": "main"})
        log = gateway.output()
    assert answer.status == 200
    assert "(event loop: LeanLoop)" in log
