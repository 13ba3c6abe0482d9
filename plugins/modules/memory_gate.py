#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.memory_gate: is the memory for the gears about to start free?"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: memory_gate
short_description: Refuse to start gears whose memory share is not free on the box now
version_added: 0.1.0
description:
  - On a unified-memory box (DGX Spark, Jetson) CPU and GPU share one pool. Before the gears
    start, reads the box's meminfo (MemAvailable, the reclaimable page cache, free swap) and
    fails, naming the host, the gears and the numbers, when the shares of the gears not yet
    running exceed what is available now. Gears already running hold their share already.
  - Which gears run is asked of the box, never assumed. Process runtime, a gear answers its
    C(/health). Compose runtime, C(docker compose ps) lists it running.
  - Applies where the gears hold real memory (a hardware profile with a GPU, or a gear on
    vLLM's CPU build, whose share is its KV cache and its processes), or where O(proc_root)
    is a fake C(/proc) that simulated gears hold their shares in (tests). Simulated gears on
    a box without a GPU, against the real C(/proc), are not gated.
  - With O(drop_caches), when some gear is to start, the page cache is written back and dropped
    first (C(sync), then C(3) to C(sys/vm/drop_caches) under O(proc_root)); the Thor's page
    cache alone can block a model load.
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.changes
  - lobes.fleet.attributes.posix
options:
  plan:
    description: This box's plan from M(lobes.fleet.mesh_plan) (C(plan.boxes[host])).
    type: dict
    required: true
  deploy_dir:
    description: Where the box's rendered files are (compose asks its project there).
    type: path
    required: true
  proc_root:
    description: The C(/proc) to read (a fake one in tests).
    type: path
    default: /proc
  enforce:
    description:
      - Fail when the gears to start do not fit.
      - V(false) only reports, for C(status.yml) and C(verify.yml), the reading, each gear's
        share and the refusal it would give.
    type: bool
    default: true
  drop_caches:
    description:
      - Drop the page cache before gears start (inventory C(fleet_drop_caches_before_start)).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Check that the box has the memory for the gears about to start
  lobes.fleet.memory_gate:
    plan: "{{ mesh.plan.boxes[inventory_hostname] }}"
    deploy_dir: /srv/lobes
    drop_caches: "{{ fleet_drop_caches_before_start | default(false) }}"
"""

RETURN = r"""
memory:
  description: The reading the decision was made on (after dropping caches when that ran), GiB.
  returned: always
  type: dict
  sample: {total_gib: 119.6, available_gib: 101.2, page_cache_gib: 3.1, swap_free_gib: 0.0}
gears:
  description: Every local gear with its share (GiB) and whether it runs now.
  returned: always
  type: list
  elements: dict
  sample: [{name: vllm-cortex, share_gib: 38.4, running: true}]
to_start:
  description: The gears not running now, whose shares must be free.
  returned: always
  type: list
  elements: str
need_gib:
  description: The sum of the shares of the gears to start.
  returned: always
  type: float
gated:
  description: Whether the check applied (see the description).
  returned: always
  type: bool
headroom:
  description: One line for people, the reading against the gears' shares.
  returned: always
  type: str
  sample: >-
    101.2 of 119.6 GiB available (page cache 3.1, swap free 0.0); gears' shares 38.4 GiB:
    vllm-cortex 38.4 running
refusal:
  description: Why the gears to start do not fit (null when they do); with O(enforce) the failure.
  returned: always
  type: str
"""

import os  # noqa: E402 - modules keep imports below their documentation

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.urls import open_url  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.hardware import (  # noqa: E402
    planned_hardware,
)
from ansible_collections.lobes.fleet.plugins.module_utils.memory import (  # noqa: E402
    headroom,
    parse_meminfo,
    refusal,
)
from ansible_collections.lobes.fleet.plugins.module_utils.plan import (  # noqa: E402
    holds_memory,
    memory_gated,
)
from ansible_collections.lobes.fleet.plugins.module_utils.render import (  # noqa: E402
    gear_service_name,
    process_health_url,
    start_order,
)

DEFAULT_PROC = "/proc"


def _answers(url):
    try:
        with open_url(url, method="GET", timeout=2, use_proxy=False) as answer:
            return answer.status == 200
    except Exception:  # refused, timed out, an HTTP error: the gear does not answer healthy
        return False


def _running_compose(module, deploy_dir):
    if not os.path.exists(os.path.join(deploy_dir, "compose.yaml")):
        return set()  # not rendered yet (a first --check): nothing of it runs
    docker = module.get_bin_path("docker", required=True)
    rc, out, err = module.run_command([docker, "compose", "--project-directory", deploy_dir,
                                       "ps", "--services", "--status", "running"])
    if rc != 0:
        module.fail_json(msg=f"docker compose ps in {deploy_dir} failed: {err.strip()}")
    return set(out.split())


def _gears(module, plan, gated):
    """[(name, share GiB, running, holds)] of the box's local gears, in start order; holds:
    the gear's share is the box's memory (plan.holds_memory)."""
    compose = plan["runtime"] == "compose"
    running = _running_compose(module, module.params["deploy_dir"]) if compose else None
    gears = []
    for role in start_order(plan):
        name = gear_service_name(plan, role)
        share = role["gear"]["memory_gib"]
        health = process_health_url(role)
        gears.append((name, share, name in running if compose else _answers(health),
                      holds_memory(role["gear"], gated)))
    return gears


def _read(module, proc_root):
    path = os.path.join(proc_root, "meminfo")
    try:
        with open(path, encoding="ascii") as handle:
            return parse_meminfo(handle.read())
    except OSError as exc:
        module.fail_json(msg=f"cannot read {path}: {exc}")


def _drop_caches(module, proc_root):
    """Write dirty pages back, then drop the page cache; False where the knob is absent."""
    knob = os.path.join(proc_root, "sys", "vm", "drop_caches")
    if not os.path.exists(knob):
        return False
    module.run_command(["sync"], check_rc=True)
    with open(knob, "w", encoding="ascii") as handle:
        handle.write("3\n")
    return True


def _stands_for(plan, gated):
    """The box simulated gears are budgeted for, where they hold none of this one's memory."""
    if gated:
        return None
    simulated = planned_hardware(plan).get("simulates")
    return f"the {simulated} they stand in for" if simulated else None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            plan=dict(type="dict", required=True),
            deploy_dir=dict(type="path", required=True),
            proc_root=dict(type="path", default=DEFAULT_PROC),
            drop_caches=dict(type="bool", default=False),
            enforce=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    plan, proc_root = module.params["plan"], module.params["proc_root"] or DEFAULT_PROC
    # A plan without hardware (a role driven by a hand-written plan) has no GPU to gate.
    gated = memory_gated(plan, proc_root != DEFAULT_PROC)
    gears = _gears(module, plan, gated)
    to_start = {name: share for name, share, running, holds in gears if not running and holds}
    gated = gated or any(holds for _name, _share, _running, holds in gears)
    enforce = module.params["enforce"]
    dropped = bool(to_start) and enforce and module.params["drop_caches"] \
        and not module.check_mode and _drop_caches(module, proc_root)
    reading = _read(module, proc_root)
    problem = refusal(plan["host"], reading, to_start) if gated else None
    result = dict(
        changed=dropped, gated=gated, memory=reading.as_dict(), to_start=sorted(to_start),
        need_gib=round(sum(to_start.values()), 2), refusal=problem,
        headroom=headroom(reading, [gear[:3] for gear in gears],
                          _stands_for(plan, gated) if gears else None),
        gears=[dict(name=name, share_gib=share, running=running)
               for name, share, running, _holds in gears],
    )
    if problem and enforce:
        module.fail_json(msg=problem, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
