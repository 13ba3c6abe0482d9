"""Multi-turn agent sessions through a pool: does sending a conversation back to its prefix pay?

16 sessions x 8 turns share a ~4k-token system prompt; each turn appends a ~200-token user
message to the session's history (and the previous answer), so every prompt's head is cached
somewhere. Sessions run closed-loop, all at once: a session sends its next turn a tool
call's time (--think-s) after the last answer ends. The pooling gateway fronts two peer
gateways, each in front of a calibrated `lobes_sim` (which models vLLM's prefix caching), on
seed 000's pair and on a homogeneous pair.
For each pool policy: time to first token (streamed) p50/p95 and aggregate tok/s, in seed time.

    PYTHONPATH=gateway python3 bench/agent_sessions_bench.py [--time-scale 10] [--write-docs]
    PYTHONPATH=gateway python3 bench/agent_sessions_bench.py --scenario 2 --pair homogeneous
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import re
import statistics
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from urllib.parse import urlsplit

import docs_section
from placement_bench import (
    SEED_RATES,
    SPARK_KEY,
    peer_gateway,
    pooling_env,
    wait_pool_ready,
)

from tests.support.gateway_proc import start_gateway
from tests.support.sim_proc import start_sim

POLICIES = ("pinned", "queue", "rate", "prefix")
# A reference, not a policy: `rate` against simulators whose prefill costs nothing (lobes_sim
# --prefill-scale 0). No placement by prefix can beat a prefill that is free, so its time to
# first token over rate's bounds what affinity can gain in the scenario (loosely: it frees the
# new tokens' prefill too, which no cache holds).
PREFILL_FREE = "rate, prefill free"
# A reference, not a policy: "static split K" sends sessions 0..K-1 straight to the second
# simulator and the rest to the first, each session staying where it started. It shows what
# placing whole sessions by the replicas' capacity, rather than each turn alone, could reach.
STATIC_SPLIT = "static split "
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


@dataclass(frozen=True)
class Endpoint:
    """Where a session sends its turns: a pooling gateway (the role's name; the replica from
    its answer's header) or one simulator directly (its served name; `name` is the replica)."""

    port: int
    model: str = "cortex"
    name: str | None = None


def stream_turn(endpoint: Endpoint, messages: list[dict]) -> tuple[Turn, str]:
    """Send one streamed chat turn; the turn's timings and the answer text."""
    body = json.dumps({"model": endpoint.model, "messages": messages,
                       "max_tokens": ANSWER_TOKENS,
                       "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}})
    connection = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=600)
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
    served_by = endpoint.name or response.getheader("X-Lobes-Proxied-By") or "local"
    return Turn(sent, first or done, done, tokens, served_by), "".join(text)


@dataclass(frozen=True)
class Scenario:
    """One agent workload: what each turn adds and how long the agent's tool call takes."""

    title: str
    turn_chars: int  # the user message of each turn (the question, or a tool's output)
    think_s: float  # seed seconds between an answer and the next turn
    policies: tuple[str, ...]
    sessions: int | None = None  # None: --sessions (16 unless told)
    # Characters of the session's own context after the shared system prompt (a coding agent's
    # files): 0 for none. Only the replica that served the session holds it.
    own_context_chars: int = 0
    # Reference rows: (--pair name, sessions placed whole on the second replica); see
    # STATIC_SPLIT. The seed pair's counts come from a sweep over 2-6
    # (changelogs/benchmark-runs.md): the best time to first token at no loss of throughput,
    # and for tool outputs also the best time to first token at any throughput.
    static_splits: tuple[tuple[str, int], ...] = ()

    def session_count(self, args: argparse.Namespace) -> int:
        """This scenario's sessions, else --sessions."""
        return self.sessions or args.sessions

    def rows(self, pair: str) -> tuple[str, ...]:
        """The policies, then this pair's static-split references."""
        splits = tuple(f"{STATIC_SPLIT}{count}" for name, count in self.static_splits
                       if name == pair)
        return self.policies + splits


SCENARIOS = (
    Scenario("the goal's example: ~220-token turns, 2 s tool calls", 920, 2.0,
             (*POLICIES, PREFILL_FREE), static_splits=(("seed", 3), ("homogeneous", 8))),
    Scenario("tool outputs: ~2,000-token turns, 10 s tool calls", 8000, 10.0,
             ("rate", "prefix", PREFILL_FREE),
             static_splits=(("seed", 4), ("seed", 5), ("homogeneous", 8))),
    # Beside the goal's example: as many sessions as the pair has slots, so a turn rarely queues
    # and its time to first token is its prefill, which is what affinity saves.
    Scenario("added scenario: 4 sessions (the pair not saturated), the example's turns",
             920, 2.0, ("rate", "prefix"), sessions=4),
    # Beside the goal's example: where prefill is most of a turn's work. Each session carries
    # its own ~23k-token context (a coding agent's files) after the shared prompt, so a turn
    # placed away from its session's replica prefills all of it again.
    Scenario("added scenario: each session's own ~23k-token context, the example's turns",
             920, 2.0, ("rate", "prefix"), own_context_chars=96_000),
)


# (--pair name, table title, the two simulators' profiles)
PAIRS = (
    ("seed", "seed 000 pair: spark-cortex + thor-cortex", ("spark-cortex", "thor-cortex")),
    ("homogeneous", "homogeneous pair: spark-cortex + spark-cortex",
     ("spark-cortex", "spark-cortex")),
)


def session(endpoint: Endpoint, index: int, turns: int, scenario: Scenario,
            scale: float) -> list[Turn]:
    """One agent session: its turns in order, each over the whole history so far, with the
    scenario's tool time between an answer and the next turn."""
    context = f"Session {index}'s working files, as the agent last read them. "
    own = (context * (scenario.own_context_chars // len(context) + 1))[
        :scenario.own_context_chars]
    messages = [{"role": "system", "content": SYSTEM + own}]
    results = []
    for number in range(turns):
        line = (f"Session {index}, step {number}: the replica table, the probe results and "
                "the last tool output, for the next call. ")
        question = (line * (scenario.turn_chars // len(line) + 1))[:scenario.turn_chars]
        messages.append({"role": "user", "content": question})
        turn, answer = stream_turn(endpoint, messages)
        messages.append({"role": "assistant", "content": answer})
        results.append(turn)
        time.sleep(scenario.think_s / scale)
    return results


@dataclass
class Result:
    policy: str
    turns: list[Turn]
    scale: float
    split: str  # turns served by the first/second replica
    hit_rate: float  # prefix-cache hits over queries, in tokens, both simulators together
    sessions: int
    think_s: float  # seed seconds between an answer and the session's next turn

    def ttft(self, quantile: float) -> float:
        values = sorted((t.first - t.sent) * self.scale for t in self.turns)
        if quantile == 0.5:
            return statistics.median(values)
        return values[min(len(values) - 1, int(quantile * len(values)))]

    def ttft_mean(self) -> float:
        return statistics.fmean((t.first - t.sent) * self.scale for t in self.turns)

    def tok_per_s(self) -> float:
        span = max(t.done for t in self.turns) - min(t.sent for t in self.turns)
        return sum(t.tokens for t in self.turns) / span / self.scale

    def steady_tok_per_s(self) -> float:
        """Throughput of the closed loop without its ramp and drain (Little's law: sessions
        over a round's mean response time plus think time, times a turn's mean tokens): a
        placement that leaves one replica finishing alone loses makespan throughput that an
        endless stream of sessions would not."""
        response = statistics.fmean((t.done - t.sent) * self.scale for t in self.turns)
        tokens = statistics.fmean(t.tokens for t in self.turns)
        return self.sessions / (response + self.think_s) * tokens


def split(turns: list[Turn], origins: list[str]) -> str:
    counts = Counter(turn.served_by for turn in turns)
    return "/".join(str(counts[origin]) for origin in origins)


def cache_counter(sim_url: str, name: str) -> float:
    """One counter of a simulator's /metrics."""
    with urllib.request.urlopen(f"{sim_url}/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def hit_rate(sim_urls: list[str]) -> float:
    hits = sum(cache_counter(url, "vllm:prefix_cache_hits_total") for url in sim_urls)
    queries = sum(cache_counter(url, "vllm:prefix_cache_queries_total") for url in sim_urls)
    return hits / queries if queries else 0.0


def run_sessions(endpoint_of: Callable[[int], Endpoint], scenario: Scenario,
                 args: argparse.Namespace) -> list[Turn]:
    """Every session at once, session i sending its turns to endpoint_of(i)."""
    lock = threading.Lock()
    every: list[Turn] = []

    def one(index: int) -> None:
        done = session(endpoint_of(index), index, args.turns, scenario, args.time_scale)
        with lock:
            every.extend(done)

    sessions = scenario.session_count(args)
    with ThreadPoolExecutor(sessions) as pool:
        list(pool.map(one, range(sessions)))
    return every


def row_setup(row: str) -> tuple[str, list[str]]:
    """The pool policy a table row runs, and its simulators' extra arguments."""
    if row == PREFILL_FREE:
        return "rate", ["--prefill-scale", "0"]
    return row, []


def measure_pair(pair: str, profiles: tuple[str, str], scenario: Scenario,
                 args: argparse.Namespace) -> list[Result]:
    """Fresh simulators per policy (an empty prefix cache each time), one pooling gateway."""
    scale = args.time_scale
    results = []
    for policy in scenario.rows(pair):
        placing, sim_args = row_setup(policy)
        with ExitStack() as stack:
            sims = [stack.enter_context(start_sim(p, time_scale=scale, extra_args=sim_args))
                    for p in profiles]
            if policy.startswith(STATIC_SPLIT):
                result = static_split(sims, int(policy[len(STATIC_SPLIT):]), scenario, args)
                results.append(report_row(result))
                continue
            first = peer_gateway(stack, sims[0].url, SERVED, SPARK_KEY)
            second = peer_gateway(stack, sims[1].url, SERVED, None)
            rates = tuple(SEED_RATES[p] * scale for p in profiles)
            env = pooling_env(first.url, second.url, placing, rates)
            orin = stack.enter_context(start_gateway(env))
            wait_pool_ready(orin.url, 2)
            port = urlsplit(orin.url).port or 0
            turns = run_sessions(lambda _index, pool=Endpoint(port): pool, scenario, args)
            result = Result(policy, turns, scale, split(turns, [first.url, second.url]),
                            hit_rate([sim.url for sim in sims]),
                            scenario.session_count(args), scenario.think_s)
            results.append(report_row(result))
    return results


def static_split(sims: list, on_second: int, scenario: Scenario,
                 args: argparse.Namespace) -> Result:
    """Sessions 0..on_second-1 straight to the second simulator, the rest to the first."""
    urls = [sim.url for sim in sims]
    endpoints = [Endpoint(urlsplit(url).port or 0, SERVED, url) for url in urls]
    turns = run_sessions(lambda index: endpoints[1 if index < on_second else 0], scenario, args)
    return Result(f"{STATIC_SPLIT}{on_second}", turns, args.time_scale, split(turns, urls),
                  hit_rate(urls), scenario.session_count(args), scenario.think_s)


def report_row(result: Result) -> Result:
    print(f"  {result.policy:18s} TTFT p50 {result.ttft(0.5):6.2f} s  p95 "
          f"{result.ttft(0.95):6.2f} s  mean {result.ttft_mean():6.2f} s  "
          f"{result.tok_per_s():6.1f} tok/s  steady {result.steady_tok_per_s():6.1f}  "
          f"hits {result.hit_rate:.0%}  ({result.split})", flush=True)
    return result


def table(title: str, results: list[Result]) -> list[str]:
    rate = next(r for r in results if r.policy == "rate")
    lines = [f"**{title}**: time to first token and aggregate tok/s in seed time (ratio to "
             "rate), prefix-cache hit rate (tokens), turns served by the first/second replica",
             "", "| policy | TTFT p50 | TTFT p95 | TTFT mean | tok/s | steady tok/s | cache hits "
             "| split |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r.policy} | {r.ttft(0.5):.2f} s ({rate.ttft(0.5) / r.ttft(0.5):.2f}x faster) | "
            f"{r.ttft(0.95):.2f} s ({rate.ttft(0.95) / r.ttft(0.95):.2f}x faster) | "
            f"{r.ttft_mean():.2f} s ({rate.ttft_mean() / r.ttft_mean():.2f}x faster) | "
            f"{r.tok_per_s():.1f} ({r.tok_per_s() / rate.tok_per_s():.2f}x) | "
            f"{r.steady_tok_per_s():.1f} ({r.steady_tok_per_s() / rate.steady_tok_per_s():.2f}x) | "
            f"{r.hit_rate:.0%} | {r.split} |")
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--scenario", type=int, action="append", choices=range(len(SCENARIOS)),
                        help="run only this scenario (its index in SCENARIOS, from 0); "
                             "repeatable; all when absent")
    parser.add_argument("--pair", choices=[pair[0] for pair in PAIRS], action="append",
                        help="run only this pair; repeatable; both when absent")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    if args.write_docs and (args.scenario or args.pair):
        parser.error("--write-docs writes the whole section: drop --scenario and --pair")
    section = [
        f"Run `{' '.join(['python3', 'bench/agent_sessions_bench.py', *sys.argv[1:]])}` on "
        f"{platform.machine()} / {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}, one run each: {args.sessions} sessions x "
        f"{args.turns} turns, closed-loop, over a ~4,000-token shared system prompt; each turn "
        f"adds a user message (the question, or a tool's output) and the previous "
        f"{ANSWER_TOKENS}-token answer (streamed, ignore_eos), a tool call's time after the "
        "answer. Fresh simulators per policy (empty caches; they cache the answer's blocks "
        "too, as vLLM) at time-scale "
        f"{args.time_scale:g}; seconds and tok/s in seed time. `prefix` is rate + prefix "
        "(and size) awareness, the new default. `rate, prefill free` is a reference, not a "
        "policy: `rate` against simulators whose prefill costs nothing (`--prefill-scale 0`), "
        "so its TTFT ratio bounds what prefix affinity could gain with rate's balance of "
        "turns (loosely: no cache holds a turn's new tokens either). `static split K` is a "
        "reference too: K sessions sent whole, straight to the second simulator, the rest to "
        "the first (no gateway), so it shows what placing sessions by the replicas' capacity, "
        "not each turn alone, could reach; the seed pair's K is the best of a sweep over 2-6 "
        "at no loss of throughput (and, for tool outputs, 5: the best at any throughput). "
        "`TTFT mean` tells a placement that cut the waiting from one that moved it between "
        "turns; `tok/s` is the tokens over the run's whole span, `steady tok/s` the closed "
        "loop's without its ramp and drain (Little's law: the sessions over a turn's mean "
        "response time plus the tool call's, times a turn's tokens).",
        "",
    ]
    for index, scenario in enumerate(SCENARIOS):
        if args.scenario and index not in args.scenario:
            continue
        section += [f"### {scenario.title}", ""]
        for name, title, profiles in PAIRS:
            if args.pair and name not in args.pair:
                continue
            print(f"{scenario.title}; {title}", flush=True)
            section += table(title, measure_pair(name, profiles, scenario, args))
    print("\n".join(section))
    if args.write_docs:
        docs_section.write_section("agent-sessions-bench", "\n".join(section))


if __name__ == "__main__":
    main()
