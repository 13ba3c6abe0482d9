"""A bounded soak: mixed chat, stream and embed traffic over hundreds of keep-alive connections
through one gateway in front of simulated gears, sampling the gateway's resident memory, open
descriptors and threads. Nothing may be lost and nothing may grow after the warm-up.

    PYTHONPATH=gateway python bench/soak.py                     # 10 minutes, 300 connections
    PYTHONPATH=gateway python bench/soak.py --seconds 40 --connections 200 --json out.json
    PYTHONPATH=gateway python bench/soak.py --plot docs/img/soak.png

Each connection sends its next request as soon as the previous answer has ended, cycling
through a chat, a streamed chat and an embedding. An answer is 2xx, a documented error (an
HTTP error status with an OpenAI-shaped body), or lost (the connection closed while an answer
was due); any other status fails the run too. tests/reliability/test_soak.py runs a short soak
in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import loadgen
import procs

REPO = Path(__file__).resolve().parents[1]
GATEWAY_CORE, BACKEND_CORE = 0, 1
WARMUP_SHARE = 0.2  # the first fifth of the run settles caches, pools and buffers
SERVED = "sim-soak"
BODIES = (
    ("/v1/chat/completions", {"model": "cortex", "max_tokens": 12,
                              "messages": [{"role": "user", "content": "soak"}]}),
    ("/v1/chat/completions", {"model": "cortex", "max_tokens": 12, "stream": True,
                              "messages": [{"role": "user", "content": "soak stream"}]}),
    ("/v1/embeddings", {"model": "embedder", "input": ["a soak of embeddings"]}),
)


@dataclass
class Sample:
    at_s: float
    rss_kib: int
    fds: int
    threads: int


@dataclass
class SoakResult:
    seconds: float
    connections: int
    outcomes: Counter = field(default_factory=Counter)
    samples: list[Sample] = field(default_factory=list)

    def settled(self, attribute: str) -> tuple[float, float]:
        """Mean of a resource just after the warm-up and over the last fifth of the run."""
        settled = [s for s in self.samples if s.at_s >= WARMUP_SHARE * self.seconds]
        values = [getattr(sample, attribute) for sample in settled]
        fifth = max(1, len(values) // 5)
        return statistics.fmean(values[:fifth]), statistics.fmean(values[-fifth:])

    def as_json(self) -> dict:
        growth = {name: self.settled(name) for name in ("rss_kib", "fds", "threads")}
        return {"seconds": self.seconds, "connections": self.connections,
                "outcomes": dict(self.outcomes), "after_warmup_and_end": growth,
                "samples": [asdict(sample) for sample in self.samples]}


class MixedConnection(loadgen.ResponseReader):
    """A keep-alive connection that cycles through the mix until the soak's deadline."""

    def __init__(self, requests: list[bytes], offset: int, result: SoakResult,
                 deadline_ns: list[int]) -> None:
        super().__init__(requests[offset % len(requests)])
        self.requests, self.turn = requests, offset
        self.result, self.deadline_ns = result, deadline_ns
        self.finished = asyncio.get_running_loop().create_future()

    def response_done(self, latency_ns: int) -> None:
        status = self.status
        self.result.outcomes["2xx" if 200 <= status < 300 else f"status {status}"] += 1
        if time.perf_counter_ns() >= self.deadline_ns[0]:
            self._finish()
            return
        self.turn += 1
        self.request = self.requests[self.turn % len(self.requests)]
        self.send()

    def response_failed(self) -> None:
        self.result.outcomes["lost"] += 1
        self._finish()

    def _finish(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)


def read_status(pid: int) -> Sample:
    threads = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            threads = int(line.split()[1])
    fds = sum(1 for _fd in Path(f"/proc/{pid}/fd").iterdir())
    return Sample(0.0, procs.rss_kib(pid), fds, threads)


async def sample_every(pid: int, interval_s: float, result: SoakResult, done: asyncio.Event):
    start = time.monotonic()
    while not done.is_set():
        sample = read_status(pid)
        sample.at_s = round(time.monotonic() - start, 2)
        result.samples.append(sample)
        try:
            await asyncio.wait_for(done.wait(), interval_s)
        except TimeoutError:
            continue


async def soak(port: int, pid: int, seconds: float, connections: int) -> SoakResult:
    result = SoakResult(seconds, connections)
    requests = [loadgen.encode_post(path, json.dumps(body).encode(), f"127.0.0.1:{port}", None)
                for path, body in BODIES]
    deadline = [0]
    loop = asyncio.get_running_loop()
    conns = []
    for offset in range(connections):
        _transport, conn = await loop.create_connection(
            lambda offset=offset: MixedConnection(requests, offset, result, deadline),
            "127.0.0.1", port)
        conns.append(conn)
    done = asyncio.Event()
    sampler = asyncio.create_task(sample_every(pid, max(0.5, seconds / 120), result, done))
    deadline[0] = time.perf_counter_ns() + int(seconds * 1e9)
    for conn in conns:
        conn.send()
    await asyncio.wait([conn.finished for conn in conns], timeout=seconds + 120)
    unfinished = sum(1 for conn in conns if not conn.finished.done())
    if unfinished:
        result.outcomes["lost"] += unfinished
    for conn in conns:
        conn.transport.close()
    done.set()
    await sampler
    return result


def start_services(workdir: Path) -> list[procs.Service]:
    """Two simulated gears (cortex, embedder) on one core, the gateway alone on the other."""
    env = {"PYTHONPATH": str(REPO / "gateway"), "PATH": "/usr/bin:/bin"}
    cortex_port, embed_port, gateway_port = (procs.free_port() for _port in range(3))
    sim = [sys.executable, "-m", "lobes_sim", "--host", "127.0.0.1", "--time-scale", "50",
           "--max-num-seqs", "256"]
    cortex = procs.spawn("cortex", [*sim, "--port", str(cortex_port), "--profile",
                                    "spark-cortex", "--served-name", SERVED],
                         cortex_port, BACKEND_CORE, workdir, env)
    embed = procs.spawn("embedder", [*sim, "--port", str(embed_port), "--profile", "embedder"],
                        embed_port, BACKEND_CORE, workdir, env)
    # As the collection deploys it: the access log on, into a file (its writer is a thread).
    gateway_env = {**env, "GATEWAY_HOST": "127.0.0.1", "GATEWAY_PORT": str(gateway_port),
                   "GATEWAY_ACCESS_LOG": str(workdir / "access.log"),
                   "PRIMARY_BASE_URL": f"http://127.0.0.1:{cortex_port}",
                   "PRIMARY_SERVED_NAME": SERVED, "PRIMARY_MAX_ACTIVE": "256",
                   "EMBED_BASE_URL": f"http://127.0.0.1:{embed_port}"}
    gateway = procs.spawn("gateway", [sys.executable, "-m", "lobes_gateway"], gateway_port,
                          GATEWAY_CORE, workdir, gateway_env)
    return [cortex, embed, gateway]


def run(seconds: float, connections: int) -> SoakResult:
    procs.raise_fd_limit()
    with tempfile.TemporaryDirectory(prefix="lobes-soak-") as workdir:
        services = start_services(Path(workdir))
        try:
            gateway = services[-1]
            return asyncio.run(soak(gateway.port, gateway.pid, seconds, connections))
        finally:
            for service in reversed(services):
                service.stop()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--json", type=Path, help="write the result here")
    parser.add_argument("--plot", type=Path,
                        help="plot the resource curves to this PNG (needs requirements-bench.txt)")
    return parser


def main() -> int:
    args = _parser().parse_args()
    result = run(args.seconds, args.connections)
    summary = result.as_json()
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    print(json.dumps({key: value for key, value in summary.items() if key != "samples"}))
    if args.plot:
        plot(result, args.plot)
    return 0 if set(result.outcomes) == {"2xx"} else 1


def plot(result: SoakResult, path: Path) -> None:
    """The three resource curves over the run, the warm-up shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = [sample.at_s for sample in result.samples]
    figure, axes = plt.subplots(3, 1, sharex=True, figsize=(8, 6))
    for axis, (name, label) in zip(axes, (("rss_kib", "resident memory (MiB)"),
                                          ("fds", "open descriptors"),
                                          ("threads", "threads")), strict=True):
        values = [getattr(sample, name) for sample in result.samples]
        if name == "rss_kib":
            values = [value / 1024 for value in values]
        axis.plot(times, values)
        axis.set_ylabel(label)
        axis.set_ylim(bottom=0)
        axis.axvspan(0, WARMUP_SHARE * result.seconds, alpha=0.15)
    axes[-1].set_xlabel(f"seconds ({result.connections} connections, mixed chat/stream/embed)")
    figure.tight_layout()
    figure.savefig(path, dpi=90)


if __name__ == "__main__":
    sys.exit(main())
