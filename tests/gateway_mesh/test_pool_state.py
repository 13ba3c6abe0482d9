"""A pool judged one probe pass at a time: the reference rule, compatibility, the dark peer."""

from lobes_gateway.mesh.replicas import (
    REFERENCE_REASON,
    Fingerprint,
    ProbeResult,
    ReplicaSet,
    ReplicaSpec,
)

UNREACHABLE = "http://127.0.0.1:9"
SPARK = "http://spark:8001"
THOR = "http://thor:8000"
QWEN = Fingerprint("unsloth/Qwen3.8-27B-NVFP4", 262144)


def ready(fingerprint=QWEN, ids=None):
    listed = frozenset(ids or {fingerprint.served_id})
    return ProbeResult(ready=True, listed_ids=listed, fingerprint=fingerprint)


def dark():
    return ProbeResult.failed("peer gateway unreachable")


def pool(*origins):
    return ReplicaSet("cortex", tuple(ReplicaSpec(origin=o) for o in origins))


def rows(p):
    return [(s.origin, s.ready, s.compatible, s.reason) for s in p.states]


def test_before_any_pass_nothing_is_ready_or_selectable():
    p = pool(SPARK, THOR)
    assert not p.ready and p.selectable() == () and p.context is None
    assert all(s.reason == "not probed yet" for s in p.states)


def test_reference_is_the_first_ready_peer_not_the_first_declared():
    p = pool(UNREACHABLE, THOR)
    p.apply_pass({UNREACHABLE: dark(), THOR: ready()}, now=1.0)
    assert rows(p) == [
        (UNREACHABLE, False, False, "peer gateway unreachable"),
        (THOR, True, True, REFERENCE_REASON),
    ]
    assert p.reference.origin == THOR


def test_both_ready_and_agreeing_are_compatible_with_an_empty_reason():
    p = pool(SPARK, THOR)
    p.apply_pass({SPARK: ready(), THOR: ready()}, now=1.0)
    assert rows(p) == [(SPARK, True, True, REFERENCE_REASON), (THOR, True, True, "")]
    assert [s.origin for s in p.selectable()] == [SPARK, THOR]


def test_a_peer_that_goes_dark_does_not_stay_compatible_on_a_stale_fingerprint():
    p = pool(SPARK, THOR)
    p.apply_pass({SPARK: ready(), THOR: ready()}, now=1.0)
    p.apply_pass({SPARK: ready(), THOR: dark()}, now=2.0)
    thor = p.states[1]
    assert (thor.ready, thor.compatible, thor.reason) == (False, False, "peer gateway unreachable")
    assert thor.fingerprint is None
    assert [s.origin for s in p.selectable()] == [SPARK]
    assert p.capabilities()["replicas"][1] == {
        "origin": THOR,
        "ready": False,
        "compatible": False,
        "reason": "peer gateway unreachable",
    }


def test_the_reference_is_never_a_peer_that_went_dark():
    p = pool(SPARK, THOR)
    p.apply_pass({SPARK: ready(), THOR: ready()}, now=1.0)
    p.apply_pass({SPARK: dark(), THOR: ready()}, now=2.0)
    assert p.reference.origin == THOR
    assert rows(p)[0] == (SPARK, False, False, "peer gateway unreachable")


def test_a_peer_missing_from_the_pass_counts_as_failed():
    p = pool(SPARK, THOR)
    p.apply_pass({SPARK: ready(), THOR: ready()}, now=1.0)
    p.apply_pass({SPARK: ready()}, now=2.0)
    assert rows(p)[1] == (THOR, False, False, "no probe answer in this pass")


def test_a_peer_that_comes_back_is_compatible_again():
    p = pool(SPARK, THOR)
    p.apply_pass({SPARK: ready(), THOR: dark()}, now=1.0)
    p.apply_pass({SPARK: ready(), THOR: ready()}, now=2.0)
    assert rows(p)[1] == (THOR, True, True, "")


def test_a_different_model_is_ready_but_not_compatible_a_different_window_is_both():
    p = pool(SPARK, THOR, "http://orin:8000")
    p.apply_pass(
        {
            SPARK: ready(),
            THOR: ready(Fingerprint(QWEN.served_id, 1048576)),
            "http://orin:8000": ready(Fingerprint("other/model", 262144)),
        },
        now=1.0,
    )
    assert rows(p)[1:] == [
        (THOR, True, True, ""),
        ("http://orin:8000", True, False, "serves other/model, reference serves " + QWEN.served_id),
    ]
    assert [(s.origin, s.window) for s in p.selectable()] == [(SPARK, 262144), (THOR, 1048576)]
    assert p.context == 1048576  # the longest request the pool can take


def test_runtime_is_compared_only_when_both_publish_it():
    p = pool(SPARK, THOR, "http://orin:8000")
    nvfp4 = Fingerprint(QWEN.served_id, QWEN.context, "nvfp4")
    p.apply_pass(
        {
            SPARK: ready(nvfp4),
            THOR: ready(QWEN),
            "http://orin:8000": ready(Fingerprint(QWEN.served_id, QWEN.context, "fp8")),
        },
        now=1.0,
    )
    assert [s.compatible for s in p.states] == [True, True, False]
    assert p.states[2].reason == "runtime fp8, reference runtime nvfp4"


def test_context_is_the_largest_window_of_the_ready_replicas():
    p = pool(UNREACHABLE, THOR)
    p.apply_pass({UNREACHABLE: dark(), THOR: ready()}, now=1.0)
    capabilities = p.capabilities()
    assert capabilities["ready"] is True
    assert capabilities["context"] == 262144
    assert p.served_id == QWEN.served_id


def test_all_dark_means_not_ready_and_no_context():
    p = pool(SPARK, THOR)
    p.apply_pass({SPARK: ready(), THOR: ready()}, now=1.0)
    p.apply_pass({SPARK: dark(), THOR: dark()}, now=2.0)
    dark_row = {"ready": False, "compatible": False, "reason": "peer gateway unreachable"}
    assert p.capabilities() == {
        "ready": False,
        "context": None,
        "replicas": [{"origin": SPARK, **dark_row}, {"origin": THOR, **dark_row}],
    }


def test_an_id_is_listed_only_while_a_selectable_peer_lists_it():
    p = pool(SPARK, THOR)
    p.apply_pass({SPARK: ready(ids={QWEN.served_id, "extra"}), THOR: ready()}, now=1.0)
    assert p.peer_lists("extra") and p.peer_lists(QWEN.served_id)
    p.apply_pass({SPARK: dark(), THOR: ready()}, now=2.0)
    assert not p.peer_lists("extra")
    assert p.peer_lists(QWEN.served_id)
    p.apply_pass({SPARK: dark(), THOR: dark()}, now=3.0)
    assert not p.peer_lists(QWEN.served_id)
