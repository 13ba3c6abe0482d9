"""mesh_plan as operators run it: through ansible-playbook, with --limit and a broken mesh."""

from __future__ import annotations

import shutil

import yaml

from tests.unit import rendering
from tests.unit.rendering import GOLDEN, run_render


def test_limit_still_plans_the_whole_mesh(tmp_path):
    result = run_render("tailnet", tmp_path, "--limit", "agx-orin")
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["agx-orin"]
    rendered = (tmp_path / "agx-orin" / ".env").read_text()
    assert rendered == (GOLDEN / "tailnet" / "agx-orin" / ".env").read_text()


def test_a_broken_mesh_fails_the_play_naming_host_role_and_field(tmp_path):
    source = rendering.INVENTORIES["sim-mesh"][0]
    broken = tmp_path / "inventory"
    shutil.copytree(source, broken)
    beta = broken / "host_vars" / "beta.yml"
    variables = yaml.safe_load(beta.read_text())
    variables["fleet_roles"]["senses"]["proxy"] = "beta"
    beta.write_text(yaml.safe_dump(variables))
    rendering.INVENTORIES["broken"] = (broken, None)
    try:
        result = run_render("broken", tmp_path / "out")
    finally:
        del rendering.INVENTORIES["broken"]
    assert result.returncode != 0
    assert "host beta, role senses, field proxy: names this box itself" in result.stdout
    assert not (tmp_path / "out").exists()
