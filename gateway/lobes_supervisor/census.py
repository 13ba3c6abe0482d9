"""Every process of a deployment, found by what it is, not only by its pidfiles.

A pidfile can be lost or emptied, and runs that overlapped before the lock existed could each
have recorded a monitor of their own. A monitor is recognised by its command line (python -m
lobes_supervisor --state-dir DIR ... monitor NAME) and a service's processes by the marks their
environment carries (lobes_processes), so a rerun sees every process of a service: it keeps one
monitor per service, never starts a second beside it, and down leaves nothing running.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field

import lobes_processes

from . import pidfile
from .layout import Layout
from .monitor import STOP_GRACE_S


@dataclass(frozen=True)
class Census:
    """The live processes of a state directory, by service."""

    monitors: dict = field(default_factory=dict)  # name -> [PidRecord] of monitor processes
    started: dict = field(default_factory=dict)  # name -> [PidRecord] of marked processes

    def names(self) -> set:
        return set(self.monitors) | set(self.started)

    def running(self, name: str) -> bool:
        return bool(self.monitors.get(name) or self.started.get(name))


def _records(pids: list, name: str, kind: str) -> list:
    records = []
    for pid in pids:
        try:
            records.append(pidfile.record_for(pid, name, kind))
        except ProcessLookupError:
            continue  # gone since the scan
    return records


def take(layout: Layout, recorded: dict) -> Census:
    """What runs of this state directory now: its monitors (found, and those its pidfiles
    name, for a /proc whose command lines this user cannot read) and its marked processes."""
    monitors, started = lobes_processes.deployment(str(layout.state_dir))
    found = {name: _records(pids, name, "monitor") for name, pids in monitors.items()}
    for name, (_path, record) in recorded.items():
        if pidfile.alive(record) and record.pid not in {r.pid for r in found.get(name, [])}:
            found.setdefault(name, []).append(record)
    marked = {name: _records(pids, name, "child") for name, pids in started.items()}
    return Census({k: v for k, v in found.items() if v}, {k: v for k, v in marked.items() if v})


def _signal(records: list, signum: int) -> None:
    for record in records:
        if pidfile.alive(record):
            try:
                os.kill(record.pid, signum)
            except ProcessLookupError:
                continue


def _wait_gone(records: list, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while any(pidfile.alive(r) for r in records) and time.monotonic() < deadline:
        time.sleep(0.05)


def stop(layout: Layout, name: str, census: Census) -> bool:
    """Stop every process of a service: its monitors first (each stops its own child), then
    whatever still carries the service's marks. Whether anything was running."""
    monitors = census.monitors.get(name, [])
    _signal(monitors, signal.SIGTERM)
    _wait_gone(monitors, STOP_GRACE_S + 5)
    _signal(monitors, signal.SIGKILL)
    # Left behind by a monitor that was killed before it could stop them, or that never got
    # to: the marks say whose they are.
    leftovers = take(layout, {}).started.get(name, [])
    child = pidfile.read(layout.run_dir / f"{name}.child.pid")
    if pidfile.alive(child) and child.pid not in {r.pid for r in leftovers}:
        leftovers.append(child)
    _signal(leftovers, signal.SIGTERM)
    _wait_gone(leftovers, STOP_GRACE_S)
    _signal(leftovers, signal.SIGKILL)
    _wait_gone(monitors + leftovers, 5)
    for path in (layout.run_dir / f"{name}.pid", layout.run_dir / f"{name}.child.pid"):
        pidfile.remove(path)
    return bool(monitors or census.started.get(name))
