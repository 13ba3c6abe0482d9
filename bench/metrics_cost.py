"""What a change costs the gateway: three gateways, interleaved, one run.

The gateway of a tree before the change (--base REVISION, a git revision of this checkout whose
gateway is taken with git archive; or --base-dir, a gateway/ directory; --base-name labels it,
"before metrics" by default: the run that measured /metrics and the access log), this
checkout's gateway with the access log off (metrics are always on), and the same with
GATEWAY_ACCESS_LOG on (a file in the run's temporary directory), all in front of gateway_bench's
backend and pinned to the same core.
Each phase measures the three in interleaved rounds, so drifting load on a shared host hits them
alike: added p50 latency at c=1, CPU per request at c=1, c=64 and c=256, CPU per SSE chunk.

    python3 bench/metrics_cost.py --base a4d558d | --base-dir /tmp/base/gateway [--base-name NAME]
        [--rounds 7] [--docs [--section NAME]]

--docs writes the table between the markers of --section (metrics-cost) in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import sys
import tempfile
from pathlib import Path

import docs_section
import gateway_bench as bench

FIGURES = (
    ("added p50 latency, c=1 (ms)", "c1", "p50"),
    ("CPU per request, c=1 (us)", "c1", "cpu_per_req_us"),
    ("CPU per request, c=64 (us)", "c64", "cpu_per_req_us"),
    ("CPU per request, c=256 (us)", "c256", "cpu_per_req_us"),
    ("CPU per SSE chunk (us)", "sse", "cpu_per_event_us"),
)
THIS_TREE = ("access log off", "access log on")


async def measure(cfg: bench.Settings, base_dir: Path, workdir: Path,
                  names: tuple[str, ...]) -> dict:
    """Every phase against direct and the three gateways: results[phase][target]."""
    os.sched_setaffinity(0, {bench.CLIENT_CORE})
    backend = bench.start_backend(workdir)
    backend_port = backend.port
    here = bench.REPO / "gateway"
    logged = {"GATEWAY_ACCESS_LOG": str(workdir / "access.log")}
    services = [backend]
    try:
        targets = [bench.Target("direct", backend_port, None)]
        for name, gateway_dir, env in zip(
            names, (base_dir, here, here), ({}, {}, logged), strict=True
        ):
            service = bench.start_gateway(backend_port, gateway_dir, workdir, extra_env=env)
            services.append(service)
            targets.append(bench.Target(name, service.port, service))
        pids = [os.getpid(), *(service.pid for service in services)]
        json_post = bench.post(bench.chat_body())
        sse_post = bench.sse_request(cfg)
        return {
            "c1": await bench.phase(targets, json_post, 1, cfg, pids, print),
            "c64": await bench.phase(targets, json_post, 64, cfg, pids, print),
            "c256": await bench.phase(targets, json_post, 256, cfg, pids, print),
            "sse": await bench.phase(targets, sse_post, cfg.sse_concurrency, cfg, pids, print),
        }
    finally:
        for service in reversed(services):
            service.stop()


def table(results: dict, rounds: int, window_s: float, names: tuple[str, ...],
          base: str) -> str:
    """The run's figures; `base` is the argument that named the base tree."""
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Measured {when}, {os.cpu_count()} cores, host load average "
        f"{bench.load_average()} after; medians of {rounds} interleaved rounds of "
        f"{window_s:g} s windows (command: `python3 bench/metrics_cost.py {base} --base-name "
        f"'{names[0]}' --rounds {rounds} --window {window_s:g}`).",
        "",
        f"| figure | {' | '.join(names)} | off / before | on / before |",
        "|---|---|---|---|---|---|",
    ]
    for label, phase, key in FIGURES:
        values = [results[phase][name][key] for name in names]
        if key == "p50":
            values = [value - results[phase]["direct"]["p50"] for value in values]
        cells = [f"{value:.3f}" if key == "p50" else f"{value:.0f}" for value in values]
        ratios = [f"{value / values[0]:.2f}x" for value in values[1:]]
        lines.append(f"| {label} | {' | '.join(cells)} | {' | '.join(ratios)} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    base = parser.add_mutually_exclusive_group(required=True)
    base.add_argument("--base", metavar="REVISION",
                      help="a git revision of this checkout: its gateway is the base")
    base.add_argument("--base-dir", type=Path, help="the gateway/ directory of the base tree")
    parser.add_argument("--base-name", default="before metrics", help="the base tree's label")
    parser.add_argument("--section", default="metrics-cost",
                        help="the docs/benchmarks.md section --docs writes")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--window", type=float, default=2.0)
    parser.add_argument("--docs", action="store_true", help="write docs/benchmarks.md")
    args = parser.parse_args(argv)
    cfg = bench.Settings(
        rounds=args.rounds,
        window_s=args.window,
        streams=0,
        python=sys.executable,  # both trees' gateways run under this script's interpreter
        targets=("direct", "gateway"),
        nice=0,
        write_docs=args.docs,
    )
    with tempfile.TemporaryDirectory(prefix="metrics-cost-") as tmp:
        names = (args.base_name, *THIS_TREE)
        base_dir = args.base_dir or bench.gateway_of_revision(args.base, Path(tmp) / "base")
        results = asyncio.run(measure(cfg, base_dir, Path(tmp), names))
    base = f"--base {args.base}" if args.base else f"--base-dir {args.base_dir}"
    text = table(results, args.rounds, args.window, names, base)
    print(text)
    if args.docs:
        docs_section.write_section(args.section, text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
