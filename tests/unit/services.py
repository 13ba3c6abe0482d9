"""Start what a rendered services.json describes, as real processes, for module tests."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from lobes_service_files import parse_env_file

ROOT = Path(__file__).resolve().parents[2]


class Services:
    """The processes of one rendered box; stop() kills them all."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        self.procs: dict = {}
        gateway_link = dest / "gateway"
        if not gateway_link.exists():
            gateway_link.symlink_to(ROOT / "gateway")
        self.spec = json.loads((dest / "services.json").read_text())["services"]

    def start(self, name: str) -> None:
        service = next(item for item in self.spec if item["name"] == name)
        env = {"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1"}
        if service.get("env_file"):
            env.update(parse_env_file((self.dest / service["env_file"]).read_text()))
        env.update(service["env"])
        log = open(self.dest / service["log"], "ab")  # noqa: SIM115 - lives with the process
        self.procs[name] = (subprocess.Popen(service["argv"], cwd=self.dest / service["cwd"],
                                             env=env, stdout=log, stderr=subprocess.STDOUT),
                            log)
        try:
            wait_health(health_url(service, env))
        except RuntimeError as error:
            log_text = (self.dest / service["log"]).read_text()
            raise RuntimeError(f"{name}: {error}: {log_text}") from error

    def start_all(self, skip: tuple = ()) -> None:
        for service in self.spec:
            if service["name"] not in skip:
                self.start(service["name"])

    def stop(self) -> None:
        for proc, log in self.procs.values():
            proc.kill()
            proc.wait(timeout=10)
            log.close()
        self.procs.clear()


def health_url(service: dict, env: dict) -> str:
    argv = service["argv"]
    port = argv[argv.index("--port") + 1] if "--port" in argv else env["GATEWAY_PORT"]
    return f"http://127.0.0.1:{port}/health"


def wait_health(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except (OSError, ValueError):
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer")


_HANDED_OUT: set = set()  # ports given to a test but maybe not bound yet


def _bindable(port: int) -> bool:
    if port in _HANDED_OUT:
        return False
    with socket.socket() as sock:
        # Servers bind with SO_REUSEADDR: a port left in TIME_WAIT is free for them.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_block(size: int) -> int:
    """The first port of `size` consecutive free ports below the ephemeral range, where no
    outgoing connection takes a port (a busy machine may hold thousands), none of them handed
    out before by this module."""
    floor = _ephemeral_floor()
    tries = 500
    while tries:
        tries -= 1
        base = random.randrange(20000, floor - size)
        if all(_bindable(base + i) for i in range(size)):
            _HANDED_OUT.update(range(base, base + size))
            return base
    raise RuntimeError(f"no {size} consecutive free ports")


def free_port() -> int:
    """One free port, never one handed out before by this module."""
    return free_block(1)
