"""Fixtures for tests that start real supervised processes and run ansible on this machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
GATEWAY_SRC = ROOT / "gateway"
VENV_BIN = Path(sys.executable).parent
REGISTRY = shutil.which("docker-registry") or "/usr/bin/docker-registry"


def supervisor(state_dir: Path, *args: str, services: Path | None = None) -> dict:
    """Run python3 -m lobes_supervisor and return its JSON answer."""
    argv = [sys.executable, "-m", "lobes_supervisor", "--state-dir", str(state_dir)]
    if services is not None:
        argv += ["--services", str(services)]
    done = subprocess.run(
        [*argv, *args],
        env={**os.environ, "PYTHONPATH": str(GATEWAY_SRC)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """A supervisor state directory whose services are all stopped at teardown."""
    state = tmp_path / "state"
    yield state
    supervisor(state, "down")


def ansible_env() -> dict[str, str]:
    """The environment for ansible commands: this venv first, the collection on its path."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["ANSIBLE_COLLECTIONS_PATH"] = str(ROOT / ".collections")
    env["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
    env["ANSIBLE_NOCOLOR"] = "1"
    env["ANSIBLE_FORCE_COLOR"] = "0"
    return env


def ansible_module(module: str, args: str, *, check: bool = False,
                   env: dict[str, str] | None = None) -> dict:
    """Run one module on localhost through ansible and return its result."""
    argv = [
        str(VENV_BIN / "ansible"),
        "localhost",
        "-m",
        module,
        "-a",
        args,
        "--diff",
        "-e",
        f"ansible_python_interpreter={sys.executable}",
    ]
    if check:
        argv.append("--check")
    env = {
        **ansible_env(),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
        **(env or {}),
    }
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    return json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def run(*argv: str, timeout: float = 300, cwd: Path | None = None) -> str:
    """Run a command that must succeed; its stdout."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=cwd)
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def engine() -> None:
    """The Docker engine and the base image; scripts/engine.sh skips what is there already. It
    stays up: tests in other workers may use it, and scripts/test.sh stops an engine it did not
    find running when it ends."""
    run("bash", str(ROOT / "scripts" / "engine.sh"), "up", timeout=1200)


@pytest.fixture(scope="module")
def registry(tmp_path_factory, engine) -> str:
    """A distribution registry on 127.0.0.1 (Docker trusts loopback registries over plain
    HTTP); its address."""
    if not Path(REGISTRY).exists():
        run("bash", str(ROOT / "scripts" / "tools.sh"), timeout=900)
    root = tmp_path_factory.mktemp("registry")
    address = f"127.0.0.1:{free_port()}"
    config = root / "config.yml"
    config.write_text(yaml.safe_dump({
        "version": 0.1, "log": {"level": "error"},
        "storage": {"filesystem": {"rootdirectory": str(root / "data")}},
        "http": {"addr": address}}))
    process = subprocess.Popen([REGISTRY, "serve", str(config)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{address}/v2/", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the registry did not answer"
                time.sleep(0.2)
        yield address
    finally:
        process.terminate()
        process.wait(timeout=30)


def _has_link(name: str) -> bool:
    """Whether this machine's network namespace has the interface `name`."""
    return subprocess.run(["ip", "link", "show", name], capture_output=True, timeout=30,
                          check=False).returncode == 0


@pytest.fixture(scope="module")
def second_engine(engine) -> Iterator[str]:
    """A second Docker daemon of its own (data root, exec root, socket; no bridge, no iptables
    rules), for a box that shares nothing with the first engine but the kernel: its
    DOCKER_HOST. Stopped, and its directories removed, after the module's tests."""
    # A short directory: the daemon's sockets live under it, and a socket path is <= 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="lobes-d2-", dir="/tmp"))
    host = f"unix://{root}/docker.sock"
    log = open(root / "dockerd.log", "wb")  # noqa: SIM115 - open for the daemon's lifetime
    # In a network namespace of its own: a dockerd with --bridge=none deletes the host's
    # docker0 when it starts, and the first engine's containers lost their network (measured).
    bridge_before = _has_link("docker0")
    daemon = subprocess.Popen(
        ["unshare", "--net", "--",
         "dockerd", "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
         "--pidfile", str(root / "dockerd.pid"), "--host", host, "--bridge=none",
         "--iptables=false", "--ip-masq=false", "--ip-forward=false"],
        stdout=log, stderr=subprocess.STDOUT)
    env = {**os.environ, "DOCKER_HOST": host}
    try:
        deadline = time.monotonic() + 60
        while subprocess.run(["docker", "info"], env=env, capture_output=True, timeout=30,
                             check=False).returncode != 0:
            assert daemon.poll() is None, (root / "dockerd.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the second dockerd did not answer"
            time.sleep(0.3)
        assert _has_link("docker0") == bridge_before, "the second dockerd changed docker0"
        yield host
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def mesh(tmp_path: Path):
    """A copy of inventories/local on the test's own ports and deploy directory (LocalMesh)."""
    # Imported here: the test module that defines it imports this one.
    from .test_playbooks import LocalMesh  # pylint: disable=import-outside-toplevel

    deployed = LocalMesh(tmp_path)
    yield deployed
    # Whatever the test did, nothing it started outlives it.
    supervisor(deployed.deploy_dir / "state", "down")
