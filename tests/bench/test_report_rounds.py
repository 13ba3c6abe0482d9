"""The gateway bench's CPU bars show the range of their rounds' own ratios to nginx: a socket
run's ratio moves with the host, and the range says by how much in that run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# bench/ is not a package: its report module is loaded from its file.
_SPEC = importlib.util.spec_from_file_location(
    "bench_report", Path(__file__).resolve().parents[2] / "bench" / "report.py")
report = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(report)


def _results(gateway_rounds: list[float], nginx_rounds: list[float]) -> dict:
    def target(rounds: list[float]) -> dict:
        middle = sorted(rounds)[len(rounds) // 2]
        return {"cpu_per_req_us": middle, "round_cpu_per_req_us": rounds}

    return {"c64": {"gateway": target(gateway_rounds), "nginx": target(nginx_rounds)},
            "c256": {"gateway": target(gateway_rounds), "nginx": target(nginx_rounds)}}


def test_each_round_is_paired_with_nginxs_window_of_the_same_round():
    results = _results([90.0, 120.0, 100.0], [30.0, 48.0, 40.0])

    assert report.round_ratios(results, "gateway", 64) == [2.5, 2.5, 3.0]


def test_the_cpu_bars_show_the_median_ratio_then_the_rounds_range():
    results = _results([90.0, 120.0, 100.0], [30.0, 48.0, 40.0])

    bars = {each.name: (each.shown, each.met) for each in report.targets(results, 0, 0)}

    assert bars["CPU per request (c=64) <= 2x nginx"] == ("2.50x; rounds 2.50-3.00x", False)


def test_a_run_without_its_rounds_shows_the_ratio_alone():
    results = {"c256": {"gateway": {"cpu_per_req_us": 99.0},
                        "nginx": {"cpu_per_req_us": 33.0}}}

    bars = {each.name: (each.shown, each.met) for each in report.targets(results, 0, 0)}

    assert bars["CPU per request (c=256) <= 2x nginx"] == ("3.00x", False)
