"""The inventory schema: every refusal collected and named (host, role, field, value, what is
allowed, the closest valid name), secrets never shown, no refusal repeated as the errors it
would cause further on, and any value at all either refused or rendered into files every
reader takes as written (generated: hypothesis)."""

from __future__ import annotations

import json

import pytest
import yaml
from ansible_collections.lobes.fleet.plugins.action.render import secrets_for
from ansible_collections.lobes.fleet.plugins.module_utils import render, schema
from ansible_collections.lobes.fleet.plugins.module_utils.contract import ROLE_NAMES
from ansible_collections.lobes.fleet.plugins.module_utils.errors import FleetErrors
from ansible_collections.lobes.fleet.plugins.module_utils.inventory import Unreadable
from ansible_collections.lobes.fleet.plugins.module_utils.plan import plan_mesh
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lobes_gateway.policy.config import load_config
from lobes_gateway.policy.routing import Router
from lobes_service_files import parse_env_file

from tests.unit.mesh import seed_mesh


def refusals(mesh: dict) -> list:
    with pytest.raises(FleetErrors) as caught:
        plan_mesh(mesh)
    return caught.value.errors


def where(errors: list) -> list:
    return [(error.host, error.role, error.field) for error in errors]


def test_every_refusal_of_every_host_is_collected_at_once():
    mesh = seed_mesh()
    mesh["spark"]["fleet_gateway_port"] = "8²"  # a digit Python's int() takes, no port
    mesh["spark"]["fleet_roles"]["cortex"]["context"] = -5
    mesh["spark"]["fleet_roles"]["senses"]["num_speculative_tokens"] = 0
    mesh["thor"]["fleet_sim_time_scale"] = 0
    mesh["orin"]["fleet_memory_headroom_gib"] = -8
    assert sorted(where(refusals(mesh)), key=str) == sorted([
        ("spark", None, "fleet_gateway_port"), ("spark", "cortex", "context"),
        ("spark", "senses", "num_speculative_tokens"), ("thor", None, "fleet_sim_time_scale"),
        ("orin", None, "fleet_memory_headroom_gib")], key=str)


def test_a_refusal_names_the_value_and_what_is_allowed():
    mesh = seed_mesh()
    mesh["spark"]["fleet_roles"]["cortex"]["context"] = -5
    (error,) = refusals(mesh)
    assert str(error) == ("host spark, role cortex, field context: out of range: -5 (allowed: "
                          "a whole number between 1 and 16777216)")
    assert (error.value, error.allowed) == ("-5", "a whole number between 1 and 16777216")


def test_a_refused_gear_is_not_reported_again_by_the_peers_that_name_it():
    # The Thor refers senses to the Spark and the Orin proxies it there: with the Spark's
    # senses refused, neither may be told that the Spark does not host senses.
    mesh = seed_mesh()
    mesh["spark"]["fleet_roles"]["senses"]["max_active"] = 0
    assert where(refusals(mesh)) == [("spark", "senses", "max_active")]


def test_a_refused_window_suggests_no_yarn_factor():
    mesh = seed_mesh()
    mesh["spark"]["fleet_roles"]["cortex"]["native_context"] = -1
    (error,) = refusals(mesh)
    assert error.field == "native_context" and "yarn" not in str(error)


def test_a_box_with_a_refused_variable_is_left_out_of_its_peers_checks():
    mesh = seed_mesh()
    mesh["spark"]["fleet_runtime"] = "proces"
    assert where(refusals(mesh)) == [("spark", None, "fleet_runtime")]


@pytest.mark.parametrize(("edit", "field", "suggestion"), [
    (lambda m: m["spark"].update(fleet_runtime="proces"), "fleet_runtime", "process"),
    (lambda m: m["spark"].update(fleet_gatway_port=8001), "fleet_gatway_port",
     "fleet_gateway_port"),
    (lambda m: m["spark"].update(flet_roles={}), "flet_roles", "fleet_roles"),
    (lambda m: m["spark"]["fleet_roles"].update(cortx={}), "fleet_roles", "cortex"),
    (lambda m: m["spark"]["fleet_roles"]["cortex"].update(contxt=1), "contxt", "context"),
    (lambda m: m["spark"].update(fleet_hardware="gb-10"), "fleet_hardware", "gb10"),
    (lambda m: m["orin"]["fleet_roles"]["senses"].update(proxy="sprak"), "proxy", "spark"),
    (lambda m: m["spark"]["fleet_roles"]["cortex"].update(sim_profile="spark-cortx"),
     "sim_profile", "spark-cortex"),
    (lambda m: m["spark"].update(fleet_gateway_tuning={"GATEWAY_UPSTREAM_TIMEOUT": 60}),
     "fleet_gateway_tuning", "GATEWAY_UPSTREAM_TIMEOUT_S"),
    (lambda m: m["spark"].update(fleet_gateway_aliases={"fast": "minr"}),
     "fleet_gateway_aliases.fast", "minor"),
], ids=["runtime", "variable", "variable-without-the-prefix", "role", "role-field", "hardware",
        "peer", "sim-profile", "tunable", "alias-target"])
def test_a_misspelt_name_is_refused_with_the_closest_valid_one(edit, field, suggestion):
    mesh = seed_mesh()
    edit(mesh)
    errors = refusals(mesh)
    assert [(e.field, e.suggestion) for e in errors] == [(field, suggestion)], errors
    assert f"did you mean {suggestion!r}?" in str(errors[0])


@pytest.mark.parametrize(("groups", "message", "suggestion"), [
    (["fleet", "thors"], "is not set: the host is in no hardware group (its groups: fleet, "
     "thors)", "thor"),
    (["fleet", "orin", "thor"], "the host is in more than one hardware group, orin and thor",
     None),
    (["fleet", "thor"], "is not set: the host is in the group thor, whose vars must set it",
     None),
], ids=["no-group", "two-groups", "group-without-its-vars"])
def test_a_host_is_in_exactly_one_hardware_group(groups, message, suggestion):
    mesh = seed_mesh()
    del mesh["thor"]["fleet_hardware"]
    mesh["thor"]["group_names"] = groups
    if len(groups) == 3:
        mesh["thor"]["fleet_hardware"] = "thor"
    (error,) = refusals(mesh)
    assert (error.host, error.field, error.suggestion) == ("thor", "fleet_hardware", suggestion)
    assert message in str(error)


def test_a_group_and_a_profile_that_disagree_are_refused():
    mesh = seed_mesh()
    mesh["thor"]["group_names"] = ["fleet", "orin"]
    (error,) = refusals(mesh)
    assert "is 'thor' but the host is in the hardware group orin" in str(error)


@pytest.mark.parametrize(("field", "value", "secret"), [
    ("fleet_origin", "http://admin:s3cret@spark.tail0be7e0.ts.net:8001", "s3cret"),
    ("fleet_gateway_api_key", "ab,cd", "ab,cd"),
    ("fleet_gateway_api_key", 'quote"d', 'quote"d'),
    ("fleet_gateway_api_key", "new\nline", "new\nline"),
    ("fleet_mesh_key", schema.SecretValue("with space"), "with space"),
], ids=["password-in-origin", "comma-in-key", "quote-in-key", "newline-in-key",
        "space-in-mesh-key"])
def test_a_secret_is_refused_without_being_shown(field, value, secret):
    mesh = seed_mesh()
    mesh["spark"][field] = value
    (error,) = refusals(mesh)
    assert (error.host, error.field) == ("spark", field)
    assert secret not in str(error) and "********" in str(error)


def test_an_unreadable_variable_is_named_with_why():
    mesh = seed_mesh()
    mesh["thor"]["fleet_gear_image"] = Unreadable("'no_such_var' is undefined")
    (error,) = refusals(mesh)
    assert str(error) == ("host thor, field fleet_gear_image: cannot be read: 'no_such_var' "
                          "is undefined")


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: m["spark"].update(fleet_gateway_api_key=""),
     "host spark, field fleet_gateway_api_key: is empty, which would turn the gate off"),
    (lambda m: m["thor"].pop("fleet_gateway_open"),
     "host thor, field fleet_gateway_api_key: is not set and the gateway binds 0.0.0.0"),
    (lambda m: m["spark"].update(fleet_gateway_open=True),
     "host spark, field fleet_gateway_open: is true but fleet_gateway_api_key is set"),
], ids=["empty-key", "no-key-and-no-switch", "key-and-switch"])
def test_an_open_gate_is_declared_never_silent(edit, message):
    mesh = seed_mesh()
    edit(mesh)
    (error,) = refusals(mesh)
    assert message in str(error)


def test_a_box_on_its_loopback_needs_no_key():
    mesh = seed_mesh()
    del mesh["thor"]["fleet_gateway_open"]
    mesh["thor"]["fleet_gateway_host"] = "127.0.0.1"
    assert plan_mesh(mesh)["boxes"]["thor"]["gateway"]["auth"] is False


@pytest.mark.parametrize(("edit", "field", "message"), [
    (lambda m: m["spark"].update(fleet_runtime="process", fleet_hardware="sim",
                                 fleet_gear_port_base=65530),
     "fleet_gear_port_base", "puts gear-embedder on port 65536 and gear-reranker on port 65537, "
     "past 65535"),
    (lambda m: m["spark"].update(fleet_runtime="process", fleet_hardware="sim",
                                 fleet_gear_port_base=8000),
     "fleet_gear_port_base", "puts gear-senses on port 8001, which gateway takes"),
    (lambda m: m["spark"].update(fleet_monitoring_host="spark",
                                 fleet_monitoring_listen_address="0.0.0.0:8001"),
     "fleet_monitoring_listen_address", "puts prometheus on port 8001, which gateway takes"),
], ids=["past-65535", "on-the-gateway", "prometheus-on-the-gateway"])
def test_ports_that_cannot_all_listen_on_one_box_are_refused(edit, field, message):
    mesh = seed_mesh()
    edit(mesh)
    (error,) = refusals(mesh)
    assert (error.host, error.field) == ("spark", field) and message in str(error)


@pytest.mark.parametrize(("edit", "field"), [
    (lambda m: m["orin"]["fleet_roles"].update(stt={"feasible": False, "pool": ["spark"]}),
     "pool"),
    (lambda m: m["spark"]["fleet_roles"].update(embedder=False), "fleet_roles"),
    (lambda m: m["spark"]["fleet_roles"]["cortex"].update(served_name="qwen$HOME"),
     "served_name"),
    (lambda m: m["spark"].update(fleet_gateway_aliases={"main2": "main,hard=senses"}),
     "fleet_gateway_aliases.main2"),
    (lambda m: m["spark"].update(fleet_hf_cache="/data:/etc"), "fleet_hf_cache"),
    (lambda m: m["thor"].update(fleet_origin="http://SPARK.tail0be7e0.ts.net:8001"),
     "fleet_origin"),
    (lambda m: m["spark"].update(fleet_origin="http://spark.tail0be7e0.ts.net:8001#top"),
     "fleet_origin"),
    (lambda m: m["spark"].update(ansible_host="spark .tail0be7e0.ts.net"), "ansible_host"),
    (lambda m: m["spark"].update(fleet_gateway_host="every-address"), "fleet_gateway_host"),
    (lambda m: m["spark"].update(fleet_default_model="no-such-model"), "fleet_default_model"),
    (lambda m: m["spark"]["fleet_roles"]["cortex"].update(sim_profile="embedder",
                                                          engine="sim"), "sim_profile"),
], ids=["audio-pooled", "role-not-a-mapping", "dollar-in-served-name", "alias-injection",
        "colon-in-a-volume-path", "one-origin-in-two-spellings", "origin-fragment",
        "space-in-address", "bind-not-an-address", "unknown-default-model",
        "profile-of-another-task"])
def test_what_could_only_fail_on_the_box_is_refused_in_the_plan(edit, field):
    mesh = seed_mesh()
    edit(mesh)
    assert [error.field for error in refusals(mesh)] == [field]


def test_a_peers_served_name_the_gateway_would_not_know_becomes_the_role_name():
    # The Orin pools cortex from boxes that serve it under a name of their own: its gateway
    # knows that name only for gears it serves, so its default model is the role.
    mesh = seed_mesh()
    for host in ("spark", "thor"):
        mesh[host]["fleet_roles"]["cortex"]["served_name"] = "house-cortex"
    orin = plan_mesh(mesh)["boxes"]["orin"]
    assert orin["gateway"]["default_model"] == "cortex"
    env = dict(render.render_env(orin, {"gateway_api_key": "k", "peer_keys": {"spark": "s"}}))
    Router(load_config(env))


def test_a_box_is_held_to_the_bounds_a_gateway_holds_its_peers_adverts_to():
    from ansible_collections.lobes.fleet.plugins.module_utils.contract import ADVERTISED_BOUNDS

    fields = schema.ROLE_FIELDS
    held = {"context": fields["context"].kind.bound,
            "max_active": fields["max_active"].kind.bound,
            "rate": schema.POOL_RATE.kind.bound,
            "served_name": fields["served_name"].kind.pattern}
    assert held == ADVERTISED_BOUNDS
    assert all(held[name] is bound for name, bound in ADVERTISED_BOUNDS.items())


def test_the_schema_knows_every_variable_the_roles_and_playbooks_read():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    read = set()
    for path in [*root.glob("roles/*/*/*.yml"), *root.glob("playbooks/*.yml")]:
        read |= set(re.findall(r"\bfleet_[a-z_]+\b", path.read_text()))
    assert read <= set(schema.BOX_FIELDS), sorted(read - set(schema.BOX_FIELDS))


# ---------------------------------------------------------------- generated: any value at all

HOSTILE_TEXT = st.text(alphabet=st.sampled_from(list("aZ09._-/:@$,=#'\" \n\t\\{}%²٣é")),
                       max_size=12)
# Values a field may well take, so that many generated inventories pass the plan and render.
PLAUSIBLE = st.sampled_from([
    "main", "cortex", "minor", "spark", "thor", "sim", "process", "compose", "vllm", "rate",
    "127.0.0.1", "::1", "http://[fd7a::11]:8002", "http://spark.example:8002", "/srv/lobes x",
    "org/model-1", "org/model:tag", "fp8", "1h", "interactive", 18300, 8002, 0.2, 2.0, 262144,
    True, False, ["spark"], ["spark", "thor"], {"spark": 48.9},
])
VALUES = st.one_of(
    PLAUSIBLE, PLAUSIBLE, PLAUSIBLE,
    st.none(), st.booleans(), st.integers(-2**70, 2**70),
    st.floats(allow_nan=True, allow_infinity=True), HOSTILE_TEXT,
    st.lists(HOSTILE_TEXT, max_size=3), st.dictionaries(HOSTILE_TEXT, HOSTILE_TEXT, max_size=2),
)
BOX_NAMES = sorted(name for name in schema.BOX_FIELDS if name != "fleet_hardware")
EDITS = st.lists(st.one_of(
    st.tuples(st.sampled_from(["spark", "thor", "orin"]), st.sampled_from(BOX_NAMES), VALUES),
    st.tuples(st.sampled_from(["spark", "thor", "orin"]),
              st.tuples(st.sampled_from(ROLE_NAMES), st.sampled_from(sorted(schema.ROLE_FIELDS))),
              VALUES),
), min_size=1, max_size=3)


def _apply(mesh: dict, edits: list) -> None:
    for host, name, value in edits:
        if isinstance(name, tuple):
            role, field = name
            roles = mesh[host].setdefault("fleet_roles", {})
            if isinstance(roles, dict) and isinstance(roles.setdefault(role, {}), dict):
                roles[role][field] = value
        else:
            mesh[host][name] = value


def _secrets(mesh: dict, host: str, plan: dict) -> dict:
    def text(value):
        return value.text if isinstance(value, schema.SecretValue) else value

    hostvars = {name: {key: text(value) for key, value in box.items()}
                for name, box in mesh.items()}
    return secrets_for(plan, {"hostvars": hostvars, **hostvars[host]})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(EDITS)
def test_any_value_is_refused_by_name_or_rendered_as_every_reader_takes_it(edits):
    mesh = seed_mesh()
    _apply(mesh, edits)
    try:
        plan = plan_mesh(mesh)
    except FleetErrors as errors:
        assert errors.errors and all(error.host in mesh for error in errors.errors)
        return
    for host, box in plan["boxes"].items():
        env = render.render_env(box, _secrets(mesh, host, box))
        assert parse_env_file(render.format_env(env)) == dict(env)
        Router(load_config(dict(env)))
        text = render.to_yaml(render.render_compose(box))
        assert yaml.safe_load(text) == json.loads(
            json.dumps(render.render_compose(box)).replace("$", "$$"))
        json.dumps(render.render_services(box))


@pytest.mark.parametrize("address", [":²", "127.0.0.1:٨٠", "[::1]:\uff11\uff12"])
def test_a_listen_address_port_of_non_ascii_digits_is_refused_not_raised(address):
    """str.isdigit takes superscripts and other scripts' digits, which int() may not read (the
    generated inventory test found ':²' raising a ValueError instead of being refused)."""
    with pytest.raises(schema.Refused):
        schema.ListenAddress().read(address)
