"""Declared referrals and where keys travel, on the deployed mesh."""

from __future__ import annotations

import pytest
from fleet_mesh import Mesh, served_by, sustained_load
from seed_requests import cortex_request, new_tag, tagged

from tests.support.client import call

# A request per referred task: the endpoint and body of the role it names.
TASK_REQUESTS = {
    "embed": ("/v1/embeddings", lambda role: {"model": role, "input": "replay"}),
    "rerank": ("/v1/rerank", lambda role: {"model": role, "query": "q", "documents": ["a"]}),
}
KEY_BURST = 16
KEY_WAVES = 3


def referred_roles(mesh: Mesh) -> list[str]:
    return [name for name, role in mesh["agx-orin"].plan["roles"].items()
            if role["mode"] == "refer"]


@pytest.mark.parametrize("caller", ["orin-key", "fleet-key"])
def test_a_declared_referral_answers_404_naming_its_host(mesh: Mesh, caller: str) -> None:
    orin = mesh["agx-orin"]
    headers = orin.auth if caller == "orin-key" else {
        "Authorization": f"Bearer {mesh.fleet_key}"}
    assert referred_roles(mesh), "the Orin declares its embedder and reranker as referrals"
    for role in referred_roles(mesh):
        planned = orin.plan["roles"][role]
        path, body = TASK_REQUESTS[planned["task"]]
        reply = call(orin.origin, "POST", path, body(role), headers)
        assert (reply.status, reply.error["code"]) == (404, "role_infeasible"), reply
        assert reply.error["hosted_by"] == planned["hosted_by"]
        host = mesh.by_origin(planned["hosted_by"])
        assert call(host.origin, "POST", path, body(role), host.auth).status == 200


def test_the_callers_key_stays_on_the_orin_and_the_pairwise_key_opens_the_spark(
        mesh: Mesh) -> None:
    orin, spark, thor = mesh["agx-orin"], mesh["spark"], mesh["agx-thor"]
    # The Spark's gate refuses the Orin's callers' key: a Spark answer through the Orin proves
    # the Orin sent its pairwise key instead.
    assert "spark" in orin.plan["key_hosts"]
    assert call(spark.origin, "POST", "/v1/chat/completions", cortex_request(),
                orin.auth).status == 401
    tag = new_tag()
    replies = sustained_load(orin.origin, cortex_request(tag), orin.auth, KEY_BURST, KEY_WAVES)
    received = tagged(spark.gear_requests("cortex") + thor.gear_requests("cortex"), tag)

    assert {reply.status for reply in replies} == {200}
    assert set(served_by(replies)) == {spark.origin, thor.origin}
    assert len(received) == len(replies)
    assert not [request for request in received
                if any(orin.api_key in value for value in request["headers"].values())]
