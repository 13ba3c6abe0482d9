"""Every profile starts, serves its own model id, and takes command-line overrides."""

from __future__ import annotations

import subprocess
import sys

import pytest
from lobes_sim.profiles import GENERATE, PROFILES

from tests.support.sim_proc import GATEWAY_DIR

from .client import chat_payload, post, request

GENERATE_PROFILES = sorted(name for name, p in PROFILES.items() if p.task == GENERATE)


@pytest.mark.parametrize("name", GENERATE_PROFILES)
def test_each_generate_profile_serves_its_model(sim_factory, name):
    sim = sim_factory(name, time_scale=100)
    profile = PROFILES[name]
    [model] = request(sim.url, "GET", "/v1/models").json()["data"]
    assert (model["id"], model["max_model_len"]) == (profile.served_name, profile.max_model_len)
    answer = post(sim.url, "/v1/chat/completions", chat_payload(max_tokens=400)).json()
    low, high = profile.natural_length
    assert low <= answer["usage"]["completion_tokens"] <= high
    assert answer["choices"][0]["finish_reason"] == "stop"


def test_admin_health_reports_the_effective_configuration(sim_factory):
    sim = sim_factory("thor-cortex", served_name="cortex-x", time_scale=5, extra_args=[
        "--max-model-len", "65536", "--max-num-seqs", "3", "--quantization", "fp8",
    ])
    health = request(sim.admin_url, "GET", "/health").json()
    assert health == {
        "status": "ok",
        "serving_port": sim.port,
        "profile": "thor-cortex",
        "served_name": "cortex-x",
        "max_model_len": 65536,
        "max_num_seqs": 3,
        "quantization": "fp8",
        "time_scale": 5.0,
    }


def test_help_documents_every_option():
    result = subprocess.run(
        [sys.executable, "-m", "lobes_sim", "--help"],
        cwd=GATEWAY_DIR, capture_output=True, text=True, check=True,
    )
    for option in ("--host", "--port", "--profile", "--served-name", "--max-model-len",
                   "--max-num-seqs", "--time-scale", "--prefill-scale", "--seed", "--embed-dim",
                   "--quantization",
                   "--admin-port", "--fault-refuse", "--fault-status", "--fault-hang",
                   "--fault-hang-s", "--fault-die-after-chunks", "--fault-slow",
                   "--fault-reject-strict-tools"):
        assert option in result.stdout, option
    for name in PROFILES:
        assert name in result.stdout


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--time-scale", "0", "--time-scale must be positive"),
    ("--prefill-scale", "-1", "--prefill-scale: '-1' is not a number >= 0"),
])
def test_a_bad_scale_stops_start_up_with_a_message(option, value, message):
    result = subprocess.run(
        [sys.executable, "-m", "lobes_sim", option, value],
        cwd=GATEWAY_DIR, capture_output=True, text=True, check=False,
    )
    assert result.returncode == 2
    assert message in result.stderr
