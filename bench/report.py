"""The benchmark's markdown: the side-by-side table and the targets with PASS/MISS."""

from __future__ import annotations

import math
from typing import NamedTuple

COLUMNS = ("direct", "nginx", "relay", "gateway", "logged")
# The gateway's columns, each also given as a ratio to nginx: access log off, then on.
GATEWAYS = ("gateway", "logged")
# The floor: bench/bare_relay.py, the cheapest stdlib asyncio relay.
FLOOR = "relay"
# The gateway of another revision, when the run measured one beside this one (--before).
BEFORE = "before"

# The gateway's bars, each a ratio to nginx's figure of the same run (or a count it must
# hold): a socket run's absolute figures move with the host, its ratios far less.
MAX_CPU_PER_REQUEST_X_NGINX = 2.0
# The concurrencies the CPU-per-request bar is checked at.
CPU_BAR_CONCURRENCIES = (64, 256)
MAX_CPU_PER_CHUNK_X_NGINX = 1.75
MAX_ADDED_P50_C1_X_NGINX = 1.2
MAX_KIB_PER_STREAM = 8.0
# The proxies that hold the many streams: nginx is the reference, the gateways are judged.
BIG_STREAMS_TARGETS = ("nginx", *GATEWAYS)
# The phases that hold streams open (the others are timed windows).
HELD_PHASES = ("streams", "big_streams")


def _get(results: dict, phase: str, target: str, key: str) -> float | None:
    value = results.get(phase, {}).get(target, {}).get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def _added(results: dict, phase: str, target: str, key: str) -> float | None:
    """What a proxy adds over direct-to-backend for a latency figure."""
    proxied, direct = _get(results, phase, target, key), _get(results, phase, "direct", key)
    return None if proxied is None or direct is None else proxied - direct


def _ratio(value: float | None, reference: float | None) -> float | None:
    """value / reference; none when the reference is not a positive figure (noise around 0)."""
    return None if value is None or reference is None or reference <= 0 else value / reference


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _row(label: str, cells: list[str], ratios: dict[str, float | None] | None) -> str:
    """A figure's cells, then each gateway's ratio to nginx ('-' where none applies)."""
    shown = [_fmt((ratios or {}).get(t), "{:.2f}x") for t in GATEWAYS]
    return f"| {label} | " + " | ".join(cells + shown) + " |"


def _to_nginx(values: dict[str, float | None]) -> dict[str, float | None]:
    return {t: _ratio(values.get(t), values.get("nginx")) for t in GATEWAYS}


def _latency_rows(results: dict, concurrency: int) -> list[str]:
    phase = f"c{concurrency}"
    rows = []
    for key in ("p50", "p99"):
        cells = [_fmt(_get(results, phase, "direct", key), "{:.3f} ms (base)")]
        added = {t: _added(results, phase, t, key) for t in COLUMNS[1:]}
        cells += [_fmt(added[t], "{:+.3f} ms") for t in COLUMNS[1:]]
        label = f"{key} latency, c={concurrency}: direct / added by proxy"
        rows.append(_row(label, cells, _to_nginx(added)))
    return rows


def _per_concurrency_rows(
    results: dict, concurrencies: list[int], key: str, label: str, pattern: str
) -> list[str]:
    """One row per concurrency of metric `key`, with the gateway/nginx ratio."""
    rows = []
    for concurrency in concurrencies:
        values = {t: _get(results, f"c{concurrency}", t, key) for t in COLUMNS}
        rows.append(
            _row(
                f"{label}, c={concurrency}",
                [_fmt(values[t], pattern) for t in COLUMNS],
                _to_nginx(values),
            )
        )
    return rows


def _throughput_and_cpu_rows(results: dict, concurrencies: list[int]) -> list[str]:
    rows = _per_concurrency_rows(results, concurrencies, "rps", "requests/s", "{:,.0f}")
    wait = {t: _get(results, "c64", t, "wait_share") for t in COLUMNS}
    rows.append(
        _row(
            "proxy waiting for a CPU, c=64 (share of its runnable time; host load)",
            [_fmt(wait[t] and wait[t] * 100, "{:.0f}%") for t in COLUMNS],
            None,
        )
    )
    rows += _per_concurrency_rows(
        results, concurrencies, "cpu_per_req_us", "proxy CPU per request", "{:.0f} us"
    )
    rows += _per_concurrency_rows(
        results, concurrencies, "system_per_req_us", "of which in the kernel (stime)",
        "{:.0f} us"
    )
    return rows


def _held_row(results: dict, phase: str, label: str) -> str:
    """Streams live at once / failed, for each target the phase held them through."""
    cells = []
    for target in COLUMNS:
        held, failed = (_get(results, phase, target, key) for key in ("live_at_sample", "failed"))
        cells.append("-" if held is None else f"{held:,.0f} / {failed:,.0f}")
    return _row(label, cells, None)


def _stream_rows(results: dict, streams: int, big_streams: int) -> list[str]:
    cpu = {t: _get(results, "sse", t, "cpu_per_event_us") for t in COLUMNS}
    ttfc_added = {t: _added(results, "ttfc", t, "ttfc_p50") for t in COLUMNS[1:]}
    kib = {t: _get(results, "streams", t, "kib_per_stream") for t in COLUMNS}
    rows = [
        _row(
            "proxy CPU per SSE chunk",
            [_fmt(cpu[t], "{:.0f} us") for t in COLUMNS],
            _to_nginx(cpu),
        ),
        _row(
            "time to first chunk p50, c=1: direct / added",
            [_fmt(_get(results, "ttfc", "direct", "ttfc_p50"), "{:.3f} ms (base)")]
            + [_fmt(ttfc_added[t], "{:+.3f} ms") for t in COLUMNS[1:]],
            _to_nginx(ttfc_added),
        ),
        _held_row(results, "streams", f"{streams:,} SSE streams: live at once / failed"),
        _row(
            "RSS per held stream",
            [_fmt(kib[t], "{:.1f} KiB") for t in COLUMNS],
            _to_nginx(kib),
        ),
    ]
    if big_streams:
        label = f"{big_streams:,} SSE streams, each proxy fresh: live at once / failed"
        rows.append(_held_row(results, "big_streams", label))
    return rows


def _cpu_per_request_x_nginx(results: dict, target: str, concurrency: int) -> float | None:
    phase = f"c{concurrency}"
    return _ratio(
        _get(results, phase, target, "cpu_per_req_us"),
        _get(results, phase, "nginx", "cpu_per_req_us"),
    )


def round_ratios(results: dict, target: str, concurrency: int) -> list[float]:
    """The target's CPU a request over nginx's, round by round (each pair measured within one
    interleaved round, seconds apart); empty when the rounds were not kept."""
    def rounds(name: str) -> list:
        return results.get(f"c{concurrency}", {}).get(name, {}).get("round_cpu_per_req_us", [])

    pairs = zip(rounds(target), rounds("nginx"), strict=False)
    return sorted(r for r in (_ratio(own, nginx) for own, nginx in pairs) if r is not None)


def _with_rounds(ratio: float | None, rounds: list[float]) -> str:
    """A CPU ratio, and the range of its rounds' own ratios when there are several."""
    shown = _fmt(ratio, "{:.2f}x")
    if ratio is None or len(rounds) < 2:
        return shown
    return f"{shown}; rounds {rounds[0]:.2f}-{rounds[-1]:.2f}x"


class Bar(NamedTuple):
    """One target: what it asks, what the run measured, whether that meets it, and the phase
    whose figures it reads (a target not run in that phase is NOT RUN)."""

    name: str
    shown: str
    met: bool
    phase: str


def _at_most(value: float | None, limit: float) -> bool:
    return value is not None and value <= limit


def _added_p50_bar(results: dict, target: str) -> Bar:
    """The added median at c=1 as a ratio to nginx's added median of the same run."""
    added, nginx = _added(results, "c1", target, "p50"), _added(results, "c1", "nginx", "p50")
    ratio = _ratio(added, nginx)
    ms = {name: _fmt(value, "{:+.3f} ms") for name, value in (("own", added), ("nginx", nginx))}
    shown = f"{_fmt(ratio, '{:.2f}x')} ({ms['own']} vs nginx's {ms['nginx']})"
    return Bar(
        f"added median latency at c=1 <= {MAX_ADDED_P50_C1_X_NGINX:g}x nginx's",
        shown,
        _at_most(ratio, MAX_ADDED_P50_C1_X_NGINX),
        "c1",
    )


def _cpu_bars(results: dict, target: str) -> list[Bar]:
    bars = []
    for concurrency in CPU_BAR_CONCURRENCIES:
        ratio = _cpu_per_request_x_nginx(results, target, concurrency)
        bars.append(
            Bar(
                f"CPU per request (c={concurrency}) <= {MAX_CPU_PER_REQUEST_X_NGINX:g}x nginx",
                _with_rounds(ratio, round_ratios(results, target, concurrency)),
                _at_most(ratio, MAX_CPU_PER_REQUEST_X_NGINX),
                f"c{concurrency}",
            )
        )
    chunk = _ratio(
        _get(results, "sse", target, "cpu_per_event_us"),
        _get(results, "sse", "nginx", "cpu_per_event_us"),
    )
    bars.append(
        Bar(
            f"CPU per SSE chunk <= {MAX_CPU_PER_CHUNK_X_NGINX:g}x nginx",
            _fmt(chunk, "{:.2f}x"),
            _at_most(chunk, MAX_CPU_PER_CHUNK_X_NGINX),
            "sse",
        )
    )
    return bars


def _streams_bar(results: dict, target: str, streams: int) -> Bar:
    failed = _get(results, "streams", target, "failed")
    held = _get(results, "streams", target, "live_at_sample")
    kib = _get(results, "streams", target, "kib_per_stream")
    return Bar(
        f"{streams:,} concurrent streams, 0 failed, <= {MAX_KIB_PER_STREAM:g} KiB each",
        f"{_fmt(held, '{:,.0f}')} open, {_fmt(failed, '{:,.0f}')} failed, "
        f"{_fmt(kib, '{:.1f}')} KiB",
        failed == 0 and held == streams and _at_most(kib, MAX_KIB_PER_STREAM),
        "streams",
    )


def _big_streams_bar(results: dict, target: str, big_streams: int) -> Bar:
    """No more failed streams than nginx when both hold `big_streams` at once, each fresh;
    the failures the load generator caused itself are counted in both and shown apart."""
    failed = _get(results, "big_streams", target, "failed")
    nginx = _get(results, "big_streams", "nginx", "failed")
    held = _get(results, "big_streams", target, "live_at_sample")
    client = _get(results, "big_streams", target, "client_failed")
    shown = (
        f"{_fmt(failed, '{:,.0f}')} failed vs nginx {_fmt(nginx, '{:,.0f}')} "
        f"({_fmt(held, '{:,.0f}')} live at once; {_fmt(client, '{:,.0f}')} of the failures "
        "the client's own)"
    )
    return Bar(
        f"{big_streams:,} concurrent streams, no more failed than nginx",
        shown,
        failed is not None and nginx is not None and failed <= nginx,
        "big_streams",
    )


def targets(results: dict, streams: int, big_streams: int, target: str = "gateway") -> list[Bar]:
    """Each of the gateway's bars, judged for `target` (the gateway with its access log off,
    or on) against nginx's figures of the same run."""
    return [
        _added_p50_bar(results, target),
        *_cpu_bars(results, target),
        _streams_bar(results, target, streams),
        _big_streams_bar(results, target, big_streams),
    ]


def _target_rows(results: dict, streams: int, big_streams: int) -> list[str]:
    """The bars, with the gateway's verdict with its access log off and on side by side."""
    rows = []
    for off, on in zip(
        targets(results, streams, big_streams, "gateway"),
        targets(results, streams, big_streams, "logged"),
        strict=True,
    ):
        cells = [
            f"{judged.shown} ({_verdict(judged.met, name in results.get(judged.phase, {}))})"
            for judged, name in ((off, "gateway"), (on, "logged"))
        ]
        rows.append(f"| {off.name} | " + " | ".join(cells) + " |")
    return rows


def _floor_rows(results: dict, concurrencies: list[int]) -> list[str]:
    """CPU against the bare relay: what the host charges any Python proxy (the relay against
    nginx) apart from what the gateway's own work costs (the gateway against the relay)."""
    measures = [(f"c{c}", "cpu_per_req_us", f"CPU per request, c={c}") for c in concurrencies]
    measures.append(("sse", "cpu_per_event_us", "CPU per SSE chunk"))
    rows = [
        "| figure | bare relay / nginx | gateway / bare relay | access log on / bare relay |",
        "|---|---|---|---|",
    ]
    for phase, key, label in measures:
        floor = _get(results, phase, FLOOR, key)
        ratios = [_ratio(floor, _get(results, phase, "nginx", key))]
        ratios += [_ratio(_get(results, phase, t, key), floor) for t in GATEWAYS]
        rows.append(f"| {label} | " + " | ".join(_fmt(r, "{:.2f}x") for r in ratios) + " |")
    return rows


def _before_rows(results: dict, concurrencies: list[int], revision: str | None) -> list[str]:
    """This gateway against the one of another revision, measured in the same run (--before):
    each figure, and its ratio to nginx's; nothing when the run measured none."""
    if not revision:
        return []
    measures = [(f"c{c}", "cpu_per_req_us", f"CPU per request, c={c}", "{:.1f} us")
                for c in concurrencies]
    measures += [("sse", "cpu_per_event_us", "CPU per SSE chunk", "{:.1f} us"),
                 ("streams", "kib_per_stream", "RSS per held stream", "{:.1f} KiB")]
    rows = [
        f"This gateway against the gateway at `{revision}` (`before`), in the same interleaved "
        "rounds:",
        "",
        "| figure | before | gateway | gateway / before | before / nginx | gateway / nginx |",
        "|---|---|---|---|---|---|",
    ]
    for phase, key, label, pattern in measures:
        values = {t: _get(results, phase, t, key) for t in ("nginx", BEFORE, "gateway")}
        rows.append(_before_row(label, values, pattern))
    added = {t: _added(results, "c1", t, "p50") for t in ("nginx", BEFORE, "gateway")}
    rows += [_before_row("added p50 latency, c=1", added, "+{:.3f} ms"), ""]
    return rows


def _before_row(label: str, values: dict[str, float | None], pattern: str) -> str:
    nginx, before, gateway = values["nginx"], values[BEFORE], values["gateway"]
    ratios = [_ratio(gateway, before), _ratio(before, nginx), _ratio(gateway, nginx)]
    cells = [_fmt(before, pattern), _fmt(gateway, pattern), *(_fmt(r, "{:.2f}x") for r in ratios)]
    return f"| {label} | " + " | ".join(cells) + " |"


def _error_note(results: dict) -> str:
    errors = {
        t: sum(results[p].get(t, {}).get("errors", 0) for p in results if p not in HELD_PHASES)
        for t in COLUMNS
    }
    listed = ", ".join(f"{t} {n}" for t, n in errors.items())
    return f"Non-200 or broken responses in the timed phases: {listed}."


def _streams_note(results: dict, phase: str, title: str) -> str:
    """How long opening all streams took, why any failed, and how late the client's own
    event loop ran while they were held (a late loop stalls streams on the client's side)."""
    parts = []
    for target, held in results.get(phase, {}).items():
        reasons = "; ".join(f"{n} {why}" for why, n in sorted(held["failures"].items()))
        lag = held.get("client_lag_s")
        parts.append(
            f"{target} opened all in {held['open_s']:.1f} s"
            + ("" if lag is None else f", client loop up to {lag:.2f} s late")
            + (f" (failed: {reasons})" if reasons else "")
        )
    return f"{title}: " + "; ".join(parts) + "." if parts else ""


def _open_files_note(info: dict, big_streams: int) -> str:
    """Whether the proxies could open the sockets the most streams need: below that, streams
    fail on the bench's limit whichever the proxy."""
    files = info.get("open_files")
    if not files or files["limit"] >= files["needed"]:
        return ""
    return (
        f"The open-file limit, {files['limit']:,}, is below the {files['needed']:,} a proxy "
        "needs for the most streams (two sockets each, the client's and the upstream one, plus "
        "headroom) and this host does not let the bench raise it: failures near "
        f"{big_streams:,} streams are that limit's, in nginx (its worker_connections follow "
        "the limit) as in the gateway."
    )


def _verdict(met: bool, measured: bool) -> str:
    if not measured:
        return "NOT RUN"
    return "PASS" if met else "MISS"


def render(results: dict, info: dict) -> str:
    cfg = info["settings"]
    concurrencies = sorted(int(p[1:]) for p in results if p.startswith("c") and p[1:].isdigit())
    lines = [
        f"Measured {info['date']} on {info['machine']}; the Python proxies (gateway, bare "
        f"relay) under {info['proxy_python']}, the client and backend under Python "
        f"{info['python']}; nginx {info['nginx']}, gateway at `{info['gateway']}`. Host load "
        "average "
        f"{info['load_before']} before, {info['load_after']} after (other work on the host "
        "moves wall-time figures; CPU ratios and KiB per stream are the stable ones).",
        "",
        f"Command: `{info['command']}`. Backend: `bench/fast_backend.py` (stdlib asyncio, "
        "pre-encoded responses). Bare relay: `bench/bare_relay.py`, the floor of a stdlib "
        "asyncio proxy (callbacks only, pooled upstream connections, bytes relayed untouched; "
        "no auth, routing, parsing or metrics). Each proxy pinned to core 1, client and "
        "backend to core 0, "
        f"all in a session of their own at niceness {cfg.nice:+d} (its autogroup too). "
        f"Figures are medians of {cfg.rounds} interleaved rounds of {cfg.window_s:g} s windows "
        "(each round starts one target later). "
        "CPU is the proxy process tree's time on a CPU over the window, as the scheduler "
        "counts it in nanoseconds (/proc/<pid>/task/*/schedstat; whole clock ticks of "
        "utime+stime rounded nginx's in an SSE round, about 16 ticks, by up to an eighth), the "
        "kernel's part (stime) its share of the ticks; the CPU bars below "
        "also give the range of the rounds' own ratios to nginx (each pair measured within "
        "one round). SSE chunks: "
        f"{cfg.sse_concurrency} concurrent streams of {cfg.sse_chunks} chunks "
        f"{cfg.sse_interval_ms} ms apart, every stream's chunks on one {cfg.sse_interval_ms} ms "
        "step clock as vLLM sends each running stream's token at one decode step (CPU per "
        "chunk includes each stream's request, spread over its chunks). Held streams: opened "
        "200 at a time, one chunk every "
        f"{cfg.stream_interval_ms} ms, sampled 3 intervals after the last opened, then ended "
        "by the backend; failed = not live at the sample (silent for 5 intervals or gone) or "
        "not ending with `data: [DONE]`; RSS per stream = (RSS with all open - RSS idle) / "
        f"{cfg.streams:,}, each proxy fresh."
        + (
            f" Then {cfg.big_streams:,} streams held the same way through a fresh nginx and "
            "gateway (access log off and on), each stopped after: the gateway may lose no more "
            "of them than nginx. The load generator is one Python process on core 0 (with the "
            "backend): failures from its own fd or port limits are counted as the client's, "
            "and how late its event loop ran while the streams were held is noted, since a "
            "late client stalls streams whatever the proxy."
            if cfg.big_streams
            else ""
        )
        + " The targets are ratios to nginx's figures of the same run: CPU per request at "
        f"c={' and c='.join(map(str, CPU_BAR_CONCURRENCIES))} <= "
        f"{MAX_CPU_PER_REQUEST_X_NGINX:g}x, CPU per SSE chunk <= "
        f"{MAX_CPU_PER_CHUNK_X_NGINX:g}x, added p50 at c=1 <= {MAX_ADDED_P50_C1_X_NGINX:g}x "
        f"nginx's added p50; and {cfg.streams:,} held streams, 0 failed, <= "
        f"{MAX_KIB_PER_STREAM:g} KiB RSS each."
        + (
            " The c=1 phases run under SCHED_FIFO (wake-up latency, not CPU share, is what"
            " they measure)."
            if cfg.realtime
            else ""
        ),
        "",
        "| figure | direct | nginx | bare relay | gateway | gateway, access log on "
        "| gateway / nginx | access log on / nginx |",
        "|---|---|---|---|---|---|---|---|",
        *_throughput_and_cpu_rows(results, concurrencies),
        *(row for c in concurrencies for row in _latency_rows(results, c)),
        *_stream_rows(results, cfg.streams, cfg.big_streams),
        "",
        _error_note(results),
        _streams_note(results, "streams", "Held streams"),
        _streams_note(results, "big_streams", f"{cfg.big_streams:,} held streams"),
        _open_files_note(info, cfg.big_streams),
        "",
        *_floor_rows(results, concurrencies),
        "",
        "| target | gateway | gateway, access log on |",
        "|---|---|---|",
        *_target_rows(results, cfg.streams, cfg.big_streams),
        "",
        *_before_rows(results, concurrencies, info.get("before")),
        "Where the gateway spends its CPU: `python3 bench/profile_gateway.py [--sse]` (cProfile "
        "on the gateway's own CPU clock, same load and pinning).",
    ]
    return "\n".join(lines)
