"""The same gateway and bare relay under two Python interpreters, against nginx, in one run.

A Python proxy's CPU a request depends on the interpreter's build as much as on its code: a
shared libpython built without optimizations (pyenv's default, many development machines) runs
the same bytecode slower than a distribution's python3 (libpython linked into the executable,
optimized). gateway_bench.py measures the interpreter a box runs; this script shows how far
the figure moves with the build: every target interleaved in each round, as gateway_bench does.

    python3 bench/interpreters_bench.py                      # the distro's python3 vs this one
    python3 bench/interpreters_bench.py --other /opt/py/bin/python3 --write-docs
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

import docs_section
import gateway_bench as bench
import procs

CONCURRENCIES = (64, 256)


def start_targets(backend_port: int, pythons: dict[str, str], workdir: Path, nofile: int,
                  targets: list[bench.Target]) -> None:
    """nginx, then the bare relay and the gateway under each interpreter, each added to
    `targets` once started (so a failed start leaves the others to be stopped)."""
    nginx = procs.start_nginx(backend_port, bench.PROXY_CORE, workdir, nofile)
    targets.append(bench.Target("nginx", nginx.port, nginx))
    for label, python in pythons.items():
        relay = bench.start_relay(backend_port, workdir, python)
        targets.append(bench.Target(f"relay, {label}", relay.port, relay))
        gateway = bench.start_gateway(backend_port, bench.REPO / "gateway", workdir,
                                      name=f"gateway-{label}", python=python)
        targets.append(bench.Target(f"gateway, {label}", gateway.port, gateway))


async def measure(pythons: dict[str, str], cfg: bench.Settings) -> dict[int, dict]:
    """results[concurrency][target] -> gateway_bench's figures (medians of the rounds)."""
    nofile = procs.raise_fd_limit()
    os.sched_setaffinity(0, {bench.CLIENT_CORE})
    bench.renice(cfg.nice, print)
    with tempfile.TemporaryDirectory(prefix="interpreters-") as tmp:
        backend = bench.start_backend(Path(tmp))
        targets: list[bench.Target] = []
        try:
            start_targets(backend.port, pythons, Path(tmp), nofile, targets)
            request = bench.post(bench.chat_body())
            return {c: await bench.interleaved(targets, request, c, cfg) for c in CONCURRENCIES}
        finally:
            for target in reversed(targets):
                assert target.service is not None
                target.service.stop()
            backend.stop()


def table(results: dict[int, dict], pythons: dict[str, str], cfg: bench.Settings) -> str:
    described = "; ".join(f"{label}: {procs.describe_interpreter(python)}"
                          for label, python in pythons.items())
    lines = [f"`python3 bench/interpreters_bench.py`, one run: {cfg.rounds} interleaved rounds of "
             f"{cfg.window_s:g} s windows per concurrency, pinned, reniced and in a session "
             "of its own as gateway_bench.py. "
             f"Interpreters: {described}. Proxy CPU a request (user + system), its ratio to "
             "nginx's in the same run, and the kernel's part (stime).", "",
             "| target | " + " | ".join(f"c={c}" for c in CONCURRENCIES) + " |",
             "|---|" + "---|" * len(CONCURRENCIES)]
    for name in results[CONCURRENCIES[0]]:
        cells = []
        for concurrency in CONCURRENCIES:
            figures = results[concurrency][name]
            ratio = figures["cpu_per_req_us"] / results[concurrency]["nginx"]["cpu_per_req_us"]
            cells.append(f"{figures['cpu_per_req_us']:.0f} us ({ratio:.2f}x; stime "
                         f"{figures['system_per_req_us']:.0f} us)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    errors = sum(figures["errors"] for by_target in results.values()
                 for figures in by_target.values())
    lines += ["", f"Non-200 or broken responses: {errors}."]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--distro", default=procs.distro_python(),
                        help="the distribution's python3 (default: procs.distro_python())")
    parser.add_argument("--other", default=sys.executable,
                        help="the interpreter to compare with (default: this script's)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--window", type=float, default=3.0)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    if args.distro is None:
        parser.error("no distribution python3 found: name one with --distro")
    if os.environ.get(bench.OWN_SESSION_ENV) != "1":
        # As gateway_bench: niceness reaches the whole host only from a session of its own.
        return bench.rerun_in_own_session(argv, __file__)
    pythons = {"distro": args.distro, "other": args.other}
    cfg = bench.Settings(rounds=args.rounds, window_s=args.window, streams=0,
                         python=args.distro, targets=(), sse_concurrency=0, sse_chunks=0,
                         realtime=False, write_docs=args.write_docs)
    text = table(asyncio.run(measure(pythons, cfg)), pythons, cfg)
    print(text)
    if args.write_docs:
        docs_section.write_section("interpreters-bench", text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
