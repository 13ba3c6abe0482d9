"""P_PEER_ORIGINS / _API_KEYS / _RATES -> the pool's replicas, and the hosted pool's local slot.

The environment is parsed by config.load_config (one place); these tests hold it to the
pool rules: the empty-slot inheritance, rates in origin order, and errors naming the fix.
"""

import pytest
from lobes_gateway.mesh.peers import replica_specs
from lobes_gateway.mesh.replicas import LOCAL_ORIGIN, ReplicaSet, ReplicaSpec, with_local_replica
from lobes_gateway.policy.config import ConfigError, load_config

SPARK = "http://spark.tail0be7e0.ts.net:8001"
THOR = "http://thor.tail0be7e0.ts.net:8000"


def specs(**overrides):
    env = {
        "PRIMARY_FEASIBLE": "false",
        "PRIMARY_PEER_ORIGIN": SPARK,
        "PRIMARY_PEER_PROXY": "true",
        "PRIMARY_PEER_API_KEY": "spark-inbound",
        "PRIMARY_PEER_ORIGINS": f"{SPARK},{THOR}",
        "PRIMARY_PEER_API_KEYS": ",",
    }
    env.update({k: v for k, v in overrides.items() if v is not None})
    for key in [k for k, v in overrides.items() if v is None]:
        env.pop(key)
    return replica_specs(load_config(env).roles["cortex"])


def test_empty_slot_of_the_singular_peer_inherits_its_key():
    spark, thor = specs()
    assert spark == ReplicaSpec(origin=SPARK, api_key="spark-inbound")
    assert thor == ReplicaSpec(origin=THOR, api_key=None)


def test_inheritance_matches_the_singular_origin_despite_a_trailing_slash():
    spark, _ = specs(PRIMARY_PEER_ORIGIN=SPARK + "/")
    assert spark.api_key == "spark-inbound"


def test_an_explicit_slot_wins_over_inheritance():
    spark, thor = specs(PRIMARY_PEER_API_KEYS="own-spark,thor-key")
    assert (spark.api_key, thor.api_key) == ("own-spark", "thor-key")


def test_an_empty_slot_of_another_origin_never_inherits():
    spark, thor = specs(PRIMARY_PEER_ORIGIN=THOR, PRIMARY_PEER_API_KEY="thor-key")
    assert spark.api_key is None
    assert thor.api_key == "thor-key"


def test_unset_keys_mean_every_slot_is_empty():
    spark, thor = specs(PRIMARY_PEER_API_KEYS=None)
    assert spark.api_key == "spark-inbound"
    assert thor.api_key is None


def test_a_key_list_of_the_wrong_length_names_the_variable():
    with pytest.raises(ConfigError, match="PRIMARY_PEER_API_KEYS"):
        specs(PRIMARY_PEER_API_KEYS="a,b,c")


def test_rates_are_priors_in_origin_order_with_empty_slots():
    spark, thor = specs(PRIMARY_PEER_RATES="48.9,")
    assert spark.prior_rate == 48.9
    assert thor.prior_rate is None


@pytest.mark.parametrize("rates", ["48.9", "fast,11", "48.9,0"])
def test_bad_rates_name_the_variable(rates):
    with pytest.raises(ConfigError, match="PRIMARY_PEER_RATES"):
        specs(PRIMARY_PEER_RATES=rates)


def test_an_origin_declared_twice_is_refused_by_the_pool():
    spark, _ = specs()
    with pytest.raises(ValueError, match="declares an origin twice"):
        ReplicaSet("cortex", (spark, spark))


def test_local_replica_comes_first_when_self_origin_is_not_declared():
    peers = specs()
    hosted = with_local_replica(peers, local_url="http://127.0.0.1:8101", self_origin=None)
    assert hosted[0] == ReplicaSpec(origin=LOCAL_ORIGIN, local_url="http://127.0.0.1:8101")
    assert hosted[1:] == peers


def test_self_origin_among_the_origins_keeps_its_slot_and_rate():
    peers = specs(PRIMARY_PEER_RATES="48.9,11")
    hosted = with_local_replica(peers, local_url="http://127.0.0.1:8101", self_origin=THOR)
    assert [s.origin for s in hosted] == [SPARK, THOR]
    assert hosted[1].is_local and hosted[1].prior_rate == 11.0
    assert not hosted[0].is_local
