"""The gateway bench names the interpreter its Python proxies run under, and its build: the
CPU figures depend on both (docs/benchmarks.md, "The interpreter's build")."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _procs(call: str) -> str:
    """What bench/procs.py's `call` prints, run by this interpreter with this PATH."""
    code = f"import sys; sys.path.insert(0, {str(BENCH)!r}); import procs; print(procs.{call})"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def test_an_interpreter_is_described_by_its_path_version_and_libpython():
    shared = "/libpython" in Path("/proc/self/maps").read_text()

    described = _procs(f"describe_interpreter({sys.executable!r})")

    build = "shared libpython" if shared else "libpython linked in"
    assert described == f"{sys.executable} ({platform.python_version()}, {build})"


def test_the_distributions_python3_is_found_even_with_a_venv_first_on_path():
    # The tests run with the venv's bin first on PATH, as the benchmarks are run.
    found = _procs("distro_python()")

    assert Path(found).parent in {Path("/usr/bin"), Path("/bin"), Path("/usr/local/bin")}
    assert Path(found).parent != Path(sys.executable).parent
