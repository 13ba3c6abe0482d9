"""The pool learns its backends' characters per token from the usage their answers report:
real processes, a pooling gateway in front of two peer gateways, each fronting a simulator
whose tokenizer counts eight characters a token (the gateway assumes four until it learns).
The window check is where the grain shows: a prompt of 6,000 tokens at four characters fits
the 4,096-token window at eight."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.support.client import chat
from tests.support.gateway_proc import start_gateway
from tests.support.sim_proc import start_sim

from .test_pool_mesh import SERVED, all_selectable

WINDOW = 4096
GRAIN = ["--chars-per-token", "8", "--max-model-len", str(WINDOW)]
LONG_PROMPT = "w" * 24_000  # 6,000 tokens at four characters, 3,000 at eight
TEACHING_PROMPT = "t" * 2_000


@pytest.fixture
def pool():
    with pooling_gateway({}) as orin:
        yield orin


@pytest.fixture
def resumable_pool():
    with pooling_gateway({"PRIMARY_STREAM_RESUME": "true"}) as orin:
        yield orin


@contextmanager
def pooling_gateway(extra: dict[str, str]) -> Iterator:
    with start_sim("spark-cortex", time_scale=50, extra_args=GRAIN) as first_sim, \
            start_sim("spark-cortex", time_scale=50, extra_args=GRAIN) as second_sim, \
            start_gateway(peer_env(first_sim)) as first, \
            start_gateway(peer_env(second_sim)) as second, \
            start_gateway({"PRIMARY_FEASIBLE": "false", "PRIMARY_PEER_ORIGIN": first.url,
                           "PRIMARY_PEER_PROXY": "true",
                           "PRIMARY_PEER_ORIGINS": f"{first.url},{second.url}",
                           "PRIMARY_MAX_ACTIVE": "2",
                           "GATEWAY_PROBE_INTERVAL_S": "0.1", **extra}) as orin:
        all_selectable(orin)
        yield orin


def peer_env(sim) -> dict[str, str]:
    return {"PRIMARY_BASE_URL": sim.url, "PRIMARY_SERVED_NAME": SERVED,
            "PRIMARY_MAX_MODEL_LEN": str(WINDOW), "PRIMARY_MAX_ACTIVE": "2"}


def ask(orin, content: str, **options: object):
    return chat(orin.url, {"model": "cortex", "max_tokens": 4,
                           "messages": [{"role": "user", "content": content}], **options})


def test_answers_teach_the_grain_and_a_prompt_that_fits_is_no_longer_refused(pool):
    refused = ask(pool, LONG_PROMPT)
    assert refused.status == 400
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    for _turn in range(6):
        assert ask(pool, TEACHING_PROMPT).status == 200
    reply = ask(pool, LONG_PROMPT)
    assert reply.status == 200, reply.body
    assert reply.json()["usage"]["prompt_tokens"] == 3000 + 4 + 2


def test_streams_that_report_usage_teach_the_grain_too(pool):
    for _turn in range(6):
        reply = ask(pool, TEACHING_PROMPT, stream=True, stream_options={"include_usage": True})
        assert reply.status == 200
        assert b'"prompt_tokens":256' in reply.body  # 2,000 / 8 + the template's 6
    assert ask(pool, LONG_PROMPT).status == 200


def test_streams_teach_the_grain_from_the_usage_the_gateway_asks_for(pool):
    """Every stream is asked for its usage (and it is taken out again for a caller that did
    not ask): the prompt tokens it reports teach the grain like a JSON answer's."""
    for _turn in range(6):
        reply = ask(pool, TEACHING_PROMPT, stream=True)
        assert reply.status == 200
        assert b'"usage"' not in reply.body
    assert ask(pool, LONG_PROMPT).status == 200


def test_resumable_streams_teach_the_grain_from_the_usage_resume_asks_for(resumable_pool):
    """With P_STREAM_RESUME each part is asked for usage per chunk (stripped again for a
    client that did not ask): the prompt tokens it reports teach the grain like a JSON answer's."""
    for _turn in range(6):
        reply = ask(resumable_pool, TEACHING_PROMPT, stream=True)
        assert reply.status == 200
        assert b'"usage"' not in reply.body
    assert ask(resumable_pool, LONG_PROMPT).status == 200
