"""lobes_supervisor finds its processes by what they are: runs that overlap, pidfiles emptied or
lost, and a stranger on a service's port never leave two copies of a service or a process
that down does not stop; one run at a time holds the state directory."""

from __future__ import annotations

import fcntl
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import lobes_processes
import pytest

from tests.support.ports import free_port
from tests.support.wait import wait_until

from .conftest import GATEWAY_SRC, supervisor
from .test_supervisor import SLEEPER, _alive, _gear, _service, _write_services


def census(state_dir: Path) -> tuple[dict, dict]:
    """service -> monitor pids, service -> pids carrying its marks, as /proc shows them."""
    return lobes_processes.deployment(str(state_dir.resolve()))


def one_each(state_dir: Path, names: set) -> bool:
    monitors, started = census(state_dir)
    return (set(monitors) == names and all(len(pids) == 1 for pids in monitors.values())
            and set(started) == names and all(len(pids) == 1 for pids in started.values()))


def _services(tmp_path: Path) -> Path:
    return _write_services(tmp_path, [_gear("gear-cortex", free_port(), []),
                                      _service("sleeper", SLEEPER)])


def _up_in_background(state_dir: Path, services: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "lobes_supervisor", "--state-dir", str(state_dir), "--services",
         str(services), "up"], env={**os.environ, "PYTHONPATH": str(GATEWAY_SRC)},
        stdout=subprocess.PIPE, text=True)


def test_two_ups_started_together_leave_one_monitor_and_one_process_per_service(
        tmp_path, state_dir):
    services = _services(tmp_path)
    runs = [_up_in_background(state_dir, services) for _run in range(2)]
    for run in runs:
        assert run.wait(timeout=120) == 0, run.stdout.read()
    assert one_each(state_dir, {"gear-cortex", "sleeper"}), census(state_dir)
    # The second found the first's services running: it started nothing.
    answer = supervisor(state_dir, "up", services=services)
    assert [row["action"] for row in answer["up"]] == ["unchanged", "unchanged"]


@pytest.mark.parametrize("damage", ["emptied", "lost", "corrupt"])
def test_a_damaged_pidfile_replaces_the_service_and_never_doubles_it(
        tmp_path, state_dir, damage):
    services = _services(tmp_path)
    supervisor(state_dir, "up", services=services)
    (first,) = census(state_dir)[0]["sleeper"]
    pidfile = state_dir / "run" / "sleeper.pid"
    if damage == "lost":
        pidfile.unlink()
    else:
        pidfile.write_text("" if damage == "emptied" else "{not json")

    answer = supervisor(state_dir, "up", services=services)

    assert {row["name"]: row["action"] for row in answer["up"]} == {
        "gear-cortex": "unchanged", "sleeper": "restarted"}
    assert one_each(state_dir, {"gear-cortex", "sleeper"}), census(state_dir)
    assert census(state_dir)[0]["sleeper"] != [first]
    assert supervisor(state_dir, "up", services=services)["up"][1]["action"] == "unchanged"


def test_down_stops_every_process_of_the_deployment_whatever_its_pidfiles_say(
        tmp_path, state_dir):
    services = _services(tmp_path)
    supervisor(state_dir, "up", services=services)
    monitors, started = census(state_dir)
    for path in (state_dir / "run").glob("*.pid"):
        path.unlink()
    # A monitor killed outright leaves its process behind, with no monitor to stop it.
    os.kill(monitors["sleeper"][0], 9)

    answer = supervisor(state_dir, "down")

    assert {row["name"]: row["action"] for row in answer["down"]} == {
        "gear-cortex": "stopped", "sleeper": "stopped"}
    wait_until(lambda: census(state_dir) == ({}, {}), timeout=20,
               message="every process of the deployment to be gone")
    assert not any(_alive(pid) for pids in started.values() for pid in pids)


def test_a_run_waits_while_another_holds_the_state_directory(tmp_path, state_dir):
    services = _services(tmp_path)
    state_dir.mkdir(parents=True)
    with open(state_dir / "deploy.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        run = _up_in_background(state_dir, services)
        with pytest.raises(subprocess.TimeoutExpired):
            run.wait(timeout=2)
        assert census(state_dir) == ({}, {})  # it started nothing while it waited
    assert run.wait(timeout=120) == 0
    assert one_each(state_dir, {"gear-cortex", "sleeper"})


def test_a_run_that_waits_too_long_names_the_holder(tmp_path, state_dir):
    from lobes_supervisor import lock
    from lobes_supervisor.layout import Layout

    layout = Layout(state_dir)
    holder = rf"holds .*deploy.lock \(pid {os.getpid()} "
    with lock.held(layout), pytest.raises(lock.LockTimeout, match=holder), \
            lock.held(layout, wait_s=0.3):
        pytest.fail("two runs held the lock at once")


class _Impostor(http.server.BaseHTTPRequestHandler):
    """Another program on a service's port: healthy on /health, another model on /v1/models."""

    def do_GET(self):
        body = b'{"data": [{"id": "someone-elses-model"}]}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def impostor() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Impostor)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_stranger_answering_the_health_check_is_not_taken_for_the_service(
        tmp_path, state_dir, impostor):
    services = _write_services(tmp_path, [
        {**_gear("gear-cortex", impostor, []), "health_timeout_s": 120},
        _gear("gear-senses", free_port(), ["gear-cortex"])])

    answer = supervisor(state_dir, "up", services=services)

    # The gear cannot bind the port; that is what fails the run, at once, with its log.
    assert answer["failed"] is True
    assert "service 'gear-cortex' exited with 1 before it became healthy" in answer["msg"]
    assert "Address already in use" in answer["msg"]
    assert "those after it were not started (gear-senses)" in answer["msg"]
