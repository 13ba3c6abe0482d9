"""Named client keys from the inventory to the .env: fleet_client_keys (classes and limits in the
plan, keys only from the vault), GATEWAY_CLIENT_KEYS rendered, masked and read by the gateway."""

from __future__ import annotations

import json

import pytest
from ansible_collections.lobes.fleet.plugins.action.mesh_plan import fleet_vars
from ansible_collections.lobes.fleet.plugins.action.render import secrets_for
from ansible_collections.lobes.fleet.plugins.module_utils.errors import FleetErrors
from ansible_collections.lobes.fleet.plugins.module_utils.plan import plan_mesh
from ansible_collections.lobes.fleet.plugins.module_utils.render import RenderError, render_env
from ansible_collections.lobes.fleet.plugins.modules import render as render_module
from lobes_gateway.policy.config import load_config

from tests.unit.mesh import seed_mesh
from tests.unit.modules import run_module

PERSON_KEY = "person-secret-key-1"
AGENTS_KEY = "agents-secret-key-2"
CLIENT_KEYS = {"person": {"key": PERSON_KEY, "class": "interactive"},
               "agents": {"key": AGENTS_KEY, "class": "batch", "inflight_limit": 8}}
SECRETS = {"gateway_api_key": "spark-inbound",
           "client_keys": {"person": PERSON_KEY, "agents": AGENTS_KEY}}


def spark_plan(client_keys: dict | None = None) -> dict:
    hostvars = seed_mesh()
    hostvars["spark"]["fleet_client_keys"] = client_keys or CLIENT_KEYS
    return plan_mesh(hostvars)["boxes"]["spark"]


def test_the_plan_carries_names_classes_and_limits_never_keys():
    plan = spark_plan()
    assert plan["gateway"]["client_keys"] == [
        {"name": "agents", "class": "batch", "inflight_limit": 8},
        {"name": "person", "class": "interactive", "inflight_limit": None}]
    assert PERSON_KEY not in json.dumps(plan)


def test_the_plan_action_hands_each_key_over_masked():
    picked = fleet_vars({"fleet_client_keys": CLIENT_KEYS, "fleet_hardware": "gb10",
                         "fleet_gateway_api_key": "box-key"})
    person = picked["fleet_client_keys"]["person"]
    assert person["class"] == "interactive" and person["key"].text == PERSON_KEY
    assert PERSON_KEY not in repr(picked) and "box-key" not in repr(picked)
    assert PERSON_KEY not in str(person["key"])


def test_a_key_that_no_list_can_carry_is_refused_by_the_plan_masked():
    hostvars = seed_mesh()
    hostvars["spark"]["fleet_client_keys"] = {"person": {"key": "a:b,c"}}
    with pytest.raises(FleetErrors) as caught:
        plan_mesh(hostvars)
    (error,) = caught.value.errors
    assert (error.host, error.field, error.value) == ("spark", "fleet_client_keys.person.key",
                                                      "********")
    assert "a:b,c" not in str(caught.value)


def test_the_render_action_takes_the_keys_from_the_hosts_variables():
    secrets = secrets_for({}, {"hostvars": {}, "fleet_client_keys": CLIENT_KEYS})
    assert secrets["client_keys"] == {"person": PERSON_KEY, "agents": AGENTS_KEY}


def test_the_env_holds_the_keys_and_the_gateway_reads_them():
    env = dict(render_env(spark_plan(), SECRETS))
    assert env["GATEWAY_CLIENT_KEYS"] == (f"agents={AGENTS_KEY}:batch:8,"
                                          f"person={PERSON_KEY}:interactive")
    config = load_config(env)
    assert [(k.name, k.priority, k.inflight_limit) for k in config.client_keys] == [
        ("agents", "batch", 8), ("person", "interactive", None)]


def test_no_client_keys_render_no_variable():
    plan = plan_mesh(seed_mesh())["boxes"]["spark"]
    assert plan["gateway"]["client_keys"] == []
    assert "GATEWAY_CLIENT_KEYS" not in dict(render_env(plan, {"gateway_api_key": "k"}))


@pytest.mark.parametrize(("secrets", "message"), [
    ({"gateway_api_key": "k", "client_keys": {"agents": AGENTS_KEY}},
     "field fleet_client_keys.person.key"),
    ({"gateway_api_key": "k", "client_keys": {"agents": AGENTS_KEY, "person": "a:b"}},
     "may not hold whitespace, commas or colons"),
], ids=["missing-key", "key-with-a-colon"])
def test_a_missing_or_unusable_key_fails_naming_the_field(secrets, message):
    with pytest.raises(RenderError, match=message) as caught:
        render_env(spark_plan(), secrets)
    assert "a:b" not in str(caught.value)


@pytest.mark.parametrize(("entries", "field"), [
    ({"person": {"key": PERSON_KEY, "class": "urgent"}}, "fleet_client_keys.person.class"),
    ({"person": {"key": PERSON_KEY, "inflight_limit": 0}},
     "fleet_client_keys.person.inflight_limit"),
    ({"person": {"class": "batch"}}, "fleet_client_keys.person.key"),
    ({"person": {"key": PERSON_KEY, "colour": "red"}}, "fleet_client_keys.person.colour"),
    ({"fleet": {"key": PERSON_KEY}}, "fleet_client_keys.fleet"),
    ({"a b": {"key": PERSON_KEY}}, "fleet_client_keys"),
    ({1: {"key": PERSON_KEY}}, "fleet_client_keys"),
    ({"person": {"key": PERSON_KEY}, "agents": {"key": PERSON_KEY}},
     "fleet_client_keys.agents.key"),
    ({"person": {"key": "spark-key"}}, "fleet_client_keys.person.key"),
], ids=["bad-class", "zero-limit", "no-key", "unknown-field", "reserved-name", "bad-name",
        "name-not-text", "one-key-twice", "the-boxs-own-key"])
def test_a_bad_entry_fails_naming_host_and_field(entries, field):
    hostvars = seed_mesh()
    hostvars["spark"]["fleet_client_keys"] = entries
    with pytest.raises(FleetErrors) as caught:
        plan_mesh(hostvars)
    assert [(e.host, e.field) for e in caught.value.errors] == [("spark", field)]


def test_named_keys_need_the_boxs_own_key():
    hostvars = seed_mesh()
    hostvars["thor"]["fleet_client_keys"] = {"person": {"key": PERSON_KEY}}
    with pytest.raises(FleetErrors, match="fleet_gateway_api_key"):
        plan_mesh(hostvars)


def test_the_render_module_masks_the_client_keys(tmp_path):
    args = {"plan": spark_plan(), "dest": str(tmp_path / "spark"), "secrets": SECRETS}
    result = run_module(render_module.main, args, check_mode=True, diff=True)
    text = json.dumps(result)
    assert PERSON_KEY not in text and AGENTS_KEY not in text
    env_diff = next(item for item in result["diff"] if item["after_header"].endswith(".env"))
    assert "GATEWAY_CLIENT_KEYS=********" in env_diff["after"]
