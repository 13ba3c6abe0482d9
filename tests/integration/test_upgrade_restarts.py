"""The first site.yml after an upgrade of the collection restarts only what runs changed code.

The local default is deployed, then deployed again from a newer gateway source with the same
inventory (gateway_source_dir stands in for the upgraded collection's gateway/): a change to
code no service runs (the model tools, the supervisor) restarts nothing, a change to the
gateway restarts the gateway alone, a change to the simulator restarts the gears alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .conftest import GATEWAY_SRC
from .test_playbooks import LocalMesh, _ok

GEARS = {"gear-cortex", "gear-senses", "gear-embedder", "gear-reranker"}


def _upgrade(source: Path, *changed: str) -> None:
    """A newer gateway source: the given files (relative to gateway/) changed."""
    for name in changed:
        with (source / name).open("a") as handle:
            handle.write("\n# changed by the upgrade\n")


def _restarted(before: dict[str, int], after: dict[str, int]) -> set[str]:
    assert set(after) == set(before)
    return {name for name in before if before[name] != after[name]}


@pytest.mark.slow
def test_an_upgrade_restarts_only_the_services_whose_code_changed(
        mesh: LocalMesh) -> None:
    _ok(mesh.playbook("site.yml"))
    newer = mesh.deploy_dir.parent / "newer-gateway"
    shutil.copytree(GATEWAY_SRC, newer, ignore=shutil.ignore_patterns("__pycache__"))
    steps = (
        (("lobes_model_serve.py", "lobes_supervisor/census.py"), set()),
        (("lobes_gateway/__main__.py",), {"gateway"}),
        (("lobes_sim/__main__.py",), GEARS),
    )
    for changed, restarted in steps:
        before = mesh.processes()
        _upgrade(newer, *changed)
        assert _ok(mesh.playbook("site.yml", "-e", f"gateway_source_dir={newer}"))["changed"] > 0
        assert _restarted(before, mesh.processes()) == restarted, changed
