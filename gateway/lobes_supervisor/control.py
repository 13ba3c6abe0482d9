"""up / down / status over a state directory: what the CLI and the Ansible module call."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from lobes_contract import is_secret_env
from lobes_service_files import (
    EnvFileError,
    Service,
    ServicesError,
    fingerprint,
    log_quote,
    masked_tail,
    read_env_file,
    select,
    service_secrets,
)

from . import pidfile
from .health import wait_until_healthy
from .layout import Layout
from .monitor import STOP_GRACE_S, terminate_group

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
    for name in sorted(set(by_name) | set(monitors)):
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
    """Refuse a service whose .env cannot be parsed before its monitor starts."""
    if spec.env_path is not None and os.path.exists(spec.env_path):
        try:
            read_env_file(spec.env_path)
        except EnvFileError as exc:
            raise ServicesError(f"service {spec.name!r}: field 'env_file': {exc}") from exc


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
    """Block until spec's health URL answers 200 (its start-up peak is over); the services
    listed after it are not started when it does not within its timeout, or exits first."""
    after = (f"the services already up keep running, those after it were not started "
             f"({', '.join(later) or 'none'})")

    def exited() -> None:
        state = layout.read_state(spec.name)
        if state.get("restarts"):
            raise SupervisorError(
                f"service {spec.name!r} exited with {state.get('last_exit')} before it became "
                f"healthy ({spec.health}); its monitor restarts it; {after}; "
                f"{_log_quoted(spec, layout)}")

    if not wait_until_healthy(spec.health, spec.health_timeout_s, exited):
        raise SupervisorError(
            f"service {spec.name!r} did not become healthy ({spec.health}) within "
            f"{spec.health_timeout_s:g} s; {after}; {_log_quoted(spec, layout)}")


def _log_quoted(spec: Service, layout: Layout) -> str:
    """Where the service's log is and how it ends (secrets masked): the reason, usually."""
    path = layout.log(spec)
    tail = masked_tail(str(path), service_secrets(spec, is_secret_env))
    return log_quote(str(path), tail)


def _stop(layout: Layout, path: Path, record: pidfile.PidRecord) -> None:
    child_path = layout.run_dir / f"{record.name}.child.pid"
    if pidfile.alive(record):
        os.kill(record.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S + 5
        while pidfile.alive(record) and time.monotonic() < deadline:
            time.sleep(0.05)
        if pidfile.alive(record):
            os.kill(record.pid, signal.SIGKILL)
    child = pidfile.read(child_path)
    if pidfile.alive(child):
        # The monitor was killed before it could stop its child: stop the child's group here.
        terminate_group(child.pid)
    pidfile.remove(child_path)
    pidfile.remove(path)


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
    the services file no longer lists; watch paths are part of every fingerprint."""
    selected = select(specs, names, exclude)
    for spec in selected:
        _check_env_file(spec)
    monitors = _monitors(layout)
    listed = {s.name for s in specs}
    actions = []
    for name, (path, record) in monitors.items():
        if name not in listed and pidfile.alive(record):
            if not dry_run:
                _stop(layout, path, record)
            actions.append(Action(name, "stopped"))
    # In the file's order, one at a time: a service with a health URL is healthy before the
    # next starts, so the start-up peaks of gears sharing one memory never overlap.
    for position, spec in enumerate(selected):
        path, record = monitors.get(spec.name, (layout.monitor_pidfile(spec), None))
        if pidfile.alive(record) and record.fingerprint == fingerprint(spec, watch):
            actions.append(Action(spec.name, "unchanged"))
            continue
        verb = "restarted" if pidfile.alive(record) else "started"
        if not dry_run:
            if record is not None:
                _stop(layout, path, record)
            _start(spec, layout, services_file, watch)
            if spec.health:
                wait_healthy(spec, layout, [later.name for later in selected[position + 1:]])
        actions.append(Action(spec.name, verb))
    return actions


def down(
    layout: Layout, names: Iterable[str] = (), exclude: Iterable[str] = (), *, dry_run: bool = False
) -> list[Action]:
    """Stop the named services (all found in the state directory when names is empty)."""
    monitors = _monitors(layout)
    selected = [n for n in (list(names) or sorted(monitors)) if n not in set(exclude)]
    actions = []
    for name in selected:
        path, record = monitors.get(name, (None, None))
        if record is None or not pidfile.alive(record):
            if record is not None and not dry_run:
                _stop(layout, path, record)
            actions.append(Action(name, "absent"))
            continue
        if not dry_run:
            _stop(layout, path, record)
        actions.append(Action(name, "stopped"))
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
    monitors = _monitors(layout)
    selected = select(specs, names, exclude)
    for spec in selected:
        _check_env_file(spec)
    for spec in selected:
        path, record = monitors.get(spec.name, (None, None))
        if record is not None and not dry_run:
            _stop(layout, path, record)
    done = up(layout, specs, services_file, [s.name for s in selected], watch=watch,
              dry_run=dry_run)
    return [Action(a.name, "restarted") for a in done if a.action != "stopped"]
