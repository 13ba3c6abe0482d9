"""Start a real gateway process for tests: free port, wait for /health, kill on teardown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.ports import free_port
from tests.support.wait import WaitTimeout, http_ok, wait_until

ROOT = Path(__file__).resolve().parents[2]
GATEWAY_DIR = ROOT / "gateway"
# The interpreter the gateway runs under: the tests' own unless LOBES_TEST_GATEWAY_PYTHON names
# another (the gateway supports Python >= 3.10; the boxes run what their OS ships).
GATEWAY_PYTHON = os.environ.get("LOBES_TEST_GATEWAY_PYTHON") or sys.executable


def calm_proc_root() -> str:
    """A /proc stand-in with no swap, no iowait and half the memory free: a test gateway sheds
    only when its test makes pressure (LOBES_PROC_ROOT of its own), never because the host
    running the tests is busy."""
    root = Path(tempfile.mkdtemp(prefix="lobes-calm-proc-"))
    (root / "meminfo").write_text("MemTotal: 100000 kB\nMemAvailable: 50000 kB\n"
                                  "SwapTotal: 1000 kB\nSwapFree: 1000 kB\n")
    (root / "stat").write_text("cpu  0 0 0 0 0 0 0 0 0 0\n")
    return str(root)


CALM_PROC_ROOT = calm_proc_root()


class GatewayProcess:
    """A running `python3 -m lobes_gateway`; usable as a context manager."""

    def __init__(self, env: dict[str, str], port: int | None = None,
                 startup_timeout_s: float = 15.0) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {key: value for key, value in os.environ.items()
                    if not key.startswith(("GATEWAY_", "LOBES_", "CULTURE_"))}
        full_env.update({"PYTHONPATH": str(GATEWAY_DIR), "GATEWAY_HOST": "127.0.0.1",
                         "GATEWAY_PORT": str(self.port), "LOBES_PROC_ROOT": CALM_PROC_ROOT})
        full_env.update(env)
        self.env = full_env
        # A file, never an unread pipe: a chatty gateway must not block on a full pipe.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop())
        self._proc = subprocess.Popen([GATEWAY_PYTHON, "-m", "lobes_gateway"], env=full_env,
                                      stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_ready(startup_timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        """Return once /health answers 200; raise if the process exits or never answers."""
        try:
            wait_until(self._ready, timeout=timeout_s,
                       message=f"the gateway on port {self.port} to answer /health")
        except WaitTimeout as error:
            self.stop()
            raise RuntimeError(str(error)) from error

    def _ready(self) -> bool:
        """Whether /health answers 200 now; raises once the process has exited."""
        if self._proc.poll() is not None:
            raise RuntimeError(f"gateway exited with {self._proc.returncode}: {self.output()}")
        return http_ok(f"{self.url}/health")

    def output(self) -> str:
        """Everything the gateway has written to stdout and stderr so far."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.poll() is None

    def get_json(self, path: str, headers: dict[str, str] | None = None) -> dict:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def shutdown(self, timeout_s: float = 10.0) -> tuple[int, str]:
        """SIGTERM and wait for the exit: (exit code, everything it wrote)."""
        self._proc.terminate()
        code = self._proc.wait(timeout=timeout_s)
        return code, self.output()

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()

    def __enter__(self) -> GatewayProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_gateway(env: dict[str, str], *, port: int | None = None) -> GatewayProcess:
    """Start a gateway configured by `env` (GATEWAY_HOST/PORT are set for you)."""
    return GatewayProcess(env, port=port)


def run_config_check(env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run the gateway expecting it to refuse start-up; returns the finished process."""
    full_env = {key: value for key, value in os.environ.items()
                if not key.startswith(("GATEWAY_", "LOBES_", "CULTURE_"))}
    full_env.update({"PYTHONPATH": str(GATEWAY_DIR), "GATEWAY_PORT": str(free_port())})
    full_env.update(env)
    return subprocess.run([GATEWAY_PYTHON, "-m", "lobes_gateway"], env=full_env,
                          capture_output=True, text=True, timeout=15, check=False)


@pytest.fixture
def gateway_factory() -> Iterator[Any]:
    """A function with start_gateway's signature; every gateway it starts stops at teardown."""
    started: list[GatewayProcess] = []

    def factory(env: dict[str, str], **options: Any) -> GatewayProcess:
        gateway = start_gateway(env, **options)
        started.append(gateway)
        return gateway

    yield factory
    for gateway in started:
        gateway.stop()
