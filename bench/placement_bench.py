"""Pool placement benchmark: pinned vs queue depth vs service rate vs prefix, through real gateways.

Replays seed 000 section 4: an "orin" gateway that does not host cortex pools it from two
peer gateways, each fronting a calibrated simulator (spark-cortex 48.9 tok/s, thor-cortex
11.0 tok/s, 2 slots each), then a homogeneous pair (two spark-cortex). For each pool policy
it sends bursts of 4, 8 and 16 concurrent chat requests (max_tokens=160, as in the seed), the
same bursts as a new user sends them (154-token answers to "hi", ignore_eos), a sustained
Poisson arrival stream and a sustained overload (closed-loop clients, each sending its next
request when its answer ends), and reports aggregate tok/s in the seed's own time (wall tok/s
divided by the simulator's time-scale), so the figures compare to seed 000. Each policy's
figures are also given against the targets placement must meet (never slower than pinned to
the fastest replica on a burst; near the pair's limit under overload).

    PYTHONPATH=gateway python3 bench/placement_bench.py [--time-scale 10] [--write-docs]

--write-docs rewrites the placement-bench section of docs/benchmarks.md and the plot
docs/img/placement-bench.png (matplotlib is needed for the plot only).
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import random
import sys
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import docs_section

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "gateway")]

from tests.support.gateway_proc import start_gateway  # noqa: E402
from tests.support.sim_proc import start_sim  # noqa: E402

PLOT = ROOT / "docs" / "img" / "placement-bench.png"
SPARK_KEY = "spark-inbound-key"
BURSTS = (4, 8, 16)
# A new user's request: "hi", a 154-token answer whatever the model would say.
USER_PROMPT, USER_TOKENS = "hi", 154
# Targets, as ratios to the same run pinned to the first (fastest) replica: a burst is never
# slower than waiting for the best replica (0.98x: the run's noise), and an overload of the
# seed pair comes near its limit, (90 + 22) / 90 = 1.24x the Spark alone (1.22x).
BURST_TARGET = 0.98
OVERLOAD_TARGET = 1.22
POLICIES = ("pinned", "queue", "rate", "prefix")
SEED_RATES = {"spark-cortex": 48.9, "thor-cortex": 11.0}


@dataclass(frozen=True)
class Answer:
    """One completed request: tokens, when it was sent and finished, where it was served."""

    tokens: int
    sent: float
    done: float
    served_by: str
    reason: str


@dataclass
class Run:
    """The answers of one burst or one sustained stream."""

    answers: list[Answer] = field(default_factory=list)

    def tok_per_s(self, time_scale: float) -> float:
        span = max(a.done for a in self.answers) - min(a.sent for a in self.answers)
        return sum(a.tokens for a in self.answers) / span / time_scale

    def latency_s(self, quantile: float, time_scale: float) -> float:
        latencies = sorted((a.done - a.sent) * time_scale for a in self.answers)
        return latencies[min(len(latencies) - 1, int(quantile * len(latencies)))]

    def split(self, names: dict[str, str]) -> str:
        counts = Counter(names.get(a.served_by, a.served_by) for a in self.answers)
        return "/".join(f"{counts.get(n, 0)}" for n in names.values())


def chat(port: int, index: int, user: bool = False) -> Answer:
    """One non-streamed chat request to the pooling gateway, as seed 000 sent them (or, with
    `user`, as a new user does: "hi", a 154-token answer, ignore_eos)."""
    payload: dict = {
        "model": "cortex",
        "messages": [{"role": "user", "content": f"Describe replica pools, part {index}."}],
        "max_tokens": 160,
        "temperature": 0,
    }
    if user:
        payload.update(messages=[{"role": "user", "content": USER_PROMPT}],
                       max_tokens=USER_TOKENS, ignore_eos=True)
    body = json.dumps(payload)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    sent = time.monotonic()
    connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    payload = response.read()
    done = time.monotonic()
    connection.close()
    if response.status != 200:
        raise RuntimeError(f"request {index}: HTTP {response.status} {payload[:200]!r}")
    tokens = json.loads(payload)["usage"]["completion_tokens"]
    served_by = response.getheader("X-Lobes-Proxied-By") or "local"
    return Answer(tokens, sent, done, served_by, response.getheader("X-Lobes-Route-Reason", ""))


def burst(port: int, size: int, user: bool = False) -> Run:
    with ThreadPoolExecutor(size) as pool:
        return Run(list(pool.map(lambda i: chat(port, i, user), range(size))))


def overload(port: int, clients: int, seconds: float) -> Run:
    """`clients` closed-loop clients sending the user's request for `seconds` (wall): each
    sends its next request as its answer ends; the answers that ended in the window count,
    and the window is from the first send to the last answer."""
    answers: list[Answer] = []
    lock = threading.Lock()
    until = time.monotonic() + seconds

    def client(first: int) -> None:
        index = first
        while time.monotonic() < until:
            answer = chat(port, index, user=True)
            with lock:
                answers.append(answer)
            index += clients

    with ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(client, i) for i in range(clients)]:
            future.result()
    return Run(answers)


def sustained(port: int, per_s: float, count: int, seed: int = 0) -> Run:
    """count requests with Poisson arrivals at per_s (wall) per second."""
    rng = random.Random(seed)
    answers: list[Answer] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        answer = chat(port, i)
        with lock:
            answers.append(answer)

    with ThreadPoolExecutor(count) as pool:
        futures = []
        for i in range(count):
            futures.append(pool.submit(one, i))
            time.sleep(rng.expovariate(per_s))
        for future in futures:
            future.result()
    return Run(answers)


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def wait_pool_ready(url: str, replicas: int, timeout_s: float = 30.0) -> None:
    """Until /capabilities shows every replica of the cortex pool ready and compatible."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        cortex = get_json(f"{url}/capabilities")["roles"]["cortex"]
        rows = cortex.get("replicas", [])
        if len(rows) == replicas and all(r["ready"] and r["compatible"] for r in rows):
            return
        time.sleep(0.1)
    raise RuntimeError(f"pool at {url} never became ready: {cortex}")


def peer_gateway(stack: ExitStack, sim_url: str, served: str, api_key: str | None):
    env = {
        "PRIMARY_BASE_URL": sim_url,
        "PRIMARY_SERVED_NAME": served,
        "PRIMARY_MAX_MODEL_LEN": "262144",
        "PRIMARY_MAX_ACTIVE": "2",
    }
    if api_key:
        env["GATEWAY_API_KEY"] = api_key
    return stack.enter_context(start_gateway(env))


def pooling_env(spark_url: str, thor_url: str, policy: str, rates: tuple[float, float]) -> dict:
    """Seed 000 section 0's configuration, with the policy under test and scaled priors."""
    return {
        "PRIMARY_FEASIBLE": "false",
        "PRIMARY_PEER_ORIGIN": spark_url,
        "PRIMARY_PEER_PROXY": "true",
        "PRIMARY_PEER_API_KEY": SPARK_KEY,
        "PRIMARY_PEER_ORIGINS": f"{spark_url},{thor_url}",
        "PRIMARY_PEER_API_KEYS": ",",
        "PRIMARY_PEER_RATES": ",".join(f"{r:g}" for r in rates),
        "PRIMARY_MAX_ACTIVE": "2",
        "GATEWAY_POOL_POLICY": policy,
        "GATEWAY_PROBE_INTERVAL_S": "0.5",
    }


@dataclass
class PolicyResult:
    policy: str
    bursts: dict[int, Run]
    stream: Run
    user_bursts: dict[int, Run]
    overload: Run


def measure_pair(
    profiles: tuple[str, str], args: argparse.Namespace
) -> tuple[list[PolicyResult], dict[str, str]]:
    """Start the pair, then one pooling gateway per policy; bursts and a sustained stream."""
    scale = args.time_scale
    results = []
    with ExitStack() as stack:
        sims = [stack.enter_context(start_sim(p, time_scale=scale)) for p in profiles]
        served = "unsloth/Qwen3.8-27B-NVFP4"
        spark = peer_gateway(stack, sims[0].url, served, SPARK_KEY)
        thor = peer_gateway(stack, sims[1].url, served, None)
        names = {spark.url: "first", thor.url: "second"}
        rates = tuple(SEED_RATES[p] * scale for p in profiles)
        for policy in POLICIES:
            with start_gateway(pooling_env(spark.url, thor.url, policy, rates)) as orin:
                wait_pool_ready(orin.url, 2)
                burst(orin.port, 2)  # warm the keep-alive connections
                runs = {size: burst(orin.port, size) for size in BURSTS}
                user_runs = {size: burst(orin.port, size, user=True) for size in BURSTS}
                stream = sustained(orin.port, args.arrivals_per_s * scale, args.stream_count)
                loaded = overload(orin.port, args.overload_clients, args.overload_s)
                results.append(PolicyResult(policy, runs, stream, user_runs, loaded))
                print(
                    f"  {policy:7s} "
                    + "  ".join(
                        f"N={n}: {r.tok_per_s(scale):6.1f} tok/s ({r.split(names)})"
                        for n, r in runs.items()
                    )
                    + "  user "
                    + "  ".join(
                        f"N={n}: {r.tok_per_s(scale):6.1f} tok/s ({r.split(names)})"
                        for n, r in user_runs.items()
                    )
                    + f"  sustained: {stream.tok_per_s(scale):6.1f} tok/s "
                    f"p95 {stream.latency_s(0.95, scale):5.1f} s ({stream.split(names)})"
                    f"  overload: {loaded.tok_per_s(scale):6.1f} tok/s ({loaded.split(names)})",
                    flush=True,
                )
    return results, names


def table(
    title: str, results: list[PolicyResult], scale: float, names: dict[str, str]
) -> list[str]:
    pinned = {n: results[0].bursts[n].tok_per_s(scale) for n in BURSTS}
    pinned_stream = results[0].stream.tok_per_s(scale)
    lines = [
        f"**{title}**: aggregate tok/s in seed time (ratio to pinned; requests served "
        "by the first/second replica)",
        "",
        "| policy | burst 4 | burst 8 | burst 16 | sustained | sustained p95 latency |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        cells = [
            f"{r.tok_per_s(scale):.1f} ({r.tok_per_s(scale) / pinned[n]:.2f}x; {r.split(names)})"
            for n, r in result.bursts.items()
        ]
        stream = result.stream.tok_per_s(scale)
        cells.append(f"{stream:.1f} ({stream / pinned_stream:.2f}x; {result.stream.split(names)})")
        cells.append(f"{result.stream.latency_s(0.95, scale):.1f} s")
        lines.append(f"| {result.policy} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def verdict(ratio: float, target: float) -> str:
    return f"{ratio:.2f}x ({'PASS' if ratio >= target else 'MISS'})"


def targets(title: str, results: list[PolicyResult], scale: float,
            names: dict[str, str]) -> list[str]:
    """Each policy against the targets, as ratios to pinned in the same run: the bench's
    bursts, the user's bursts (154 tokens to "hi"), and the overload."""
    pinned = results[0]
    head = " | ".join([*(f"burst {n}" for n in BURSTS), *(f"user burst {n}" for n in BURSTS)])
    lines = [
        f"**{title}**: against the targets (ratio to pinned in this run; PASS at >= "
        f"{BURST_TARGET:g}x on a burst, >= {OVERLOAD_TARGET:g}x under overload)",
        "",
        f"| policy | {head} | overload (tok/s; split) |",
        "|---|" + "---|" * (2 * len(BURSTS) + 1),
    ]
    for result in results[1:]:
        cells = [verdict(result.bursts[n].tok_per_s(scale) / pinned.bursts[n].tok_per_s(scale),
                         BURST_TARGET) for n in BURSTS]
        cells += [verdict(result.user_bursts[n].tok_per_s(scale)
                          / pinned.user_bursts[n].tok_per_s(scale), BURST_TARGET)
                  for n in BURSTS]
        loaded = result.overload.tok_per_s(scale)
        cells.append(f"{verdict(loaded / pinned.overload.tok_per_s(scale), OVERLOAD_TARGET)}: "
                     f"{loaded:.1f} against {pinned.overload.tok_per_s(scale):.1f}; "
                     f"{result.overload.split(names)}")
        lines.append(f"| {result.policy} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def plot(pairs: dict[str, list[PolicyResult]], scale: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(pairs), figsize=(11, 4), sharey=False)
    labels = [f"burst {n}" for n in BURSTS] + ["sustained"]
    for ax, (title, results) in zip(axes, pairs.items(), strict=True):
        width = 0.8 / len(results)
        for i, result in enumerate(results):
            values = [r.tok_per_s(scale) for r in result.bursts.values()]
            values.append(result.stream.tok_per_s(scale))
            ax.bar([x + i * width for x in range(len(labels))], values, width, label=result.policy)
        ax.set_xticks([x + width for x in range(len(labels))], labels)
        ax.set_title(title)
        ax.set_ylabel("aggregate tok/s (seed time)")
        ax.legend()
    figure.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(PLOT, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument(
        "--arrivals-per-s",
        type=float,
        default=0.7,
        help="sustained arrival rate in seed time (requests per second)",
    )
    parser.add_argument("--stream-count", type=int, default=60)
    parser.add_argument("--overload-clients", type=int, default=12,
                        help="closed-loop clients of the sustained overload")
    parser.add_argument("--overload-s", type=float, default=30.0,
                        help="the overload's length, wall seconds")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    scale = args.time_scale
    pairs: dict[str, list[PolicyResult]] = {}
    names: dict[str, dict[str, str]] = {}
    for title, profiles in (
        ("seed 000 pair: spark-cortex + thor-cortex", ("spark-cortex", "thor-cortex")),
        ("homogeneous pair: spark-cortex + spark-cortex", ("spark-cortex", "spark-cortex")),
    ):
        print(title, flush=True)
        pairs[title], names[title] = measure_pair(profiles, args)
    section = [
        f"Run `{' '.join(['python3', 'bench/placement_bench.py', *sys.argv[1:]])}` on "
        f"{platform.machine()} / {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}: real gateway processes (a pooling "
        "gateway in front of two peer gateways, each fronting a calibrated `lobes_sim`) at "
        f"time-scale {scale:g}; tok/s are converted back to seed time. Bursts send N "
        f"concurrent chat requests (max_tokens=160); sustained sends {args.stream_count} "
        f"requests with Poisson arrivals at {args.arrivals_per_s:g} req/s (seed time), above "
        "what the fast replica alone serves: its tok/s is bounded by the arrivals, its p95 "
        "latency shows the queue. User bursts send N concurrent requests as a new user does "
        f"(\"{USER_PROMPT}\", max_tokens={USER_TOKENS}, ignore_eos); the overload is "
        f"{args.overload_clients} closed-loop clients sending those for {args.overload_s:g} s "
        "(wall).",
        "",
    ]
    for title, results in pairs.items():
        section += table(title, results, scale, names[title])
        section += targets(title, results, scale, names[title])
    section.append("![placement benchmark](img/placement-bench.png)")
    print("\n".join(section))
    if args.write_docs:
        plot(pairs, scale)
        docs_section.write_section("placement-bench", "\n".join(section))


if __name__ == "__main__":
    main()
