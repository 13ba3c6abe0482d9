"""The short soak of CI: bench/soak.py for 30 s at 200 keep-alive connections of mixed chat,
stream and embed traffic through a real gateway and simulated gears. Every answer is a 2xx
(nothing lost, no error), and after the warm-up the gateway's resident memory, descriptors and
threads do not grow. The 10-minute run and its curves are in docs/reliability.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_short_soak_loses_nothing_and_grows_nothing(tmp_path):
    out = tmp_path / "soak.json"
    run = subprocess.run(
        [sys.executable, "soak.py", "--seconds", "30", "--connections", "200", "--json", str(out)],
        cwd=ROOT / "bench", env={**os.environ, "PYTHONPATH": str(ROOT / "gateway")},
        capture_output=True, text=True, timeout=300, check=False)
    assert out.exists(), run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(out.read_text())
    outcomes = result["outcomes"]
    assert set(outcomes) == {"2xx"} and outcomes["2xx"] > 200, outcomes
    assert run.returncode == 0
    growth = result["after_warmup_and_end"]
    rss_settled, rss_end = growth["rss_kib"]
    assert rss_end <= rss_settled * 1.15 + 2048, growth
    # The upstream keep-alive pool may still reach a new high-water mark after the warm-up:
    # each client connection has at most one request out, so each of the two gears' pools holds
    # at most one connection per client, and the descriptors never pass the clients' and both
    # pools' (a leak per request, tens of thousands of requests here, would pass it at once).
    # Measured: 538 after warm-up and 592 at the end in one run, 578 and 586 in another.
    first_sample = result["samples"][0]["fds"]
    _fds_settled, fds_end = growth["fds"]
    assert fds_end <= first_sample + 200 * 3 + 16, growth
    assert growth["threads"][1] <= growth["threads"][0], growth
