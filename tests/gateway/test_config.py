"""policy/config.py: the environment contract parses into typed, validated, frozen config."""

import dataclasses
import socket
from pathlib import Path

import pytest
from lobes_gateway import __version__
from lobes_gateway.policy.config import ConfigError, load_config
from lobes_gateway.transport.upstream import Origin
from lobes_service_files import parse_env_file

from tests.support.gateway_proc import run_config_check

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden"


def test_defaults_without_environment():
    config = load_config({})
    assert config.port == 8000
    assert config.api_key is None
    assert config.limits.max_body_bytes == 32 * 1024 * 1024
    assert config.limits.max_inflight_per_key == 32
    assert config.pressure.swap_degraded == 75.0
    assert config.pressure.iowait_degraded == 50.0
    assert config.pressure.proc_root == "/proc"
    cortex = config.roles["cortex"]
    assert cortex.feasible and not cortex.wired
    assert cortex.served_name == "sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP"
    assert cortex.max_model_len == 131072


def test_config_is_frozen():
    config = load_config({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.port = 1  # type: ignore[misc]


def test_version_matches_galaxy():
    galaxy = (pytest.importorskip("pathlib").Path(__file__).parents[2] / "galaxy.yml").read_text()
    assert f"version: {__version__}" in galaxy


def test_role_variables():
    config = load_config({
        "PRIMARY_BASE_URL": "http://10.0.0.5:8001/", "PRIMARY_SERVED_NAME": "qwen",
        "PRIMARY_MAX_MODEL_LEN": "65536", "PRIMARY_MAX_ACTIVE": "2",
        "FALLBACK_URL": "http://fb:8000",
    })
    cortex = config.roles["cortex"]
    assert cortex.base_url == Origin("10.0.0.5", 8001)
    assert (cortex.served_name, cortex.max_model_len, cortex.max_active) == ("qwen", 65536, 2)
    assert config.roles["fallback"].base_url == Origin("fb", 8000)


def test_inverted_feasibility_of_opt_in_roles():
    config = load_config({"WORKER_BASE_URL": "http://w:8000", "MUSE_FEASIBLE": "true"})
    assert not load_config({}).roles["muse"].feasible
    assert config.roles["worker"].feasible
    assert config.roles["muse"].feasible  # an explicit value always wins
    assert not load_config({"WORKER_BASE_URL": "http://w:8000",
                            "WORKER_FEASIBLE": "false"}).roles["worker"].feasible
    assert load_config({}).roles["stt"].feasible  # absent = feasible for core roles


def test_peer_pool_with_key_inheritance_and_rates():
    config = load_config({
        "PRIMARY_FEASIBLE": "false", "PRIMARY_PEER_PROXY": "true",
        "PRIMARY_PEER_ORIGIN": "http://spark:8001",
        "PRIMARY_PEER_API_KEY": "spark-key",
        "PRIMARY_PEER_ORIGINS": "http://spark:8001, http://thor:8000",
        "PRIMARY_PEER_API_KEYS": ",",
        "PRIMARY_PEER_RATES": "48.9,",
    })
    cortex = config.roles["cortex"]
    assert cortex.route == "pool" and cortex.peer_origin == "http://spark:8001"
    spark, thor = cortex.peers
    # The empty slot of the singular peer's own origin inherits its key; the other stays keyless.
    assert (spark.origin, spark.api_key, spark.rate) == ("http://spark:8001", "spark-key", 48.9)
    assert (thor.origin, thor.api_key, thor.rate) == ("http://thor:8000", None, None)


def test_stream_resume_is_per_role_and_off_unless_set():
    config = load_config({"PRIMARY_ROUTE": "pool", "PRIMARY_PEER_ORIGINS": "http://a:1,http://b:2",
                          "PRIMARY_STREAM_RESUME": "true", "GATEWAY_STREAM_STALL_S": "2.5"})
    assert config.roles["cortex"].stream_resume
    assert not config.roles["minor"].stream_resume
    assert config.limits.stream_stall_s == 2.5
    assert load_config({}).limits.stream_stall_s == 30.0
    with pytest.raises(ConfigError, match=r"PRIMARY_STREAM_RESUME.*true or false"):
        load_config({"PRIMARY_STREAM_RESUME": "sometimes"})
    # Off says nothing a lone backend could break.
    assert not load_config({"PRIMARY_STREAM_RESUME": "false"}).roles["cortex"].stream_resume


def test_explicit_pool_key_wins_over_inheritance():
    config = load_config({
        "EMBED_PEER_ORIGIN": "http://a:1", "EMBED_PEER_API_KEY": "k1",
        "EMBED_PEER_ORIGINS": "http://a:1,http://b:2", "EMBED_PEER_API_KEYS": "own,k2",
    })
    assert [p.api_key for p in config.roles["embedder"].peers] == ["own", "k2"]


def test_globals():
    config = load_config({
        "GATEWAY_HOST": "127.0.0.1", "GATEWAY_PORT": "9000", "GATEWAY_DEFAULT_MODEL": "main",
        "GATEWAY_ALIASES": "gpt-4=main, fast = minor", "CULTURE_VLLM_API_KEY": "culture",
        "GATEWAY_FLEET_KEY": "fleet", "GATEWAY_SELF_ORIGIN": "http://orin:8000",
        "GATEWAY_FORCE_STRICT_TOOLS": "1", "AUDIO_URL": "http://bridge:9000",
        "LOBES_SWAP_DEGRADED_THRESHOLD": "80", "LOBES_PROC_ROOT": "/tmp/proc",
        "GATEWAY_MAX_BODY_BYTES": "1024", "GATEWAY_MAX_INFLIGHT_PER_KEY": "4",
        "GATEWAY_POOL_POLICY": "queue",
    })
    assert (config.host, config.port, config.default_model) == ("127.0.0.1", 9000, "main")
    assert dict(config.aliases) == {"gpt-4": "main", "fast": "minor"}
    assert config.api_key == "culture"
    assert config.fleet_key == "fleet" and config.self_origin == "http://orin:8000"
    assert config.force_strict_tools
    assert config.audio_url == Origin("bridge", 9000)
    assert config.pressure.swap_degraded == 80.0 and config.pressure.proc_root == "/tmp/proc"
    assert config.limits.max_body_bytes == 1024 and config.limits.max_inflight_per_key == 4
    assert config.pool_policy == "queue"


def test_gateway_api_key_wins_over_culture_key():
    config = load_config({"GATEWAY_API_KEY": "g", "CULTURE_VLLM_API_KEY": "c"})
    assert config.api_key == "g"


@pytest.mark.parametrize(("env", "variable", "fix"), [
    ({"PRIMARY_BASE_URL": "spark:8000"}, "PRIMARY_BASE_URL", "http://host:port"),
    ({"PRIMARY_BASE_URL": "http://spark:8000/v1"}, "PRIMARY_BASE_URL", "without /v1"),
    ({"MUSE_FEASIBLE": "maybe"}, "MUSE_FEASIBLE", "true or false"),
    ({"GATEWAY_PORT": "eighty"}, "GATEWAY_PORT", "whole number"),
    ({"GATEWAY_PORT": "70000"}, "GATEWAY_PORT", "65535 or less"),
    ({"PRIMARY_BASE_URL": "http://spark:0"}, "PRIMARY_BASE_URL", "use a port 1-65535"),
    ({"PRIMARY_BASE_URL": "http://spark:70000"}, "PRIMARY_BASE_URL", "use a port 1-65535"),
    ({"PRIMARY_MAX_MODEL_LEN": "0"}, "PRIMARY_MAX_MODEL_LEN", "1 or more"),
    ({"LOBES_SWAP_DEGRADED_THRESHOLD": "120"}, "LOBES_SWAP_DEGRADED_THRESHOLD",
     "between 0 and 100"),
    ({"GATEWAY_ALIASES": "broken"}, "GATEWAY_ALIASES", "alias=target"),
    ({"PRIMARY_PEER_ORIGINS": "http://a:1,http://b:2", "PRIMARY_PEER_RATES": "1"},
     "PRIMARY_PEER_RATES", "one entry per"),
    ({"PRIMARY_PEER_ORIGINS": "http://a:1", "PRIMARY_PEER_RATES": "-3"},
     "PRIMARY_PEER_RATES", "> 0"),
    ({"PRIMARY_PEER_API_KEYS": "k"}, "PRIMARY_PEER_API_KEYS", "PRIMARY_PEER_ORIGINS"),
    ({"GATEWAY_POOL_POLICY": "random"}, "GATEWAY_POOL_POLICY", "prefix, rate"),
    # Misspelt names stop the gateway, naming the closest known one.
    ({"GATEWAY_PORTT": "8000"}, "GATEWAY_PORTT", "did you mean GATEWAY_PORT?"),
    ({"PRIMARY_BASEURL": "http://a:1"}, "PRIMARY_BASEURL", "did you mean PRIMARY_BASE_URL?"),
    ({"EMBED_PEER_ORIGIN_": "http://a:1"}, "EMBED_PEER_ORIGIN_",
     "did you mean EMBED_PEER_ORIGIN?"),
    ({"GATEWAY_COLOUR": "blue"}, "GATEWAY_COLOUR", "docs/gateway.md lists the names"),
    # An explicit route must agree with the variables it needs.
    ({"PRIMARY_ROUTE": "teleport"}, "PRIMARY_ROUTE", "serve, pool, proxy, refer, owners, off"),
    ({"PRIMARY_ROUTE": "proxy", "PRIMARY_FEASIBLE": "false"}, "PRIMARY_ROUTE",
     "set PRIMARY_PEER_ORIGIN"),
    ({"PRIMARY_ROUTE": "refer"}, "PRIMARY_ROUTE", "set PRIMARY_FEASIBLE=false"),
    ({"PRIMARY_ROUTE": "serve", "PRIMARY_FEASIBLE": "false"}, "PRIMARY_ROUTE",
     "set PRIMARY_FEASIBLE=true"),
    ({"PRIMARY_ROUTE": "pool"}, "PRIMARY_ROUTE", "set PRIMARY_PEER_ORIGINS"),
    ({"PRIMARY_ROUTE": "owners", "PRIMARY_FEASIBLE": "false",
      "PRIMARY_PEER_ORIGINS": "http://a:1"}, "PRIMARY_ROUTE", "set GATEWAY_FLEET_KEY"),
    ({"PRIMARY_ROUTE": "refer", "PRIMARY_FEASIBLE": "false",
      "PRIMARY_PEER_ORIGIN": "http://a:1", "PRIMARY_PEER_ORIGINS": "http://a:1"},
     "PRIMARY_PEER_ORIGINS", "route the role as pool"),
    # Stream resume needs another replica: on a lone backend it would be silently ignored.
    ({"PRIMARY_STREAM_RESUME": "true"}, "PRIMARY_STREAM_RESUME", "PRIMARY_ROUTE=pool"),
    ({"PRIMARY_FEASIBLE": "false", "PRIMARY_PEER_ORIGIN": "http://a:1",
      "PRIMARY_PEER_PROXY": "true", "PRIMARY_STREAM_RESUME": "true"},
     "PRIMARY_STREAM_RESUME", "remove PRIMARY_STREAM_RESUME"),
], ids=["origin-without-scheme", "origin-with-v1", "feasible-not-boolean", "port-not-a-number",
        "port-above-65535", "origin-port-zero", "origin-port-above-65535",
        "window-zero", "swap-threshold-over-100", "alias-without-target", "rates-miscounted",
        "rate-negative", "keys-without-origins", "unknown-pool-policy", "misspelt-global",
        "misspelt-role-variable", "trailing-underscore", "unknown-global", "unknown-route",
        "proxy-without-peer", "refer-while-feasible", "serve-while-infeasible",
        "pool-without-origins", "owners-without-fleet-key", "refer-with-pool-origins",
        "resume-on-a-lone-backend", "resume-on-a-proxied-role"])
def test_bad_variable_names_itself_and_the_fix(env, variable, fix):
    with pytest.raises(ConfigError) as info:
        load_config(env)
    assert info.value.variable == variable
    assert str(info.value).startswith(variable)
    assert fix in str(info.value)


def test_several_unknown_names_are_all_named():
    with pytest.raises(ConfigError) as info:
        load_config({"GATEWAY_PORTT": "1", "MINOR_SERVED": "x", "PATH": "/bin", "LOBESX": "1"})
    assert str(info.value).startswith("GATEWAY_PORTT: is not a variable of the gateway's "
                                      "contract (and MINOR_SERVED)")


@pytest.mark.parametrize(("env", "route"), [
    ({}, "serve"),
    ({"PRIMARY_PEER_ORIGINS": "http://a:1"}, "pool"),
    ({"PRIMARY_FEASIBLE": "false"}, "off"),
    ({"PRIMARY_FEASIBLE": "false", "PRIMARY_PEER_ORIGIN": "http://a:1"}, "refer"),
    ({"PRIMARY_FEASIBLE": "false", "PRIMARY_PEER_ORIGIN": "http://a:1",
      "PRIMARY_PEER_PROXY": "true"}, "proxy"),
    ({"PRIMARY_FEASIBLE": "false", "PRIMARY_PEER_ORIGINS": "http://a:1",
      "PRIMARY_PEER_PROXY": "true"}, "pool"),
    # The tailnet defect: a fleet key once made this referral owner forwarding.
    ({"PRIMARY_FEASIBLE": "false", "PRIMARY_PEER_ORIGIN": "http://a:1",
      "GATEWAY_FLEET_KEY": "mesh"}, "refer"),
    ({"PRIMARY_FEASIBLE": "false", "PRIMARY_PEER_ORIGINS": "http://a:1",
      "GATEWAY_FLEET_KEY": "mesh", "PRIMARY_ROUTE": "owners"}, "owners"),
], ids=["serve", "hosted pool", "off", "refer", "proxy", "peer pool", "fleet key refers",
        "owners"])
def test_an_env_without_p_route_keeps_seed_004s_meaning(env, route):
    assert load_config(env).roles["cortex"].route == route


def test_a_misspelt_variable_in_a_rendered_env_stops_the_gateway_at_start():
    """The golden tailnet .env with one name misspelt, as an operator's hand edit would."""
    rendered = (GOLDEN / "tailnet" / "agx-orin" / ".env").read_text()
    env = parse_env_file(rendered.replace("EMBED_PEER_ORIGIN=", "EMBED_PEER_ORIGN="))
    del env["GATEWAY_PORT"]  # a free one: the check must fail on the name, not the port
    started = run_config_check(env)
    assert started.returncode == 2
    assert ("EMBED_PEER_ORIGN: is not a variable of the gateway's contract; "
            "did you mean EMBED_PEER_ORIGIN?") in started.stderr


def test_a_port_another_process_holds_stops_start_up_naming_the_variable():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = run_config_check({"GATEWAY_HOST": "127.0.0.1", "GATEWAY_PORT": str(port),
                                    "PRIMARY_BASE_URL": "http://127.0.0.1:9"})
    assert started.returncode == 2
    assert started.stderr == (
        f"lobes_gateway: cannot listen on 127.0.0.1:{port} (GATEWAY_HOST, GATEWAY_PORT): Address "
        "already in use; another process holds the port: stop it, or set GATEWAY_PORT (the "
        "inventory's fleet_gateway_port) to a free one\n")


def test_an_address_the_box_does_not_have_stops_start_up_naming_the_variable():
    # 192.0.2.0/24 is reserved for documentation: no box has it, and a bind sends nothing.
    started = run_config_check({"GATEWAY_HOST": "192.0.2.1",
                                "PRIMARY_BASE_URL": "http://127.0.0.1:9"})
    assert started.returncode == 2
    assert "cannot listen on 192.0.2.1:" in started.stderr
    assert ("Cannot assign requested address; set GATEWAY_HOST (the inventory's "
            "fleet_gateway_host) to an address of this box") in started.stderr
    assert "Traceback" not in started.stderr
