"""Where the gateway spends its time: run it under cProfile with the benchmark's load.

    python3 bench/profile_gateway.py                 # non-streaming, c=64, 5 s
    python3 bench/profile_gateway.py --sse --top 40  # SSE chunks, c=16
    python3 bench/profile_gateway.py --concurrency 256 --access-log

Profiling slows the gateway several-fold, so read the shares, not the absolute times. The
profiler's clock is the gateway's own CPU time, so other work on a shared host does not land
in whatever function was running when the gateway was preempted. Same layout as
gateway_bench.py: the gateway pinned to core 1, client and backend to core 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import gateway_bench
import loadgen
import procs

# Runs lobes_gateway as __main__ under cProfile on process CPU time; stats go to argv[1].
PROFILED_GATEWAY = """
import cProfile, runpy, sys, time
profiler = cProfile.Profile(time.process_time)
profiler.enable()
try:
    runpy.run_module("lobes_gateway", run_name="__main__")
finally:
    profiler.disable()
    profiler.dump_stats(sys.argv[1])
"""


async def profile(args: argparse.Namespace, workdir: Path) -> Path:
    """Drive a cProfile'd gateway for args.seconds; returns the stats file."""
    procs.raise_fd_limit()
    os.sched_setaffinity(0, {gateway_bench.CLIENT_CORE})
    backend = gateway_bench.start_backend(workdir)
    backend_port = backend.port
    stats_path = workdir / "gateway.prof"
    gateway = gateway_bench.start_gateway(
        backend_port,
        args.gateway_dir.resolve(),
        workdir,
        argv=[sys.executable, "-c", PROFILED_GATEWAY, str(stats_path)],
        extra_env={"GATEWAY_ACCESS_LOG": str(workdir / "access.log")} if args.access_log else None,
    )
    try:
        if args.sse:
            body = gateway_bench.chat_body(stream=True, bench_chunks=50, bench_interval_ms=4)
        else:
            body = gateway_bench.chat_body()
        result = await loadgen.closed_loop(
            "127.0.0.1", gateway.port, gateway_bench.post(body), args.concurrency, args.seconds
        )
        print(
            f"{result.requests} requests, {result.events} SSE events, {result.errors} errors",
            file=sys.stderr,
        )
    finally:
        gateway.proc.send_signal(signal.SIGTERM)  # a clean exit writes the profile
        gateway.proc.wait(timeout=15)
        backend.stop()
    return stats_path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sse", action="store_true", help="streamed chunks instead of JSON")
    parser.add_argument("--concurrency", type=int, help="default 64 (JSON) or 16 (SSE)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--top", type=int, default=30, help="functions to list")
    parser.add_argument("--sort", default="tottime", help="pstats sort key (default tottime)")
    parser.add_argument("--gateway-dir", type=Path, default=gateway_bench.REPO / "gateway")
    parser.add_argument("--save", type=Path, help="also keep the raw pstats file here")
    parser.add_argument("--access-log", action="store_true", help="with the access log on (a file)")
    args = parser.parse_args(argv)
    args.concurrency = args.concurrency or (16 if args.sse else 64)
    with tempfile.TemporaryDirectory(prefix="gateway-profile-") as tmp:
        stats_path = asyncio.run(profile(args, Path(tmp)))
        pstats.Stats(str(stats_path)).sort_stats(args.sort).print_stats(args.top)
        if args.save:
            shutil.copyfile(stats_path, args.save)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
