"""Streams killed mid-answer: 200 chat streams through a pool of two replicas, one replica's
gateway killed (SIGKILL) while it holds streams, with P_STREAM_RESUME on and, for comparison,
off. Each stream's text is checked token by token against the unbroken reference answer (the
simulators are deterministic per prompt: the same request to the surviving replica).

Reported per mode: streams completed whole (ended with [DONE] and equal to the reference),
streams resumed, tokens lost and duplicated (a token-sequence diff against the reference), and
the stall a resumed stream's client saw at the switch: its longest gap between two events, less
that stream's median gap (p50 and max, wall milliseconds, and in the simulator's time).

    PYTHONPATH=gateway python3 bench/resume_bench.py [--streams 200] [--write-docs]

--write-docs rewrites the resume-bench section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import difflib
import os
import platform
import re
import signal
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import docs_section
import procs

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "gateway")]

from tests.support.gateway_proc import start_gateway  # noqa: E402
from tests.support.sim_proc import start_sim  # noqa: E402
from tests.support.sse import Streamed, stream_chat  # noqa: E402

SERVED = "unsloth/Qwen3.8-27B-NVFP4"
MAX_TOKENS = 120
_TOKEN = re.compile(r" ?[^ ]+")


@dataclass(frozen=True)
class Verdict:
    """One stream, judged against its reference."""

    whole: bool
    resumed: bool
    lost: int
    duplicated: int
    stall_s: float | None  # the switch's added stall, for a resumed stream
    failure: str  # how a stream that is not whole ended ("" for a whole one)


def ask(index: int) -> dict:
    return {"model": "cortex", "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": f"Tell me of replica pools, part {index}."}],
            "stream_options": {"include_usage": True}}


def judge(streamed: Streamed, reference: str) -> Verdict:
    got, want = _TOKEN.findall(streamed.text), _TOKEN.findall(reference)
    lost = duplicated = 0
    matcher = difflib.SequenceMatcher(None, want, got, autojunk=False)
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        if tag in ("delete", "replace"):
            lost += a1 - a0
        if tag in ("insert", "replace"):
            duplicated += b1 - b0
    resumed = bool(streamed.finish and "lobes_resumed" in streamed.finish)
    stall = None
    if resumed and len(streamed.arrivals) > 3:
        gaps = [b - a for a, b in zip(streamed.arrivals[1:], streamed.arrivals[2:],
                                      strict=False)]
        stall = max(gaps) - statistics.median(gaps)
    whole = streamed.done and streamed.text == reference
    failure = "" if whole else (f"HTTP {streamed.status}, {len(streamed.events)} events, "
                                f"done={streamed.done}, errors={streamed.errors}"
                                f"{', body=' + streamed.body.decode() if streamed.body else ''}")
    return Verdict(whole, resumed, lost, duplicated, stall, failure)


@dataclass(frozen=True)
class Pass:
    """One mode's streams, judged, and the pooling gateway's CPU seconds for them."""

    verdicts: list[Verdict]
    cpu_s: float


def run(resume: bool, streams: int, concurrency: int, time_scale: float) -> Pass:
    """One pass: a fresh pool, `streams` streams, the first replica killed a third of the way."""
    with ExitStack() as stack:
        # Slots for every stream on one replica: the stall measured is the switch's, not a
        # queue on the survivor.
        sims = [stack.enter_context(start_sim("spark-cortex", time_scale=time_scale,
                                              extra_args=["--max-num-seqs", str(concurrency)]))
                for _replica in range(2)]
        peers = [stack.enter_context(start_gateway({
            "PRIMARY_BASE_URL": sim.url, "PRIMARY_SERVED_NAME": SERVED,
            "PRIMARY_MAX_MODEL_LEN": "262144", "PRIMARY_MAX_ACTIVE": str(concurrency)}))
            for sim in sims]
        pool = stack.enter_context(start_gateway({
            "PRIMARY_FEASIBLE": "false", "PRIMARY_ROUTE": "pool", "GATEWAY_POOL_POLICY": "queue",
            "PRIMARY_PEER_ORIGINS": ",".join(p.url for p in peers),
            "PRIMARY_MAX_ACTIVE": str(concurrency),
            "PRIMARY_STREAM_RESUME": "true" if resume else "false",
            "GATEWAY_PROBE_INTERVAL_S": "0.2", "GATEWAY_PROBE_TIMEOUT_S": "0.5"}))
        _wait_pool(pool)
        victim, survivor = peers
        started = threading.Semaphore(0)
        killer = threading.Thread(target=_kill_when, args=(started, streams // 3, victim.pid))
        killer.start()

        def one(index: int) -> Streamed:
            started.release()
            return stream_chat(pool.url, ask(index), timeout=120)

        cpu_before = procs.cpu_seconds(pool.pid)
        with ThreadPoolExecutor(concurrency) as workers:
            answers = list(workers.map(one, range(streams)))
        cpu_s = procs.cpu_seconds(pool.pid) - cpu_before
        killer.join()
        references = [stream_chat(survivor.url, ask(i), timeout=120).text
                      for i in range(streams)]
    return Pass([judge(a, r) for a, r in zip(answers, references, strict=True)], cpu_s)


def _kill_when(started: threading.Semaphore, count: int, pid: int) -> None:
    """SIGKILL `pid` once `count` streams have started (and their replica holds some)."""
    for _started in range(count):
        started.acquire()
    time.sleep(0.3)
    os.kill(pid, signal.SIGKILL)


def _wait_pool(pool) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = pool.get_json("/capabilities")["roles"]["cortex"].get("replicas", [])
        if len(rows) == 2 and all(r["ready"] and r["compatible"] for r in rows):
            return
        time.sleep(0.1)
    raise RuntimeError("the pool's replicas never became ready")


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def row(mode: str, result: Pass, time_scale: float) -> str:
    verdicts = result.verdicts
    stalls = [v.stall_s for v in verdicts if v.stall_s is not None]
    p50, most = _quantile(stalls, 0.5), max(stalls, default=0.0)
    return (f"| {mode} | {len(verdicts)} | {sum(v.whole for v in verdicts)} | "
            f"{sum(v.resumed for v in verdicts)} | {sum(v.lost for v in verdicts)} | "
            f"{sum(v.duplicated for v in verdicts)} | "
            f"{p50 * 1000:.0f} / {most * 1000:.0f} | "
            f"{p50 * time_scale * 1000:.0f} / {most * time_scale * 1000:.0f} | "
            f"{result.cpu_s / len(verdicts) * 1000:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--time-scale", type=float, default=5.0)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    results = [run(on, args.streams, args.concurrency, args.time_scale) for on in (False, True)]
    rows = [row(f"resume {mode}", result, args.time_scale)
            for mode, result in zip(("off", "on"), results, strict=True)]
    section = [
        f"{args.streams} chat streams (max_tokens {MAX_TOKENS}, {args.concurrency} at a time) "
        "through a pool of two spark-cortex replicas (queue placement, "
        f"{args.concurrency} slots each), the first replica's "
        f"gateway SIGKILLed once a third of the streams had started; simulators at time-scale "
        f"{args.time_scale:g}; {platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, `bench/resume_bench.py`, one run.",
        "",
        "| mode | streams | completed whole | resumed | tokens lost | tokens duplicated | "
        "added stall p50 / max (ms wall) | (ms, simulated time) | pool gateway CPU ms per stream |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    print("\n".join(section))
    for mode, result in zip(("off", "on"), results, strict=True):
        for failure in sorted({v.failure for v in result.verdicts if v.failure}):
            print(f"resume {mode}: not whole: {failure}", file=sys.stderr)
    if args.write_docs:
        docs_section.write_section("resume-bench", "\n".join(section))


if __name__ == "__main__":
    main()
