"""up / down / status over a state directory: what the CLI and the Ansible module call."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import lobes_processes
from lobes_contract import is_secret_env
from lobes_service_files import (
    EnvFileError,
    Service,
    ServicesError,
    env_file_conflict,
    fingerprint,
    log_quote,
    masked_tail,
    select,
    service_secrets,
)

from . import census, lock, pidfile
from .health import wait_until_healthy
from .layout import Layout

START_TIMEOUT_S = 15.0
_PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)


class SupervisorError(RuntimeError):
    """A service could not be started or stopped; the message names it."""


@dataclass(frozen=True)
class ServiceStatus:
    """One service as the supervisor sees it."""

    name: str
    running: bool
    pid: int | None = None
    child_pid: int | None = None
    child_running: bool = False
    fingerprint: str = ""
    restarts: int = 0
    last_exit: int | None = None
    log: str = ""


@dataclass(frozen=True)
class Action:
    """What up/down did (or, in a dry run, would do) to one service."""

    name: str
    action: str  # started, restarted, stopped, unchanged, absent


def _monitors(layout: Layout) -> dict[str, tuple[Path, pidfile.PidRecord]]:
    """Monitor pidfiles found in the run directory, by service name."""
    found: dict[str, tuple[Path, pidfile.PidRecord]] = {}
    if not layout.run_dir.is_dir():
        return found
    for path in sorted(layout.run_dir.glob("*.pid")):
        record = pidfile.read(path)
        if record is not None and record.kind == "monitor":
            found[record.name] = (path, record)
    return found


def status(layout: Layout, specs: Iterable[Service] = ()) -> list[ServiceStatus]:
    """Every service named in specs or found running in the state directory."""
    monitors = _monitors(layout)
    by_name = {s.name: s for s in specs}
    rows = []
    for name in sorted(set(by_name) | set(monitors) | census.take(layout, monitors).names()):
        _path, record = monitors.get(name, (None, None))
        child = pidfile.read(layout.run_dir / f"{name}.child.pid")
        state = layout.read_state(name)
        spec = by_name.get(name)
        rows.append(
            ServiceStatus(
                name=name,
                running=pidfile.alive(record),
                pid=record.pid if pidfile.alive(record) else None,
                child_pid=child.pid if pidfile.alive(child) else None,
                child_running=pidfile.alive(child),
                fingerprint=record.fingerprint if record else "",
                restarts=state.get("restarts", 0),
                last_exit=state.get("last_exit"),
                log=str(layout.log(spec)) if spec else "",
            )
        )
    return rows


def _check_env_file(spec: Service) -> None:
    """Refuse a service whose .env cannot be parsed, or sets a name its own env sets, before
    its monitor starts."""
    try:
        conflict = env_file_conflict(spec.env_path, spec.env)
    except EnvFileError as exc:
        raise ServicesError(f"service {spec.name!r}: field 'env_file': {exc}") from exc
    if conflict:
        raise ServicesError(f"service {spec.name!r}: field 'env_file': {conflict}")


def _start(spec: Service, layout: Layout, services_file: Path, watch: tuple[str, ...]) -> None:
    layout.ensure()
    # The restart count a health wait reads is this start's, not an earlier monitor's.
    layout.state_file(spec.name).unlink(missing_ok=True)
    env = {"PATH": os.environ.get("PATH", os.defpath), "PYTHONPATH": _PACKAGE_PARENT}
    argv = [
        sys.executable,
        "-m",
        "lobes_supervisor",
        "--state-dir",
        str(layout.state_dir),
        "--services",
        str(services_file),
        *(arg for path in watch for arg in ("--watch", path)),
        "monitor",
        spec.name,
    ]
    with layout.log(spec).open("a") as log:
        # The monitor double-forks: this call returns once it is detached.
        subprocess.run(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=True,
            timeout=START_TIMEOUT_S,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        record = pidfile.read(layout.monitor_pidfile(spec))
        child = pidfile.read(layout.child_pidfile(spec))
        if pidfile.alive(record) and child is not None:
            return
        time.sleep(0.05)
    raise SupervisorError(f"service {spec.name!r}: monitor did not start; "
                          f"{_log_quoted(spec, layout)}")


def wait_healthy(spec: Service, layout: Layout, later: list[str]) -> None:
    """Block until spec's health URL answers 200 from the process started (its start-up peak is
    over); the services listed after it are not started when it does not within its timeout,
    or exits first (a port another program holds, say: its log says so at once)."""
    after = (f"the services already up keep running, those after it were not started "
             f"({', '.join(later) or 'none'})")

    def exited() -> None:
        state = layout.read_state(spec.name)
        if state.get("restarts"):
            raise SupervisorError(
                f"service {spec.name!r} exited with {state.get('last_exit')} before it became "
                f"healthy ({spec.health}); its monitor restarts it; {after}; "
                f"{_log_quoted(spec, layout)}")

    if not wait_until_healthy(spec.health, spec.health_timeout_s, exited,
                              lambda: _answered_by_service(spec, layout)):
        stranger = _stranger(spec, layout)
        raise SupervisorError(
            f"service {spec.name!r} did not become healthy ({spec.health}) within "
            f"{spec.health_timeout_s:g} s{stranger}; {after}; {_log_quoted(spec, layout)}")


def _health_port(spec: Service) -> tuple[str, int | None]:
    parts = urlsplit(spec.health)
    return parts.hostname or "127.0.0.1", parts.port


def _answered_by_service(spec: Service, layout: Layout) -> bool:
    """Whether the socket behind the health URL belongs to the service's own process tree
    (its child leads a session of its own); True where this box cannot tell (no listener in
    this network namespace)."""
    host, port = _health_port(spec)
    if port is None:
        return True
    listeners, holders = lobes_processes.port_holders(port, host)
    if not listeners:
        return True
    child = pidfile.read(layout.child_pidfile(spec))
    return pidfile.alive(child) and any(
        lobes_processes.session(pid) == child.pid for pid in holders)


def _stranger(spec: Service, layout: Layout) -> str:
    """", and what holds its port instead", when another program answers for the service."""
    host, port = _health_port(spec)
    if port is None or _answered_by_service(spec, layout):
        return ""
    _listeners, holders = lobes_processes.port_holders(port, host)
    named = ", ".join(lobes_processes.describe(pid) for pid in sorted(holders))
    return f"; port {port} is held by another program: {named or 'a process of another user'}"


def _log_quoted(spec: Service, layout: Layout) -> str:
    """Where the service's log is and how it ends (secrets masked): the reason, usually."""
    path = layout.log(spec)
    tail = masked_tail(str(path), service_secrets(spec, is_secret_env))
    return log_quote(str(path), tail)


def _stop(layout: Layout, name: str, found: census.Census, path: Path | None) -> bool:
    """Stop every process of a service; whether anything of it was running."""
    was_running = census.stop(layout, name, found)
    if path is not None:
        pidfile.remove(path)
    return was_running


def _one_monitor(found: census.Census, name: str, record: pidfile.PidRecord | None) -> bool:
    """Whether the service runs as it should: exactly the one monitor its pidfile names."""
    return pidfile.alive(record) and [r.pid for r in found.monitors.get(name, [])] == [record.pid]


def up(
    layout: Layout,
    specs: list[Service],
    services_file: Path,
    names: Iterable[str] = (),
    exclude: Iterable[str] = (),
    *,
    watch: tuple[str, ...] = (),
    dry_run: bool = False,
) -> list[Action]:
    """Make the selected specs run (start missing, restart changed) and stop services that
    the services file no longer lists; watch paths are part of every fingerprint. A service
    whose processes are not exactly one monitor its pidfile names (a lost or emptied pidfile,
    runs that overlapped) is stopped whole and started once. Holds the state directory's lock.
    """
    selected = select(specs, names, exclude)
    for spec in selected:
        _check_env_file(spec)
    with lock.held(layout):
        return _up(layout, specs, selected, services_file, watch, dry_run)


def _up(layout: Layout, specs: list[Service], selected: list[Service], services_file: Path,
        watch: tuple[str, ...], dry_run: bool) -> list[Action]:
    monitors = _monitors(layout)
    found = census.take(layout, monitors)
    listed = {s.name for s in specs}
    actions = []
    for name in sorted(found.names() - listed):
        if not dry_run:
            _stop(layout, name, found, monitors.get(name, (None, None))[0])
        actions.append(Action(name, "stopped"))
    # In the file's order, one at a time: a service with a health URL is healthy before the
    # next starts, so the start-up peaks of gears sharing one memory never overlap.
    for position, spec in enumerate(selected):
        path, record = monitors.get(spec.name, (layout.monitor_pidfile(spec), None))
        if _one_monitor(found, spec.name, record) and (
                record.fingerprint == fingerprint(spec, watch)):
            actions.append(Action(spec.name, "unchanged"))
            continue
        verb = "restarted" if found.running(spec.name) else "started"
        if not dry_run:
            _stop(layout, spec.name, found, path)
            _start(spec, layout, services_file, watch)
            if spec.health:
                wait_healthy(spec, layout, [later.name for later in selected[position + 1:]])
        actions.append(Action(spec.name, verb))
    return actions


def down(
    layout: Layout, names: Iterable[str] = (), exclude: Iterable[str] = (), *, dry_run: bool = False
) -> list[Action]:
    """Stop the named services (all found in the state directory when names is empty), every
    process of each, whether a pidfile names it or not. Holds the state directory's lock."""
    with lock.held(layout):
        monitors = _monitors(layout)
        found = census.take(layout, monitors)
        every = sorted(set(monitors) | found.names())
        selected = [n for n in (list(names) or every) if n not in set(exclude)]
        actions = []
        for name in selected:
            running = found.running(name)
            if not dry_run:
                _stop(layout, name, found, monitors.get(name, (None, None))[0])
            actions.append(Action(name, "stopped" if running else "absent"))
        return actions


def restart(
    layout: Layout,
    specs: list[Service],
    services_file: Path,
    names: Iterable[str] = (),
    exclude: Iterable[str] = (),
    *,
    watch: tuple[str, ...] = (),
    dry_run: bool = False,
) -> list[Action]:
    """Stop and start the selected services, whatever their fingerprint."""
    selected = select(specs, names, exclude)
    for spec in selected:
        _check_env_file(spec)
    with lock.held(layout):
        monitors = _monitors(layout)
        found = census.take(layout, monitors)
        for spec in selected:
            if not dry_run:
                _stop(layout, spec.name, found, monitors.get(spec.name, (None, None))[0])
        done = _up(layout, specs, selected, services_file, watch, dry_run)
    return [Action(a.name, "restarted") for a in done if a.action != "stopped"]
