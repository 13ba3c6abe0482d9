"""The programs that run on a box (the gateway, the simulator, the supervisor and the contract
they share) run on Python 3.10: the Jetson boxes' Ubuntu 22.04 ships it, while the tests run on
3.11. vermin reads every module for syntax and standard-library names newer than that."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BOX_SIDE = Path(__file__).resolve().parents[2] / "gateway"
OLDEST_BOX_PYTHON = "3.10"
# vermin's command, installed beside the tests' interpreter (requirements-dev.txt).
VERMIN = Path(sys.executable).with_name("vermin")


def _vermin(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VERMIN), f"-t={OLDEST_BOX_PYTHON}-",
                           "--violations", "--eval-annotations", "--no-tips", "--no-config-file",
                           *map(str, paths)], capture_output=True, text=True, check=False)


def test_the_box_side_programs_need_nothing_newer_than_python_3_10():
    checked = _vermin(BOX_SIDE)
    assert checked.returncode == 0, (
        f"a box-side module needs a Python newer than {OLDEST_BOX_PYTHON} (the Jetson boxes' "
        f"Ubuntu 22.04); use what {OLDEST_BOX_PYTHON} has:\n{checked.stdout}{checked.stderr}")


def test_the_check_refuses_what_python_3_10_lacks(tmp_path):
    newer = tmp_path / "newer.py"
    newer.write_text("import asyncio\n\n\nasync def wait():\n"
                     "    async with asyncio.timeout(1):\n        pass\n")
    checked = _vermin(newer)
    assert checked.returncode != 0
    assert "asyncio.timeout" in checked.stdout
