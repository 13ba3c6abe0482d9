"""lobes_supervisor over real processes: start, restart with backoff, identity, stop."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.wait import wait_until

from .conftest import supervisor

# A child that prints its environment and then sleeps; a second spawns a grandchild too.
SLEEPER = (
    "import os,time;print('env', os.environ.get('FROM_FILE'), os.environ.get('FROM_SPEC'));"
    "time.sleep(600)"
)
FAMILY = (
    "import subprocess,sys,time;"
    "p=subprocess.Popen([sys.executable,'-c','import time;time.sleep(600)']);"
    "open('grandchild.pid','w').write(str(p.pid));time.sleep(600)"
)
CRASHER = "import sys;print('crashing');sys.exit(3)"


def _write_services(directory: Path, services: list[dict]) -> Path:
    path = directory / "services.json"
    path.write_text(json.dumps({"services": services}))
    return path


def _service(name: str, code: str, **extra: object) -> dict:
    return {"name": name, "argv": [sys.executable, "-c", code], **extra}


def _status(state_dir: Path) -> dict[str, dict]:
    return {row["name"]: row for row in supervisor(state_dir, "status")["status"]}


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def test_up_runs_services_with_env_file_and_spec_env_and_logs_output(tmp_path, state_dir):
    (tmp_path / "box.env").write_text('# comment\nFROM_FILE="file value"\n')
    services = _write_services(
        tmp_path, [_service("sleeper", SLEEPER, env_file="box.env", env={"FROM_SPEC": "spec"})]
    )

    answer = supervisor(state_dir, "up", services=services)

    assert answer["up"] == [{"name": "sleeper", "action": "started"}]
    row = _status(state_dir)["sleeper"]
    assert row["running"] and row["child_running"]
    assert _alive(row["pid"]) and _alive(row["child_pid"])
    log = state_dir / "log" / "sleeper.log"
    wait_until(lambda: "env file value spec" in log.read_text(), timeout=20,
               message="the sleeper to log both env values")


def test_second_up_is_unchanged_and_a_changed_env_file_restarts(tmp_path, state_dir):
    env_file = tmp_path / "box.env"
    env_file.write_text("FROM_FILE=one\n")
    services = _write_services(tmp_path, [_service("sleeper", SLEEPER, env_file="box.env")])
    supervisor(state_dir, "up", services=services)
    first_child = _status(state_dir)["sleeper"]["child_pid"]

    assert supervisor(state_dir, "up", services=services)["up"][0]["action"] == "unchanged"
    env_file.write_text("FROM_FILE=two\n")
    assert supervisor(state_dir, "up", services=services)["up"][0]["action"] == "restarted"

    wait_until(lambda: not _alive(first_child), timeout=20,
               message="the first child to exit on restart")
    log = state_dir / "log" / "sleeper.log"
    wait_until(lambda: "env two None" in log.read_text(), timeout=20,
               message="the restarted child to log the new env file")


def test_a_watched_directory_change_restarts_but_pycache_does_not(tmp_path, state_dir):
    code = tmp_path / "code"
    (code / "__pycache__").mkdir(parents=True)
    (code / "app.py").write_text("VERSION = 1\n")
    services = _write_services(tmp_path, [_service("sleeper", SLEEPER, watch=["code"])])
    supervisor(state_dir, "up", services=services)

    (code / "__pycache__" / "app.cpython-311.pyc").write_bytes(b"compiled")
    assert supervisor(state_dir, "up", services=services)["up"][0]["action"] == "unchanged"
    (code / "app.py").write_text("VERSION = 2\n")
    assert supervisor(state_dir, "up", services=services)["up"][0]["action"] == "restarted"


def test_an_extra_watch_path_restarts_only_when_its_content_changes(tmp_path, state_dir):
    code = tmp_path / "code"
    code.mkdir()
    (code / "app.py").write_text("VERSION = 1\n")
    services = _write_services(tmp_path, [_service("sleeper", SLEEPER)])
    watch = ("--watch", str(code))
    supervisor(state_dir, *watch, "up", services=services)

    assert supervisor(state_dir, *watch, "up", services=services)["up"][0]["action"] == "unchanged"
    (code / "app.py").write_text("VERSION = 2\n")
    assert supervisor(state_dir, *watch, "up", services=services)["up"][0]["action"] == "restarted"


def test_an_env_file_that_does_not_parse_is_refused_naming_its_line(tmp_path, state_dir):
    (tmp_path / "box.env").write_text("A=1\nnot a pair\n")
    services = _write_services(tmp_path, [_service("sleeper", SLEEPER, env_file="box.env")])

    answer = supervisor(state_dir, "up", services=services)

    assert answer["failed"] is True
    assert "service 'sleeper': field 'env_file'" in answer["msg"]
    assert "box.env, line 2" in answer["msg"]
    assert _status(state_dir) == {}


def test_an_env_file_setting_a_name_of_the_services_env_is_refused(tmp_path, state_dir):
    """systemd lets the file win, Compose and the supervisor the env: a name in both would run
    differently under each runtime, so it is refused, naming it."""
    (tmp_path / "box.env").write_text("A=1\nPYTHONPATH=/elsewhere\n")
    services = _write_services(tmp_path, [_service("sleeper", SLEEPER, env_file="box.env",
                                                   env={"PYTHONPATH": "/srv/lobes/gateway"})])

    answer = supervisor(state_dir, "up", services=services)

    assert answer["failed"] is True
    assert "service 'sleeper': field 'env_file'" in answer["msg"]
    assert "box.env sets PYTHONPATH, which the service's env sets too" in answer["msg"]
    assert _status(state_dir) == {}


def test_a_service_no_longer_listed_is_stopped(tmp_path, state_dir):
    services = _write_services(tmp_path, [_service("keep", SLEEPER), _service("drop", SLEEPER)])
    supervisor(state_dir, "up", services=services)
    dropped_child = _status(state_dir)["drop"]["child_pid"]

    _write_services(tmp_path, [_service("keep", SLEEPER)])
    actions = supervisor(state_dir, "up", services=services)["up"]

    assert {"name": "drop", "action": "stopped"} in actions
    assert {"name": "keep", "action": "unchanged"} in actions
    assert not _alive(dropped_child)


def test_an_exiting_child_is_restarted_with_growing_backoff(tmp_path, state_dir):
    services = _write_services(tmp_path, [_service("crasher", CRASHER)])
    supervisor(state_dir, "up", services=services)
    log = state_dir / "log" / "crasher.log"

    wait_until(lambda: log.read_text().count("crashing") >= 3, timeout=20,
               message="three crashes in the log")

    text = log.read_text()
    assert "exited with 3; restarting in 0.5s" in text
    assert "exited with 3; restarting in 1.0s" in text
    assert _status(state_dir)["crasher"]["restarts"] >= 2
    assert _status(state_dir)["crasher"]["last_exit"] == 3
    assert _status(state_dir)["crasher"]["running"]


def test_a_killed_child_is_replaced_by_a_new_process(tmp_path, state_dir):
    services = _write_services(tmp_path, [_service("sleeper", SLEEPER)])
    supervisor(state_dir, "up", services=services)
    first = _status(state_dir)["sleeper"]["child_pid"]

    os.kill(first, signal.SIGKILL)

    def replaced() -> bool:
        pid = _status(state_dir)["sleeper"]["child_pid"]
        return pid is not None and pid != first

    wait_until(replaced, timeout=20, message="a new child pid")
    assert _status(state_dir)["sleeper"]["restarts"] == 1


def test_down_stops_the_whole_process_group_and_removes_pidfiles(tmp_path, state_dir):
    services = _write_services(tmp_path, [_service("family", FAMILY)])
    supervisor(state_dir, "up", services=services)
    grandchild_file = tmp_path / "grandchild.pid"
    wait_until(lambda: grandchild_file.exists() and grandchild_file.read_text().strip(),
               timeout=20, message="the grandchild to write its pid")
    row = _status(state_dir)["family"]
    grandchild = int(grandchild_file.read_text())

    assert supervisor(state_dir, "down")["down"] == [{"name": "family", "action": "stopped"}]

    for pid in (row["pid"], row["child_pid"], grandchild):
        wait_until(lambda pid=pid: not _alive(pid), timeout=5, message=f"pid {pid} to exit")
    assert list((state_dir / "run").glob("*.pid")) == []
    assert supervisor(state_dir, "down")["down"] == []


def test_down_after_the_monitor_was_killed_still_stops_its_child(tmp_path, state_dir):
    services = _write_services(tmp_path, [_service("sleeper", SLEEPER)])
    supervisor(state_dir, "up", services=services)
    row = _status(state_dir)["sleeper"]

    os.kill(row["pid"], signal.SIGKILL)
    wait_until(lambda: not _alive(row["pid"]), timeout=20,
               message="the killed supervisor to exit")
    assert _status(state_dir)["sleeper"]["running"] is False

    supervisor(state_dir, "down", "sleeper")
    wait_until(lambda: not _alive(row["child_pid"]), timeout=5,
               message="the orphaned child to be stopped")


def test_a_pidfile_whose_pid_was_reused_is_not_taken_for_the_service(tmp_path, state_dir):
    stranger = subprocess.Popen([sys.executable, "-c", "import time;time.sleep(600)"])
    try:
        run_dir = state_dir / "run"
        run_dir.mkdir(parents=True)
        # Same pid, a different kernel start time: what a reused pid looks like.
        record = {
            "pid": stranger.pid,
            "start_ticks": 1,
            "name": "ghost",
            "kind": "monitor",
            "fingerprint": "",
        }
        (run_dir / "ghost.pid").write_text(json.dumps(record))

        assert _status(state_dir)["ghost"]["running"] is False
        supervisor(state_dir, "down", "ghost")
        assert stranger.poll() is None, "down killed a process it does not own"
    finally:
        stranger.kill()
        stranger.wait()


def test_dry_run_reports_without_starting(tmp_path, state_dir):
    services = _write_services(tmp_path, [_service("sleeper", SLEEPER)])

    answer = supervisor(state_dir, "--dry-run", "up", services=services)

    assert answer["up"] == [{"name": "sleeper", "action": "started"}]
    assert _status(state_dir) == {}


def test_exclude_and_names_select_services(tmp_path, state_dir):
    services = _write_services(
        tmp_path, [_service("gateway", SLEEPER), _service("gear-cortex", SLEEPER)]
    )

    gears = supervisor(state_dir, "--exclude", "gateway", "up", services=services)["up"]
    assert gears == [{"name": "gear-cortex", "action": "started"}]
    assert set(_status(state_dir)) == {"gear-cortex"}
    gateway = supervisor(state_dir, "up", "gateway", services=services)["up"]
    assert gateway == [{"name": "gateway", "action": "started"}]


@pytest.mark.parametrize(
    ("services", "message"),
    [
        ([{"argv": ["x"]}], "field 'name'"),
        ([{"name": "a b", "argv": ["x"]}], "may hold only"),
        ([{"name": "a", "argv": []}], "field 'argv'"),
        ([{"name": "a", "argv": ["x"]}, {"name": "a", "argv": ["y"]}], "duplicate"),
        ([{"name": "a", "argv": ["x"], "pidfile": "../a.pid"}], "bare file name"),
    ],
)
def test_a_bad_services_file_is_refused_naming_the_field(tmp_path, state_dir, services, message):
    path = _write_services(tmp_path, services)

    answer = supervisor(state_dir, "up", services=path)

    assert answer["failed"] is True
    assert message in answer["msg"]


# A gear stand-in: notes when it started, takes a moment (its start-up peak), then answers
# /health on its port and notes when it became healthy.
GEAR = (
    "import http.server, sys, time\n"
    "port, name = int(sys.argv[1]), sys.argv[2]\n"
    "open(name + '.started', 'w').write(repr(time.time()))\n"
    "time.sleep(0.5)\n"
    "class Health(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers()\n"
    "    def log_message(self, *args): pass\n"
    "server = http.server.HTTPServer(('127.0.0.1', port), Health)\n"
    "open(name + '.healthy', 'w').write(repr(time.time()))\n"
    "server.serve_forever()\n"
)


def _gear(name: str, port: int, after: list[str], **extra: object) -> dict:
    return {"name": name, "argv": [sys.executable, "-c", GEAR, str(port), name],
            "health": f"http://127.0.0.1:{port}/health", "health_timeout_s": 20,
            "after": after, **extra}


def test_gears_start_one_at_a_time_each_after_the_one_before_is_healthy(tmp_path, state_dir):
    ports = [free_port() for _gear_index in range(3)]
    names = ["gear-cortex", "gear-senses", "gear-embedder"]
    services = _write_services(tmp_path, [
        _gear(name, port, names[:index][-1:]) for index, (name, port) in
        enumerate(zip(names, ports, strict=True))])

    answer = supervisor(state_dir, "up", services=services)

    assert [row["action"] for row in answer["up"]] == ["started"] * 3
    moments = {name: (float((tmp_path / f"{name}.started").read_text()),
                      float((tmp_path / f"{name}.healthy").read_text())) for name in names}
    for earlier, later in itertools.pairwise(names):
        assert moments[later][0] >= moments[earlier][1], (earlier, later, moments)


def test_a_gear_that_never_becomes_healthy_stops_the_sequence_naming_it(tmp_path, state_dir):
    ports = [free_port() for _gear_index in range(2)]
    never = {"name": "gear-senses", "argv": [sys.executable, "-c", SLEEPER],
             "health": f"http://127.0.0.1:{free_port()}/health", "health_timeout_s": 2,
             "after": ["gear-cortex"]}
    services = _write_services(tmp_path, [
        _gear("gear-cortex", ports[0], []), never,
        _gear("gear-embedder", ports[1], ["gear-senses"])])

    answer = supervisor(state_dir, "up", services=services)

    assert answer["failed"] is True
    assert "service 'gear-senses' did not become healthy" in answer["msg"]
    assert "those after it were not started (gear-embedder)" in answer["msg"]
    assert f"its log {state_dir / 'log' / 'gear-senses.log'} ends:" in answer["msg"]
    assert "env None None" in answer["msg"]  # what the service printed: the log's end, quoted
    status = _status(state_dir)
    assert status["gear-cortex"]["running"] and status["gear-senses"]["running"]
    assert "gear-embedder" not in status or not status["gear-embedder"]["running"]
    assert not (tmp_path / "gear-embedder.started").exists()


# A service that cannot start: it prints a reason, its key among other output, and exits.
FAILS_AT_START = (
    "import os,sys;print('starting with key', os.environ['GATEWAY_API_KEY']);"
    "print('client keys', os.environ['GATEWAY_CLIENT_KEYS']);"
    "print('lobes_gateway: GATEWAY_PORT 8000 is in use', file=sys.stderr);sys.exit(2)"
)


def test_a_service_that_exits_before_it_is_healthy_fails_up_with_its_log_secrets_masked(
        tmp_path, state_dir):
    (tmp_path / "box.env").write_text("GATEWAY_API_KEY=sk-box-secret-1\n"
                                      "GATEWAY_CLIENT_KEYS=ci=sk-ci-secret-2:batch\n")
    services = _write_services(tmp_path, [
        {**_service("gateway", FAILS_AT_START, env_file="box.env"),
         "health": f"http://127.0.0.1:{free_port()}/health", "health_timeout_s": 50},
        _gear("gear-late", free_port(), ["gateway"])])

    answer = supervisor(state_dir, "up", services=services)

    assert answer["failed"] is True
    message = answer["msg"]
    # Told at its exit, not after the health timeout, with the exit status and the reason.
    assert "service 'gateway' exited with 2 before it became healthy" in message
    assert "those after it were not started (gear-late)" in message
    assert "lobes_gateway: GATEWAY_PORT 8000 is in use" in message
    assert "starting with key ********" in message
    assert "client keys ********" in message
    assert "sk-box-secret-1" not in message and "sk-ci-secret-2" not in message
    assert not (tmp_path / "gear-late.started").exists()


def test_a_restarted_service_is_not_failed_for_an_earlier_monitors_restarts(
        tmp_path, state_dir):
    port = free_port()
    services = _write_services(tmp_path, [_gear("gear-cortex", port, [])])
    (state_dir / "run").mkdir(parents=True)
    # What a monitor that restarted its child once, long ago, left behind.
    (state_dir / "run" / "gear-cortex.state.json").write_text(
        json.dumps({"restarts": 1, "last_exit": 1}))

    answer = supervisor(state_dir, "up", services=services)

    assert answer["up"] == [{"name": "gear-cortex", "action": "started"}]
