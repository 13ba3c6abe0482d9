"""The built collection ships the collection and nothing a run wrote: no rendered .env (keys),
log, pidfile or bytecode, even when built from a working tree right after site-local.sh."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECRET = f"built-tree-secret-{uuid.uuid4().hex}"  # made per run: no file holds it
_NOT_COPIED = shutil.ignore_patterns(".git", ".venv", ".collections", "tests/output")


def _run_leftovers(tree: Path) -> None:
    """What scripts/site-local.sh and the tests leave in a working tree."""
    state = tree / ".state" / "local"
    (state / "state").mkdir(parents=True, exist_ok=True)
    (state / ".env").write_text(f"GATEWAY_API_KEY={SECRET}\n")
    (state / "state" / "gateway.log").write_text(f"started with {SECRET}\n")
    (state / "state" / "gateway.pid").write_text("4242 17\n")
    cache = tree / "gateway" / "lobes_gateway" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "stale.cpython-311.pyc").write_bytes(b"\0")


def test_the_package_leaves_out_everything_a_run_writes(tmp_path):
    tree = tmp_path / "fleet"
    shutil.copytree(ROOT, tree, symlinks=True, ignore=_NOT_COPIED)
    _run_leftovers(tree)
    galaxy = Path(sys.executable).parent / "ansible-galaxy"
    subprocess.run([str(galaxy), "collection", "build", str(tree), "--output-path",
                    str(tmp_path)], check=True, capture_output=True, text=True, timeout=120)
    (package,) = tmp_path.glob("lobes-fleet-*.tar.gz")
    with tarfile.open(package) as archive:
        names = archive.getnames()
        leaked = [m.name for m in archive.getmembers()
                  if m.isfile() and SECRET.encode() in archive.extractfile(m).read()]
    assert leaked == []
    assert [n for n in names if n.startswith(".state") or n.endswith((".pyc", ".log", ".pid"))
            or Path(n).name == ".env"] == []
    # What the package is for is in it: the module_utils contract and the box-side programs.
    assert {"plugins/module_utils/contract.py", "gateway/lobes_contract.py",
            "gateway/lobes_gateway/app/dispatch.py", "roles/services/tasks/up.yml"} <= set(names)


def test_the_metadata_names_no_placeholder_address():
    """A package must not point its users at an address that does not exist: the repository
    and other links are given only when real (Galaxy makes them optional)."""
    text = (ROOT / "galaxy.yml").read_text()
    for placeholder in ("example.invalid", "example.com", "example.org", "TODO", "CHANGEME"):
        assert placeholder not in text
