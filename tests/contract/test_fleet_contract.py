"""The collection and the stdlib gateway share the contract, service-files and model-files modules
(the gateway must run without the collection, so gateway/lobes_contract.py,
gateway/lobes_service_files.py and gateway/lobes_model_files.py are links to
plugins/module_utils/). These tests hold the rest together: each link is the same
file and stays stdlib-only, every
rendered .env is one the gateway accepts and reads back as rendered, the gateway built from each
tailnet box's .env routes every role as that box's plan declares, and the keys a box attaches to
its peers are exactly the inbound keys those peers were rendered with."""

from __future__ import annotations

import ast
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import lobes_contract
import lobes_model_files
import lobes_service_files
import pytest
import yaml
from ansible_collections.lobes.fleet.plugins.module_utils import (
    advert,
    contract,
    model_files,
    service_files,
)
from ansible_collections.lobes.fleet.plugins.module_utils.plan import plan_mesh
from ansible_collections.lobes.fleet.plugins.module_utils.render import render_env
from lobes_gateway import __version__ as gateway_version
from lobes_gateway.policy.config import (
    LIMIT_VARIABLES,
    PRESSURE_VARIABLES,
    ConfigError,
    GatewayConfig,
    load_config,
)
from lobes_gateway.transport.upstream import Origin, request_head
from lobes_service_files import parse_env_file

from tests.support.gateway_proc import start_gateway
from tests.unit.mesh import seed_mesh

ROOT = Path(__file__).resolve().parents[2]
GOLDEN_ENVS = sorted((ROOT / "tests" / "fixtures" / "golden").glob("*/*/.env"))
TAILNET = ROOT / "inventories" / "tailnet"
# What a box routes, whatever its peers' and gears' health: the fields the plan decides.
ROUTING_FIELDS = ("route", "feasible", "proxied", "hosted_by")


# (the box-side module, the module_utils module it links to)
LINKED = [(lobes_contract, contract), (lobes_service_files, service_files),
          (lobes_model_files, model_files)]


@pytest.mark.parametrize(("linked", "module_utils"), LINKED, ids=lambda m: m.__name__)
def test_the_gateway_and_the_collection_import_one_file(linked, module_utils):
    assert Path(linked.__file__).is_symlink()
    assert Path(linked.__file__).resolve() == Path(module_utils.__file__).resolve()


@pytest.mark.parametrize("module_utils", [contract, service_files, model_files],
                         ids=lambda m: m.__name__)
def test_a_linked_module_imports_only_the_standard_library(module_utils):
    tree = ast.parse(Path(module_utils.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


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
    assert config.pool_policy == env.get("GATEWAY_POOL_POLICY", lobes_contract.POOL_POLICIES[0])
    rendered_prefixes = {key.split("_", 1)[0] for key in env if key.endswith("_FEASIBLE")}
    for prefix in rendered_prefixes:
        role = next(r for r in config.roles.values() if r.role.prefix == prefix)
        assert role.feasible == (env[f"{prefix}_FEASIBLE"] == "true")
        if f"{prefix}_SERVED_NAME" in env:
            assert role.served_name == env[f"{prefix}_SERVED_NAME"]
        if f"{prefix}_MAX_MODEL_LEN" in env:
            assert role.max_model_len == int(env[f"{prefix}_MAX_MODEL_LEN"])
        assert role.wired == (f"{prefix}_BASE_URL" in env)
        assert role.route == env[f"{prefix}_ROUTE"]
        assert role.quantization == env.get(f"{prefix}_QUANTIZATION")
        assert role.stream_resume == (env.get(f"{prefix}_STREAM_RESUME") == "true")
        # Rendered for pools only (the gateway refuses it elsewhere); every example pool
        # keeps the collection's default, on.
        assert (f"{prefix}_STREAM_RESUME" in env) == (role.route == "pool")


@pytest.fixture(scope="module")
def tailnet_plan() -> dict:
    """The example mesh's plan, from the inventory as ansible reads it (keys stay vaulted)."""
    listing = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(TAILNET), "--list",
         "--vault-password-file", str(TAILNET / "vault-password.example.txt")],
        capture_output=True, text=True, check=True, timeout=60)
    return plan_mesh(json.loads(listing.stdout, object_hook=_vaulted)["_meta"]["hostvars"])


_VAULTED = itertools.count()


def _vaulted(value: dict):
    """A vault value as ansible-inventory lists it, as a key of the plan's accepted shape, each
    its own (the plan needs to know a key is set and distinct, never what it is)."""
    return f"vaulted-key-{next(_VAULTED)}" if "__ansible_vault" in value else value


@pytest.mark.parametrize("env_file", [p for p in GOLDEN_ENVS if p.parts[-3] == "tailnet"],
                         ids=lambda p: p.parent.name)
def test_a_gateway_built_from_a_rendered_env_routes_every_role_as_planned(
        env_file, tailnet_plan):
    """The tailnet defect: a fleet key once turned the Orin's referrals into forwarding."""
    env = parse_env_file(env_file.read_text())
    env.update(GATEWAY_PROBE_TIMEOUT_S="0.2", GATEWAY_CONNECT_TIMEOUT_S="0.2")
    del env["GATEWAY_HOST"], env["GATEWAY_PORT"]
    box_plan = tailnet_plan["boxes"][env_file.parent.name]
    expected = {role: {field: fields[field] for field in ROUTING_FIELDS}
                for role, fields in advert.expected_roles(box_plan).items()}
    with start_gateway(env) as gateway:
        capabilities = gateway.get_json("/capabilities")
    advertised = advert.advertised_roles(capabilities, env["GATEWAY_SELF_ORIGIN"])
    assert advert.compare(expected, advertised) == {}
    assert {role: fields["route"] for role, fields in expected.items()} == {
        name: env[f"{contract.role_spec(name).prefix}_ROUTE"] for name in expected}


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
        if role.peer_origin and role.route in (contract.PROXY, contract.POOL):
            assert role.peer_api_key == inbound[role.peer_origin], (role.name, role.peer_origin)
            dialled += 1
        for peer in role.peers:
            if peer.origin == config.self_origin:
                continue
            assert peer.api_key == inbound[peer.origin], (role.name, peer.origin)
            dialled += 1
    if env_file.parent.name in ("agx-orin", "agx-thor"):
        assert dialled > 0


class _Recording(dict):
    """An environment that remembers every name the gateway asks it for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[str] = set()

    def get(self, name, default=None):
        self.asked.add(name)
        return super().get(name, default)


def test_the_gateway_reads_every_contract_name_and_no_other():
    environ = _Recording()
    load_config(environ)
    assert environ.asked == set(contract.KNOWN_ENV)


def _rendered(value: float) -> str:
    """A tuning value as render writes it into .env."""
    return str(int(value)) if float(value).is_integer() else str(value)


@pytest.mark.parametrize("name", sorted(contract.TUNABLES))
def test_a_number_past_any_float_is_refused_alike(name):
    # The inventory's YAML and the gateway's .env both take whole numbers of any size; the
    # gateway would read such a value as infinity, so the plan must refuse it too.
    huge = 10**400
    assert "finite" in contract.TUNABLES[name].refusal(huge)
    with pytest.raises(ConfigError, match=f"{name}: must be a finite number"):
        load_config({name: str(huge)})


def _tuned_value(config: GatewayConfig, name: str) -> float:
    """The configuration field a tunable variable sets."""
    if name in PRESSURE_VARIABLES.values():
        fields = {variable: attr for attr, variable in PRESSURE_VARIABLES.items()}
        return getattr(config.pressure, fields[name])
    fields = {variable: attr for attr, variable in LIMIT_VARIABLES.items()}
    return getattr(config.limits, fields[name])


def test_every_tunable_sets_one_gateway_field_and_its_default_is_in_range():
    variables = [*PRESSURE_VARIABLES.values(), *LIMIT_VARIABLES.values()]
    assert sorted(variables) == sorted(contract.TUNABLES)
    defaults = load_config({})
    for name in variables:
        assert contract.TUNABLES[name].refusal(_tuned_value(defaults, name)) is None, name


@pytest.mark.parametrize("name", sorted(contract.TUNABLES))
def test_the_gateway_takes_exactly_the_tuning_values_the_inventory_accepts(name):
    tunable = contract.TUNABLES[name]
    taken = [tunable.minimum, *([tunable.maximum] if tunable.maximum is not None else [])]
    refused = [tunable.minimum - (1 if tunable.integer else tunable.minimum / 2 or 1)]
    if tunable.maximum is not None:
        refused.append(tunable.maximum + 1)
    if tunable.integer:
        refused.append(tunable.minimum + 0.5)
    for value in taken:
        assert tunable.refusal(value) is None
        assert _tuned_value(load_config({name: _rendered(value)}), name) == value
    for value in refused:
        assert tunable.refusal(value) is not None
        with pytest.raises(ConfigError, match=name):
            load_config({name: _rendered(value)})


# An origin as written, its host and port, and the origin both sides write back.
ORIGINS = [
    ("http://spark:8001", ("spark", 8001), "http://spark:8001"),
    ("http://spark.example", ("spark.example", 80), "http://spark.example:80"),
    ("http://10.0.0.5:8000/", ("10.0.0.5", 8000), "http://10.0.0.5:8000"),
    ("http://[fd7a:115c:a1e0::11]:8000", ("fd7a:115c:a1e0::11", 8000),
     "http://[fd7a:115c:a1e0::11]:8000"),
]


@pytest.mark.parametrize(("origin", "host_and_port", "canonical"), ORIGINS)
def test_an_origin_is_read_and_written_back_alike_on_both_sides(
        origin, host_and_port, canonical):
    assert contract.parse_http_origin(origin) == host_and_port
    assert contract.http_origin(*host_and_port) == canonical
    env = {"PRIMARY_BASE_URL": "http://127.0.0.1:9", "PRIMARY_FEASIBLE": "false",
           "PRIMARY_PEER_ORIGINS": origin}
    (peer,) = load_config(env).roles["cortex"].peers
    assert peer.origin == canonical


@pytest.mark.parametrize(("origin", "fix"), [
    ("http://fd7a:115c:a1e0::11:8000", "IPv6 address in brackets"),
    ("http://spark:0", "use a port 1-65535"),
    ("http://spark:65536", "use a port 1-65535"),
    ("http://spark:8000/v1", "without /v1"),
    ("https://spark:8000", "plain HTTP"),
])
def test_an_origin_either_side_refuses_is_refused_by_both_with_the_fix(origin, fix):
    with pytest.raises(contract.OriginError, match=re.escape(fix)):
        contract.parse_http_origin(origin)
    with pytest.raises(ConfigError, match=re.escape(fix)):
        load_config({"PRIMARY_BASE_URL": origin})


def test_a_mesh_addressed_by_ipv6_renders_origins_its_gateways_accept():
    """Tailscale gives every box an IPv6 address too: a box whose ansible_host is one gets an
    origin with the address in brackets, which its peers' gateways read back as rendered."""
    mesh = seed_mesh()
    mesh["spark"]["ansible_host"] = "fd7a:115c:a1e0::11"
    mesh["thor"]["ansible_host"] = "fd7a:115c:a1e0::12"
    orin = plan_mesh(mesh)["boxes"]["orin"]
    origins = [peer["origin"] for peer in orin["roles"]["cortex"]["peers"]]
    assert origins == ["http://[fd7a:115c:a1e0::11]:8001", "http://[fd7a:115c:a1e0::12]:8000"]
    env = dict(render_env(orin, {"gateway_api_key": "k", "peer_keys": {"spark": "s"}}))
    config = load_config(env)
    assert [peer.origin for peer in config.roles["cortex"].peers] == origins
    head = request_head("POST", "/v1/chat/completions", Origin("fd7a:115c:a1e0::11", 8001), "", 2)
    assert b"\r\nHost: [fd7a:115c:a1e0::11]:8001\r\n" in head
