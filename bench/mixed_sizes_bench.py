"""Mixed request sizes on seed 000's pair: rate placement, size-aware placement, and an oracle.

80% short answers (32 tokens) and 20% long ones (1,024), in a random order with Poisson
arrivals (the same sequence for every policy), each request naming its own max_tokens
(ignore_eos, so the answer is exactly that long). The pooling gateway fronts a spark-cortex and
a thor-cortex peer gateway, each before a calibrated `lobes_sim`. Compared: `rate` (waves of the
request's own size), `prefix` (the default: the work in flight priced request by request) and
a clairvoyant oracle: the client itself sends each request straight to the peer gateway where
it finishes first, knowing every request's length, the profiles' exact step times and what
each replica holds (greedy earliest completion, slots FIFO). Latency is end to end, seed time.

    PYTHONPATH=gateway python3 bench/mixed_sizes_bench.py [--time-scale 10] [--write-docs]
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import random
import statistics
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import docs_section

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "gateway")]

from lobes_sim.profiles import PROFILES, Profile  # noqa: E402
from placement_bench import (  # noqa: E402
    SEED_RATES,
    SPARK_KEY,
    peer_gateway,
    pooling_env,
    wait_pool_ready,
)

from tests.support.gateway_proc import start_gateway  # noqa: E402
from tests.support.sim_proc import start_sim  # noqa: E402

SERVED = "unsloth/Qwen3.8-27B-NVFP4"
PAIR = ("spark-cortex", "thor-cortex")
SHORT, LONG = 32, 1024


@dataclass(frozen=True)
class Answer:
    tokens: int
    sent: float
    done: float
    served_by: str


def ask(port: int, tokens: int, index: int, api_key: str | None = None) -> Answer:
    """One non-streamed chat request of exactly `tokens` answer tokens."""
    body = json.dumps({"model": "cortex", "max_tokens": tokens, "ignore_eos": True,
                       "messages": [{"role": "user", "content": f"Task {index}: report."}]})
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    sent = time.monotonic()
    connection.request("POST", "/v1/chat/completions", body, headers)
    response = connection.getresponse()
    payload = response.read()
    done = time.monotonic()
    connection.close()
    if response.status != 200:
        raise RuntimeError(f"request {index}: HTTP {response.status} {payload[:200]!r}")
    served = response.getheader("X-Lobes-Proxied-By") or f"127.0.0.1:{port}"
    return Answer(json.loads(payload)["usage"]["completion_tokens"], sent, done, served)


@dataclass
class OracleReplica:
    """What the oracle knows of one replica: its port, key, profile, and the predicted end of
    each request it sent there."""

    port: int
    api_key: str | None
    profile: Profile
    scale: float
    ends: dict[int, float] = field(default_factory=dict)

    def finish_if_sent(self, tokens: int, now: float) -> float:
        """When a request of `tokens` sent now would end (wall clock), FIFO on the slots."""
        ahead = sorted(end for end in self.ends.values() if end > now)
        slots = self.profile.max_num_seqs
        start = now if len(ahead) < slots else ahead[len(ahead) - slots]
        batch = min(slots, len(ahead) + 1)
        seconds = (self.profile.prefill_seconds(8)
                   + tokens * self.profile.step_seconds(batch))
        return start + seconds / self.scale


class Oracle:
    """Greedy earliest completion with exact lengths and exact step times, client-side."""

    def __init__(self, replicas: list[OracleReplica]) -> None:
        self.replicas = replicas
        self.lock = threading.Lock()

    def ask(self, tokens: int, index: int) -> Answer:
        with self.lock:
            now = time.monotonic()
            best = min(self.replicas, key=lambda r: r.finish_if_sent(tokens, now))
            best.ends[index] = best.finish_if_sent(tokens, now)
        try:
            return ask(best.port, tokens, index, best.api_key)
        finally:
            with self.lock:
                del best.ends[index]


def workload(count: int, per_s: float, seed: int) -> list[tuple[float, int]]:
    """(gap before it in seed seconds, answer tokens) of each request: 80/20 short/long."""
    rng = random.Random(seed)
    return [(rng.expovariate(per_s), SHORT if rng.random() < 0.8 else LONG)
            for _request in range(count)]


def replay(send, requests: list[tuple[float, int]], scale: float) -> list[Answer]:
    """Send each request after its gap (wall = seed / scale), each on its own thread."""
    with ThreadPoolExecutor(len(requests)) as pool:
        futures = []
        for index, (gap, tokens) in enumerate(requests):
            time.sleep(gap / scale)
            futures.append(pool.submit(send, tokens, index))
        return [future.result() for future in futures]


@dataclass
class Result:
    name: str
    answers: list[Answer]
    scale: float
    split: str

    def latencies(self, tokens: int | None = None) -> list[float]:
        return sorted((a.done - a.sent) * self.scale for a in self.answers
                      if tokens is None or a.tokens == tokens)

    def mean(self, tokens: int | None = None) -> float:
        return statistics.fmean(self.latencies(tokens))

    def p95(self) -> float:
        values = self.latencies()
        return values[min(len(values) - 1, int(0.95 * len(values)))]

    def tok_per_s(self) -> float:
        span = max(a.done for a in self.answers) - min(a.sent for a in self.answers)
        return sum(a.tokens for a in self.answers) / span / self.scale


def measure(name: str, requests: list[tuple[float, int]], args: argparse.Namespace) -> Result:
    """Fresh simulators and gateways for one policy (or the oracle), then the replay."""
    scale = args.time_scale
    with ExitStack() as stack:
        sims = [stack.enter_context(start_sim(p, time_scale=scale)) for p in PAIR]
        spark = peer_gateway(stack, sims[0].url, SERVED, SPARK_KEY)
        thor = peer_gateway(stack, sims[1].url, SERVED, None)
        origins = [spark.url, thor.url]
        if name == "oracle":
            oracle = Oracle([OracleReplica(urlsplit(spark.url).port or 0, SPARK_KEY,
                                           PROFILES[PAIR[0]], scale),
                             OracleReplica(urlsplit(thor.url).port or 0, None,
                                           PROFILES[PAIR[1]], scale)])
            answers = replay(oracle.ask, requests, scale)
            origins = [f"127.0.0.1:{urlsplit(url).port}" for url in origins]
        else:
            rates = tuple(SEED_RATES[p] * scale for p in PAIR)
            orin = stack.enter_context(start_gateway(pooling_env(spark.url, thor.url, name,
                                                                 rates)))
            wait_pool_ready(orin.url, 2)
            port = urlsplit(orin.url).port or 0
            answers = replay(lambda tokens, index: ask(port, tokens, index), requests, scale)
    counts = Counter(a.served_by for a in answers)
    result = Result(name, answers, scale, "/".join(str(counts[o]) for o in origins))
    print(f"  {name:7s} mean {result.mean():6.2f} s (short {result.mean(SHORT):6.2f}, long "
          f"{result.mean(LONG):6.2f})  p95 {result.p95():6.2f} s  {result.tok_per_s():6.1f} "
          f"tok/s  ({result.split})", flush=True)
    return result


def table(results: list[Result]) -> list[str]:
    oracle = next(r for r in results if r.name == "oracle")
    rate = next(r for r in results if r.name == "rate")
    lines = ["| placement | mean latency | vs oracle | vs rate | p95 latency | short mean | "
             "long mean | tok/s | spark/thor |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r.name} | {r.mean():.2f} s | {r.mean() / oracle.mean():.2f}x | "
            f"{r.mean() / rate.mean():.2f}x | {r.p95():.2f} s | {r.mean(SHORT):.2f} s | "
            f"{r.mean(LONG):.2f} s | {r.tok_per_s():.1f} | {r.split} |")
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument("--count", type=int, default=80)
    parser.add_argument("--arrivals-per-s", type=float, default=0.35,
                        help="Poisson arrival rate in seed time (requests per second)")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    requests = workload(args.count, args.arrivals_per_s, args.seed)
    sizes = Counter(tokens for _gap, tokens in requests)
    offered = sum(tokens for _gap, tokens in requests) / sum(gap for gap, _tokens in requests)
    print(f"{args.count} requests: {sizes[SHORT]} short, {sizes[LONG]} long; offered "
          f"{offered:.1f} tok/s (seed time)", flush=True)
    results = [measure(name, requests, args) for name in ("rate", "prefix", "oracle")]
    section = [
        f"Run `{' '.join(['python3', 'bench/mixed_sizes_bench.py', *sys.argv[1:]])}` on "
        f"{platform.machine()} / {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}, one run: seed 000's pair at time-scale "
        f"{args.time_scale:g}, {args.count} requests ({sizes[SHORT]} of {SHORT} tokens, "
        f"{sizes[LONG]} of {LONG}) with Poisson arrivals at {args.arrivals_per_s:g} req/s, "
        f"{offered:.0f} tok/s offered against the pair's ~110; every request names its own "
        "max_tokens. Latency end to end, seconds of seed time.",
        "",
        *table(results),
    ]
    print("\n".join(section))
    if args.write_docs:
        docs_section.write_section("mixed-sizes-bench", "\n".join(section))


if __name__ == "__main__":
    main()
