"""P_PEER_ORIGINS / _API_KEYS / _RATES -> replica specs, and the hosted pool's local slot."""

import pytest
from lobes_gateway.peers import LOCAL_ORIGIN, ReplicaSpec, replica_specs, with_local_replica

SPARK = "http://spark.tail0be7e0.ts.net:8001"
THOR = "http://thor.tail0be7e0.ts.net:8000"


def specs(**overrides):
    args = {
        "origins": f"{SPARK},{THOR}",
        "api_keys": ",",
        "rates": None,
        "singular_origin": SPARK,
        "singular_key": "spark-inbound",
        "prefix": "PRIMARY",
    }
    args.update(overrides)
    return replica_specs(**args)


def test_empty_slot_of_the_singular_peer_inherits_its_key():
    spark, thor = specs()
    assert spark.api_key == "spark-inbound"
    assert thor.api_key is None


def test_inheritance_matches_the_singular_origin_despite_a_trailing_slash():
    spark, _ = specs(singular_origin=SPARK + "/")
    assert spark.api_key == "spark-inbound"


def test_an_explicit_slot_wins_over_inheritance():
    spark, thor = specs(api_keys="own-spark,thor-key")
    assert (spark.api_key, thor.api_key) == ("own-spark", "thor-key")


def test_an_empty_slot_of_another_origin_never_inherits():
    spark, thor = specs(singular_origin=THOR, singular_key="thor-key")
    assert spark.api_key is None
    assert thor.api_key == "thor-key"


def test_unset_keys_mean_every_slot_is_empty():
    spark, thor = specs(api_keys=None)
    assert spark.api_key == "spark-inbound"
    assert thor.api_key is None


def test_a_key_list_of_the_wrong_length_names_both_variables():
    with pytest.raises(
        ValueError, match=r"PRIMARY_PEER_API_KEYS has 3 slots.*PRIMARY_PEER_ORIGINS"
    ):
        specs(api_keys="a,b,c")


def test_rates_are_priors_in_origin_order_with_empty_slots():
    spark, thor = specs(rates="48.9,")
    assert spark.prior_rate == 48.9
    assert thor.prior_rate is None


@pytest.mark.parametrize(
    ("rates", "message"),
    [("48.9", "has 1 entries"), ("fast,11", "not a number"), ("48.9,0", "greater than 0")],
)
def test_bad_rates_name_the_variable_and_the_fix(rates, message):
    with pytest.raises(ValueError, match=f"PRIMARY_PEER_RATES.*{message}"):
        specs(rates=rates)


def test_an_origin_declared_twice_is_refused_by_the_pool():
    from lobes_gateway.peers import Pool

    with pytest.raises(ValueError, match="declares an origin twice"):
        Pool("cortex", specs(origins=f"{SPARK},{SPARK}"))


def test_local_replica_comes_first_when_self_origin_is_not_declared():
    peers = specs()
    hosted = with_local_replica(peers, local_url="http://127.0.0.1:8101", self_origin=None)
    assert hosted[0] == ReplicaSpec(origin=LOCAL_ORIGIN, local_url="http://127.0.0.1:8101")
    assert hosted[1:] == peers


def test_self_origin_among_the_origins_keeps_its_slot_and_rate():
    peers = specs(rates="48.9,11")
    hosted = with_local_replica(peers, local_url="http://127.0.0.1:8101", self_origin=THOR)
    assert [s.origin for s in hosted] == [SPARK, THOR]
    assert hosted[1].is_local and hosted[1].prior_rate == 11.0
    assert not hosted[0].is_local
