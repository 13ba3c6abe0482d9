"""Gateway benchmark: direct-to-backend vs nginx vs a bare asyncio relay vs lobes_gateway
(access log off and on), one run.

Prints a markdown table (requests/s and added p50/p99 latency at c=1/64/256, CPU per request
and per SSE chunk as a ratio to nginx, time-to-first-chunk overhead, RSS per stream with 4,000
SSE streams held open, then 10,000 streams held through a fresh nginx and gateway each) plus
PASS/MISS per target, and writes it between the gateway-bench markers of docs/benchmarks.md.
The targets are ratios to nginx in the same run: CPU per request at c=64 and c=256 <= 2x,
CPU per SSE chunk <= 1.75x, added p50 at c=1 <= 1.2x nginx's added p50, 4,000 held streams
with 0 failed at <= 8 KiB RSS each, and at 10,000 held streams no more failed than nginx
(bench/report.py holds the numbers). bench/bare_relay.py, the cheapest relay stdlib asyncio
allows, is measured alongside: the gateway's CPU as a ratio to it is the cost of the gateway's
own work, and the relay's ratio to nginx is what the host does to any Python proxy. A
benchmark, not a test: it asserts nothing, it reports.

    python3 bench/gateway_bench.py             # the full run (about 10 minutes)
    python3 bench/gateway_bench.py --quick     # a smoke run with short windows, 500 streams
                                               # (1,000 in the many-streams phase)
    python3 bench/gateway_bench.py --big-streams 0   # without the 10,000-stream phase
    python3 bench/gateway_bench.py --before 36f76ce  # and that revision's gateway beside this
                                               # one, in the same rounds (an A/B in one run)

Each proxy is pinned to core 1; the load generator (this process) and the backend share core 0.
That one client process holds every stream: connect failures from its own limits are counted
as the client's, and its event loop's worst lateness is reported with the held streams.
The Python proxies (gateway, bare relay) run under --python, by default the distribution's
python3: the interpreter a box runs the gateway with, not whatever build runs this script.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import docs_section
import loadgen
import procs
import report

REPO = Path(__file__).resolve().parent.parent
CLIENT_CORE, PROXY_CORE = 0, 1
SERVED_NAME = "bench-model"
API_KEY = "bench-key"
CONCURRENCIES = (1, 64, 256)
# "relay" is bench/bare_relay.py; "logged" is the gateway with its JSON access log on (a file).
TARGETS = ("direct", "nginx", "relay", "gateway", "logged")
# The gateway of another revision (--before), run beside this one when asked.
BEFORE = "before"
OWN_SESSION_ENV = "LOBES_BENCH_OWN_SESSION"
# A proxied stream holds two sockets in the proxy (the client's and the upstream one); the
# headroom covers listeners, logs and the timed phases' connections.
SOCKETS_PER_STREAM = 2
FD_HEADROOM = 1024


@dataclass(frozen=True)
class Settings:
    """How long and how hard each phase runs; the defaults are the gateway bench's own."""

    rounds: int
    window_s: float
    streams: int
    python: str  # the interpreter of the Python proxies (gateway, bare relay)
    targets: tuple[str, ...]
    big_streams: int = 0  # streams held through each fresh proxy at the end; 0 skips it
    stream_interval_ms: int = 1000
    sse_concurrency: int = 16
    sse_chunks: int = 50
    sse_interval_ms: int = 4
    gateway_dir: Path = REPO / "gateway"
    nice: int = -10
    realtime: bool = True
    write_docs: bool = False
    before: str | None = None  # a git revision whose gateway runs beside this one


@dataclass
class Target:
    """One endpoint the client drives; `service` is the proxy whose CPU and RSS are read."""

    name: str
    port: int
    service: procs.Service | None


def chat_body(**extra: object) -> bytes:
    body = {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": "Say something short."}],
        "max_tokens": 16,
        **extra,
    }
    return json.dumps(body).encode()


def post(body: bytes) -> bytes:
    return loadgen.encode_post("/v1/chat/completions", body, "127.0.0.1", API_KEY)


def sse_request(cfg: Settings) -> bytes:
    """The SSE phase's request: its chunks on the backend's step clock, as vLLM sends every
    running stream's token at one decode step (streams at random phases moved a round's CPU
    per chunk by how many chunks happened to share a wake-up)."""
    return post(chat_body(stream=True, bench_chunks=cfg.sse_chunks,
                          bench_interval_ms=cfg.sse_interval_ms, bench_step_aligned=True))


def percentile_ms(samples_ns: list[int], pct: float) -> float:
    if not samples_ns:
        return float("nan")
    ordered = sorted(samples_ns)
    index = min(len(ordered) - 1, int(len(ordered) * pct / 100))
    return ordered[index] / 1e6


def gateway_env(backend_url: str, port: int) -> dict[str, str]:
    """The benchmarked gateway's settings: one backend, auth on, the in-flight cap above the
    stream count."""
    return {
        "GATEWAY_HOST": "127.0.0.1",
        "GATEWAY_PORT": str(port),
        "PRIMARY_BASE_URL": backend_url,
        "PRIMARY_SERVED_NAME": SERVED_NAME,
        "GATEWAY_DEFAULT_MODEL": SERVED_NAME,
        "GATEWAY_API_KEY": API_KEY,
        "GATEWAY_MAX_INFLIGHT_PER_KEY": "100000",
    }


def start_gateway(
    backend_port: int,
    gateway_dir: Path,
    workdir: Path,
    argv: list[str] | None = None,
    extra_env: dict[str, str] | None = None,
    name: str = "gateway",
    python: str = sys.executable,
) -> procs.Service:
    """The gateway with auth on and the in-flight cap above the stream count, run by `python`.

    `argv` replaces `python -m lobes_gateway` (profile_gateway.py runs it under cProfile);
    `extra_env` adds variables (metrics_cost.py turns the access log on).
    """
    port = procs.free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(gateway_dir),
        **gateway_env(f"http://127.0.0.1:{backend_port}", port),
        **(extra_env or {}),
    }
    command = argv or [python, "-m", "lobes_gateway"]
    return procs.spawn(name, command, port, PROXY_CORE, workdir, env)


async def measure_window(target: Target, request: bytes, concurrency: int, window_s: float):
    """One warmed, measured closed-loop window: throughput, latency and proxy CPU.

    CPU is the scheduler's own count of the proxy's time on a CPU (nanoseconds), not utime +
    stime: those are whole clock ticks (10 ms), and nginx's CPU in a round of the SSE phase is
    about 16 of them, so rounding alone moved a round's figure by up to 12%. The kernel's part
    is stime's share of the ticks, applied to that count.
    """
    await loadgen.closed_loop("127.0.0.1", target.port, request, concurrency, min(0.3, window_s))
    pid = target.service.pid if target.service else None
    ticks_before = procs.cpu_times(pid) if pid else (0.0, 0.0)
    sched_before = procs.sched_ns(pid) if pid else (0, 0)
    result = await loadgen.closed_loop("127.0.0.1", target.port, request, concurrency, window_s)
    cpu = system = wait_share = None
    if pid:
        user, system_ticks = (
            after - before for after, before in zip(procs.cpu_times(pid), ticks_before, strict=True)
        )
        ran, waited = (
            after - before for after, before in zip(procs.sched_ns(pid), sched_before, strict=True)
        )
        cpu = ran / 1e9
        system = cpu * system_ticks / (user + system_ticks) if user + system_ticks else 0.0
        wait_share = waited / (ran + waited) if ran + waited else None
    return {
        "wait_share": wait_share,
        "rps": result.requests / result.elapsed_s,
        "p50": percentile_ms(result.latencies_ns, 50),
        "p99": percentile_ms(result.latencies_ns, 99),
        "ttfc_p50": percentile_ms(result.first_event_ns, 50),
        "cpu_per_req_us": cpu / result.requests * 1e6 if cpu is not None else None,
        "system_per_req_us": system / result.requests * 1e6 if system is not None else None,
        "cpu_per_event_us": cpu / result.events * 1e6
        if cpu is not None and result.events
        else None,
        "errors": result.errors,
        "requests": result.requests,
    }


def median_of(rounds: list[dict]) -> dict:
    """Per-metric median over interleaved rounds; error counts are summed."""
    merged = {}
    for key in rounds[0]:
        values = [r[key] for r in rounds if r[key] is not None]
        if key in ("errors", "requests"):
            merged[key] = sum(values)
        else:
            merged[key] = statistics.median(values) if values else None
    return merged


async def interleaved(targets: list[Target], request: bytes, concurrency: int, cfg: Settings):
    """Rounds of every target in turn, so load drifts on the host hit all alike. Each round
    starts one target later, so no target always runs first after a pause (or right after
    another one's load): with as many rounds as targets each runs once in every position."""
    per_target: dict[str, list[dict]] = {t.name: [] for t in targets}
    for round_index in range(cfg.rounds):
        shift = round_index % len(targets)
        for target in targets[shift:] + targets[:shift]:
            per_target[target.name].append(
                await measure_window(target, request, concurrency, cfg.window_s)
            )
    merged = {name: median_of(rounds) for name, rounds in per_target.items()}
    # Each round's CPU a request too: a ratio within one round pairs windows seconds apart,
    # so the spread of those ratios shows how much the host moved the figure in this run.
    for name, rounds in per_target.items():
        merged[name]["round_cpu_per_req_us"] = [r["cpu_per_req_us"] for r in rounds]
    return merged


async def phase(
    targets: list[Target], request: bytes, concurrency: int, cfg: Settings, pids: list[int], log
) -> dict:
    """One interleaved phase; at c=1 every process of the run is real-time while it lasts."""
    realtime = cfg.realtime and concurrency == 1
    if realtime:
        try:
            procs.set_realtime(pids, True)
        except PermissionError:
            log("cannot use SCHED_FIFO (not root): c=1 runs at normal priority")
            realtime = False
    try:
        return await interleaved(targets, request, concurrency, cfg)
    finally:
        if realtime:
            procs.set_realtime(pids, False)


async def http_get(port: int, path: str) -> bytes:
    """One GET on a fresh connection; returns the response body (Content-Length framed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    head = (await reader.readuntil(b"\r\n\r\n")).lower()
    length = int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
    body = await reader.readexactly(length)
    writer.close()
    return body


async def held_streams(target: Target, backend_port: int, cfg: Settings, count: int) -> dict:
    """Hold `count` SSE streams open at once; RSS per stream = (held - idle) / count."""
    interval_s = cfg.stream_interval_ms / 1000
    request = post(
        chat_body(stream=True, bench_chunks=1_000_000, bench_interval_ms=cfg.stream_interval_ms)
    )
    warm = post(chat_body(stream=True, bench_chunks=2))
    await loadgen.closed_loop("127.0.0.1", target.port, warm, 8, 0.3)
    idle_kib = procs.rss_kib(target.service.pid) if target.service else None

    async def sample_rss() -> int | None:
        return procs.rss_kib(target.service.pid) if target.service else None

    result = await loadgen.hold_streams(
        "127.0.0.1",
        target.port,
        request,
        count,
        interval_s,
        while_open=sample_rss,
        finish=lambda: http_get(backend_port, "/bench/finish"),
    )
    held_kib = result.sample
    return {
        "failed": result.failed,
        "client_failed": result.client_failed,
        "failures": dict(result.failures),
        "open_s": result.open_s,
        "client_lag_s": result.lag_s,
        "live_at_sample": result.live_at_sample,
        "kib_per_stream": (held_kib - idle_kib) / count if idle_kib is not None else None,
    }


async def big_streams_phase(cfg: Settings, starters: dict, backend_port: int, log) -> dict:
    """Hold cfg.big_streams streams through each fresh proxy in turn (nginx, the reference,
    first), each stopped once its streams ended."""
    held = {}
    for name in (t for t in report.BIG_STREAMS_TARGETS if t in cfg.targets):
        service = starters[name]()
        try:
            log(f"[{name}] holding {cfg.big_streams} streams, fresh")
            target = Target(name, service.port, service)
            held[name] = await held_streams(target, backend_port, cfg, cfg.big_streams)
        finally:
            service.stop()
    return held


def start_relay(backend_port: int, workdir: Path, python: str) -> procs.Service:
    """bench/bare_relay.py on the proxies' core, run by `python`: the floor of a stdlib
    asyncio proxy."""
    port = procs.free_port()
    argv = [
        python,
        str(REPO / "bench" / "bare_relay.py"),
        "--port",
        str(port),
        "--backend",
        f"http://127.0.0.1:{backend_port}",
    ]
    return procs.spawn("relay", argv, port, PROXY_CORE, workdir)


def start_backend(workdir: Path) -> procs.Service:
    """bench/fast_backend.py on the client's core: the backend every target fronts."""
    port = procs.free_port()
    argv = [sys.executable, str(REPO / "bench" / "fast_backend.py"), "--port", str(port)]
    return procs.spawn("backend", argv, port, CLIENT_CORE, workdir)


def open_files_needed(cfg: Settings) -> int:
    """The descriptors a proxy needs to hold the run's most streams at once."""
    return SOCKETS_PER_STREAM * max(cfg.streams, cfg.big_streams) + FD_HEADROOM


def raise_open_files(cfg: Settings, log) -> dict[str, int]:
    """Raise the open-file limit the proxies inherit to what the run needs, where allowed;
    says so when the limit stays below it."""
    needed = open_files_needed(cfg)
    limit = procs.raise_fd_limit(needed)
    if limit < needed:
        log(f"open-file limit {limit} (the hard limit; not allowed to raise it) is below the "
            f"{needed} a proxy needs: the most streams fail on the limit")
    return {"limit": limit, "needed": needed}


async def run(cfg: Settings, workdir: Path, log, nofile: int) -> dict:
    """Every phase against every target, the proxies allowed `nofile` open files; returns
    results[phase][target] -> metrics."""
    os.sched_setaffinity(0, {CLIENT_CORE})
    renice(cfg.nice, log)
    backend = start_backend(workdir)
    backend_port = backend.port
    services = [backend]
    results: dict[str, dict] = {"streams": {}}
    try:
        targets = [Target("direct", backend_port, None)]
        starters = {
            "nginx": lambda: procs.start_nginx(backend_port, PROXY_CORE, workdir, nofile),
            "relay": lambda: start_relay(backend_port, workdir, cfg.python),
            "gateway": lambda: start_gateway(
                backend_port, cfg.gateway_dir, workdir, python=cfg.python
            ),
            "logged": lambda: start_gateway(
                backend_port,
                cfg.gateway_dir,
                workdir,
                extra_env={"GATEWAY_ACCESS_LOG": str(workdir / "access.log")},
                name="logged",
                python=cfg.python,
            ),
        }
        if cfg.before:
            before_dir = gateway_of_revision(cfg.before, workdir / BEFORE)
            starters[BEFORE] = lambda: start_gateway(
                backend_port, before_dir, workdir, name=BEFORE, python=cfg.python
            )
        # Streams first: each proxy is fresh, so its idle RSS is the start-up footprint.
        for name in cfg.targets:
            if name != "direct":
                service = starters[name]()
                services.append(service)
                targets.append(Target(name, service.port, service))
            log(f"[{name}] holding {cfg.streams} streams")
            results["streams"][name] = await held_streams(
                targets[-1], backend_port, cfg, cfg.streams
            )
        pids = [os.getpid(), *(service.pid for service in services)]
        for concurrency in CONCURRENCIES:
            log(f"non-streaming c={concurrency}: {cfg.rounds} rounds x {cfg.window_s} s")
            results[f"c{concurrency}"] = await phase(
                targets, post(chat_body()), concurrency, cfg, pids, log
            )
        log(f"SSE chunks: c={cfg.sse_concurrency}, {cfg.sse_chunks} chunks/stream")
        results["sse"] = await phase(targets, sse_request(cfg), cfg.sse_concurrency, cfg, pids, log)
        log("time to first chunk, c=1")
        results["ttfc"] = await phase(
            targets, post(chat_body(stream=True, bench_chunks=2)), 1, cfg, pids, log
        )
        # Last, so the sockets it leaves closing cannot touch the figures above.
        if cfg.big_streams:
            results["big_streams"] = await big_streams_phase(cfg, starters, backend_port, log)
    finally:
        for service in reversed(services):
            service.stop()
    return results


def renice(nice: int, log) -> None:
    """Lower this process's niceness by `nice`, inherited by the backend and the proxies it
    starts; says so when it may not."""
    if not nice:
        return
    try:
        procs.raise_priority(nice)
    except OSError as error:
        log(f"cannot renice by {nice} ({error}): running at normal priority")


def load_average() -> str:
    """The host's 1-minute load average: other work on the machine skews wall-time figures."""
    return Path("/proc/loadavg").read_text().split()[0]


def gateway_revision(gateway_dir: Path) -> str:
    """The last commit of the gateway's package in `gateway_dir` (short hash and date), and
    whether the tree has changes since; empty outside a git checkout."""
    commit = subprocess.run(
        ["git", "-C", str(gateway_dir), "log", "-1", "--format=%h %cI", "--", "lobes_gateway"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(gateway_dir), "status", "--porcelain", "--", "lobes_gateway"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return commit + (" + uncommitted changes" if commit and dirty else "")


def gateway_of_revision(revision: str, into: Path) -> Path:
    """The gateway package of git `revision` of this checkout, written under `into`: the
    directory to put on PYTHONPATH (with the module_utils its links lead to)."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", revision, "gateway", "plugins/module_utils"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "gateway"


def revision_of(revision: str) -> str:
    """The last commit of the gateway's package at git `revision` (short hash and date)."""
    return subprocess.run(
        ["git", "-C", str(REPO), "log", "-1", "--format=%h %cI", revision, "--",
         "gateway/lobes_gateway"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def describe_run(cfg: Settings, argv: list[str]) -> dict:
    """Machine, date, versions and command line for the table's header."""
    cpu_model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "machine": f"{cpu_model}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, "
        f"Linux {platform.release()}",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python3 " + shlex.join(["bench/gateway_bench.py", *argv]),
        "python": platform.python_version(),
        "proxy_python": procs.describe_interpreter(cfg.python),
        "nginx": procs.nginx_version(procs.ensure_nginx()),
        "gateway": gateway_revision(cfg.gateway_dir) or str(cfg.gateway_dir),
        "before": revision_of(cfg.before) if cfg.before else None,
        "load_before": load_average(),
        "settings": cfg,
    }


def parse_args(argv: list[str]) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run (not for the docs)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per phase (default 5)")
    parser.add_argument("--window", type=float, help="seconds per measured window (default 3)")
    parser.add_argument("--streams", type=int, help="SSE streams held at once (default 4000)")
    parser.add_argument(
        "--big-streams",
        type=int,
        help="SSE streams held at once through a fresh nginx and gateway at the end (default "
        "10000, --quick 1000; 0 skips the phase)",
    )
    parser.add_argument(
        "--gateway-dir",
        type=Path,
        default=REPO / "gateway",
        help="directory holding lobes_gateway (default: this checkout's gateway/)",
    )
    parser.add_argument(
        "--python",
        default=procs.distro_python() or sys.executable,
        help="interpreter of the Python proxies (gateway, bare relay); default: the "
        "distribution's python3, as a box runs the gateway (else this script's)",
    )
    parser.add_argument(
        "--targets",
        default=",".join(TARGETS),
        help="comma list out of direct,nginx,relay,gateway,logged (default all; direct always "
        "runs)",
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=-10,
        help="niceness increment for the benchmark's processes (default -10: other load on a "
        "shared host disturbs them less; 0 to leave priority alone)",
    )
    parser.add_argument(
        "--no-realtime",
        action="store_true",
        help="run the c=1 phases at normal priority instead of SCHED_FIFO",
    )
    parser.add_argument(
        "--before",
        metavar="REVISION",
        help="also run the gateway of this git revision (its gateway/ from git archive) as "
        "target 'before', interleaved with the others: this gateway against that one in one "
        "run",
    )
    parser.add_argument("--no-docs", action="store_true", help="print only; leave the docs alone")
    args = parser.parse_args(argv)
    quick = args.quick
    asked = {name.strip() for name in args.targets.split(",")}
    unknown = asked - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}: choose from {', '.join(TARGETS)}")
    chosen = tuple(name for name in TARGETS if name in asked or name == "direct")
    if args.before:
        try:
            revision_of(args.before)
        except subprocess.CalledProcessError:
            parser.error(f"--before {args.before}: not a revision of this checkout")
        chosen += (BEFORE,)
    return Settings(
        rounds=args.rounds or (1 if quick else 5),
        window_s=args.window or (0.5 if quick else 3.0),
        streams=args.streams or (500 if quick else 4000),
        big_streams=(1000 if quick else 10_000) if args.big_streams is None else args.big_streams,
        gateway_dir=args.gateway_dir.resolve(),
        python=args.python,
        targets=chosen,
        nice=args.nice,
        realtime=not args.no_realtime,
        write_docs=not (args.no_docs or quick) and set(TARGETS) <= set(chosen),
        before=args.before,
    )


def save_raw(results: dict, run_info: dict) -> None:
    """Keep the run's raw figures in bench/out/ (git-ignored) for a closer look later."""
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    cfg = run_info["settings"]
    info = {**run_info, "settings": {**vars(cfg), "gateway_dir": str(cfg.gateway_dir)}}
    raw = json.dumps({"run": info, "results": results}, indent=1)
    (out / "gateway_bench.json").write_text(raw)


def rerun_in_own_session(argv: list[str], script: str = __file__) -> int:
    """Run the benchmark as a child in a new session, so it gets its own scheduling group.

    With Linux autogroups, CPU is shared between sessions first and niceness only counts
    inside one; a session of its own lets the benchmark's niceness reach the whole host.
    """
    env = {**os.environ, OWN_SESSION_ENV: "1"}
    child = subprocess.Popen([sys.executable, script, *argv], start_new_session=True, env=env)
    try:
        return child.wait()
    except KeyboardInterrupt:
        child.terminate()  # its own handler stops what it started
        return child.wait()


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds through the finally that stops every process


def main(argv: list[str]) -> int:
    cfg = parse_args(argv)
    if cfg.nice and os.environ.get(OWN_SESSION_ENV) != "1":
        return rerun_in_own_session(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    if (
        "gateway" in cfg.targets
        and not (cfg.gateway_dir / "lobes_gateway" / "__main__.py").exists()
    ):
        print(
            f"no lobes_gateway under {cfg.gateway_dir}: merge the gw branch or pass --gateway-dir"
        )
        return 2
    run_info = describe_run(cfg, argv)

    def log(line: str) -> None:
        print(line, file=sys.stderr)

    run_info["open_files"] = raise_open_files(cfg, log)
    with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp:
        results = asyncio.run(run(cfg, Path(tmp), log, run_info["open_files"]["limit"]))
    run_info["load_after"] = load_average()
    save_raw(results, run_info)
    text = report.render(results, run_info)
    print(text)
    if cfg.write_docs:
        docs_section.write_section("gateway-bench", text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
