"""lobes.fleet.verify against real gateways and simulated gears rendered from a plan."""

from __future__ import annotations

import copy
import sys
import threading
import time
from types import SimpleNamespace

import pytest
from ansible_collections.lobes.fleet.plugins.module_utils.contract import (
    ROLE_NAMES,
    SIM_ENGINE_VERSION,
)
from ansible_collections.lobes.fleet.plugins.module_utils.plan import plan_mesh
from ansible_collections.lobes.fleet.plugins.modules import render as render_module
from ansible_collections.lobes.fleet.plugins.modules import verify as verify_module

from tests.support.ports import free_block, free_port
from tests.unit.modules import run_module
from tests.unit.services import Services

ALPHA_KEY = "alpha-inbound-test-key"


def sim_mesh() -> dict:
    """alpha serves cortex and embedder; gamma serves cortex in a hosted pool with alpha, and
    the reranker; beta pools cortex from both, proxies the reranker, refers the embedder."""
    common = {"fleet_hardware": "sim", "fleet_runtime": "process",
              "fleet_gateway_host": "127.0.0.1", "fleet_python": sys.executable,
              "fleet_sim_time_scale": 20.0}

    def box(roles: dict, **extra) -> dict:
        port = free_port()
        return {**common, "fleet_gateway_port": port, "fleet_origin": f"http://127.0.0.1:{port}",
                "fleet_gear_port_base": free_block(len(ROLE_NAMES)), "fleet_roles": roles,
                **extra}

    return {
        "alpha": box({"cortex": {"sim_profile": "instant"}, "embedder": {}},
                     fleet_gateway_api_key="alpha-inbound-key"),
        "gamma": box({"cortex": {"sim_profile": "instant", "feasible": True, "pool": ["alpha"],
                                 "rates": {"alpha": 48.9}},
                      "reranker": {}}),
        "beta": box({"cortex": {"feasible": False, "pool": ["alpha", "gamma"],
                                "rates": {"alpha": 48.9, "gamma": 11.0}},
                     "reranker": {"feasible": False, "proxy": "gamma"},
                     "embedder": {"feasible": False, "referral": "alpha"}}),
    }


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    """Both boxes rendered by the render module and their services started."""
    plan = plan_mesh(sim_mesh())
    boxes = {}
    peer_key = {"peer_keys": {"alpha": ALPHA_KEY}}
    secrets = {"alpha": {"gateway_api_key": ALPHA_KEY}, "gamma": peer_key, "beta": peer_key}
    for host in ("alpha", "gamma", "beta"):
        dest = tmp_path_factory.mktemp(host)
        args = {"plan": plan["boxes"][host], "dest": str(dest), "secrets": secrets[host]}
        assert run_module(render_module.main, args)["changed"] is True
        boxes[host] = Services(dest)
    try:
        for services in boxes.values():
            services.start_all()
        yield SimpleNamespace(plan=plan, boxes=boxes)
    finally:
        for services in boxes.values():
            services.stop()


def verify(plan: dict, check: bool = False, **options) -> dict:
    args = {"plan": plan, "timeout": 20, "interval": 0.2, **options}
    return run_module(verify_module.main, args, check_mode=check)


def test_a_box_serving_its_roles_verifies(mesh):
    plan = mesh.plan
    result = verify(plan["boxes"]["alpha"])
    assert result.get("failed") is not True, result.get("msg")
    assert result["version"] == "0.1.0" and result["changed"] is False
    cortex = result["roles"]["cortex"]
    assert (cortex["feasible"], cortex["ready"], cortex["proxied"]) == (True, True, False)
    assert cortex["context"] == 131072


def test_a_box_in_a_hosted_pool_verifies(mesh):
    plan = mesh.plan
    result = verify(plan["boxes"]["gamma"])
    assert result.get("failed") is not True, result.get("msg")
    cortex = result["roles"]["cortex"]
    assert (cortex["feasible"], cortex["ready"], cortex["proxied"]) == (True, True, False)
    assert cortex["replicas"] == [plan["boxes"]["alpha"]["origin"]]


def test_a_pooling_proxying_and_referring_box_verifies_in_check_mode(mesh):
    plan = mesh.plan
    alpha, gamma = plan["boxes"]["alpha"]["origin"], plan["boxes"]["gamma"]["origin"]
    result = verify(plan["boxes"]["beta"], check=True)
    assert result.get("failed") is not True, result.get("msg")
    cortex, reranker = result["roles"]["cortex"], result["roles"]["reranker"]
    assert (cortex["feasible"], cortex["ready"], cortex["proxied"]) == (False, True, True)
    assert cortex["context"] == 131072 and cortex["replicas"] == sorted([alpha, gamma])
    assert (reranker["proxied"], reranker["hosted_by"], reranker["ready"]) == (True, gamma, True)
    embedder = result["roles"]["embedder"]
    assert (embedder["feasible"], embedder["proxied"], embedder["hosted_by"]) == (
        False, False, alpha)


def test_a_pool_missing_its_peer_fails_on_ready_and_replicas(mesh):
    plan = copy.deepcopy(mesh.plan["boxes"]["beta"])
    plan["roles"]["cortex"]["peers"].append(
        {"host": "delta", "origin": "http://127.0.0.1:9", "auth": False, "rate": None})
    result = verify(plan, timeout=1)
    assert result["failed"] is True
    cortex_rows = [line for line in result["msg"].splitlines() if "<-" in line]
    assert len(cortex_rows) == 1 and cortex_rows[0].count("<-") == 1
    assert "2 peer(s)  <-" in cortex_rows[0]


def test_a_mismatch_fails_with_a_declared_vs_advertised_table(mesh):
    plan = mesh.plan
    wrong = copy.deepcopy(plan["boxes"]["alpha"])
    wrong["roles"]["cortex"]["context"] = 262144
    result = verify(wrong, timeout=1)
    assert result["failed"] is True and result["attempts"] >= 2
    lines = result["msg"].splitlines()
    header = next(line for line in lines if line.startswith("role"))
    assert header.split() == ["role", "side", "route", "feasible", "ready", "proxied", "hosted_by",
                              "served_name", "context", "replicas", "policy", "stream_resume",
                              "engine_version", "model_revision"]
    declared = next(line for line in lines if line.startswith("cortex"))
    advertised = lines[lines.index(declared) + 1]
    assert "262144" in declared and "131072  <-" in advertised
    assert not any("<-" in line for line in lines if line.startswith("embedder"))


def test_a_gear_whose_engine_reports_another_version_fails_naming_role_and_versions(mesh):
    plan, alpha = mesh.plan, mesh.boxes["alpha"]
    alpha.kill("gear-embedder")
    alpha.start("gear-embedder", ("--engine-version", "0.0.1.skewed"))
    try:
        result = verify(plan["boxes"]["alpha"], timeout=8)
    finally:
        alpha.kill("gear-embedder")
        alpha.start("gear-embedder")
    assert result["failed"] is True
    assert (f"host alpha, role embedder, field engine_version: declared {SIM_ENGINE_VERSION}, "
            "advertised 0.0.1.skewed") in result["msg"]
    flagged = [line for line in result["msg"].splitlines() if "<-" in line]
    assert len(flagged) == 1 and "0.0.1.skewed  <-" in flagged[0]
    assert verify(plan["boxes"]["alpha"]).get("failed") is not True


PINNED = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


def test_a_gear_on_other_weights_than_its_pin_fails_naming_both_revisions(mesh):
    plan, alpha = copy.deepcopy(mesh.plan["boxes"]["alpha"]), mesh.boxes["alpha"]
    plan["roles"]["embedder"]["gear"]["pinned_revision"] = PINNED
    alpha.kill("gear-embedder")
    alpha.start("gear-embedder", ("--model", f"/var/lib/lobes/models/acme/embed/{OTHER}"))
    try:
        skewed = verify(plan, timeout=8)
    finally:
        alpha.kill("gear-embedder")
        alpha.start("gear-embedder", ("--model", f"/var/lib/lobes/models/acme/embed/{PINNED}"))
    assert skewed["failed"] is True
    assert (f"host alpha, role embedder, field model_revision: declared {PINNED}, "
            f"advertised {OTHER}") in skewed["msg"]
    try:
        assert verify(plan).get("failed") is not True
    finally:
        alpha.kill("gear-embedder")
        alpha.start("gear-embedder")


LOCKED = "sha256:" + "1a" * 32
PULLED = "sha256:" + "2b" * 32
REPO = "127.0.0.1:5000/lobes/sim"


def _container(*digests: str) -> dict:
    """A gear container as image_digest reports it, its image holding these digests of REPO."""
    return {"container": "c0ffee", "config_image": f"{REPO}@{LOCKED}",
            "image_id": "sha256:" + "9" * 64,
            "repo_digests": [f"{REPO}@{digest}" for digest in digests]}


def test_a_gear_container_on_another_image_than_its_pin_fails_at_once_naming_both(mesh):
    plan = copy.deepcopy(mesh.plan["boxes"]["alpha"])
    plan["roles"]["embedder"]["gear"]["image"] = f"{REPO}@{LOCKED}"
    service = plan["roles"]["embedder"]["gear"]["service"]
    skewed = verify(plan, timeout=20, images={service: _container(PULLED)})
    # A skew is not waited on: it fails before the gateway is read.
    assert skewed["failed"] is True and skewed["attempts"] == 0, skewed["msg"]
    assert f"host alpha, role embedder, field image: declared {LOCKED}, advertised {PULLED}" \
        in skewed["msg"]
    flagged = [line for line in skewed["msg"].splitlines() if "<-" in line]
    assert len(flagged) == 1 and f"{PULLED}  <-" in flagged[0]
    gone = verify(plan, timeout=1, images={})
    assert f"role embedder, field image: declared {LOCKED}, advertised no container" in gone["msg"]
    agreed = verify(plan, images={service: _container(PULLED, LOCKED)})
    assert agreed.get("failed") is not True and agreed["images"] == {"embedder": LOCKED}
    # Without the containers' report (the process runtime, or verify from the controller)
    # the image is not compared.
    assert verify(plan).get("failed") is not True


def test_a_version_other_than_the_collections_fails(mesh):
    plan = mesh.plan
    result = verify(plan["boxes"]["alpha"], version="9.9.9", timeout=0.5)
    assert result["failed"] is True
    assert "version: declared 9.9.9, advertised 0.1.0" in result["msg"]


@pytest.mark.timing  # gives up within 10 s of wall time
def test_an_unreachable_gateway_fails_after_the_timeout(mesh):
    plan = mesh.plan
    started = time.monotonic()
    result = verify(plan["boxes"]["alpha"], url=f"http://127.0.0.1:{free_port()}",
                    timeout=1)
    assert result["failed"] is True and "did not answer" in result["msg"]
    assert result["attempts"] >= 2 and time.monotonic() - started < 10


def test_verify_waits_for_a_gear_that_comes_up_late(mesh):
    plan, boxes = mesh.plan, mesh.boxes
    alpha = boxes["alpha"]
    alpha.kill("gear-embedder")
    starter = threading.Timer(1.0, alpha.start, args=("gear-embedder",))
    starter.start()
    try:
        result = verify(plan["boxes"]["alpha"], timeout=20)
    finally:
        starter.join()
    assert result.get("failed") is not True, result.get("msg")
    assert result["attempts"] >= 2 and result["roles"]["embedder"]["ready"] is True
