"""The monitor: one process per service that keeps its child running and restarts it on exit."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TextIO

from lobes_processes import SERVICE_MARK, STATE_DIR_MARK
from lobes_service_files import EnvFileError, Service, fingerprint, read_env_file

from . import pidfile
from .layout import Layout

FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
# A child that ran this long is considered healthy again: the backoff starts over.
STABLE_AFTER_S = 30.0
STOP_GRACE_S = 10.0
LOG_ROTATE_BYTES = 16 * 1024 * 1024


class _Stop:
    requested = False

    def request(self, signum: int, frame: object) -> None:
        self.requested = True


def _note(log: TextIO, message: str) -> None:
    log.write(f"[lobes_supervisor {time.strftime('%Y-%m-%dT%H:%M:%S')}] {message}\n")
    log.flush()


def rotate_log(path: Path) -> None:
    """Keep one older log beside path once it grows past LOG_ROTATE_BYTES."""
    if path.exists() and path.stat().st_size > LOG_ROTATE_BYTES:
        path.replace(path.with_name(path.name + ".1"))


def child_environment(spec: Service, inherited: Mapping[str, str],
                      layout: Layout | None = None) -> dict[str, str]:
    """The child's environment: a few inherited basics, then env_file, then the spec's env,
    then the marks that tie it to its state directory and service (lobes_processes)."""
    env = {k: v for k, v in inherited.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TZ")}
    env.setdefault("PATH", os.defpath)
    env["PYTHONUNBUFFERED"] = "1"
    if spec.env_path is not None:
        env.update(read_env_file(spec.env_path))
    env.update(spec.env)
    if layout is not None:
        env.update({STATE_DIR_MARK: str(layout.state_dir), SERVICE_MARK: spec.name})
    return env


def _spawn(spec: Service, layout: Layout, log: TextIO) -> subprocess.Popen:
    # Its own session, so stopping signals the whole process group the child may grow.
    return subprocess.Popen(
        list(spec.argv),
        cwd=spec.workdir,
        env=child_environment(spec, os.environ, layout),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait(child: subprocess.Popen, stop: _Stop) -> int | None:
    while not stop.requested:
        try:
            return child.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            continue
    return None


def _sleep(seconds: float, stop: _Stop) -> None:
    deadline = time.monotonic() + seconds
    while not stop.requested and time.monotonic() < deadline:
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


def _group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def terminate_group(
    pid: int, grace_s: float = STOP_GRACE_S, exited: Callable[[], bool] | None = None
) -> None:
    """SIGTERM the process group led by pid, then SIGKILL whatever is left after grace_s.

    exited tells whether the group leader is gone; the default probes the group, which a
    zombie leader keeps alive, so a parent passes its own reaping check instead.
    """
    gone = exited or (lambda: not _group_alive(pid))
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if gone():
            break
        time.sleep(0.05)
    # Anything left in the group (the leader's own children too) gets no more grace.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def run(spec: Service, layout: Layout, extra_watch: Iterable[str] = ()) -> int:
    """Supervise spec until SIGTERM/SIGINT; returns the exit status for the monitor."""
    stop = _Stop()
    signal.signal(signal.SIGTERM, stop.request)
    signal.signal(signal.SIGINT, stop.request)
    log_path = layout.log(spec)
    rotate_log(log_path)
    with log_path.open("a", buffering=1) as log:
        pidfile.write(
            layout.monitor_pidfile(spec),
            pidfile.record_for(os.getpid(), spec.name, "monitor", fingerprint(spec, extra_watch)),
        )
        try:
            _supervise(spec, layout, log, stop)
        finally:
            pidfile.remove(layout.child_pidfile(spec))
            pidfile.remove_own(layout.monitor_pidfile(spec), os.getpid())
            _note(log, f"{spec.name}: monitor stopped")
    return 0


def _supervise(spec: Service, layout: Layout, log: TextIO, stop: _Stop) -> None:
    backoff = FIRST_BACKOFF_S
    restarts = 0
    # The exit that caused the latest restart: kept while the next child runs, so a reader
    # (status, a health wait) sees why it restarted whenever it looks.
    last_exit: int | None = None
    while not stop.requested:
        started = time.monotonic()
        try:
            child = _spawn(spec, layout, log)
        except (OSError, EnvFileError) as exc:
            _note(log, f"{spec.name}: cannot start {spec.argv[0]!r}: {exc}")
            exit_code: int | None = 127
        else:
            pidfile.write(layout.child_pidfile(spec), _child_record(child.pid, spec))
            layout.write_state(spec, restarts=restarts, last_exit=last_exit)
            _note(log, f"{spec.name}: started pid {child.pid} (restart #{restarts})")
            exit_code = _wait(child, stop)
            if exit_code is None:
                terminate_group(child.pid, exited=lambda c=child: c.poll() is not None)
                child.wait()
                return
        if time.monotonic() - started >= STABLE_AFTER_S:
            backoff = FIRST_BACKOFF_S
        restarts += 1
        last_exit = exit_code
        layout.write_state(spec, restarts=restarts, last_exit=exit_code)
        _note(log, f"{spec.name}: exited with {exit_code}; restarting in {backoff:.1f}s")
        _sleep(backoff, stop)
        backoff = min(backoff * 2, MAX_BACKOFF_S)


def _child_record(pid: int, spec: Service) -> pidfile.PidRecord:
    try:
        return pidfile.record_for(pid, spec.name, "child")
    except ProcessLookupError:
        # Exited before we looked: record it anyway; alive() will read it as gone.
        return pidfile.PidRecord(pid=pid, start_ticks=-1, name=spec.name, kind="child")
