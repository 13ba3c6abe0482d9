"""bench/inprocess_cost.py drives the real Gateway through in-memory transports: each request
must come back a 200 carrying the backend's body, or the CPU it reports is not a request's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_harness_relays_every_request_through_the_real_gateway(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCH / "inprocess_cost.py"), "--requests", "300", "--warmup", "20",
         "--rounds", "2", "--concurrency", "4", "--access-log"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    assert "access log on:" in done.stdout and "us a request of process CPU" in done.stdout
