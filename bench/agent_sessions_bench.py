"""Multi-turn agent sessions through a pool: does sending a conversation back to its prefix pay?

16 sessions x 8 turns share a ~4k-token system prompt; each turn appends a ~200-token user
message to the session's history (and the previous answer), so every prompt's head is cached
somewhere. Sessions run closed-loop, all at once: a session sends its next turn when the last
answer ends. The pooling gateway fronts two peer gateways, each in front of a calibrated
`lobes_sim` (which models vLLM's prefix caching), on seed 000's pair and on a homogeneous pair.
For each pool policy: time to first token (streamed) p50/p95 and aggregate tok/s, in seed time.

    PYTHONPATH=gateway python3 bench/agent_sessions_bench.py [--time-scale 10] [--write-docs]
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import statistics
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from urllib.parse import urlsplit

from placement_bench import (
    ROOT,
    SEED_RATES,
    SPARK_KEY,
    peer_gateway,
    pooling_env,
    wait_pool_ready,
)

from tests.support.gateway_proc import start_gateway
from tests.support.sim_proc import start_sim

DOCS = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- agent-sessions-bench:start -->", "<!-- agent-sessions-bench:end -->"
POLICIES = ("pinned", "queue", "rate", "prefix")
SERVED = "unsloth/Qwen3.8-27B-NVFP4"
SYSTEM = "You are the fleet's agent: plan, call tools, report what each step measured. " * 208
ANSWER_TOKENS = 64


@dataclass(frozen=True)
class Turn:
    """One streamed answer: when it was sent, its first token, its end, its tokens."""

    sent: float
    first: float
    done: float
    tokens: int
    served_by: str


def stream_turn(port: int, messages: list[dict]) -> tuple[Turn, str]:
    """Send one streamed chat turn; the turn's timings and the answer text."""
    body = json.dumps({"model": "cortex", "messages": messages, "max_tokens": ANSWER_TOKENS,
                       "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}})
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    sent = time.monotonic()
    connection.request("POST", "/v1/chat/completions", body,
                       {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:200]!r}")
    first, text, tokens = 0.0, [], 0
    for line in response:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        event = json.loads(line[6:])
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
        for choice in event.get("choices", []):
            piece = choice.get("delta", {}).get("content")
            if piece:
                first = first or time.monotonic()
                text.append(piece)
    done = time.monotonic()
    connection.close()
    served_by = response.getheader("X-Lobes-Proxied-By") or "local"
    return Turn(sent, first or done, done, tokens, served_by), "".join(text)


def session(port: int, index: int, turns: int) -> list[Turn]:
    """One agent session: its turns in order, each over the whole history so far."""
    messages = [{"role": "system", "content": SYSTEM}]
    results = []
    for number in range(turns):
        question = (f"Session {index}, step {number}: inspect the replica table, the probe "
                    "results and the last tool output, then decide the next call. " * 8)
        messages.append({"role": "user", "content": question})
        turn, answer = stream_turn(port, messages)
        messages.append({"role": "assistant", "content": answer})
        results.append(turn)
    return results


@dataclass
class Result:
    policy: str
    turns: list[Turn]
    scale: float
    split: str  # turns served by the first/second replica

    def ttft(self, quantile: float) -> float:
        values = sorted((t.first - t.sent) * self.scale for t in self.turns)
        if quantile == 0.5:
            return statistics.median(values)
        return values[min(len(values) - 1, int(quantile * len(values)))]

    def tok_per_s(self) -> float:
        span = max(t.done for t in self.turns) - min(t.sent for t in self.turns)
        return sum(t.tokens for t in self.turns) / span / self.scale



def split(turns: list[Turn], origins: list[str]) -> str:
    counts = Counter(turn.served_by for turn in turns)
    return "/".join(str(counts[origin]) for origin in origins)


def run_policy(port: int, sessions: int, turns: int) -> list[Turn]:
    lock = threading.Lock()
    every: list[Turn] = []

    def one(index: int) -> None:
        done = session(port, index, turns)
        with lock:
            every.extend(done)

    with ThreadPoolExecutor(sessions) as pool:
        list(pool.map(one, range(sessions)))
    return every


def measure_pair(profiles: tuple[str, str], args: argparse.Namespace) -> list[Result]:
    """Fresh simulators per policy (an empty prefix cache each time), one pooling gateway."""
    scale = args.time_scale
    results = []
    for policy in POLICIES:
        with ExitStack() as stack:
            sims = [stack.enter_context(start_sim(p, time_scale=scale)) for p in profiles]
            first = peer_gateway(stack, sims[0].url, SERVED, SPARK_KEY)
            second = peer_gateway(stack, sims[1].url, SERVED, None)
            rates = tuple(SEED_RATES[p] * scale for p in profiles)
            env = pooling_env(first.url, second.url, policy, rates)
            orin = stack.enter_context(start_gateway(env))
            wait_pool_ready(orin.url, 2)
            port = urlsplit(orin.url).port or 0
            turns = run_policy(port, args.sessions, args.turns)
            result = Result(policy, turns, scale, split(turns, [first.url, second.url]))
            results.append(result)
            print(f"  {policy:7s} TTFT p50 {result.ttft(0.5):6.2f} s  p95 "
                  f"{result.ttft(0.95):6.2f} s  {result.tok_per_s():6.1f} tok/s  "
                  f"({result.split})", flush=True)
    return results


def table(title: str, results: list[Result]) -> list[str]:
    rate = next(r for r in results if r.policy == "rate")
    lines = [f"**{title}**: time to first token and aggregate tok/s in seed time (ratio to "
             "rate; turns served by the first/second replica)", "",
             "| policy | TTFT p50 | TTFT p95 | tok/s | split |", "|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r.policy} | {r.ttft(0.5):.2f} s ({rate.ttft(0.5) / r.ttft(0.5):.2f}x faster) | "
            f"{r.ttft(0.95):.2f} s ({rate.ttft(0.95) / r.ttft(0.95):.2f}x faster) | "
            f"{r.tok_per_s():.1f} ({r.tok_per_s() / rate.tok_per_s():.2f}x) | "
            f"{r.split} |")
    return [*lines, ""]


def write_docs(section: list[str]) -> None:
    text = DOCS.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    DOCS.write_text(head + START + "\n" + "\n".join(section) + "\n" + END + tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    section = [
        f"Run `{' '.join(['python3', 'bench/agent_sessions_bench.py', *sys.argv[1:]])}` on "
        f"{platform.machine()} / {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}, one run: {args.sessions} sessions x "
        f"{args.turns} turns, closed-loop, over a ~4,000-token shared system prompt; each turn "
        f"adds a ~220-token user message and the previous {ANSWER_TOKENS}-token answer "
        "(streamed, ignore_eos). Fresh simulators per policy (empty caches) at time-scale "
        f"{args.time_scale:g}; seconds and tok/s in seed time. `prefix` is rate + prefix "
        "(and size) awareness, the new default.",
        "",
    ]
    for title, profiles in (
        ("seed 000 pair: spark-cortex + thor-cortex", ("spark-cortex", "thor-cortex")),
        ("homogeneous pair: spark-cortex + spark-cortex", ("spark-cortex", "spark-cortex")),
    ):
        print(title, flush=True)
        section += table(title, measure_pair(profiles, args))
    print("\n".join(section))
    if args.write_docs:
        write_docs(section)


if __name__ == "__main__":
    main()
