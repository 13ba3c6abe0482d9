"""lobes_supervisor.logwrap, a container's main process, over real processes: output kept in
the box's log across starts, signals passed on, the command's exit status returned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.wait import wait_until

from .conftest import GATEWAY_SRC


def logwrap(log: Path, code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "lobes_supervisor.logwrap", str(log), "--",
         sys.executable, "-u", "-c", code],
        env={**os.environ, "PYTHONPATH": str(GATEWAY_SRC)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_output_goes_to_stdout_and_is_appended_to_the_log_on_every_start(tmp_path):
    log = tmp_path / "log" / "vllm-cortex.log"
    for boot in ("first", "second"):
        run = logwrap(log, f"import sys; print('{boot} boot'); "
                           "print('Traceback: boom', file=sys.stderr); sys.exit(3)")
        out, _err = run.communicate(timeout=30)
        assert run.returncode == 3
        assert out.splitlines() == [f"{boot} boot", "Traceback: boom"]
    text = log.read_text()
    assert text.count("started: ") == 2 and text.count("exited with status 3") == 2
    assert text.index("first boot") < text.index("second boot")
    assert "Traceback: boom" in text


def test_a_stop_signal_reaches_the_command_and_its_status_comes_back(tmp_path):
    log = tmp_path / "gateway.log"
    run = logwrap(log, "import signal, sys, time\n"
                       "def drain(*args): print('draining'); sys.exit(0)\n"
                       "signal.signal(signal.SIGTERM, drain)\n"
                       "print('ready'); time.sleep(60)")
    assert run.stdout.readline().strip() == "ready"
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=30) == 0
    wait_until(lambda: "exited with status 0" in log.read_text(),
               message="logwrap marks the exit in the log")
    assert "draining" in log.read_text()


def test_a_command_killed_by_a_signal_exits_128_plus_the_signal(tmp_path):
    run = logwrap(tmp_path / "gear.log", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    run.communicate(timeout=30)
    assert run.returncode == 128 + signal.SIGKILL


def test_without_a_command_it_prints_its_usage(tmp_path):
    run = subprocess.run([sys.executable, "-m", "lobes_supervisor.logwrap", str(tmp_path / "x")],
                         env={**os.environ, "PYTHONPATH": str(GATEWAY_SRC)},
                         capture_output=True, text=True, timeout=30, check=False)
    assert run.returncode == 2 and "usage:" in run.stderr
