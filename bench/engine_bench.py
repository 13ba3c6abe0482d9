"""The gateway in front of the real engine: vLLM's CPU build serving the tiny chat model (the
command line the collection renders for a CPU gear), streamed to directly and through a
gateway, in one run, alternating round by round.

Prints a markdown table (time to first token p50 and aggregate tokens/s at 1, 4 and 16
concurrent streams, direct against the gateway) with the engine's and the gateway's memory,
and writes it between the engine-bench markers of docs/benchmarks.md. A benchmark, not a test:
it asserts nothing, it reports.

    python3 bench/engine_bench.py            # about 3 minutes (the engine starts in ~40 s)
    python3 bench/engine_bench.py --quick    # one round each, shorter streams

On a 2-core machine the engine's worker is bound to one core and its engine core busy-polls
the other, which the gateway and this client share: the engine's API server then sends a
stream in bursts, and a client's timings are mostly the engine's scheduling. So the run also
traces the gateway itself (strace, one round of 16 streams): for each SSE event, the time from
the gateway's read of it from the engine to its write of it to the client, which is what the
gateway adds to each token, whatever the client sees.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / ".collections")]

import docs_section  # noqa: E402

from tests.conformance.servers import CHAT_NAME, gateway_env, sim_embed, vllm_chat  # noqa: E402
from tests.support.client import call  # noqa: E402
from tests.support.gateway_proc import start_gateway  # noqa: E402
from tests.support.vllm_proc import engine_install  # noqa: E402

CONCURRENCY = (1, 4, 16)
TARGETS = ("direct", "gateway")
# The engine core keeps polling its worker for a second after each step: a pause longer than
# that before every round starts each from the same idle engine, whichever path ran before.
SETTLE_S = 1.5


@dataclass
class Round:
    """One round of `concurrency` streams: each stream's time to first token, all tokens."""

    ttfts: list[float] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0
    failures: int = 0

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def one_stream(url: str, body: dict, out: Round, lock: threading.Lock) -> None:
    """Stream one answer; record when its first token came and how many tokens it had."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    started = time.perf_counter()
    first, tokens = None, 0
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        for line in response:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            event = json.loads(line[6:])
            if first is None and any((c.get("delta") or {}).get("content")
                                     for c in event.get("choices") or ()):
                first = time.perf_counter() - started
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    finally:
        conn.close()
    with lock:
        if first is None or not tokens:
            out.failures += 1
        else:
            out.ttfts.append(first)
            out.tokens += tokens


def run_round(url: str, concurrency: int, max_tokens: int, seed: int) -> Round:
    out, lock = Round(), threading.Lock()
    bodies = [{"model": CHAT_NAME, "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
               "temperature": 1.0, "seed": seed + n,
               "stream_options": {"include_usage": True},
               "messages": [{"role": "user", "content": f"stream {seed + n}"}]}
              for n in range(concurrency)]
    threads = [threading.Thread(target=one_stream, args=(url, body, out, lock))
               for body in bodies]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.seconds = time.perf_counter() - started
    return out


def measure(urls: dict[str, str], rounds: int, max_tokens: int) -> dict:
    """(target, concurrency) -> the rounds' merged TTFTs and their tokens/s, rounds of the two
    targets alternating so that a slow patch of the machine falls on both."""
    results: dict = {(t, c): {"ttfts": [], "rates": [], "failures": 0}
                     for t in TARGETS for c in CONCURRENCY}
    for concurrency in CONCURRENCY:
        run_round(urls["direct"], concurrency, 16, seed=0)  # warm the batch shape
        for number in range(rounds):
            for target in (TARGETS if number % 2 == 0 else TARGETS[::-1]):
                time.sleep(SETTLE_S)
                done = run_round(urls[target], concurrency, max_tokens, seed=1000 * number)
                entry = results[(target, concurrency)]
                entry["ttfts"].extend(done.ttfts)
                entry["rates"].append(done.rate)
                entry["failures"] += done.failures
    return results


def table(results: dict, memory: dict, run: dict, delays: list[float]) -> str:
    lines = [
        f"Run {run['when']} on {run['host']} ({run['cores']} cores), vLLM {run['engine']} CPU "
        f"build, the tiny chat model, {run['rounds']} rounds of {run['max_tokens']}-token "
        f"streams per cell (ignore_eos, sampled), rounds of the two paths alternating, each "
        f"after {SETTLE_S:g} s idle.",
        "",
        "| streams | TTFT p50 direct | TTFT p50 gateway | added | tok/s direct | tok/s gateway "
        "| gateway/direct |",
        "|---|---|---|---|---|---|---|",
    ]
    for concurrency in CONCURRENCY:
        direct, gateway = results[("direct", concurrency)], results[("gateway", concurrency)]
        t_direct = statistics.median(direct["ttfts"]) * 1000
        t_gateway = statistics.median(gateway["ttfts"]) * 1000
        r_direct = statistics.median(direct["rates"])
        r_gateway = statistics.median(gateway["rates"])
        lines.append(f"| {concurrency} | {t_direct:.1f} ms | {t_gateway:.1f} ms | "
                     f"{t_gateway - t_direct:+.1f} ms | {r_direct:.0f} | {r_gateway:.0f} | "
                     f"{r_gateway / r_direct:.3f} |")
    if delays:
        ordered = sorted(delays)
        p50, p99 = ordered[len(ordered) // 2], ordered[int(len(ordered) * 0.99)]
        lines += ["", f"The gateway's own delay per SSE event (strace on the gateway, one round of "
                  f"16 streams of 128 tokens, {len(delays)} events matched, strace's own cost "
                  f"included): p50 "
                  f"{p50 * 1e6:.0f} us, p99 {p99 * 1e6:.0f} us, max {ordered[-1] * 1e3:.1f} ms."]
    failures = sum(entry["failures"] for entry in results.values())
    lines += ["", f"Streams that failed: {failures}. Memory while serving (proportional set "
              f"size, shared pages counted once): engine {memory['engine']:.2f} GiB "
              f"({memory['processes']} processes, a 1 GiB KV cache), gateway "
              f"{memory['gateway']:.0f} MiB."]
    return "\n".join(lines)


def pss_kib(pid: int) -> int:
    """A process's proportional set size: shared pages (the engine's shared memory, its
    libraries) divided among the processes that map them, so a sum counts each page once."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


# One line of strace -tt output: the time, the call, its arguments, its result.
_SYSCALL = re.compile(r"^(?:\d+ +)?(\d+):(\d+):([\d.]+) (\w+)\((.*)\) = (-?\d+)")
# A quoted string of strace's, escapes included.
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def relay_delays(trace: str) -> list[float]:
    """Seconds from the gateway's read of each SSE event from the engine to its write of the
    same event to the client, matched by the event's text (its id and token make it unique)."""
    reads: dict[str, float] = {}
    delays = []
    for line in trace.splitlines():
        match = _SYSCALL.match(line)
        if not match or int(match[6]) <= 0:
            continue
        when = int(match[1]) * 3600 + int(match[2]) * 60 + float(match[3])
        data = "".join(_QUOTED.findall(match[5]))
        # An event's whole text (strace writes its newline as backslash-n): unique per event.
        for event in re.findall(r"data: (\{.*?)\\n", data):
            if match[4] in ("read", "recvfrom", "recvmsg"):
                reads.setdefault(event, when)
            elif event in reads:
                delays.append(when - reads.pop(event))
    return delays


def traced_round(gateway_pid: int, url: str, out: Path) -> list[float]:
    """One round of 16 streams through the gateway with strace attached to it."""
    strace = subprocess.Popen(
        ["strace", "-f", "-tt", "-s", "65536", "-o", str(out), "-p", str(gateway_pid),
         "-e", "trace=read,recvfrom,recvmsg,write,sendto,sendmsg,writev"],
        stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached
    try:
        run_round(url, 16, 128, seed=7000)
    finally:
        strace.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            strace.wait(timeout=10)
    return relay_delays(out.read_text(errors="replace"))


def cpu_model() -> str:
    """The processor's name from /proc/cpuinfo (the machine's kind, for the record)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one round, 64-token streams")
    parser.add_argument("--no-docs", action="store_true", help="print only")
    args = parser.parse_args()
    rounds, max_tokens = (1, 64) if args.quick else (6, 256)
    install = engine_install()
    engine = vllm_chat(install, max_active=max(CONCURRENCY))
    embed = sim_embed()
    gateway = start_gateway(gateway_env(engine.url, embed.url))
    try:
        results = measure({"direct": engine.url, "gateway": gateway.url}, rounds, max_tokens)
        delays = (traced_round(gateway.pid, gateway.url, Path(f"/tmp/engine-bench-{os.getpid()}"
                                                              ".strace"))
                  if shutil.which("strace") else [])
        memory = {"engine": sum(pss_kib(pid) for pid in engine.pids()) / 2**20,
                  "processes": len(engine.pids()), "gateway": pss_kib(gateway.pid) / 2**10}
        version = call(engine.url, "GET", "/version").json()["version"]
    finally:
        gateway.stop()
        embed.stop()
        engine.stop()
    run = {"when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "host": cpu_model(), "cores": os.cpu_count(), "engine": version, "rounds": rounds,
           "max_tokens": max_tokens}
    text = table(results, memory, run, delays)
    print(text)
    if not args.no_docs and not args.quick:
        docs_section.write_section("engine-bench", text,
                                   "## The gateway in front of the real engine")


if __name__ == "__main__":
    main()
