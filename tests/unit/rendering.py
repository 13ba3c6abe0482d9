"""Run the real plan+render playbook over an inventory, as an operator would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "tests" / "fixtures" / "playbooks" / "render.yml"
GOLDEN = ROOT / "tests" / "fixtures" / "golden"
INVENTORIES = {
    "tailnet": (ROOT / "inventories" / "tailnet",
                ROOT / "inventories" / "tailnet" / "vault-password.example.txt"),
    "sim-mesh": (ROOT / "tests" / "fixtures" / "inventories" / "sim-mesh", None),
    "cpu-engine": (ROOT / "tests" / "fixtures" / "inventories" / "cpu-engine", None),
}


def run_render(inventory: str, render_root: Path, *extra: str) -> subprocess.CompletedProcess:
    """ansible-playbook plan+render of one inventory into render_root/<host>."""
    source, vault = INVENTORIES[inventory]
    command = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(source),
               str(PLAYBOOK), "-e", f"render_root={render_root}",
               "-e", f"ansible_python_interpreter={sys.executable}", *extra]
    if vault:
        command += ["--vault-password-file", str(vault)]
    env = {**os.environ,
           "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".collections"),
           "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180, check=False)


def recap(output: str) -> dict:
    """host -> {ok, changed, failed, ...} from a PLAY RECAP."""
    hosts = {}
    for line in output.split("PLAY RECAP", 1)[-1].splitlines():
        if ":" not in line or "=" not in line:
            continue
        host, counts = line.split(":", 1)
        hosts[host.strip()] = {key: int(value) for key, value in
                               (item.split("=") for item in counts.split())}
    return hosts
