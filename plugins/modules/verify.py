#!/usr/bin/python
"""lobes.fleet.verify: wait until a box's gateway advertises exactly what its plan declares."""

from __future__ import annotations

DOCUMENTATION = r"""
module: verify
short_description: Check a box's gateway against its plan, waiting until it is ready
version_added: 0.1.0
description:
  - Reads the gateway's C(/health) and C(/capabilities) (both keyless) and compares them with
    the box's plan, retrying every O(interval) seconds until they agree or O(timeout) passes.
  - For every role the plan declares it compares C(feasible), C(ready), C(proxied),
    C(hosted_by), C(served_name), C(context) and the pool's C(replicas) (the peer origins),
    and the C(/health) version with the collection's own version.
  - For every gear the box runs it compares C(engine_version), what the gear's own
    C(/version) reports, with the pinned build of its engine (vLLM's CPU build, or the
    simulator's); the vLLM image's version is the image's own and is not compared. A version
    the gateway read before verify began is not trusted (a restart may have replaced the
    engine); verify waits for the next reading.
  - For every gear whose checkpoint is pinned it compares C(model_revision), the last part of
    the model root the gear's C(/v1/models) names (it loads
    C(<models>/<org>/<name>/<revision>)), with the pinned revision.
  - With O(images) (what M(lobes.fleet.image_digest) read of the box's gear containers), for
    every gear whose image is named by digest or locked in C(fleet.lock.yml) it compares
    the digest of the image the gear's container runs with that digest, before it reads the
    gateway. A skew does not go away by waiting, so verify fails at once, naming host, role,
    the pinned digest and the one running, with a table of both. Under the process runtime no
    image runs; the CPU engine's installed version is what C(engine_version) compares.
  - On failure the message is a per-role table of declared vs advertised values, the
    mismatching fields flagged.
  - Read-only; check mode runs the same reads.
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.read_only
options:
  plan:
    description:
      - This box's plan, C(plan.boxes[inventory_hostname]) of M(lobes.fleet.mesh_plan).
    type: dict
    required: true
  url:
    description:
      - Where to reach the gateway from where the module runs; defaults to
        C(http://127.0.0.1:<the plan's gateway port>).
    type: str
  version:
    description:
      - The version C(/health) must report; defaults to the collection's version.
    type: str
  timeout:
    description: Seconds to wait for the gateway to agree with the plan.
    type: float
    default: 600
  interval:
    description: Seconds between two reads.
    type: float
    default: 5
  peers_must_be_ready:
    description:
      - Whether proxied and peer-only pooled roles must be ready, which needs their peers up.
        Turn off to verify one box of a mesh whose peers are not deployed yet.
    type: bool
    default: true
  images:
    description:
      - The box's gear containers by compose service, as M(lobes.fleet.image_digest) returns
        them in RV(lobes.fleet.image_digest#module:containers); left out, images are not
        compared.
    type: dict
"""

EXAMPLES = r"""
- name: Wait until the gateway advertises what the plan declares
  lobes.fleet.verify:
    plan: "{{ mesh.plan.boxes[inventory_hostname] }}"
    timeout: 900

- name: Verify from the controller, peers not deployed yet
  lobes.fleet.verify:
    plan: "{{ mesh.plan.boxes[inventory_hostname] }}"
    url: "{{ mesh.plan.boxes[inventory_hostname].origin }}"
    peers_must_be_ready: false
  delegate_to: localhost
"""

RETURN = r"""
version:
  description: The gateway version /health reported.
  returned: when the gateway answered
  type: str
  sample: 0.1.0
roles:
  description: Per declared role, the advertised values compared.
  returned: success
  type: dict
  sample:
    cortex: {feasible: false, ready: true, proxied: true, context: 262144,
             hosted_by: "http://spark.tail0be7e0.ts.net:8001",
             served_name: sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP,
             replicas: ["http://spark.tail0be7e0.ts.net:8001",
                        "http://thor.tail0be7e0.ts.net:8000"]}
table:
  description: The declared vs advertised table (also the failure message).
  returned: always
  type: str
images:
  description: Per role whose gear is pinned by digest, the digest its container runs.
  returned: when O(images) is given and they agree
  type: dict
  sample: {cortex: "sha256:7c5a10e9a8b3c8642f4d0463a41215176c0dd834b4f0967287c7e3e517cf1be9"}
attempts:
  description: How many times the gateway was read (0 when an image skew failed first).
  returned: always
  type: int
"""

# Ansible wants the documentation strings before any import (validate-modules).
import json  # noqa: E402
import time  # noqa: E402
from http.client import HTTPException  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.urls import open_url  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils import advert  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.contract import (  # noqa: E402
    VERSION,
)
from ansible_collections.lobes.fleet.plugins.module_utils.images import (  # noqa: E402
    expected_digest,
    running_digest,
)


def read_json(url: str, timeout: float) -> dict:
    """GET a JSON body; any failure becomes an exception with a readable message."""
    with open_url(url, method="GET", timeout=timeout, use_proxy=False,
                  validate_certs=False) as response:
        return json.loads(response.read())


def image_report(plan: dict, containers: dict) -> tuple:
    """(role -> {image: pinned digest}, role -> {image: what its container runs}, differences)
    for the gears pinned by digest."""
    pinned = {name: {"image": expected_digest(role.get("gear"))}
              for name, role in plan["roles"].items() if expected_digest(role.get("gear"))}
    running = {name: {"image": running_digest(plan["roles"][name]["gear"], containers)}
               for name in pinned}
    return pinned, running, advert.compare(pinned, running)


def check_images(module: AnsibleModule, plan: dict, containers: dict) -> dict:
    """role -> the digest its gear's container runs, for the gears pinned by digest; fails at
    once when one runs another image than its pin."""
    pinned, running, differences = image_report(plan, containers)
    if not differences:
        return {name: seen["image"] for name, seen in running.items()}
    host = plan.get("host")
    lines = ["the gear containers do not run the images the plan and the lock pin"]
    lines += [f"host {host}, {line}" if host else line
              for line in advert.explained(pinned, running, differences)]
    shown = advert.table(pinned, running, differences, ("image",))
    lines += [shown, "redeploy the box (site.yml) to run the pinned images; "
              "docs/operations.md says how to move a pin"]
    module.fail_json(msg="\n".join(lines), table=shown, attempts=0, version=None)


def observe(base: str, plan: dict, expected: dict, version: str, timeout: float,
            running_s: float) -> dict:
    """One read of /health and /capabilities, compared with the plan; an engine version is
    taken only if the gateway read it within `running_s` (since verify began)."""
    try:
        health = read_json(f"{base}/health", timeout)
        capabilities = read_json(f"{base}/capabilities", timeout)
    except (OSError, ValueError, HTTPException) as error:  # not up yet, or not a gateway
        return {"reachable": False, "error": f"{base} did not answer: {error}",
                "advertised": {}, "differences": {}, "version": None}
    advertised = advert.advertised_roles(capabilities, plan["origin"], running_s)
    return {"reachable": True, "error": None, "advertised": advertised,
            "differences": advert.compare(expected, advertised),
            "version": health.get("version"), "version_ok": health.get("version") == version}


def agreed(seen: dict) -> bool:
    return seen["reachable"] and seen["version_ok"] and not seen["differences"]


def failure_message(seen: dict, expected: dict, version: str, waited: float,
                    host: str | None = None) -> str:
    lines = [f"the gateway does not advertise what the plan declares (waited {waited:.0f}s)"]
    if not seen["reachable"]:
        lines.append(seen["error"])
    elif not seen["version_ok"]:
        lines.append(f"version: declared {version}, advertised {seen['version']} (redeploy the "
                     "gateway from this collection)")
    lines += [f"host {host}, {line}" if host else line
              for line in advert.explained(expected, seen["advertised"], seen["differences"])]
    lines.append(advert.table(expected, seen["advertised"], seen["differences"]))
    return "\n".join(lines)


def run(module: AnsibleModule) -> dict:
    params = module.params
    plan = params["plan"]
    base = (params["url"] or f"http://127.0.0.1:{plan['gateway']['port']}").rstrip("/")
    version = params["version"] or VERSION
    images = None if params["images"] is None else check_images(module, plan, params["images"])
    expected = advert.expected_roles(plan, params["peers_must_be_ready"])
    started = time.monotonic()
    attempts = 0
    while True:
        attempts += 1
        seen = observe(base, plan, expected, version, min(params["interval"] + 5, 30),
                       time.monotonic() - started)
        waited = time.monotonic() - started
        if agreed(seen) or waited + params["interval"] > params["timeout"]:
            break
        time.sleep(params["interval"])
    shown = advert.table(expected, seen["advertised"], seen["differences"])
    if not agreed(seen):
        module.fail_json(msg=failure_message(seen, expected, version, waited, plan.get("host")),
                         table=shown,
                         attempts=attempts, version=seen["version"])
    roles = {role: seen["advertised"][role] for role in expected}
    result = {"changed": False, "version": seen["version"], "roles": roles, "table": shown,
              "attempts": attempts}
    if images is not None:
        result["images"] = images
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "plan": {"type": "dict", "required": True},
            "url": {"type": "str"},
            "version": {"type": "str"},
            "timeout": {"type": "float", "default": 600},
            "interval": {"type": "float", "default": 5},
            "peers_must_be_ready": {"type": "bool", "default": True},
            "images": {"type": "dict"},
        },
        supports_check_mode=True,
    )
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
