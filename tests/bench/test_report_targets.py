"""The gateway bench's targets: each a ratio to nginx's figure of the same run (CPU per request
at c=64 and c=256, CPU per SSE chunk, the added median at c=1), 4,000 held streams with none
failed and few KiB each, and no more failed than nginx when both hold 10,000 streams."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

# bench/ is not a package: its report module is loaded from its file.
_SPEC = importlib.util.spec_from_file_location(
    "bench_report", Path(__file__).resolve().parents[2] / "bench" / "report.py")
report = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(report)

STREAMS, BIG = 4000, 10_000


def _held(live: int, failed: int, kib: float = 6.0, client_failed: int = 0) -> dict:
    return {"live_at_sample": live, "failed": failed, "client_failed": client_failed,
            "kib_per_stream": kib, "failures": {"stalled or ended before the sample": failed},
            "open_s": 4.0, "client_lag_s": 0.01}


def _results(**gateway: float) -> dict:
    """A run where nginx's figures are round numbers and the gateway's are given (defaults
    meet every bar)."""
    own = {"c64": 180.0, "c256": 190.0, "chunk": 170.0, "p50_c1": 1.11, "kib": 7.5,
           "failed": 0, "live": STREAMS, "big_failed": 7, **gateway}
    return {
        "c1": {"direct": {"p50": 1.0}, "nginx": {"p50": 1.1}, "gateway": {"p50": own["p50_c1"]}},
        "c64": {"nginx": {"cpu_per_req_us": 100.0}, "gateway": {"cpu_per_req_us": own["c64"]}},
        "c256": {"nginx": {"cpu_per_req_us": 100.0}, "gateway": {"cpu_per_req_us": own["c256"]}},
        "sse": {"nginx": {"cpu_per_event_us": 100.0},
                "gateway": {"cpu_per_event_us": own["chunk"]}},
        "streams": {"nginx": _held(STREAMS, 0, 2.0),
                    "gateway": _held(own["live"], own["failed"], own["kib"])},
        "big_streams": {"nginx": _held(BIG - 1094, 1094),
                        "gateway": _held(BIG - own["big_failed"], own["big_failed"])},
    }


def _met(results: dict, target: str = "gateway") -> dict[str, bool]:
    return {each.name: each.met for each in report.targets(results, STREAMS, BIG, target)}


ADDED_P50 = "added median latency at c=1 <= 1.2x nginx's"
CPU_C64 = "CPU per request (c=64) <= 2x nginx"
CPU_C256 = "CPU per request (c=256) <= 2x nginx"
CHUNK = "CPU per SSE chunk <= 1.75x nginx"
HELD = "4,000 concurrent streams, 0 failed, <= 8 KiB each"
BIG_HELD = "10,000 concurrent streams, no more failed than nginx"


def test_a_gateway_within_every_ratio_passes_every_bar():
    assert _met(_results()) == dict.fromkeys(
        (ADDED_P50, CPU_C64, CPU_C256, CHUNK, HELD, BIG_HELD), True)


@pytest.mark.parametrize(("figure", "value", "missed"), [
    ("c64", 201.0, CPU_C64),
    ("c256", 201.0, CPU_C256),
    ("chunk", 176.0, CHUNK),
    ("p50_c1", 1.125, ADDED_P50),
    ("kib", 8.5, HELD),
    ("failed", 1, HELD),
    ("live", STREAMS - 1, HELD),
    ("big_failed", 1095, BIG_HELD),
])
def test_a_figure_past_its_bar_misses_that_bar_alone(figure, value, missed):
    met = _met(_results(**{figure: value}))

    assert [name for name, ok in met.items() if not ok] == [missed]


@pytest.mark.parametrize(("figure", "value", "judged"), [
    ("c64", 200.0, CPU_C64),
    ("c256", 200.0, CPU_C256),
    ("chunk", 175.0, CHUNK),
    ("kib", 8.0, HELD),
    ("big_failed", 1094, BIG_HELD),
])
def test_a_figure_on_its_bar_meets_it(figure, value, judged):
    assert _met(_results(**{figure: value}))[judged]


def test_the_added_median_is_judged_as_a_ratio_to_nginxs_not_in_milliseconds():
    results = _results()
    # Both added 2 ms and more: far above the old 0.35 ms bar, but the gateway adds only
    # 1.15x what nginx adds in the same run.
    results["c1"] = {"direct": {"p50": 1.0}, "nginx": {"p50": 3.0}, "gateway": {"p50": 3.3}}

    judged = next(b for b in report.targets(results, STREAMS, BIG) if b.name == ADDED_P50)

    assert judged.met
    assert judged.shown == "1.15x (+2.300 ms vs nginx's +2.000 ms)"


def test_the_added_median_misses_when_nginx_adds_nothing_to_compare_with():
    results = _results()
    results["c1"]["nginx"]["p50"] = 0.99  # within noise of direct: no ratio to take

    assert not _met(results)[ADDED_P50]


def test_the_big_streams_bar_follows_nginxs_failures_of_the_same_run():
    results = _results(big_failed=7)
    results["big_streams"]["nginx"] = _held(BIG, 0)

    assert not _met(results)[BIG_HELD]

    results["big_streams"]["nginx"] = _held(BIG - 7, 7)

    assert _met(results)[BIG_HELD]


def test_the_big_streams_bar_misses_without_nginxs_figure():
    results = _results(big_failed=0)
    del results["big_streams"]["nginx"]

    assert not _met(results)[BIG_HELD]


def test_the_big_streams_bar_shows_the_clients_own_failures_apart():
    results = _results()
    results["big_streams"]["gateway"] = _held(BIG - 30, 30, client_failed=25)

    judged = next(b for b in report.targets(results, STREAMS, BIG) if b.name == BIG_HELD)

    assert judged.shown == "30 failed vs nginx 1,094 (9,970 live at once; 25 of the failures " \
        "the client's own)"


def _rendered(results: dict, **info: object) -> str:
    settings = SimpleNamespace(nice=-10, rounds=1, window_s=0.5, sse_concurrency=16,
                               sse_chunks=50, sse_interval_ms=4, stream_interval_ms=1000,
                               streams=STREAMS, big_streams=BIG, realtime=False)
    info = {"date": "today", "machine": "a host", "proxy_python": "python3", "python": "3",
            "nginx": "1", "gateway": "abc", "load_before": "0", "load_after": "0",
            "command": "bench", "settings": settings, **info}
    return report.render(results, info)


def _rendered_target_rows(results: dict) -> dict[str, str]:
    lines = _rendered(results).splitlines()
    return {line.split(" | ")[0][2:]: line for line in lines if line.startswith("| ")}


def test_the_table_gives_each_bar_a_verdict_and_not_run_where_the_phase_did_not_run():
    results = _results(c64=250.0)
    del results["big_streams"]["gateway"]

    rows = _rendered_target_rows(results)

    assert rows[CPU_C64].endswith("(MISS) | - (NOT RUN) |")
    assert rows[CPU_C256].endswith("(PASS) | - (NOT RUN) |")
    assert rows[BIG_HELD].endswith("(NOT RUN) | - failed vs nginx 1,094 (- live at once; - of "
                                   "the failures the client's own) (NOT RUN) |")


def test_the_table_shows_the_big_streams_held_and_failed_per_proxy():
    rows = _rendered_target_rows(_results(big_failed=7))

    row = rows["10,000 SSE streams, each proxy fresh: live at once / failed"]

    assert row.split(" | ")[1:5] == ["-", "8,906 / 1,094", "-", "9,993 / 7"]


def test_the_table_says_when_the_open_file_limit_caps_the_streams_a_proxy_can_hold():
    short = _rendered(_results(), open_files={"limit": 20_000, "needed": 21_024})
    enough = _rendered(_results(), open_files={"limit": 65_536, "needed": 21_024})

    assert "The open-file limit, 20,000, is below the 21,024 a proxy needs" in short
    assert "open-file limit" not in enough


def _with_before(results: dict, **before: float) -> dict:
    """`results` with a gateway of another revision measured beside this one."""
    results["c1"]["before"] = {"p50": before["p50_c1"]}
    for phase, key in (("c64", "cpu_per_req_us"), ("c256", "cpu_per_req_us"),
                       ("sse", "cpu_per_event_us")):
        results[phase]["before"] = {key: before[phase]}
    results["streams"]["before"] = _held(STREAMS, 0, before["kib"])
    return results


def test_a_run_with_a_gateway_before_gives_each_figure_against_it_and_nginx():
    results = _with_before(_results(c64=180.0, c256=190.0, chunk=170.0, p50_c1=1.11, kib=7.5),
                           c64=200.0, c256=190.0, sse=136.0, p50_c1=1.06, kib=10.0)

    text = _rendered(results, before="abc1234 2026-12-05")
    heading = "This gateway against the gateway at `abc1234 2026-12-05`"
    assert heading in text
    lines = text.split(heading, 1)[1].split("\n\n")[1].splitlines()
    rows = {line.split(" | ")[0][2:]: line for line in lines if line.startswith("| ")}

    # before, gateway, gateway / before, before / nginx, gateway / nginx
    assert rows["CPU per request, c=64"].split(" | ")[1:] == [
        "200.0 us", "180.0 us", "0.90x", "2.00x", "1.80x |"]
    assert rows["CPU per SSE chunk"].split(" | ")[1:4] == ["136.0 us", "170.0 us", "1.25x"]
    assert rows["RSS per held stream"].split(" | ")[3] == "0.75x"
    assert rows["added p50 latency, c=1"].split(" | ")[1:4] == ["+0.060 ms", "+0.110 ms", "1.83x"]


def test_a_run_without_a_gateway_before_has_no_such_table():
    assert "This gateway against" not in _rendered(_results())
