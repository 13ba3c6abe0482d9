"""What verify expects a gateway to advertise for each mode, against seed-shaped adverts."""

from __future__ import annotations

from ansible_collections.lobes.fleet.plugins.module_utils import advert
from ansible_collections.lobes.fleet.plugins.module_utils.plan import plan_mesh

from tests.unit.mesh import SPARK, THOR, seed_mesh

CORTEX = "sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP"


def orin_capabilities(**cortex) -> dict:
    """The Orin's /capabilities after seed 000's fix: pooled cortex, ready at 262144."""
    entry = {"route": "pool", "feasible": False, "ready": True, "proxied": True,
             "hosted_by": SPARK,
             "served_name": CORTEX, "context": 262144,
             "replicas": [{"origin": SPARK, "ready": True, "compatible": True, "reason": ""},
                          {"origin": THOR, "ready": True, "compatible": True, "reason": ""}],
             "policy": "prefix", "stream_resume": True}
    entry.update(cortex)
    return {"roles": {
        "cortex": entry,
        "senses": {"route": "proxy", "feasible": False, "ready": True, "proxied": True,
                   "hosted_by": SPARK, "served_name": "coolthor/gemma-4-12B-it-NVFP4A16",
                   "context": 32768},
        "worker": {"route": "serve", "feasible": True, "ready": True, "proxied": False,
                   "hosted_by": None,
                   "served_name": "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4",
                   "context": 32768},
        "minor": {"feasible": True, "ready": False},  # undeclared roles are not compared
    }}


def differences(plan: dict, capabilities: dict, peers_must_be_ready: bool = True) -> dict:
    expected = advert.expected_roles(plan, peers_must_be_ready)
    return advert.compare(expected, advert.advertised_roles(capabilities, plan["origin"]))


def orin_plan() -> dict:
    return plan_mesh(seed_mesh())["boxes"]["orin"]


def test_seed_000s_fixed_advert_matches_the_orins_plan():
    assert differences(orin_plan(), orin_capabilities()) == {}


def test_seed_000s_baseline_advert_is_caught():
    """Before the fix the Orin advertised ready=False and its own 1048576 mirror."""
    found = differences(orin_plan(), orin_capabilities(ready=False, context=1048576))
    assert found == {"cortex": ["ready", "context"]}


def test_a_role_routed_otherwise_than_planned_is_caught():
    """The tailnet defect: a referral the gateway turned into forwarding to the owner."""
    capabilities = orin_capabilities()
    capabilities["roles"]["senses"].update(route="owners")
    assert differences(orin_plan(), capabilities) == {"senses": ["route"]}


def test_a_pool_missing_a_replica_is_caught():
    capabilities = orin_capabilities()
    capabilities["roles"]["cortex"]["replicas"].pop()
    assert differences(orin_plan(), capabilities) == {"cortex": ["replicas"]}


def test_a_pool_placing_or_resuming_otherwise_than_declared_is_caught():
    mesh = seed_mesh()
    mesh["orin"]["fleet_gateway_pool_policy"] = "rate"
    mesh["orin"]["fleet_roles"]["cortex"]["stream_resume"] = False
    declared = plan_mesh(mesh)["boxes"]["orin"]
    assert differences(declared, orin_capabilities()) == {"cortex": ["policy", "stream_resume"]}
    assert differences(declared, orin_capabilities(policy="rate", stream_resume=False)) == {}


def test_a_hosted_pool_may_list_its_own_replica():
    mesh = seed_mesh()
    mesh["thor"]["fleet_roles"]["cortex"].update(feasible=True, pool=["spark"])
    thor = plan_mesh(mesh)["boxes"]["thor"]
    capabilities = {"roles": {
        "cortex": {"route": "pool", "feasible": True, "ready": True, "proxied": False,
                   "hosted_by": None, "served_name": CORTEX, "context": 262144,
                   "replicas": [{"origin": THOR}, {"origin": SPARK}],
                   "policy": "prefix", "stream_resume": True},
        "senses": {"route": "refer", "feasible": False, "ready": False, "proxied": False,
                   "hosted_by": SPARK,
                   "served_name": "coolthor/gemma-4-12B-it-NVFP4A16", "context": 32768},
    }}
    assert differences(thor, capabilities) == {}


def test_peer_readiness_can_be_waived_but_not_the_rest():
    capabilities = orin_capabilities(ready=False)
    assert differences(orin_plan(), capabilities, peers_must_be_ready=False) == {}
    capabilities["roles"]["worker"]["ready"] = False
    assert differences(orin_plan(), capabilities, peers_must_be_ready=False) == {
        "worker": ["ready"]}


def test_a_remote_window_is_waived_with_peer_readiness_but_not_a_local_one():
    """A box rolled out before its peers advertises no window for what they serve yet."""
    capabilities = orin_capabilities(ready=False, context=None)
    capabilities["roles"]["senses"].update(ready=False, context=None)
    assert differences(orin_plan(), capabilities, peers_must_be_ready=False) == {}
    assert differences(orin_plan(), capabilities) == {"cortex": ["ready", "context"],
                                                      "senses": ["ready", "context"]}
    capabilities["roles"]["worker"]["context"] = None
    assert differences(orin_plan(), capabilities, peers_must_be_ready=False) == {
        "worker": ["context"]}


def test_a_declared_role_the_gateway_does_not_list_mismatches():
    capabilities = orin_capabilities()
    del capabilities["roles"]["senses"]
    assert differences(orin_plan(), capabilities)["senses"] == [
        "route", "feasible", "ready", "proxied", "hosted_by", "served_name", "context"]


def test_a_role_not_ready_is_explained_with_the_gateways_reason():
    """A gear that serves another model than its P_SERVED_NAME: the gateway says why, and
    verify's message names the role, the field and that reason (the host is its prefix)."""
    plan = orin_plan()
    capabilities = orin_capabilities()
    reason = "the gear at http://127.0.0.1:18101 serves other/model, not worker-served"
    capabilities["roles"]["worker"].update(ready=False, reason=reason)
    expected = advert.expected_roles(plan)
    seen = advert.advertised_roles(capabilities, plan["origin"])
    lines = advert.explained(expected, seen, advert.compare(expected, seen))
    assert lines == [f"role worker, field ready: declared true, advertised false ({reason})"]


def test_an_engine_version_read_before_verify_began_is_stale_and_mismatches():
    plan = plan_mesh(seed_mesh())["boxes"]["orin"]
    worker = orin_capabilities()["roles"]["worker"]
    capabilities = {"roles": {"worker": {**worker, "engine_version": "0.23.1",
                                         "engine_version_age_s": 7.5}}}
    fresh = advert.advertised_roles(capabilities, plan["origin"], read_within_s=8.0)
    stale = advert.advertised_roles(capabilities, plan["origin"], read_within_s=2.0)
    assert fresh["worker"]["engine_version"] == "0.23.1"
    assert stale["worker"]["engine_version"] == advert.STALE
