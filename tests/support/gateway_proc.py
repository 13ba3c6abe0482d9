"""Start a real gateway process for tests: free port, wait for /health, kill on teardown."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
GATEWAY_DIR = ROOT / "gateway"


def free_port() -> int:
    """A port nobody listens on right now (bound to 0 and released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class GatewayProcess:
    """A running `python3 -m lobes_gateway`; usable as a context manager."""

    def __init__(self, env: dict[str, str], port: int | None = None,
                 startup_timeout_s: float = 15.0) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {key: value for key, value in os.environ.items()
                    if not key.startswith(("GATEWAY_", "LOBES_", "CULTURE_"))}
        full_env.update({"PYTHONPATH": str(GATEWAY_DIR), "GATEWAY_HOST": "127.0.0.1",
                         "GATEWAY_PORT": str(self.port)})
        full_env.update(env)
        self.env = full_env
        self._proc = subprocess.Popen([sys.executable, "-m", "lobes_gateway"], env=full_env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self._wait_ready(startup_timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                output = self._proc.stdout.read().decode(errors="replace")
                raise RuntimeError(f"gateway exited with {self._proc.returncode}: {output}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"gateway on port {self.port} did not answer /health")

    def alive(self) -> bool:
        return self._proc.poll() is None

    def get_json(self, path: str, headers: dict[str, str] | None = None) -> dict:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()

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
    return subprocess.run([sys.executable, "-m", "lobes_gateway"], env=full_env,
                          capture_output=True, text=True, timeout=15)


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
