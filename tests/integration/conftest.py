"""Fixtures for tests that start real supervised processes and run ansible on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GATEWAY_SRC = ROOT / "gateway"
VENV_BIN = Path(sys.executable).parent


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


@pytest.fixture
def mesh(tmp_path: Path):
    """A copy of inventories/local on the test's own ports and deploy directory (LocalMesh)."""
    # Imported here: the test module that defines it imports this one.
    from .test_playbooks import LocalMesh  # pylint: disable=import-outside-toplevel

    deployed = LocalMesh(tmp_path)
    yield deployed
    # Whatever the test did, nothing it started outlives it.
    supervisor(deployed.deploy_dir / "state", "down")
