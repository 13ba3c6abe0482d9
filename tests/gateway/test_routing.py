"""routing.py: model names, aliases, the upward fallback contract, task lanes, refusals."""

import json

import pytest
from lobes_gateway.policy.config import ConfigError, load_config
from lobes_gateway.policy.routing import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    REALTIME,
    RERANKING,
    SPEECH,
    TRANSCRIPTION,
    LocalRoute,
    PoolRoute,
    ProxyRoute,
    Refusal,
    Router,
)

WIRED = {
    "PRIMARY_BASE_URL": "http://127.0.0.1:1001", "PRIMARY_SERVED_NAME": "primary-served",
    "MULTIMODAL_BASE_URL": "http://127.0.0.1:1002", "MULTIMODAL_SERVED_NAME": "mm-served",
    "EMBED_BASE_URL": "http://127.0.0.1:1003", "RERANK_BASE_URL": "http://127.0.0.1:1004",
    "AUDIO_URL": "http://127.0.0.1:1005",
}


def router(**env: str) -> Router:
    return Router(load_config({**WIRED, **env}))


def local(route) -> LocalRoute:
    assert isinstance(route, LocalRoute), route
    return route


def served(r: Router, model, lane=CHAT) -> str:
    return local(r.resolve(lane, model).route).targets[0].served_name


@pytest.mark.parametrize("model", ["main", "hard", "cortex", "primary-served",
                                   "sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP"])
def test_primary_names(model):
    route = local(router().resolve(CHAT, model).route)
    assert route.role == "cortex" and route.tier == "main"
    assert route.targets[0].served_name == "primary-served"


@pytest.mark.parametrize("model", ["multimodal", "normal", "senses", "mm-served"])
def test_multimodal_names(model):
    route = local(router().resolve(CHAT, model).route)
    assert (route.role, route.tier) == ("senses", "multimodal")


@pytest.mark.parametrize("model", [None, "", "gpt-4o", 42, ["x"]])
def test_missing_or_unknown_model_goes_to_default(model):
    assert served(router(), model) == "primary-served"


def test_default_model_variable():
    assert served(router(GATEWAY_DEFAULT_MODEL="senses"), "unknown") == "mm-served"


def test_aliases_resolve_through_names():
    r = router(GATEWAY_ALIASES="gpt-4=multimodal,house=primary-served")
    assert served(r, "gpt-4") == "mm-served"
    assert served(r, "house") == "primary-served"


def test_alias_to_nothing_is_a_config_error():
    with pytest.raises(ConfigError, match="GATEWAY_ALIASES"):
        router(GATEWAY_ALIASES="x=nonexistent")


def test_unwired_minor_falls_up_to_primary_and_keeps_requested_tier():
    resolved = router().resolve(CHAT, "cheap")
    assert resolved.requested_tier == "minor"
    assert local(resolved.route).role == "cortex"


def test_wired_minor_is_served_by_minor():
    r = router(MINOR_BASE_URL="http://127.0.0.1:1009", MINOR_SERVED_NAME="small")
    route = local(r.resolve(CHAT, "minor").route)
    assert (route.tier, route.targets[0].served_name) == ("minor", "small")


def test_unwired_multimodal_falls_up_to_main():
    env = {k: v for k, v in WIRED.items() if not k.startswith("MULTIMODAL")}
    route = local(Router(load_config(env)).resolve(CHAT, "senses").route)
    assert route.role == "cortex" and route.tier == "main"


@pytest.mark.parametrize("model", ["muse", "worker"])
def test_unwired_opt_in_roles_are_infeasible_never_upward(model):
    route = router().resolve(CHAT, model).route
    assert isinstance(route, Refusal)
    assert route.error.status == 404 and route.error.type == "role_infeasible"


def test_explicitly_feasible_but_unwired_opt_in_role_is_not_wired():
    route = router(MUSE_FEASIBLE="true").resolve(CHAT, "muse").route
    assert isinstance(route, Refusal) and route.error.status == 503
    assert "MUSE_BASE_URL" in route.error.message


def test_wired_opt_in_role_is_local():
    r = router(WORKER_BASE_URL="http://127.0.0.1:1010")
    assert local(r.resolve(CHAT, "worker").route).tier == "worker"


def test_failover_target_only_on_the_primary_lane():
    r = router(FALLBACK_URL="http://127.0.0.1:1011", FALLBACK_SERVED_NAME="mistral")
    primary = local(r.resolve(CHAT, "main").route)
    assert [t.name for t in primary.targets] == ["cortex", "fallback"]
    assert [t.name for t in local(r.resolve(CHAT, "senses").route).targets] == ["senses"]


def test_infeasible_role_refers_to_its_peer():
    route = router(MULTIMODAL_FEASIBLE="false",
                   MULTIMODAL_PEER_ORIGIN="http://spark:8000").resolve(CHAT, "senses").route
    assert isinstance(route, Refusal)
    body = json.loads(route.error.body())["error"]
    assert body["type"] == body["code"] == "role_infeasible"
    assert "http://spark:8000" in body["message"]


def test_proxy_needs_both_infeasible_and_an_origin():
    inert = router(MULTIMODAL_PEER_PROXY="true").resolve(CHAT, "senses").route
    assert isinstance(inert, LocalRoute)
    armed = router(MULTIMODAL_FEASIBLE="false", MULTIMODAL_PEER_PROXY="true",
                   MULTIMODAL_PEER_ORIGIN="http://spark:8000",
                   MULTIMODAL_PEER_API_KEY="k").resolve(CHAT, "senses").route
    assert isinstance(armed, ProxyRoute)
    assert (armed.origin, armed.api_key, armed.peer_model) == ("http://spark:8000", "k", "senses")


def test_pool_route_falls_through_to_the_single_proxy():
    route = router(PRIMARY_FEASIBLE="false", PRIMARY_PEER_PROXY="true",
                   PRIMARY_PEER_ORIGIN="http://spark:1",
                   PRIMARY_PEER_ORIGINS="http://spark:1,http://thor:2").resolve(CHAT, "main").route
    assert isinstance(route, PoolRoute)
    assert isinstance(route.fall_through, ProxyRoute)
    assert [p.origin for p in route.config.peers] == ["http://spark:1", "http://thor:2"]


def test_a_pool_without_a_singular_peer_falls_through_to_its_first_replica():
    """What placement cannot place (every replica full under the queue policy) goes to the
    first replica, with its own key: never a refusal."""
    route = router(PRIMARY_FEASIBLE="false", PRIMARY_ROUTE="pool",
                   PRIMARY_PEER_ORIGINS="http://spark:1,http://thor:2",
                   PRIMARY_PEER_API_KEYS="spark-key,").resolve(CHAT, "main").route
    assert isinstance(route, PoolRoute) and isinstance(route.fall_through, ProxyRoute)
    fall_through = route.fall_through
    assert (fall_through.origin, fall_through.api_key) == ("http://spark:1", "spark-key")


def test_task_lanes_route_by_path():
    r = router(EMBED_SERVED_NAME="emb", RERANK_SERVED_NAME="rr")
    assert local(r.lane_routes[EMBEDDINGS]).targets[0].served_name == "emb"
    assert local(r.lane_routes[RERANKING]).targets[0].served_name == "rr"
    for lane in (TRANSCRIPTION, SPEECH, REALTIME):
        route = local(r.lane_routes[lane])
        assert route.targets[0].origin.port == 1005 and not route.rewrite_model


def test_audio_lanes_move_independently():
    r = router(TTS_FEASIBLE="false", TTS_PEER_ORIGIN="http://thor:8000", TTS_PEER_PROXY="true")
    assert isinstance(r.lane_routes[SPEECH], ProxyRoute)
    assert isinstance(r.lane_routes[TRANSCRIPTION], LocalRoute)


def test_realtime_is_never_proxied():
    r = router(STT_FEASIBLE="false", STT_PEER_ORIGIN="http://thor:8000", STT_PEER_PROXY="true")
    assert isinstance(r.lane_routes[TRANSCRIPTION], ProxyRoute)
    refusal = r.lane_routes[REALTIME]
    assert isinstance(refusal, Refusal) and "http://thor:8000" in refusal.error.message


def test_strict_lane_only_for_primary_chat():
    r = router(GATEWAY_FORCE_STRICT_TOOLS="true")
    assert local(r.resolve(CHAT, "main").route).strict_lane
    assert not local(r.resolve(COMPLETIONS, "main").route).strict_lane
    assert not local(r.resolve(CHAT, "senses").route).strict_lane
    assert not local(router().resolve(CHAT, "main").route).strict_lane
