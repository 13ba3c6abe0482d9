"""Other callers while one caller sends a 30 MB body: their latency through the gateway.

A large body is read as any other, then parsed: a body over 1 MiB on a worker thread, and sent
on as the caller's bytes with only the changed members written anew (never encoded again). This
bench measures what that leaves for everyone else: small chat requests at c=1, their latency
with nothing else running, then while another connection sends 30 MB bodies back to back (a
30 MB prompt string, a body of 250,000 small messages, each asked by an alias so its model is
rewritten), all in one run. Gateway and backend are pinned as bench/gateway_bench.py pins them.

Run: python3 bench/big_body_bench.py [--window 5] [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import docs_section
import gateway_bench as bench
import loadgen
import procs

BIG_BYTES = 30 * 1024 * 1024
SHAPES = {
    "one 30 MB prompt string": lambda: {"messages": [{"role": "user", "content": "x" * BIG_BYTES}]},
    "250,000 small messages": lambda: {
        "messages": [{"role": "user", "content": "m" * 80}] * 250_000},
}


def big_request(shape: str) -> bytes:
    payload = {"model": "main", "max_tokens": 4, **SHAPES[shape]()}
    return bench.post(json.dumps(payload).encode())


async def _send_back_to_back(port: int, request: bytes, until: float, done: list[float]) -> None:
    """Send `request` on one connection again and again until `until`; each one's seconds."""
    while time.monotonic() < until:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.monotonic()
        writer.write(request)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        await reader.readexactly(length)
        done.append(time.monotonic() - started)
        assert head.startswith(b"HTTP/1.1 200 "), head[:80]
        writer.close()


def percentile_ms(samples_ns: list[int], pct: float) -> float:
    return bench.percentile_ms(samples_ns, pct)


async def measure(window_s: float, workdir: Path) -> list[dict]:
    os.sched_setaffinity(0, {bench.CLIENT_CORE})
    backend = bench.start_backend(workdir)
    gateway = bench.start_gateway(backend.port, bench.REPO / "gateway", workdir,
                                  extra_env={"GATEWAY_ALIASES": f"main={bench.SERVED_NAME}"})
    small = bench.post(bench.chat_body())
    rows = []
    try:
        quiet = await loadgen.closed_loop("127.0.0.1", gateway.port, small, 1, window_s)
        rows.append(_row("nothing else", quiet, []))
        for shape in SHAPES:
            request = big_request(shape)
            big_done: list[float] = []
            sender = asyncio.create_task(_send_back_to_back(
                gateway.port, request, time.monotonic() + window_s, big_done))
            busy = await loadgen.closed_loop("127.0.0.1", gateway.port, small, 1, window_s)
            await sender
            rows.append(_row(shape, busy, big_done))
            print(rows[-1], flush=True)
    finally:
        gateway.stop()
        backend.stop()
    return rows


def _row(beside: str, result: loadgen.LoadResult, big_done: list[float]) -> dict:
    return {"beside": beside, "requests": result.requests, "errors": result.errors,
            "p50_ms": percentile_ms(result.latencies_ns, 50),
            "p99_ms": percentile_ms(result.latencies_ns, 99),
            "max_ms": max(result.latencies_ns, default=0) / 1e6,
            "big_bodies": len(big_done),
            "big_s": sum(big_done) / len(big_done) if big_done else float("nan")}


def table(rows: list[dict], window_s: float) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    quiet = rows[0]
    lines = [f"Measured {when}, {os.cpu_count()} cores, load average {bench.load_average()} "
             f"after; {window_s:g} s windows (command: `python3 bench/big_body_bench.py "
             f"--window {window_s:g}`).", "",
             "| small requests at c=1, beside | requests | p50 ms | p99 ms | max ms | "
             "p99 / quiet p99 | 30 MB bodies answered | seconds each |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        big = (f"{row['big_bodies']} | {row['big_s']:.2f}" if row["big_bodies"] else "- | -")
        lines.append(f"| {row['beside']} | {row['requests']} | {row['p50_ms']:.3f} | "
                     f"{row['p99_ms']:.3f} | {row['max_ms']:.1f} | "
                     f"{row['p99_ms'] / quiet['p99_ms']:.2f}x | {big} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    procs.raise_fd_limit()
    with tempfile.TemporaryDirectory(prefix="lobes-big-body-") as workdir:
        rows = asyncio.run(measure(args.window, Path(workdir)))
    text = table(rows, args.window)
    print(text)
    if args.write_docs:
        docs_section.write_section("big-body", text, "## Other callers beside a 30 MB body")


if __name__ == "__main__":
    sys.exit(main())
