"""Start the real vLLM CPU build for tests: its own session, a readiness wait, and a stop that
ends each of its processes by pid and removes the shared memory it left.

    from tests.support.vllm_proc import start_vllm, engine_install

    install = engine_install()          # venv and tiny models (scripts/vllm-cpu.sh builds them)
    with start_vllm(argv, port, env) as engine:   # argv: the API server's, listening on port
        engine.url                      # http://127.0.0.1:PORT  (origin, no /v1)
        engine.process_named("VLLM::EngineCor")   # a pid of its engine core

The server runs in a session of its own: its engine core, worker and resource tracker are the
processes of that session, so a stop ends exactly those, whatever a fault left running.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.wait import http_ok

ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
# Start to /health is 25 to 40 s on the 2-core machine; a busy one takes longer.
START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 15.0
ENGINE_NICENESS = 10
SHM = Path("/dev/shm")
_LIVE: set[VllmProcess] = set()


class VllmStartError(RuntimeError):
    """The engine did not come up; the message carries the end of its log."""


@dataclass(frozen=True)
class EngineInstall:
    """Where scripts/vllm-cpu.sh put the engine's venv (<engine_dir>/<build>/venv, as on a
    box) and the tiny models (<model_dir>/lobes/tiny-chat and tiny-embed, as on a box)."""

    venv: Path
    model_dir: Path

    @property
    def engine_dir(self) -> Path:
        return self.venv.parent.parent

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


def engine_install() -> EngineInstall:
    """The cached venv and models, built by scripts/vllm-cpu.sh where absent (minutes)."""
    def run(what: str) -> Path:
        done = subprocess.run(["bash", str(ROOT / "scripts" / "vllm-cpu.sh"), what],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"scripts/vllm-cpu.sh {what} failed:\n{done.stderr[-4000:]}")
        return Path(done.stdout.strip().splitlines()[-1])

    return EngineInstall(venv=run("venv"), model_dir=run("models"))


def _session_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: fields follow the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[3])


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _shm_segments() -> set[str]:
    return {path.name for path in SHM.glob("psm_*")} if SHM.is_dir() else set()


def _mapped_segments() -> set[str]:
    """The psm_* segments some process still maps."""
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        with contextlib.suppress(OSError):
            mapped.update(word.rsplit("/", 1)[1] for word in maps.read_text().split()
                          if word.startswith("/dev/shm/psm_"))
    return mapped


class VllmProcess:
    """A running `python -m vllm.entrypoints.openai.api_server`, in its own session."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path,
                 shm_before: set[str]) -> None:
        self.process = process
        self.port = port
        self.log = log
        self._shm_before = shm_before

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def pids(self) -> list[int]:
        """Every live process of the engine's session: API server, engine core, worker,
        resource tracker."""
        return [int(entry.name) for entry in Path("/proc").iterdir()
                if entry.name.isdigit() and _session_of(int(entry.name)) == self.pid]

    def process_named(self, prefix: str) -> int:
        """The pid of the engine's process whose name starts with `prefix`."""
        for pid in self.pids():
            if _comm(pid).startswith(prefix):
                return pid
        raise LookupError(f"no {prefix} process in the engine's session: "
                          f"{[(pid, _comm(pid)) for pid in self.pids()]}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def signal_all(self, signum: int) -> None:
        """Send `signum` to each process of the engine, by pid."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def stop(self) -> None:
        """SIGTERM each process, SIGKILL what is left, then remove the shared-memory segments
        this run made that nothing maps any more. Safe to call twice."""
        self.signal_all(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.signal_all(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=STOP_TIMEOUT_S)
        leftover = _shm_segments() - self._shm_before - _mapped_segments()
        for name in leftover:
            with contextlib.suppress(OSError):
                (SHM / name).unlink()
        _LIVE.discard(self)

    def __enter__(self) -> VllmProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_vllm(argv: Sequence[str], port: int, env: dict[str, str] | None = None) -> VllmProcess:
    """Start the API server `argv` (listening on `port`) and wait for its /health."""
    full_env = {**os.environ, **(env or {})}
    with tempfile.NamedTemporaryFile(prefix="vllm_", suffix=".log", delete=False) as log:
        shm_before = _shm_segments()
        # Below the tests that drive it: on a 2-core host the engine's threads would otherwise
        # starve a test's reader and the gateway in front of it for seconds at a time.
        process = subprocess.Popen(["nice", "-n", str(ENGINE_NICENESS), *argv], stdout=log,
                                   stderr=subprocess.STDOUT, env=full_env,
                                   start_new_session=True, cwd=tempfile.gettempdir())
    engine = VllmProcess(process, port, Path(log.name), shm_before)
    _LIVE.add(engine)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not http_ok(f"{engine.url}/health"):
        if not engine.alive() or time.monotonic() > deadline:
            tail = engine.output()[-6000:]
            engine.stop()
            raise VllmStartError(f"vLLM did not become ready: {' '.join(argv)}\n{tail}")
        time.sleep(0.5)
    return engine


@atexit.register
def _stop_leftovers() -> None:
    """Last resort: no engine outlives the test session."""
    for engine in list(_LIVE):
        engine.stop()
