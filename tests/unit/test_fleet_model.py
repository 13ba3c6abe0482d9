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


DROP = object()  # as a value in an edit: remove the key at that path


def edited(changes: dict[tuple[str, ...], object]) -> dict:
    """Seed 000's hostvars with each value set at its key path (DROP removes that key)."""
    mesh = seed_mesh()
    for path, value in changes.items():
        *parents, key = path
        target = mesh
        for name in parents:
            target = target[name]
        if value is DROP:
            del target[key]
        else:
            target[key] = value
    return mesh


# Each row: edits to seed 000's hostvars, then fragments the refusal's message must all contain.
REJECTIONS = [
    pytest.param({("spark", "fleet_roles", "muse"): {}},  # 0.55 on top of the duo's 0.56
                 ["host spark", "gpu_memory_utilization", "budget over usable memory",
                  "muse 0.55", "= 1.11"], id="budget-over-usable-memory"),
    pytest.param({("spark", "fleet_memory_headroom_gib"): 60.0},
                 ["budget over usable memory"], id="headroom-override-shrinks-the-budget"),
    pytest.param({("thor", "fleet_roles", "senses", "referral"): "orin"},
                 ["host thor, role senses, field referral: orin does not host senses"],
                 id="referral-to-a-non-host"),
    pytest.param({("orin", "fleet_roles", "senses", "proxy"): "thor"},
                 ["host orin, role senses, field proxy: thor does not host senses"],
                 id="proxy-to-a-non-host"),
    pytest.param({("orin", "fleet_roles", "senses", "proxy"): "jetson9"},
                 ["host orin, role senses, field proxy: 'jetson9' is not a host of this "
                  "inventory"], id="peer-not-in-the-inventory"),
    pytest.param({("orin", "fleet_roles", "senses", "proxy"): "orin"},
                 ["host orin, role senses, field proxy: names this box itself"],
                 id="box-naming-itself-as-peer"),
    pytest.param({("orin", "fleet_roles", "senses", "referral"): "spark"},
                 ["role senses, field proxy: declare one of referral, proxy, pool or owners"],
                 id="one-peer-mode-per-role"),
    pytest.param({("orin", "fleet_roles", "senses", "feasible"): True},
                 ["role senses, field proxy: a role served here takes no referral, proxy or "
                  "owners"],
                 id="served-role-takes-no-proxy"),
    pytest.param({("thor", "fleet_roles", "cortex", "served_name"): "unsloth/Qwen3.8-27B-NVFP4"},
                 ["served model spark='sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP' vs "
                  "thor='unsloth/Qwen3.8-27B-NVFP4'"], id="pool-served-models-disagree"),
    pytest.param({("thor", "fleet_roles", "cortex", "feasible"): True,
                  ("thor", "fleet_roles", "cortex", "pool"): ["spark"],
                  ("thor", "fleet_roles", "cortex", "quantization"): "fp8"},
                 ["host thor, role cortex, field pool: pool members disagree: "
                  "quantization thor='fp8' vs spark="], id="hosted-pool-includes-this-box"),
    pytest.param({("thor", "fleet_roles", "cortex", "feasible"): True,
                  ("thor", "fleet_roles", "cortex", "pool"): ["spark"],
                  ("thor", "fleet_roles", "cortex", "mtp"): True},
                 ["host thor, role cortex, field mtp"], id="hosted-pool-with-an-invalid-gear"),
    pytest.param({("orin", "fleet_roles", "cortex", "rates"): {"spark": 48.9}},
                 ["field rates: declare a rate for every pool member and no other (missing: thor"],
                 id="rates-cover-exactly-the-pool"),
    pytest.param({("orin", "fleet_roles", "cortex", "rates"): {"spark": float("inf"), "thor": 11}},
                 ["host orin, role cortex, field rates.spark: not a finite number: inf (allowed: a "
                  "number above 0 and at most 100000)"],
                 id="rate-not-finite"),
    pytest.param({("spark", "fleet_roles", "cortex", "gpu_memory_utilization"): float("nan")},
                 ["host spark, role cortex, field gpu_memory_utilization: not a finite number: "
                  "nan"], id="share-not-a-number"),
    pytest.param({("spark", "fleet_sim_time_scale"): 10**400},
                 ["host spark, field fleet_sim_time_scale: not a finite number"],
                 id="number-past-any-float"),
    pytest.param({("spark", "fleet_roles", "stt"): {"feasible": True, "pool": ["thor"]},
                  ("spark", "fleet_audio_image"): "ghcr.io/example/realtime-bridge:1"},
                 ["role stt, field pool: audio lanes are served here or proxied"],
                 id="audio-lanes-never-pooled"),
    pytest.param({("thor", "fleet_roles", "cortex", "mtp"): True},
                 ["host thor, role cortex, field mtp: thor (sm_110) has no MTP kernel"],
                 id="mtp-without-the-kernel"),
    pytest.param({("spark", "fleet_roles", "cortex", "yarn_factor"): DROP},
                 ["host spark, role cortex, field context: 262144 exceeds the checkpoint's "
                  "native window 131072; lower it or declare yarn_factor >= 2"],
                 id="context-above-native-window-needs-yarn"),
    pytest.param({("spark", "fleet_roles", "cortex", "yarn_factor"): 1.5},
                 ["exceeds the YaRN window 131072 x 1.5 = 196608"],
                 id="yarn-factor-must-cover-the-context"),
    pytest.param({("orin", "fleet_roles", "worker", "gpu_memory_utilization"): DROP},
                 ["host orin, role worker, field gpu_memory_utilization: is unmeasured"],
                 id="unmeasured-utilization-undeclared"),
    pytest.param({("spark", "fleet_hardware"): "dgx"},
                 ["field fleet_hardware: not a known value: 'dgx' (allowed: one of gb10, orin, "
                  "sim, thor)"], id="unknown-hardware"),
    pytest.param({("spark", "fleet_runtime"): "k8s"},
                 ["field fleet_runtime: not a known value: 'k8s' (allowed: one of compose, "
                  "process)"], id="unknown-runtime"),
    pytest.param({("spark", "fleet_gateway_port"): "eighty"},
                 ["field fleet_gateway_port: not a whole number: 'eighty'"],
                 id="port-not-an-integer"),
    pytest.param({("spark", "fleet_gateway_port"): 65536},
                 ["host spark, field fleet_gateway_port: out of range: 65536 (allowed: a whole "
                  "number between 1 and 65535)"],
                 id="port-above-65535"),
    pytest.param({("spark", "fleet_gateway_port"): 0},
                 ["field fleet_gateway_port: out of range: 0"],
                 id="port-zero"),
    pytest.param({("spark", "fleet_roles"): {"brain": {}}},
                 ["host spark, role brain, field fleet_roles"], id="unknown-role"),
    pytest.param({("spark", "fleet_roles"): {"cortex": {"contxt": 1}}},
                 ["role cortex, field contxt: is not"], id="unknown-role-field"),
    pytest.param({("spark", "fleet_roles", "cortex", "context"): "big"},
                 ["role cortex, field context: not a whole number: 'big'"],
                 id="context-not-an-integer"),
    pytest.param({("spark", "fleet_gateway_tuning"): {"LOBES_FOO": 1}},
                 ["'LOBES_FOO' is not a tunable"], id="unknown-tunable"),
    pytest.param({("spark", "fleet_gateway_tuning"): {"GATEWAY_UPSTREAM_TIMEOUT_S": 0}},
                 ["host spark, field fleet_gateway_tuning.GATEWAY_UPSTREAM_TIMEOUT_S: out of "
                  "range: 0 (allowed: a number 0.01 or more)"],
                 id="tuned-timeout-the-gateway-refuses"),
    pytest.param({("spark", "fleet_gateway_tuning"): {"LOBES_SWAP_DEGRADED_THRESHOLD": 120}},
                 ["LOBES_SWAP_DEGRADED_THRESHOLD: out of range: 120 (allowed: a number between 0 "
                  "and 100)"],
                 id="tuned-percentage-above-100"),
    pytest.param({("spark", "fleet_gateway_tuning"): {"GATEWAY_MAX_BODY_BYTES": 1.5}},
                 ["GATEWAY_MAX_BODY_BYTES: not a whole number: 1.5"],
                 id="tuned-byte-count-not-whole"),
    pytest.param({("spark", "fleet_gateway_tuning"): {"GATEWAY_UPSTREAM_TIMEOUT_S": 10**400}},
                 ["GATEWAY_UPSTREAM_TIMEOUT_S: not a finite number: 1000"],
                 id="tuned-value-past-any-float"),
    pytest.param({("orin", "fleet_gateway_pool_policy"): "fastest"},
                 ["host orin, field fleet_gateway_pool_policy: not a known value: 'fastest' "
                  "(allowed: one of prefix, rate, queue, pinned)"], id="unknown-pool-policy"),
    pytest.param({("spark", "fleet_roles", "cortex", "stream_resume"): False},
                 ["host spark, role cortex, field stream_resume: applies to a pool only"],
                 id="stream-resume-without-a-pool"),
    pytest.param({("orin", "fleet_roles", "cortex", "stream_resume"): "sometimes"},
                 ["host orin, role cortex, field stream_resume: not true or false: 'sometimes'"],
                 id="stream-resume-not-a-bool"),
    pytest.param({("spark", "fleet_origin"): "spark:8001"},
                 ["host spark, field fleet_origin: is not an http://host:port origin: "
                  "'spark:8001' (allowed: http://host:port"], id="origin-without-scheme"),
    pytest.param({("spark", "fleet_origin"): "http://spark:8001/"},
                 ["host spark, field fleet_origin: ends in '/': 'http://spark:8001/'"],
                 id="origin-trailing-slash"),
    pytest.param({("spark", "fleet_origin"): "http://fd7a:115c:a1e0::11:8001"},
                 ["host spark, field fleet_origin: has an invalid port: "
                  "'http://fd7a:115c:a1e0::11:8001' (allowed: http://host:port: plain HTTP, no "
                  "path, query, fragment, user or password; an IPv6 address in brackets)"],
                 id="origin-ipv6-without-brackets"),
    pytest.param({("spark", "fleet_origin"): "http://spark:8001/v1"},
                 ["host spark, field fleet_origin: carries a path: 'http://spark:8001/v1'"],
                 id="origin-with-a-path"),
    pytest.param({("thor", "fleet_origin"): SPARK},
                 ["host thor, field fleet_origin: " + SPARK + " is also"], id="origin-taken"),
    pytest.param({("spark", "fleet_hardware"): "sim", ("spark", "fleet_gear_engine"): "vllm"},
                 ["host spark, field fleet_gear_engine: hardware sim has no GPU to run vLLM"],
                 id="vllm-without-a-gpu"),
    pytest.param({("spark", "fleet_runtime"): "process",
                  ("spark", "fleet_roles", "cortex", "engine"): "vllm"},
                 ["host spark, role cortex, field engine: the process runtime runs vLLM's CPU "
                  "build or simulated gears"],
                 id="vllm-under-the-process-runtime"),
    pytest.param({("spark", "fleet_roles", "cortex", "engine"): "vllm-cpu"},
                 ["host spark, role cortex, field engine: vLLM's CPU build runs under the "
                  "process runtime"],
                 id="vllm-cpu-under-compose"),
    pytest.param({("spark", "fleet_runtime"): "process",
                  ("spark", "fleet_roles", "cortex", "engine"): "vllm-cpu",
                  ("spark", "fleet_roles", "cortex", "gpu_memory_utilization"): 0.5},
                 ["host spark, role cortex, field gpu_memory_utilization: vLLM's CPU build has "
                  "no GPU share"],
                 id="gpu-share-on-the-cpu-engine"),
    pytest.param({("spark", "fleet_runtime"): "process",
                  ("spark", "fleet_roles", "cortex", "engine"): "vllm-cpu",
                  ("spark", "fleet_roles", "cortex", "kv_cache_gib"): 0},
                 ["host spark, role cortex, field kv_cache_gib: out of range: 0 (allowed: a whole "
                  "number between 1 and 1024)"],
                 id="no-kv-cache-on-the-cpu-engine"),
    pytest.param({("spark", "fleet_gear_engine"): "tgi"},
                 ["host spark, field fleet_gear_engine: not a known value: 'tgi' (allowed: one "
                  "of vllm, vllm-cpu, sim)"],
                 id="unknown-engine"),
    pytest.param({("thor", "fleet_roles", "cortex", "mtp"): True,
                  ("spark", "fleet_roles", "muse"): {}},
                 ["field mtp", "budget over usable memory"], id="several-errors-together"),
]


@pytest.mark.parametrize(("changes", "fragments"), REJECTIONS)
def test_an_invalid_inventory_is_refused_naming_host_role_and_field(changes, fragments):
    message = plan_error(edited(changes))
    for fragment in fragments:
        assert fragment in message


def test_proxy_cycle_is_named():
    mesh = seed_mesh()
    mesh["spark"]["fleet_roles"]["senses"] = {"feasible": False, "proxy": "orin"}
    message = plan_error(mesh)
    assert "role senses, field proxy: proxy cycle" in message
    assert re.search(r"proxy cycle (orin -> spark -> orin|spark -> orin -> spark)", message)


def test_gear_engine_is_vllm_under_compose_with_a_gpu_and_sim_otherwise():
    mesh = seed_mesh()
    mesh["spark"]["fleet_roles"]["senses"]["engine"] = "sim"
    mesh["orin"]["fleet_gear_engine"] = "sim"
    boxes = plan_mesh(mesh)["boxes"]
    assert boxes["spark"]["roles"]["cortex"]["gear"]["engine"] == "vllm"
    assert boxes["spark"]["roles"]["senses"]["gear"]["engine"] == "sim"
    assert boxes["orin"]["roles"]["worker"]["gear"]["engine"] == "sim"
    mesh["spark"]["fleet_hardware"] = "sim"
    assert plan_mesh(mesh)["boxes"]["spark"]["roles"]["cortex"]["gear"]["engine"] == "sim"


def test_mtp_defaults_on_where_the_kernel_exists_and_off_where_not():
    boxes = plan_mesh(seed_mesh())["boxes"]
    assert boxes["spark"]["roles"]["cortex"]["gear"]["mtp"] is True
    assert boxes["thor"]["roles"]["cortex"]["gear"]["mtp"] is False


def test_senses_native_window_is_128k_even_though_it_serves_32k():
    mesh = seed_mesh()
    mesh["spark"]["fleet_roles"]["senses"]["context"] = 131072
    spark = plan_mesh(mesh)["boxes"]["spark"]["roles"]["senses"]["gear"]
    assert spark["context"] == 131072 and spark["yarn_factor"] is None


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
        box["fleet_mesh_key"] = "mesh-key"
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


ORIN_SECRETS = {"gateway_api_key": "orin-key",
                "peer_keys": {"spark": "spark-key", "thor": "thor-key"}}


def test_a_pool_resumes_streams_and_places_by_the_default_policy_unless_declared_otherwise():
    orin = plan_mesh(seed_mesh())["boxes"]["orin"]
    env = dict(render_env(orin, ORIN_SECRETS))
    assert env["PRIMARY_ROUTE"] == "pool" and env["PRIMARY_STREAM_RESUME"] == "true"
    assert "GATEWAY_POOL_POLICY" not in env  # the gateway's default, prefix
    resumed = [name for name in env if name.endswith("_STREAM_RESUME")]
    assert resumed == ["PRIMARY_STREAM_RESUME"]  # the one pool
    mesh = seed_mesh()
    mesh["orin"]["fleet_gateway_pool_policy"] = "rate"
    mesh["orin"]["fleet_roles"]["cortex"]["stream_resume"] = False
    orin = plan_mesh(mesh)["boxes"]["orin"]
    assert (orin["gateway"]["pool_policy"], orin["roles"]["cortex"]["stream_resume"]) == (
        "rate", False)
    env = dict(render_env(orin, ORIN_SECRETS))
    assert env["GATEWAY_POOL_POLICY"] == "rate" and "PRIMARY_STREAM_RESUME" not in env
    assert env["PRIMARY_ROUTE"] == "pool"


def test_timeouts_are_tunable_for_long_generations_and_slow_boxes():
    mesh = seed_mesh()
    mesh["orin"]["fleet_gateway_tuning"] = {"GATEWAY_UPSTREAM_TIMEOUT_S": 1800,
                                            "GATEWAY_STREAM_STALL_S": 45.5}
    env = dict(render_env(plan_mesh(mesh)["boxes"]["orin"], ORIN_SECRETS))
    assert (env["GATEWAY_UPSTREAM_TIMEOUT_S"], env["GATEWAY_STREAM_STALL_S"]) == ("1800", "45.5")


def test_a_fleet_key_leaves_a_referral_a_referral():
    mesh = seed_mesh()
    for box in mesh.values():
        box["fleet_mesh_key"] = "mesh-key"
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


def test_pool_members_may_serve_different_windows():
    # Seed 000's Thor at its 1048576 YaRN window pools with the Spark's 262144: the window
    # is a per-replica fact, and the peer-only pool takes the longest request either can.
    mesh = edited({("thor", "fleet_roles", "cortex", "context"): 1048576,
                   ("thor", "fleet_roles", "cortex", "yarn_factor"): 8.0})
    boxes = plan_mesh(mesh)["boxes"]
    assert boxes["orin"]["roles"]["cortex"]["context"] == 1048576
    assert boxes["thor"]["roles"]["cortex"]["gear"]["context"] == 1048576


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
                         fleet_gateway_private_status="yes", fleet_memory_headroom_gib="24.5")
    spark = plan_mesh(mesh)["boxes"]["spark"]
    assert spark["gateway"]["port"] == 18555 and spark["gateway"]["force_strict_tools"] is True
    assert spark["gateway"]["private_status"] is True
    assert plan_mesh(seed_mesh())["boxes"]["spark"]["gateway"]["private_status"] is False
    assert spark["budget"]["headroom_gib"] == 24.5
    mesh["orin"]["fleet_roles"]["cortex"]["rates"] = {"spark": "48.9", "thor": "11"}
    cortex = plan_mesh(mesh)["boxes"]["orin"]["roles"]["cortex"]
    assert [peer["rate"] for peer in cortex["peers"]] == [48.9, 11.0]
