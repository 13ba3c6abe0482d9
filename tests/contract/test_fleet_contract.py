"""The collection's fleet model and the stdlib gateway hold their own copies of the contract
(the gateway must run without the collection). These tests hold the two copies together: the
role catalogs agree, every rendered .env is one the gateway accepts, and the keys a box would
attach to its peers are exactly the inbound keys those peers were rendered with."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible_collections.lobes.fleet.plugins.module_utils import catalog as fleet_catalog
from lobes_gateway import __version__ as gateway_version
from lobes_gateway import catalog as gateway_catalog
from lobes_gateway.config import load_config, parse_env_file

ROOT = Path(__file__).resolve().parents[2]
GOLDEN_ENVS = sorted((ROOT / "tests" / "fixtures" / "golden").glob("*/*/.env"))


def _shared_columns_of_fleet(spec) -> tuple:
    return (spec.prefix, spec.tier_alias, spec.compat_alias, spec.extra_aliases, spec.checkpoint,
            spec.context, spec.gpu_memory_utilization, spec.status, spec.task)


def _shared_columns_of_gateway(role) -> tuple:
    return (role.prefix, role.tier, role.compat_alias, role.extra_aliases, role.checkpoint,
            role.context, role.gpu_util, role.status, role.task)


def test_both_catalogs_hold_the_same_roles_in_the_same_order():
    assert [spec.role for spec in fleet_catalog.ROLES] == [r.name for r in gateway_catalog.ROLES]


@pytest.mark.parametrize("role", [spec.role for spec in fleet_catalog.ROLES])
def test_both_catalogs_agree_on_every_shared_column(role):
    fleet = _shared_columns_of_fleet(fleet_catalog.role_spec(role))
    gateway = _shared_columns_of_gateway(gateway_catalog.ROLES_BY_NAME[role])
    assert fleet == gateway


def test_the_gateway_reports_the_collection_version():
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    assert gateway_version == galaxy["version"]


def test_there_are_golden_env_files_for_every_tailnet_box():
    boxes = {path.parent.name for path in GOLDEN_ENVS if path.parts[-3] == "tailnet"}
    assert boxes == {"spark", "agx-orin", "agx-thor"}


@pytest.mark.parametrize("env_file", GOLDEN_ENVS, ids=lambda p: f"{p.parts[-3]}/{p.parent.name}")
def test_every_rendered_env_is_accepted_and_read_back_as_rendered(env_file):
    env = parse_env_file(env_file.read_text())
    config = load_config(env)
    assert config.port == int(env["GATEWAY_PORT"])
    assert config.self_origin == env.get("GATEWAY_SELF_ORIGIN")
    rendered_prefixes = {key.split("_", 1)[0] for key in env if key.endswith("_FEASIBLE")}
    for prefix in rendered_prefixes:
        role = next(r for r in config.roles.values() if r.role.prefix == prefix)
        assert role.feasible == (env[f"{prefix}_FEASIBLE"] == "true")
        if f"{prefix}_SERVED_NAME" in env:
            assert role.served_name == env[f"{prefix}_SERVED_NAME"]
        if f"{prefix}_MAX_MODEL_LEN" in env:
            assert role.max_model_len == int(env[f"{prefix}_MAX_MODEL_LEN"])
        assert role.wired == (f"{prefix}_BASE_URL" in env)
        assert role.quantization == env.get(f"{prefix}_QUANTIZATION")


def _inbound_keys(inventory: str) -> dict[str, str | None]:
    """origin -> the inbound GATEWAY_API_KEY that box was rendered with (None: no gate)."""
    keys = {}
    for env_file in GOLDEN_ENVS:
        if env_file.parts[-3] != inventory:
            continue
        env = parse_env_file(env_file.read_text())
        keys[env["GATEWAY_SELF_ORIGIN"]] = env.get("GATEWAY_API_KEY")
    return keys


@pytest.mark.parametrize("env_file", [p for p in GOLDEN_ENVS if p.parts[-3] == "tailnet"],
                         ids=lambda p: p.parent.name)
def test_every_peer_is_dialled_with_that_peers_own_inbound_key(env_file):
    inbound = _inbound_keys("tailnet")
    config = load_config(parse_env_file(env_file.read_text()))
    dialled = 0
    for role in config.roles.values():
        if role.peer_origin and role.peer_proxy:
            assert role.peer_api_key == inbound[role.peer_origin], (role.name, role.peer_origin)
            dialled += 1
        for peer in role.peers:
            if peer.origin == config.self_origin:
                continue
            assert peer.api_key == inbound[peer.origin], (role.name, peer.origin)
            dialled += 1
    if env_file.parent.name in ("agx-orin", "agx-thor"):
        assert dialled > 0
