"""The gateway's own work per request, without sockets: the real Gateway, in-memory transports.

The socket benchmark's CPU per request moves 15-30% with the host
(changelogs/benchmark-runs.md), more than most single cuts to the hot path save. This harness
takes the kernel, the event loop and the host out: a client Channel is handed each request's
bytes by a call, and the upstream's answer (fast_backend's) is handed to the upstream Channel
once the gateway waits for it, so a request is the gateway's Python from head to answer, its
two waits resumed as on a socket. It prints the process CPU per request over --requests (after
--warmup), the median of --rounds, and with --valgrind also the instructions per request under
cachegrind: the difference between two runs of different lengths over the difference in
requests, so start-up drops out. Instructions are the stable measure of a change; the
microseconds are this host's.

    python3 bench/inprocess_cost.py                  # CPU per request, access log off
    python3 bench/inprocess_cost.py --access-log     # with the JSON access log on (a file)
    python3 bench/inprocess_cost.py --valgrind       # and instructions per request
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import fast_backend
import gateway_bench

sys.path.insert(0, str(gateway_bench.REPO / "gateway"))

from lobes_gateway.__main__ import GC_THRESHOLDS
from lobes_gateway.app.gateway import Gateway
from lobes_gateway.policy.config import load_config
from lobes_gateway.transport.channel import Channel
from lobes_gateway.transport.upstream import Connection, Origin

BACKEND = Origin("127.0.0.1", 9)  # never dialled: its connections are in the pool already


class MemoryTransport(asyncio.Transport):
    """A transport whose writes go to `on_write`; never paused, closed only when asked."""

    def __init__(self, on_write) -> None:
        super().__init__()
        self._on_write = on_write
        self._closing = False

    def write(self, data) -> None:
        self._on_write(data)

    def is_closing(self) -> bool:
        return self._closing

    def is_reading(self) -> bool:
        return True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        self._closing = True

    def abort(self) -> None:
        self._closing = True

    def get_extra_info(self, name, default=None):
        return default


class Harness:
    """One gateway, `concurrency` keep-alive client connections and as many pooled upstream
    connections."""

    def __init__(self, gateway: Gateway, concurrency: int) -> None:
        self.answered = bytearray()
        # Upstream channels in the order the gateway sent them a request: answered so.
        self.waiting: list[Channel] = []
        for _connection in range(concurrency):
            upstream = Channel()
            upstream.connection_made(MemoryTransport(self._sent_upstream(upstream)))
            gateway.connections.release(Connection(BACKEND, upstream))
        self.clients = []
        for _connection in range(concurrency):
            client = gateway.accept()
            client.connection_made(MemoryTransport(self.answered.extend))
            self.clients.append(client)
        self.sent_upstream = 0

    def _sent_upstream(self, upstream: Channel):
        def sent(_request: bytes) -> None:  # a request is one write: head and small body
            self.waiting.append(upstream)
            self.sent_upstream += 1
        return sent

    def serve(self, request: bytes, count: int) -> None:
        """Requests arrive whole, one on each client connection in turn; the gateway sends
        each upstream and waits for its head, which then arrive whole too, in the order
        sent, as the socket benchmark's backend answers. With many connections each one's
        state is touched once a round, as under the socket benchmark's load."""
        answer = fast_backend.JSON_RESPONSE
        arrivals = [client.data_received for client in self.clients]
        for _round in range(count // len(arrivals)):
            for arrive in arrivals:
                arrive(request)
            waiting, self.waiting = self.waiting, []
            for upstream in waiting:
                upstream.data_received(answer)

    def check(self, count: int) -> None:
        """The last `count` requests were each answered 200 with the backend's body: a
        harness that measured errors, or answers the gateway made up, would mislead."""
        answered = bytes(self.answered)
        ok = answered.count(b"HTTP/1.1 200 ")
        relayed = answered.count(fast_backend.COMPLETION_BODY)
        if not ok == relayed == answered.count(b"HTTP/1.1 ") == self.sent_upstream == count:
            raise SystemExit(f"{count} requests: {self.sent_upstream} sent upstream, {ok} "
                             f"answered 200, {relayed} with the backend's body: "
                             f"{answered[:400]!r}")
        self.answered.clear()
        self.sent_upstream = 0


def environment(access_log: str | None) -> dict[str, str]:
    """The socket benchmark's gateway settings, with the access log when asked."""
    env = gateway_bench.gateway_env(BACKEND.url, 8000)
    if access_log:
        env["GATEWAY_ACCESS_LOG"] = access_log
    return env


async def measure(args: argparse.Namespace, access_log: str | None) -> list[float]:
    """Microseconds of process CPU per request, one figure per round."""
    gateway = Gateway(load_config(environment(access_log)))
    gateway.pressure.take_sample()
    if gateway.access_log is not None:
        gateway.access_log.start()
    harness = Harness(gateway, args.concurrency)
    request = gateway_bench.post(gateway_bench.chat_body())
    harness.serve(request, args.warmup)
    harness.check(args.warmup)
    # As the served gateway does (__main__.serve): start-up objects kept out of collections,
    # which run at its thresholds.
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    figures = []
    for _round in range(args.rounds):
        started = time.process_time()
        harness.serve(request, args.requests)
        figures.append((time.process_time() - started) / args.requests * 1e6)
        harness.check(args.requests)
        await asyncio.sleep(0)  # the access log's writer drains between rounds
    await gateway.close()
    return figures


def cachegrind_counts(args: argparse.Namespace, requests: int) -> dict[str, int]:
    """What cachegrind counts (instructions, data reads and writes and their cache misses)
    for this script serving `requests` requests once."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cachegrind.out"
        command = ["valgrind", "--tool=cachegrind", "--cache-sim=yes",
                   f"--cachegrind-out-file={out}", sys.executable, __file__, "--rounds", "1",
                   "--warmup", str(args.warmup), "--requests", str(requests),
                   "--concurrency", str(args.concurrency)]
        if args.access_log:
            command.append("--access-log")
        subprocess.run(command, check=True, capture_output=True)
        lines = out.read_text().splitlines()
    events = next(line for line in lines if line.startswith("events:")).split()[1:]
    summary = next(line for line in lines if line.startswith("summary:")).split()[1:]
    return dict(zip(events, map(int, summary), strict=True))


def per_request_counts(args: argparse.Namespace) -> dict[str, float]:
    """Cachegrind's counts per request: two runs of different lengths, so start-up drops out."""
    short = args.concurrency * max(1, 1000 // args.concurrency)
    long = 6 * short
    fewer, more = cachegrind_counts(args, short), cachegrind_counts(args, long)
    return {event: (more[event] - fewer[event]) / (long - short) for event in more}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--warmup", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=1,
                        help="client connections served in turn (a multiple of it is served)")
    parser.add_argument("--access-log", action="store_true")
    parser.add_argument("--valgrind", action="store_true",
                        help="also count instructions per request under cachegrind")
    args = parser.parse_args()
    if args.requests % args.concurrency or args.warmup % args.concurrency:
        parser.error("--requests and --warmup must be multiples of --concurrency")
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "access.log") if args.access_log else None
        figures = asyncio.run(measure(args, log))
    label = "access log on" if args.access_log else "access log off"
    print(f"{label}: {statistics.median(figures):.1f} us a request of process CPU "
          f"(median of {len(figures)} rounds of {args.requests}: "
          f"{', '.join(f'{f:.1f}' for f in figures)})")
    if args.valgrind:
        counts = per_request_counts(args)
        misses = counts["D1mr"] + counts["D1mw"]
        print(f"{label}: {counts['Ir'] / 1000:.1f}k instructions a request, "
              f"{(counts['Dr'] + counts['Dw']) / 1000:.1f}k data reads and writes, "
              f"{misses:.0f} first-level data cache misses, "
              f"{counts['DLmr'] + counts['DLmw']:.0f} last-level (cachegrind's model)")


if __name__ == "__main__":
    main()
