"""Free local ports for the processes tests start, and an origin nothing listens on."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

# Test-chosen ports start here; the ephemeral range starts above.
_LOWEST = 20000

_HANDED_OUT: set[int] = set()  # ports given to a test but maybe not bound yet


def _bindable(port: int) -> bool:
    """Whether a server could bind `port` now and it was not handed out before."""
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
    """The lowest port the kernel gives to outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _this_workers_range() -> tuple[int, int]:
    """The ports this process may hand out: under pytest-xdist each worker draws from its own
    slice, so a port one worker's test frees for a moment (a service it restarts) is never
    drawn by another worker's test meanwhile."""
    floor = _ephemeral_floor()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ...
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not (worker.startswith("gw") and worker[2:].isdigit()) or workers < 2:
        return _LOWEST, floor
    span = (floor - _LOWEST) // workers
    low = _LOWEST + int(worker[2:]) % workers * span
    return low, low + span


def free_block(size: int) -> int:
    """The first port of `size` consecutive free ports below the ephemeral range, where no
    outgoing connection takes a port (a busy machine may hold thousands), in this worker's
    slice of it and none of them handed out before by this process."""
    low, high = _this_workers_range()
    for _attempt in range(500):
        base = random.randrange(low, high - size)
        if all(_bindable(base + offset) for offset in range(size)):
            _HANDED_OUT.update(range(base, base + size))
            return base
    raise RuntimeError(f"no {size} consecutive free ports")


def free_port() -> int:
    """One free port, never one handed out before by this process."""
    return free_block(1)


def dead_origin() -> str:
    """An http origin on 127.0.0.1 that nothing listens on."""
    return f"http://127.0.0.1:{free_port()}"
