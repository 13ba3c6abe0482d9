"""Start real lobes_sim processes for tests: free ports, readiness wait, admin API, cleanup.

    from tests.support.sim_proc import start_sim

    with start_sim("instant") as sim:
        sim.url            # http://127.0.0.1:PORT  (origin, no /v1)
        sim.set_faults({"error_status": 503})
        sim.requests()     # what the serving port received, oldest first

or, in a test module, ``from tests.support.sim_proc import sim_factory`` and take the
``sim_factory`` fixture: ``sim = sim_factory("spark-cortex", time_scale=20)``; every simulator it
started is stopped at teardown, pass or fail.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import selectors
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.wait import WaitTimeout, http_ok, wait_until

ROOT = Path(__file__).resolve().parents[2]
GATEWAY_DIR = ROOT / "gateway"
HOST = "127.0.0.1"
START_TIMEOUT_S = 15.0
_BANNER = re.compile(r" on (?P<host>[^ ]+):(?P<port>\d+) admin (?P<admin>\d+)")
_LIVE: set[SimProcess] = set()
_FAULTS_BREAKING_HEALTH = ("refuse", "error_status", "hang", "hang_s")


class SimStartError(RuntimeError):
    """The simulator did not come up; the message carries its stderr."""


def _http(method: str, url: str, payload: Any = None, timeout: float = 5.0) -> Any:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("content-type", "application/json")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read()
    return json.loads(body) if body else None


class SimProcess:
    """A running simulator: its ports, its admin API, and how to stop it."""

    def __init__(self, process: subprocess.Popen[str], port: int, admin_port: int,
                 stderr_path: Path) -> None:
        self.process = process
        self.port = port
        self.admin_port = admin_port
        self.stderr_path = stderr_path

    @property
    def url(self) -> str:
        """Origin of the serving port, without /v1."""
        return f"http://{HOST}:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://{HOST}:{self.admin_port}"

    def set_faults(self, faults: dict[str, Any]) -> dict[str, Any]:
        """Replace the fault set ({} clears every fault); returns the set now active."""
        return _http("POST", f"{self.admin_url}/admin/faults", faults)

    def faults(self) -> dict[str, Any]:
        return _http("GET", f"{self.admin_url}/admin/faults")

    def requests(self) -> list[dict[str, Any]]:
        """The last 200 requests on the serving port: method, path, headers, body (text)."""
        return _http("GET", f"{self.admin_url}/admin/requests")["requests"]

    def clear_requests(self) -> None:
        _http("DELETE", f"{self.admin_url}/admin/requests")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stop(self) -> None:
        """Terminate the process (kill if it lingers); safe to call twice."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        _LIVE.discard(self)
        self.stderr_path.unlink(missing_ok=True)

    def __enter__(self) -> SimProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _read_banner(process: subprocess.Popen[str], deadline: float) -> re.Match[str] | None:
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                continue
            line = process.stdout.readline()
            if not line:
                return None
            match = _BANNER.search(line)
            if match:
                return match
    return None


def _wait_ready(url: str, deadline: float) -> bool:
    """Whether `url` answers 200 before `deadline` (a time.monotonic() value)."""
    try:
        wait_until(lambda: http_ok(url), timeout=max(0.0, deadline - time.monotonic()),
                   interval=0.02, message=f"{url} to answer 200")
    except WaitTimeout:
        return False
    return True


def start_sim(
    profile: str,
    *,
    served_name: str | None = None,
    time_scale: float = 1.0,
    port: int | None = None,
    admin_port: int | None = None,
    extra_args: Sequence[str] = (),
) -> SimProcess:
    """Start ``python3 -m lobes_sim`` and wait until it answers (ports default to free ones).

    time_scale defaults to 1 (real time, as calibrated); tests that only need answers pass a
    larger one or use the ``instant`` profile.
    """
    args = [
        sys.executable, "-m", "lobes_sim", "--host", HOST, "--profile", profile,
        "--port", str(port or 0), "--admin-port", str(admin_port or 0),
        "--time-scale", str(time_scale),
    ]
    if served_name:
        args += ["--served-name", served_name]
    args += list(extra_args)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(GATEWAY_DIR), env.get("PYTHONPATH")]))
    with tempfile.NamedTemporaryFile(prefix="lobes_sim_", suffix=".log", delete=False) as log:
        process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=GATEWAY_DIR
        )
    stderr_path = Path(log.name)
    deadline = time.monotonic() + START_TIMEOUT_S
    banner = _read_banner(process, deadline)
    sim = SimProcess(process, int(banner["port"]) if banner else 0,
                     int(banner["admin"]) if banner else 0, stderr_path)
    _LIVE.add(sim)
    # The banner comes once both ports listen; a healthy start must also answer /health.
    ready = banner is not None and _wait_ready(f"{sim.admin_url}/health", deadline)
    if ready and not any(sim.faults()[knob] for knob in _FAULTS_BREAKING_HEALTH):
        ready = _wait_ready(f"{sim.url}/health", deadline)
    if not ready:
        stderr = sim.stderr()
        sim.stop()
        raise SimStartError(f"lobes_sim {profile} did not become ready: {' '.join(args)}\n{stderr}")
    sim.clear_requests()  # the readiness probe is not the test's traffic
    return sim


@atexit.register
def _stop_leftovers() -> None:
    """Last resort: no simulator outlives the test session."""
    for sim in list(_LIVE):
        sim.stop()


@pytest.fixture
def sim_factory() -> Iterator[Any]:
    """A function with start_sim's signature; every simulator it starts stops at teardown."""
    started: list[SimProcess] = []

    def factory(profile: str, **options: Any) -> SimProcess:
        sim = start_sim(profile, **options)
        started.append(sim)
        return sim

    yield factory
    for sim in started:
        sim.stop()
