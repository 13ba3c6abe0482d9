"""docs/getting-started.md, run: every checked command of the guide against this scenario's
three boxes (the tailnet example mesh the guide copies), each printing what the guide shows; the
three failures it shows are made for real in a copy of the inventory and print what it says."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from guide import BREAKS, GUIDE_INVENTORY, copy_inventory, missing_lines, read_steps

ROOT = Path(__file__).resolve().parents[4]
GUIDE = ROOT / "docs" / "getting-started.md"
STEPS = read_steps(GUIDE)


def test_the_guide_checks_the_path_and_the_three_failures() -> None:
    """A guide whose checks were dropped would pass anything: the path and each failure stay."""
    commands = " ".join(step.command for step in STEPS)
    for playbook in ("site.yml --check --diff", "site.yml --diff", "verify.yml", "status.yml"):
        assert playbook in commands, playbook
    assert sorted(step.failure for step in STEPS if step.failure) == sorted(BREAKS)
    assert all(step.expected for step in STEPS), "a checked command without what it shows"


@pytest.mark.parametrize("step", STEPS, ids=[f"line-{step.line}" for step in STEPS])
def test_the_guide_command_prints_what_the_guide_shows(step, tmp_path: Path) -> None:
    inventory = Path(os.environ["LOBES_MESH_INVENTORY"])
    if step.failure:
        inventory = copy_inventory(inventory, tmp_path / "mymesh")
        BREAKS[step.failure](inventory)
    argv = [str(inventory) if word == GUIDE_INVENTORY else word
            for word in shlex.split(step.command)]
    assert str(inventory) in argv, f"line {step.line}: the command names no {GUIDE_INVENTORY}"
    # As a person's terminal reads it, less the colours (molecule forces them on).
    env = {name: value for name, value in os.environ.items() if name != "ANSIBLE_FORCE_COLOR"}
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          check=False, env={**env, "ANSIBLE_NOCOLOR": "1"})
    output = done.stdout + done.stderr
    assert (done.returncode != 0) == bool(step.failure), output[-4000:]
    missing = missing_lines(step.expected, output)
    assert not missing, f"line {step.line}: not printed: {missing}\n{output[-4000:]}"
