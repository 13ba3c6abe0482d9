"""Mixed request sizes on seed 000's pair: rate placement, size-aware placement, and an oracle.

80% short answers (32 tokens) and 20% long ones (1,024), in a random order with Poisson
arrivals (the same sequence for every policy), each request naming its own max_tokens
(ignore_eos, so the answer is exactly that long). With --asked-max-tokens N, the loose
scenario: every request asks max_tokens N, as clients often do, and stops on its own, a short
one at the simulator's natural cortex answer (~155 tokens), a long one at 1,024 (min_tokens),
so the request no longer says its length. The pooling gateway fronts a spark-cortex and
a thor-cortex peer gateway, each before a calibrated `lobes_sim`. Compared: `rate` (waves of the
request's own size), `prefix` (the default: the work in flight priced request by request) and
a clairvoyant oracle: the client itself sends each request straight to the peer gateway where
it finishes first, knowing every request's length, the profiles' exact step times and what
each replica holds (greedy earliest completion, slots FIFO). Latency is end to end, seed time.

    PYTHONPATH=gateway python3 bench/mixed_sizes_bench.py [--time-scale 10] [--write-docs]
    PYTHONPATH=gateway python3 bench/mixed_sizes_bench.py --asked-max-tokens 4096 \
        --arrivals-per-s 0.3 [--write-docs]
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
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


# The simulator's cortex answer when nothing bounds it (profiles: natural_length).
NATURAL = PROFILES[PAIR[0]].natural_length[1]


@dataclass(frozen=True)
class Answer:
    size: int  # SHORT or LONG: the request's class
    tokens: int
    sent: float
    done: float
    served_by: str


@dataclass(frozen=True)
class Asking:
    """How requests name their length: exactly (max_tokens = answer, ignore_eos), or all
    asking `max_tokens` and stopping on their own (asked > 0)."""

    asked: int = 0

    def answer_tokens(self, size: int) -> int:
        """The answer a request of class `size` gets."""
        return NATURAL if self.asked and size == SHORT else size

    def body(self, size: int, index: int) -> dict:
        messages = [{"role": "user", "content": f"Task {index}: report."}]
        if not self.asked:
            return {"model": "cortex", "max_tokens": size, "ignore_eos": True,
                    "messages": messages}
        body = {"model": "cortex", "max_tokens": self.asked, "messages": messages}
        if size == LONG:
            body["min_tokens"] = LONG
        return body


def ask(port: int, size: int, index: int, asking: Asking,
        api_key: str | None = None) -> Answer:
    """One non-streamed chat request of class `size` (its answer: Asking.answer_tokens)."""
    body = json.dumps(asking.body(size, index))
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
    return Answer(size, json.loads(payload)["usage"]["completion_tokens"], sent, done, served)


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

    def __init__(self, replicas: list[OracleReplica], asking: Asking) -> None:
        self.replicas = replicas
        self.asking = asking
        self.lock = threading.Lock()

    def ask(self, size: int, index: int) -> Answer:
        tokens = self.asking.answer_tokens(size)
        with self.lock:
            now = time.monotonic()
            best = min(self.replicas, key=lambda r: r.finish_if_sent(tokens, now))
            best.ends[index] = best.finish_if_sent(tokens, now)
        try:
            return ask(best.port, size, index, self.asking, best.api_key)
        finally:
            with self.lock:
                del best.ends[index]


def workload(count: int, per_s: float, seed: int,
             long_share: float = 0.2) -> list[tuple[float, int]]:
    """(gap before it in seed seconds, SHORT or LONG) of each request: 80/20 short/long by
    default."""
    rng = random.Random(seed)
    return [(rng.expovariate(per_s), SHORT if rng.random() < 1 - long_share else LONG)
            for _request in range(count)]


def replay(send, requests: list[tuple[float, int]], scale: float) -> list[Answer]:
    """Send each request after its gap (wall = seed / scale), each on its own thread."""
    with ThreadPoolExecutor(len(requests)) as pool:
        futures = []
        for index, (gap, size) in enumerate(requests):
            time.sleep(gap / scale)
            futures.append(pool.submit(send, size, index))
        return [future.result() for future in futures]


@dataclass
class Result:
    name: str
    answers: list[Answer]
    scale: float
    split: str

    def latencies(self, size: int | None = None) -> list[float]:
        return sorted((a.done - a.sent) * self.scale for a in self.answers
                      if size is None or a.size == size)

    def mean(self, size: int | None = None) -> float:
        return statistics.fmean(self.latencies(size) or [float("nan")])

    def p95(self) -> float:
        values = self.latencies()
        return values[min(len(values) - 1, int(0.95 * len(values)))]

    def tok_per_s(self) -> float:
        span = max(a.done for a in self.answers) - min(a.sent for a in self.answers)
        return sum(a.tokens for a in self.answers) / span / self.scale


def measure(name: str, requests: list[tuple[float, int]], args: argparse.Namespace) -> Result:
    """Fresh simulators and gateways for one policy (or the oracle), then the replay."""
    scale = args.time_scale
    asking = Asking(args.asked_max_tokens)
    with ExitStack() as stack:
        sims = [stack.enter_context(start_sim(p, time_scale=scale)) for p in PAIR]
        spark = peer_gateway(stack, sims[0].url, SERVED, SPARK_KEY)
        thor = peer_gateway(stack, sims[1].url, SERVED, None)
        origins = [spark.url, thor.url]
        if name == "oracle":
            oracle = Oracle([OracleReplica(urlsplit(spark.url).port or 0, SPARK_KEY,
                                           PROFILES[PAIR[0]], scale),
                             OracleReplica(urlsplit(thor.url).port or 0, None,
                                           PROFILES[PAIR[1]], scale)], asking)
            answers = replay(oracle.ask, requests, scale)
            origins = [f"127.0.0.1:{urlsplit(url).port}" for url in origins]
        else:
            rates = tuple(SEED_RATES[p] * scale for p in PAIR)
            orin = stack.enter_context(start_gateway(pooling_env(spark.url, thor.url, name,
                                                                 rates)))
            wait_pool_ready(orin.url, 2)
            port = urlsplit(orin.url).port or 0
            answers = replay(lambda size, index: ask(port, size, index, asking), requests,
                             scale)
    counts = Counter(a.served_by for a in answers)
    result = Result(name, answers, scale, "/".join(str(counts[o]) for o in origins))
    print(f"  {name:7s} mean {result.mean():6.2f} s (short {result.mean(SHORT):6.2f}, long "
          f"{result.mean(LONG):6.2f})  p95 {result.p95():6.2f} s  {result.tok_per_s():6.1f} "
          f"tok/s  ({result.split})", flush=True)
    return result


def seconds(value: float) -> str:
    """A class's mean in the table; a dash for a class with no requests."""
    return "-" if math.isnan(value) else f"{value:.2f} s"


def table(results: list[Result]) -> list[str]:
    oracle = next(r for r in results if r.name == "oracle")
    rate = next(r for r in results if r.name == "rate")
    lines = ["| placement | mean latency | vs oracle | vs rate | p95 latency | short mean | "
             "long mean | tok/s | spark/thor |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r.name} | {r.mean():.2f} s | {r.mean() / oracle.mean():.2f}x | "
            f"{r.mean() / rate.mean():.2f}x | {r.p95():.2f} s | {seconds(r.mean(SHORT))} | "
            f"{seconds(r.mean(LONG))} | {r.tok_per_s():.1f} | {r.split} |")
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument("--count", type=int, default=80)
    parser.add_argument("--arrivals-per-s", type=float, default=0.35,
                        help="Poisson arrival rate in seed time (requests per second)")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--asked-max-tokens", type=int, default=0,
                        help="the loose scenario: every request asks this max_tokens and stops "
                             "on its own (0: each asks exactly its answer)")
    parser.add_argument("--long-share", type=float, default=0.2,
                        help="the share of long answers (0: all short)")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    asking = Asking(args.asked_max_tokens)
    requests = workload(args.count, args.arrivals_per_s, args.seed, args.long_share)
    sizes = Counter(size for _gap, size in requests)
    offered = (sum(asking.answer_tokens(size) for _gap, size in requests)
               / sum(gap for gap, _size in requests))
    print(f"{args.count} requests: {sizes[SHORT]} short, {sizes[LONG]} long; offered "
          f"{offered:.1f} tok/s (seed time)", flush=True)
    results = [measure(name, requests, args) for name in ("rate", "prefix", "oracle")]
    short = asking.answer_tokens(SHORT)
    if asking.asked:
        named = (f"every request asks max_tokens {asking.asked} and stops on its own, a short "
                 f"one at the simulator's natural answer ({short} tokens), a long one at "
                 f"{LONG} (min_tokens)")
    else:
        named = "every request names its own max_tokens"
    section = [
        f"Run `{' '.join(['python3', 'bench/mixed_sizes_bench.py', *sys.argv[1:]])}` on "
        f"{platform.machine()} / {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}, one run: seed 000's pair at time-scale "
        f"{args.time_scale:g}, {args.count} requests ({sizes[SHORT]} of {short} tokens, "
        f"{sizes[LONG]} of {LONG}) with Poisson arrivals at {args.arrivals_per_s:g} req/s, "
        f"{offered:.0f} tok/s offered against the pair's ~110; {named}. Latency end to end, "
        "seconds of seed time.",
        "",
        *table(results),
    ]
    print("\n".join(section))
    if args.write_docs:
        name = ("mixed-sizes-bench" if not asking.asked else "mixed-sizes-loose-bench"
                if args.long_share else "mixed-sizes-loose-short-bench")
        docs_section.write_section(name, "\n".join(section))


if __name__ == "__main__":
    main()
