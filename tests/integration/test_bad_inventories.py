"""Bad inventories as data (tests/fixtures/bad-inventories.yml), each run through the real
ansible-playbook path: site.yml must refuse it in its plan, before any box is touched, with
the words the case names, and print no traceback, raw templating error or secret."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from .conftest import ROOT, VENV_BIN, ansible_env

CASES = yaml.safe_load((ROOT / "tests" / "fixtures" / "bad-inventories.yml").read_text())
BASES = {"local": ROOT / "inventories" / "local", "tailnet": ROOT / "inventories" / "tailnet"}
VAULT = BASES["tailnet"] / "vault-password.example.txt"
# What an operator must never see, whatever the inventory.
NEVER = ("Traceback", "<<< caused by >>>", "Exception", "Error while resolving")


def _set(variables: dict, path: str, value: object) -> None:
    *parents, name = path.split("/")
    for parent in parents:
        variables = variables.setdefault(parent, {})
    if value is None:
        variables.pop(name, None)
    else:
        variables[name] = value


def build(case: dict, directory: Path) -> Path:
    """The case's inventory: a copy of its base with the case's changes written in."""
    inventory = directory / "inventory"
    shutil.copytree(BASES[case["base"]], inventory)
    if case.get("hosts"):
        (inventory / "hosts.yml").write_text(case["hosts"])
    for host, changes in (case.get("set") or {}).items():
        path = inventory / "host_vars" / f"{host}.yml"
        # Loaded as Ansible does, so the vaulted values stay encrypted text when written back.
        text = path.read_text() if path.exists() else "{}"
        variables = yaml.load(text, Loader=_VaultLoader) or {}
        for name, value in changes.items():
            _set(variables, name, value)
        path.write_text(yaml.dump(variables, Dumper=_VaultDumper, sort_keys=False,
                                  allow_unicode=True))
    return inventory


class _Vaulted(str):
    """An !vault value, kept as its ciphertext."""


class _VaultLoader(yaml.SafeLoader):
    pass


class _VaultDumper(yaml.SafeDumper):
    pass


_VaultLoader.add_constructor("!vault", lambda loader, node: _Vaulted(node.value))
_VaultDumper.add_representer(
    _Vaulted, lambda dumper, value: dumper.represent_scalar("!vault", str(value), style="|"))


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_an_inventory_that_cannot_work_is_refused_in_the_plan(case, tmp_path):
    inventory = build(case, tmp_path)
    command = [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory),
               str(ROOT / "playbooks" / "site.yml"), "--check", "--diff",
               "-e", f"fleet_deploy_dir={tmp_path / 'deploy'}"]
    if case["base"] == "tailnet":
        command += ["--vault-password-file", str(VAULT)]
    run = subprocess.run(command, cwd=ROOT, env=ansible_env(), capture_output=True, text=True,
                         timeout=120, check=False)
    output = run.stdout + run.stderr
    assert run.returncode != 0, output
    assert "the mesh cannot work:" in output and "PLAY [Preflight every box]" not in output, output
    for fragment in case["expect"]:
        assert fragment in output, f"{fragment!r} not in:\n{output}"
    for fragment in [*NEVER, *case.get("absent", [])]:
        assert fragment not in output, f"{fragment!r} in:\n{output}"
    if case.get("secret"):
        assert case["secret"] not in output
