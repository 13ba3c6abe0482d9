"""Where a request's work goes in the gateway, layer by layer.

Counted, not timed: each layer's bytecode steps per request (the interpreter's own count under
sys.settrace, the same from run to run; C work inside a step, a JSON scan or a regex, is one
step). Two measures:

- c=1, in process (bench/inprocess_cost.py's harness, no sockets): each layer's steps split by
  when they run: before the request is sent upstream and from the upstream's answer to the
  caller's write (together the caller's latency path), then after the answer was written.
- c=64 over real sockets (--concurrency): the gateway in this process on 127.0.0.1, the backend
  and a closed-loop client in processes of their own; each layer's steps per request, the event
  loop's (asyncio, selectors) included.

    python3 bench/hot_path_profile.py            # both tables
    python3 bench/hot_path_profile.py --docs     # and write them to docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import docs_section
import gateway_bench
import inprocess_cost
import procs

sys.path.insert(0, str(gateway_bench.REPO / "gateway"))

from lobes_gateway.app.gateway import Gateway
from lobes_gateway.policy.config import load_config
from lobes_gateway.transport import loop as event_loop

# Each layer by the modules it is made of (a path's tail); the first match names a frame's.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("client socket and request head", ("transport/channel.py", "transport/fiber.py",
                                        "transport/heads.py", "transport/http.py")),
    ("auth and in-flight limits", ("policy/auth.py",)),
    ("JSON body", ("transport/json_body.py",)),
    ("routing and admission", ("policy/routing.py", "app/admission_gate.py",
                               "policy/admission.py", "policy/pressure.py")),
    ("dispatch (attempts, failover)", ("app/dispatch.py",)),
    ("upstream client", ("transport/upstream.py", "transport/watchdog.py")),
    ("relay to the caller", ("app/relay.py", "app/framing.py", "app/meter.py",
                             "app/stream_pipe.py", "transport/chunked.py")),
    ("metrics and request trace", ("app/metrics.py", "transport/trace.py",
                                   "app/access_log.py")),
    ("request wiring (app/gateway.py)", ("app/gateway.py",)),
    ("event loop (asyncio, selectors)", ("transport/loop.py", "/asyncio/", "/selectors.py")),
)
OTHER_GATEWAY = "other gateway modules"
OUTSIDE = "outside the gateway (the harness, the count itself)"
BEFORE_SEND, ANSWER, AFTER = "before the upstream send", "answer to the caller", "after the write"
PHASES = (BEFORE_SEND, ANSWER, AFTER)


def layer_of(filename: str) -> str:
    """The layer a code object's file belongs to."""
    for layer, tails in LAYERS:
        if any(tail in filename for tail in tails):
            return layer
    return OTHER_GATEWAY if "/lobes_gateway/" in filename else OUTSIDE


class StepCounter:
    """Counts the interpreter's steps by layer (and by the phase `phase` names) while on."""

    def __init__(self) -> None:
        self.steps: Counter[tuple[str, str]] = Counter()
        self.phase = BEFORE_SEND
        self._layers: dict[str, str] = {}

    def _trace(self, frame: FrameType, event: str, _arg: object) -> Callable | None:
        frame.f_trace_opcodes = True
        if event == "opcode":
            filename = frame.f_code.co_filename
            layer = self._layers.get(filename)
            if layer is None:
                layer = self._layers[filename] = layer_of(filename)
            self.steps[self.phase, layer] += 1
        return self._trace

    def start(self) -> None:
        """Count from here: new frames, and the frames already running below this one."""
        sys.settrace(self._trace)
        frame = sys._getframe(1)  # the running frames get no "call" event
        while frame is not None:
            frame.f_trace, frame.f_trace_opcodes = self._trace, True
            frame = frame.f_back

    @staticmethod
    def stop() -> None:
        sys.settrace(None)
        frame = sys._getframe(1)
        while frame is not None:
            frame.f_trace = None
            frame = frame.f_back

    def by_layer(self, phase: str | None = None) -> Counter[str]:
        """Steps by layer, in one phase or all."""
        total: Counter[str] = Counter()
        for (counted_phase, layer), steps in self.steps.items():
            if phase is None or counted_phase == phase:
                total[layer] += steps
        return total


async def phases_in_process(requests: int) -> StepCounter:
    """c=1 through the in-process harness: each request's steps, by phase and layer."""
    gateway = Gateway(load_config(inprocess_cost.environment(None)))
    gateway.pressure.take_sample()
    harness = inprocess_cost.Harness(gateway, 1)
    request = gateway_bench.post(gateway_bench.chat_body())
    harness.serve(request, 200)  # warm: shapes memoised, caches filled
    harness.check(200)
    counter = StepCounter()
    client = harness.clients[0]
    transport = client.transport
    assert isinstance(transport, inprocess_cost.MemoryTransport)
    answered = transport._on_write  # the harness's own sink

    def written(data: bytes) -> None:
        answered(data)
        if counter.phase == ANSWER:
            counter.phase = AFTER

    transport._on_write = written
    answer = inprocess_cost.fast_backend.JSON_RESPONSE
    for _request in range(requests):
        counter.phase = BEFORE_SEND
        counter.start()
        client.data_received(request)
        counter.phase = ANSWER
        waiting, harness.waiting = harness.waiting, []
        waiting[0].data_received(answer)
        counter.stop()
    harness.check(requests)
    await gateway.close()
    return counter


CLIENT = """
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
import gateway_bench, loadgen
body = gateway_bench.chat_body(**json.loads(sys.argv[5]))
sys.stdin.readline()  # started: the load begins when told
result = asyncio.run(loadgen.closed_loop("127.0.0.1", int(sys.argv[2]), gateway_bench.post(body),
                                         int(sys.argv[3]), float(sys.argv[4])))
print(result.requests, result.events, result.errors)
"""
# Streams for the chunk count: few and slow enough that the counted (much slowed) gateway reads
# each chunk as it was sent, as the uncounted one does, rather than several in one read.
SSE_STREAMS, SSE_CHUNKS, SSE_INTERVAL_MS = 4, 50, 20


class Served:
    """A gateway on a real 127.0.0.1 socket in this process, in front of the bench's backend."""

    def __init__(self) -> None:
        self.backend = gateway_bench.start_backend(Path(tempfile.mkdtemp(prefix="hot-path-")))
        self.port = procs.free_port()
        self.gateway = Gateway(load_config(gateway_bench.gateway_env(
            f"http://127.0.0.1:{self.backend.port}", self.port)))
        self.gateway.pressure.take_sample()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Served:
        self._server = await asyncio.get_running_loop().create_server(
            self.gateway.accept, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self._server is not None:
            self._server.close()
        await self.gateway.close()
        self.backend.stop()

    async def client(self, concurrency: int, seconds: float,
                     **body: object) -> asyncio.subprocess.Process:
        """A closed-loop client process, started; its load begins at `load`."""
        return await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLIENT, str(Path(__file__).parent), str(self.port),
            str(concurrency), str(seconds), json.dumps(body), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE)


async def load(client: asyncio.subprocess.Process) -> tuple[int, ...]:
    """Start a client's load; its (requests, events, errors) once it ended."""
    out, _err = await client.communicate(b"go\n")
    return tuple(int(figure) for figure in out.split())


async def over_sockets(concurrency: int, warm_s: float, window_s: float) -> tuple[StepCounter, int]:
    """The gateway under a closed-loop client: steps by layer over a window, and the requests
    it answered in that window."""
    async with Served() as served:
        client = await served.client(concurrency, warm_s + window_s + warm_s)
        ended = asyncio.create_task(load(client))
        await asyncio.sleep(warm_s)
        counter = StepCounter()
        before = answered_ok(served.gateway)
        counter.start()
        await asyncio.sleep(window_s)
        counter.stop()
        requests = answered_ok(served.gateway) - before
        await ended
    return counter, requests


async def chunks_over_sockets(seconds: float) -> tuple[StepCounter, int]:
    """SSE streams through the gateway, counted whole (each stream's request spread over its
    chunks, as the gateway bench's CPU per chunk is): steps by layer, and the events relayed."""
    async with Served() as served:
        # The client is started before the count: spawning a process is no chunk's work.
        client = await served.client(SSE_STREAMS, seconds, stream=True, bench_chunks=SSE_CHUNKS,
                                     bench_interval_ms=SSE_INTERVAL_MS)
        counter = StepCounter()
        counter.start()
        _requests, events, errors = await load(client)
        counter.stop()
    if errors:
        raise SystemExit(f"{errors} streams failed while counted")
    return counter, events


def answered_ok(gateway: Gateway) -> int:
    """Requests the gateway answered 200 so far (its metrics' own count)."""
    return sum(series.requests for key, series in gateway.metrics.series.items() if key[3] == 200)


def phases_table(counter: StepCounter, requests: int) -> str:
    """Markdown: each layer's steps a request in each phase, and the latency path's total."""
    per_phase = {phase: counter.by_layer(phase) for phase in PHASES}
    total = counter.by_layer()
    rows = ["| layer | before the upstream send | answer to the caller | latency path | "
            "after the write | all |", "|---|---|---|---|---|---|"]
    for layer in ordered(total):
        before, answer = per_phase[BEFORE_SEND][layer], per_phase[ANSWER][layer]
        rows.append(f"| {layer} | {each(before, requests)} | {each(answer, requests)} | "
                    f"{each(before + answer, requests)} | "
                    f"{each(per_phase[AFTER][layer], requests)} | {each(total[layer], requests)} |")
    before, answer = sum(per_phase[BEFORE_SEND].values()), sum(per_phase[ANSWER].values())
    rows.append(f"| **all** | {each(before, requests)} | {each(answer, requests)} | "
                f"**{each(before + answer, requests)}** | "
                f"{each(sum(per_phase[AFTER].values()), requests)} | "
                f"**{each(sum(total.values()), requests)}** |")
    return "\n".join(rows)


def sockets_table(counter: StepCounter, units: int, unit: str = "request") -> str:
    """Markdown: each layer's steps a request (or a chunk) over sockets, and its share."""
    total = counter.by_layer()
    whole = sum(total.values())
    rows = [f"| layer | steps a {unit} | share |", "|---|---|---|"]
    rows += [f"| {layer} | {each(total[layer], units)} | {total[layer] / whole:.1%} |"
             for layer in ordered(total)]
    rows.append(f"| **all** | **{each(whole, units)}** | 100% |")
    return "\n".join(rows)


def ordered(total: Counter[str]) -> list[str]:
    """The layers in LAYERS' order (those with any steps), then the rest."""
    named = [layer for layer, _tails in LAYERS if total[layer]]
    return named + sorted(layer for layer in total if layer not in named)


def header() -> str:
    """When, under which Python, at which commit of the gateway."""
    revision = gateway_bench.gateway_revision(gateway_bench.REPO / "gateway")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"Counted {when}, Python {platform.python_version()} (the steps are the same on any "
            f"3.11 build), the gateway at `{revision or 'a tree outside git'}`.")


def each(steps: int, requests: int) -> str:
    return f"{steps / requests:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--requests", type=int, default=200, help="c=1 requests counted")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--window", type=float, default=3.0, help="seconds counted over sockets")
    parser.add_argument("--warm", type=float, default=2.0, help="seconds before and after it")
    parser.add_argument("--sse-seconds", type=float, default=4.0,
                        help="seconds of SSE streams counted")
    parser.add_argument("--docs", action="store_true", help="write docs/benchmarks.md's section")
    args = parser.parse_args()
    # The loop the gateway serves on (python3 -m lobes_gateway), as over sockets it is a layer.
    phases = event_loop.run(phases_in_process(args.requests))
    sockets, answered = event_loop.run(over_sockets(args.concurrency, args.warm, args.window))
    chunks, events = event_loop.run(chunks_over_sockets(args.sse_seconds))
    if not answered or not events:
        raise SystemExit(f"{answered} requests answered 200 and {events} SSE events relayed "
                         "over the sockets while counting: nothing to divide by")
    text = (f"{header()}\n\n"
            f"c=1, in process: the bytecode steps a request, by layer and by when they run "
            f"({args.requests} requests, `bench/hot_path_profile.py`).\n\n"
            f"{phases_table(phases, args.requests)}\n\n"
            f"c={args.concurrency} over 127.0.0.1 sockets, the event loop included "
            f"({answered:,} requests answered in a {args.window:g} s window, each counted "
            f"whole or in part):\n\n{sockets_table(sockets, answered)}\n\n"
            f"SSE streams over the sockets ({SSE_STREAMS} at a time, {SSE_CHUNKS} chunks "
            f"{SSE_INTERVAL_MS} ms apart, each stream's request spread over its chunks as the "
            f"gateway bench's CPU per chunk is; {events:,} events relayed in "
            f"{args.sse_seconds:g} s):\n\n{sockets_table(chunks, events, 'chunk')}")
    print(text)
    if args.docs:
        docs_section.write_section("hot-path-profile", text)


if __name__ == "__main__":
    main()
