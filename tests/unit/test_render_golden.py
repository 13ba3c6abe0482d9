"""render over the real playbook: the tailnet, sim-mesh and cpu-engine files match the golden
files, a second run changes nothing, and .env is private. LOBES_UPDATE_GOLDEN=1 rewrites the
golden files from the current render (review the diff before committing)."""

from __future__ import annotations

import os
import shutil
import stat
from types import SimpleNamespace

import pytest

from tests.unit.rendering import GOLDEN, INVENTORIES, recap, run_render

HOSTS = {"tailnet": ("agx-orin", "agx-thor", "spark"), "sim-mesh": ("alpha", "beta"),
         "cpu-engine": ("gamma",)}
FILES = {"tailnet": (".env", "compose.yaml"), "sim-mesh": (".env", "services.json"),
         "cpu-engine": (".env", "services.json")}


@pytest.fixture(scope="module", params=sorted(INVENTORIES))
def rendered(request, tmp_path_factory):
    inventory = request.param
    root = tmp_path_factory.mktemp(f"render-{inventory}")
    first = run_render(inventory, root)
    assert first.returncode == 0, first.stdout + first.stderr
    second = run_render(inventory, root)
    assert second.returncode == 0, second.stdout + second.stderr
    if os.environ.get("LOBES_UPDATE_GOLDEN"):
        for host in HOSTS[inventory]:
            target = GOLDEN / inventory / host
            target.mkdir(parents=True, exist_ok=True)
            for name in FILES[inventory]:
                shutil.copyfile(root / host / name, target / name)
    return SimpleNamespace(inventory=inventory, root=root, first=recap(first.stdout),
                           second=recap(second.stdout))


def test_every_file_matches_its_golden(rendered):
    inventory, root = rendered.inventory, rendered.root
    for host in HOSTS[inventory]:
        produced = sorted(path.name for path in (root / host).iterdir())
        assert produced == sorted(FILES[inventory])
        for name in FILES[inventory]:
            golden = (GOLDEN / inventory / host / name).read_text()
            assert (root / host / name).read_text() == golden, f"{inventory}/{host}/{name}"


def test_first_run_changes_second_run_does_not(rendered):
    first, second = rendered.first, rendered.second
    for host in HOSTS[rendered.inventory]:
        assert first[host]["changed"] == 1 and first[host]["failed"] == 0
        assert second[host]["changed"] == 0, second


def test_env_is_private_and_the_rest_readable(rendered):
    inventory, root = rendered.inventory, rendered.root
    for host in HOSTS[inventory]:
        assert stat.S_IMODE((root / host / ".env").stat().st_mode) == 0o600
        other = FILES[inventory][1]
        assert stat.S_IMODE((root / host / other).stat().st_mode) == 0o644


def test_keys_are_pairwise_in_the_tailnet_goldens():
    """Each box carries the PEER's inbound key, never its own, for what it dials."""
    orin = (GOLDEN / "tailnet" / "agx-orin" / ".env").read_text()
    spark_key = "example-spark-inbound-7f3a9c1e"
    assert f"PRIMARY_PEER_API_KEY={spark_key}" in orin
    assert f"MULTIMODAL_PEER_API_KEY={spark_key}" in orin
    assert orin.count("example-orin-inbound") == 1  # only as its own GATEWAY_API_KEY
    thor = (GOLDEN / "tailnet" / "agx-thor" / ".env").read_text()
    assert "GATEWAY_API_KEY" not in thor  # seed 000: the Thor runs no inbound gate
    assert f"PRIMARY_PEER_API_KEYS={spark_key}" in thor


def test_a_vault_less_run_cannot_read_the_tailnet_keys(tmp_path):
    from tests.unit import rendering

    source = rendering.INVENTORIES["tailnet"][0]
    rendering.INVENTORIES["tailnet-novault"] = (source, None)
    try:
        result = run_render("tailnet-novault", tmp_path)
    finally:
        del rendering.INVENTORIES["tailnet-novault"]
    assert result.returncode != 0
    assert "vault" in (result.stdout + result.stderr).lower()


def test_check_diff_through_the_playbook_shows_masked_keys_and_writes_nothing(tmp_path):
    result = run_render("tailnet", tmp_path / "out", "--check", "--diff", "-v")
    assert result.returncode == 0, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert "+PRIMARY_PEER_API_KEY=********" in output
    assert "+GATEWAY_FLEET_KEY=********" in output
    assert "example-spark-inbound" not in output and "example-mesh-fleet-key" not in output
    assert not (tmp_path / "out").exists()
