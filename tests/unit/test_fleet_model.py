"""The fleet model: catalog, hardware, budget math and every validation error of mesh_plan."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from ansible_collections.lobes.fleet.plugins.module_utils import contract, hardware
from ansible_collections.lobes.fleet.plugins.module_utils.errors import FleetErrors
from ansible_collections.lobes.fleet.plugins.module_utils.plan import plan_mesh
from ansible_collections.lobes.fleet.plugins.module_utils.render import render_env

from tests.unit.mesh import SPARK, THOR, seed_mesh


def plan_error(hostvars: dict) -> str:
    with pytest.raises(FleetErrors) as caught:
        plan_mesh(hostvars)
    return str(caught.value)


def test_catalog_matches_the_seed_table():
    by_role = {spec.name: spec for spec in contract.ROLES}
    assert list(by_role) == ["cortex", "senses", "minor", "middle", "muse", "worker",
                             "embedder", "reranker", "stt", "tts", "fallback"]
    cortex = by_role["cortex"]
    assert (cortex.prefix, cortex.aliases, cortex.context, cortex.gpu_memory_utilization) == (
        "PRIMARY", ("main", "hard", "cortex"), 131072, 0.30)
    assert by_role["senses"].aliases == ("multimodal", "normal", "senses")
    assert by_role["minor"].aliases == ("minor", "cheap")
    assert by_role["worker"].gpu_memory_utilization is None
    assert {spec.prefix for spec in contract.ROLES} == {
        "PRIMARY", "MULTIMODAL", "MINOR", "MIDDLE", "MUSE", "WORKER", "EMBED", "RERANK",
        "STT", "TTS", "FALLBACK"}
    assert contract.TIER_ORDER == ("minor", "multimodal", "worker", "muse", "main")


def test_hardware_profiles_of_the_three_boxes():
    gb10, orin, thor = (hardware.hardware_profile(name) for name in ("gb10", "orin", "thor"))
    assert gb10.usable_gib == pytest.approx(121.7)
    assert (orin.arch, thor.arch) == ("sm_87", "sm_110")
    assert gb10.mtp_kernel and not thor.mtp_kernel


def test_the_duo_budget_is_seed_004s_056():
    plan = plan_mesh(seed_mesh())
    spark_budget = plan["boxes"]["spark"]["budget"]
    assert spark_budget["gears"] == {"cortex": 0.30, "senses": 0.14, "embedder": 0.06,
                                     "reranker": 0.06}
    assert spark_budget["utilization"] == pytest.approx(0.56)
    # Seed 004's table: ~70 of the 128 GB (util x 128 GiB).
    assert spark_budget["reserved_gib"] == pytest.approx(71.68)
    assert spark_budget["fits"] is True


def test_a_budget_over_usable_memory_is_rejected_naming_the_gears():
    mesh = seed_mesh()
    mesh["spark"]["fleet_roles"]["muse"] = {}  # 0.55 on top of the duo's 0.56
    message = plan_error(mesh)
    assert "host spark" in message and "gpu_memory_utilization" in message
    assert "budget over usable memory" in message
    assert "muse 0.55" in message and "= 1.11" in message


def test_headroom_override_changes_the_budget():
    mesh = seed_mesh()
    mesh["spark"]["fleet_memory_headroom_gib"] = 60.0
    assert "budget over usable memory" in plan_error(mesh)


def test_referral_to_a_box_that_does_not_host_the_role():
    mesh = seed_mesh()
    mesh["thor"]["fleet_roles"]["senses"]["referral"] = "orin"
    message = plan_error(mesh)
    assert "host thor, role senses, field referral: orin does not host senses" in message


def test_proxy_to_a_box_that_does_not_host_the_role():
    mesh = seed_mesh()
    mesh["orin"]["fleet_roles"]["senses"]["proxy"] = "thor"
    assert "host orin, role senses, field proxy: thor does not host senses" in plan_error(mesh)


def test_peer_that_is_not_in_the_inventory():
    mesh = seed_mesh()
    mesh["orin"]["fleet_roles"]["senses"]["proxy"] = "jetson9"
    assert "'jetson9' is not a fleet host" in plan_error(mesh)


def test_proxy_cycle_is_named():
    mesh = seed_mesh()
    mesh["spark"]["fleet_roles"]["senses"] = {"feasible": False, "proxy": "orin"}
    message = plan_error(mesh)
    assert "role senses, field proxy: proxy cycle" in message
    assert re.search(r"proxy cycle (orin -> spark -> orin|spark -> orin -> spark)", message)


def test_pool_members_must_agree_on_the_window():
    mesh = seed_mesh()
    # Seed 000's Thor at its 1048576 YaRN window cannot pool with the Spark's 262144.
    mesh["thor"]["fleet_roles"]["cortex"].update(context=1048576, yarn_factor=8.0)
    message = plan_error(mesh)
    assert "host orin, role cortex, field pool: pool members disagree" in message
    assert "window spark=262144 vs thor=1048576" in message


def test_pool_members_must_agree_on_the_served_model():
    mesh = seed_mesh()
    mesh["thor"]["fleet_roles"]["cortex"]["served_name"] = "unsloth/Qwen3.8-27B-NVFP4"
    assert "served model spark='sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP' vs " \
           "thor='unsloth/Qwen3.8-27B-NVFP4'" in plan_error(mesh)


def test_hosted_pool_includes_this_box_in_the_agreement():
    mesh = seed_mesh()
    mesh["thor"]["fleet_roles"]["cortex"].update(feasible=True, pool=["spark"], context=131072)
    mesh["thor"]["fleet_roles"]["cortex"].pop("yarn_factor")
    message = plan_error(mesh)
    assert "host thor, role cortex, field pool: pool members disagree: " \
           "window thor=131072 vs spark=262144" in message


def test_mtp_on_an_arch_without_the_kernel():
    mesh = seed_mesh()
    mesh["thor"]["fleet_roles"]["cortex"]["mtp"] = True
    message = plan_error(mesh)
    assert "host thor, role cortex, field mtp: thor (sm_110) has no MTP kernel" in message


def test_mtp_defaults_on_where_the_kernel_exists_and_off_where_not():
    boxes = plan_mesh(seed_mesh())["boxes"]
    assert boxes["spark"]["roles"]["cortex"]["gear"]["mtp"] is True
    assert boxes["thor"]["roles"]["cortex"]["gear"]["mtp"] is False


def test_context_above_the_native_window_needs_yarn():
    mesh = seed_mesh()
    mesh["spark"]["fleet_roles"]["cortex"].pop("yarn_factor")
    message = plan_error(mesh)
    assert "host spark, role cortex, field context: 262144 exceeds the checkpoint's native " \
           "window 131072; lower it or declare yarn_factor >= 2" in message


def test_yarn_factor_must_cover_the_context():
    mesh = seed_mesh()
    mesh["spark"]["fleet_roles"]["cortex"]["yarn_factor"] = 1.5
    assert "exceeds the YaRN window 131072 x 1.5 = 196608" in plan_error(mesh)


def test_senses_native_window_is_128k_even_though_it_serves_32k():
    mesh = seed_mesh()
    mesh["spark"]["fleet_roles"]["senses"]["context"] = 131072
    spark = plan_mesh(mesh)["boxes"]["spark"]["roles"]["senses"]["gear"]
    assert spark["context"] == 131072 and spark["yarn_factor"] is None


def test_unmeasured_utilization_must_be_declared():
    mesh = seed_mesh()
    mesh["orin"]["fleet_roles"]["worker"].pop("gpu_memory_utilization")
    assert "host orin, role worker, field gpu_memory_utilization: is unmeasured" \
        in plan_error(mesh)


@pytest.mark.parametrize(("host", "change", "expected"), [
    ("spark", {"fleet_hardware": "dgx"}, "field fleet_hardware: unknown hardware 'dgx'"),
    ("spark", {"fleet_runtime": "k8s"}, "field fleet_runtime: must be one of compose, process"),
    ("spark", {"fleet_gateway_port": "eighty"}, "field fleet_gateway_port: must be an integer"),
    ("spark", {"fleet_roles": {"brain": {}}}, "host spark, role brain, field fleet_roles"),
    ("spark", {"fleet_roles": {"cortex": {"contxt": 1}}}, "role cortex, field contxt: is not"),
    ("spark", {"fleet_roles": {"cortex": {"context": "big"}}}, "field context: must be an int"),
    ("spark", {"fleet_gateway_tuning": {"LOBES_FOO": 1}}, "'LOBES_FOO' is not a tunable"),
    ("spark", {"fleet_origin": "spark:8001"}, "field fleet_origin: must be a plain-HTTP origin"),
    ("thor", {"fleet_origin": SPARK}, "host thor, field fleet_origin: " + SPARK + " is also"),
    ("spark", {"fleet_hardware": "sim"}, "field fleet_runtime: compose runs real vLLM gears"),
])
def test_bad_box_variables_are_named(host, change, expected):
    mesh = seed_mesh()
    mesh[host].update(change)
    assert expected in plan_error(mesh)


def test_one_peer_mode_per_role():
    mesh = seed_mesh()
    mesh["orin"]["fleet_roles"]["senses"]["referral"] = "spark"
    assert "role senses, field proxy: declare one of referral, proxy, pool or owners" \
        in plan_error(mesh)


def test_a_served_role_takes_no_proxy():
    mesh = seed_mesh()
    mesh["orin"]["fleet_roles"]["senses"]["feasible"] = True
    assert "role senses, field proxy: a role served here takes no referral, proxy or owners" \
        in plan_error(mesh)


def test_rates_cover_exactly_the_pool():
    mesh = seed_mesh()
    mesh["orin"]["fleet_roles"]["cortex"]["rates"] = {"spark": 48.9}
    assert "field rates: declare a rate for every pool member and no other (missing: thor" \
        in plan_error(mesh)


def test_audio_lanes_are_never_pooled():
    mesh = seed_mesh()
    mesh["spark"]["fleet_roles"]["stt"] = {"feasible": True, "pool": ["thor"]}
    mesh["spark"]["fleet_audio_image"] = "ghcr.io/example/realtime-bridge:1"
    assert "role stt, field pool: audio lanes are served here or proxied" in plan_error(mesh)


def test_several_errors_are_reported_together():
    mesh = seed_mesh()
    mesh["thor"]["fleet_roles"]["cortex"]["mtp"] = True
    mesh["spark"]["fleet_roles"]["muse"] = {}
    errors = plan_error(mesh)
    assert "field mtp" in errors and "budget over usable memory" in errors


def test_plan_of_a_peer_only_pool():
    orin = plan_mesh(seed_mesh())["boxes"]["orin"]
    cortex = orin["roles"]["cortex"]
    assert cortex["mode"] == "pool" and cortex["feasible"] is False
    assert [(peer["origin"], peer["rate"], peer["auth"]) for peer in cortex["peers"]] == [
        (SPARK, 48.9, True), (THOR, 11.0, False)]
    assert (cortex["served_name"], cortex["context"], cortex["replicas"]) == (
        "sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP", 262144, 2)
    assert cortex["hosted_by"] == SPARK and cortex["gear"] is None
    # Only the Spark runs an inbound gate: it is the one key the Orin carries.
    assert orin["key_hosts"] == ["spark"]
    assert orin["roles"]["senses"]["mode"] == "proxy"
    assert orin["gateway"]["default_model"] == "sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP"


def test_plan_of_referral_and_local_gear():
    boxes = plan_mesh(seed_mesh())["boxes"]
    senses = boxes["thor"]["roles"]["senses"]
    assert (senses["mode"], senses["hosted_by"], senses["context"]) == ("refer", SPARK, 32768)
    assert boxes["thor"]["key_hosts"] == []  # a referral dials nobody
    gear = boxes["spark"]["roles"]["cortex"]["gear"]
    assert gear["port"] == 18100 and gear["service"] == "vllm-cortex"
    assert (gear["tool_parser"], gear["quantization"], gear["num_speculative_tokens"]) == (
        "qwen3_coder", "modelopt_fp4", 2)


def owner_mesh() -> dict:
    """The seed mesh with a fleet key on every box and the Thor forwarding senses to owners."""
    mesh = seed_mesh()
    for box in mesh.values():
        box["fleet_mesh_key"] = True
    mesh["thor"]["fleet_roles"]["senses"] = {"feasible": False, "owners": ["spark"]}
    return mesh


def test_owner_forwarding_is_a_declared_mode_rendered_explicitly():
    thor = plan_mesh(owner_mesh())["boxes"]["thor"]
    senses = thor["roles"]["senses"]
    assert (senses["mode"], senses["hosted_by"]) == ("owners", SPARK)
    assert thor["key_hosts"] == []  # owners are asked under the fleet key, not peer keys
    env = dict(render_env(thor, {"fleet_key": "mesh"}))
    assert (env["MULTIMODAL_ROUTE"], env["MULTIMODAL_PEER_ORIGINS"]) == ("owners", SPARK)
    assert env["GATEWAY_FLEET_KEY"] == "mesh"


def test_a_fleet_key_leaves_a_referral_a_referral():
    mesh = seed_mesh()
    for box in mesh.values():
        box["fleet_mesh_key"] = True
    thor = plan_mesh(mesh)["boxes"]["thor"]
    env = dict(render_env(thor, {"fleet_key": "mesh"}))
    assert env["MULTIMODAL_ROUTE"] == "refer" and "MULTIMODAL_PEER_ORIGINS" not in env


@pytest.mark.parametrize(("keyless", "message"), [
    ("thor", "host thor, role senses, field owners: forwarding to owners needs fleet_mesh_key"),
    ("spark", "host thor, role senses, field owners: spark has no fleet_mesh_key"),
], ids=["forwarding box", "owner"])
def test_owner_forwarding_needs_the_fleet_key_on_both_ends(keyless, message):
    mesh = owner_mesh()
    del mesh[keyless]["fleet_mesh_key"]
    assert message in plan_error(mesh)


def test_owners_must_host_the_role():
    mesh = owner_mesh()
    mesh["thor"]["fleet_roles"]["senses"]["owners"] = ["orin"]
    assert "host thor, role senses, field owners: orin does not host senses" in plan_error(mesh)


def test_a_checkpoint_override_drops_the_catalog_quantization():
    worker = plan_mesh(seed_mesh())["boxes"]["orin"]["roles"]["worker"]["gear"]
    assert worker["served_name"] == "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4"
    assert worker["quantization"] is None and worker["mtp"] is False


def test_the_plan_holds_no_secrets():
    mesh = seed_mesh()
    mesh["spark"]["fleet_gateway_api_key"] = "s3cret-spark-key"
    assert "s3cret" not in repr(plan_mesh(mesh))


def test_collection_version_equals_galaxy_yml():
    galaxy = yaml.safe_load((Path(__file__).resolve().parents[2] / "galaxy.yml").read_text())
    assert galaxy["version"] == contract.VERSION


def test_extra_vars_written_as_text_are_read_as_numbers_and_booleans():
    mesh = seed_mesh()
    mesh["spark"].update(fleet_gateway_port="18555", fleet_gateway_force_strict_tools="true",
                         fleet_memory_headroom_gib="24.5")
    spark = plan_mesh(mesh)["boxes"]["spark"]
    assert spark["gateway"]["port"] == 18555 and spark["gateway"]["force_strict_tools"] is True
    assert spark["budget"]["headroom_gib"] == 24.5


def test_a_box_naming_itself_as_peer():
    mesh = seed_mesh()
    mesh["orin"]["fleet_roles"]["senses"]["proxy"] = "orin"
    assert "host orin, role senses, field proxy: names this box itself" in plan_error(mesh)


def test_a_hosted_pool_whose_own_gear_is_invalid_reports_the_gear():
    mesh = seed_mesh()
    mesh["thor"]["fleet_roles"]["cortex"].update(feasible=True, pool=["spark"], mtp=True)
    message = plan_error(mesh)
    assert "host thor, role cortex, field mtp" in message
