#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.mesh_status: one table of every box's roles, read live."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: mesh_status
short_description: One table across the mesh, read from every box's gateway
version_added: 0.1.0
description:
  - Reads every box's gateway C(/capabilities) and C(/status) (both keyless) and returns one
    row per box and declared role. The box's origin and each role's peers come from the mesh
    plan of M(lobes.fleet.mesh_plan).
  - "Columns: box; role; where it is served (V(here), V(proxied to <peer>), V(pooled over
    <peers>), V(referred to <peer>)); ready (as the gateway advertises it); context (as
    advertised); in flight (running + waiting on the local gear, from its vLLM metrics; for
    a role served by peers, the requests this box has out at them)."
  - Per box, one line with the pressure block of C(/status) (mode, reason, readings) and the
    prompt and generated token counts of each local gear (from its vLLM metrics) and the
    version its engine reports.
  - A picture of the mesh as Graphviz DOT, C(dot). Boxes, the roles each serves, and an edge
    for every proxy, pool membership, referral and owner forwarding, coloured by its live
    state (ready, not compatible, unreachable). C(status.yml) has Graphviz draw it.
  - Read-only; run it once on the controller.
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.read_only
  - lobes.fleet.attributes.posix
options:
  plan:
    description: The mesh plan (the C(plan) that M(lobes.fleet.mesh_plan) returns).
    type: dict
    required: true
  timeout:
    description: Seconds to wait for each gateway's answer.
    type: float
    default: 5.0
"""

EXAMPLES = r"""
- name: Plan the mesh
  lobes.fleet.mesh_plan:
  run_once: true
  register: status_plan

- name: Read every box
  lobes.fleet.mesh_status:
    plan: "{{ status_plan.plan }}"
  run_once: true
  delegate_to: localhost
  register: status_table

- name: Show the table
  ansible.builtin.debug:
    msg: "{{ status_table.table }}"
  run_once: true
"""

RETURN = r"""
rows:
  description: One entry per box and declared role.
  returned: always
  type: list
  elements: dict
  sample:
    - box: orin
      role: cortex
      where: pooled over spark, thor
      ready: true
      context: 262144
      in_flight: null
table:
  description: The rows as aligned text lines, a header first.
  returned: always
  type: list
  elements: str
  sample:
    - "box    role      where                     ready  context  in flight"
    - "spark  cortex    here                      yes    131072   1"
unreachable_boxes:
  description:
    - Boxes whose gateway did not answer, with the reason. (Not C(unreachable), which Ansible
      reads as the controller's own host being unreachable and stops the play.)
  returned: always
  type: dict
  sample: {"thor": "connection refused"}
boxes:
  description: One line per box, its pressure block and its gears' token counts.
  returned: always
  type: list
  elements: str
  sample:
    - >-
      spark: pressure warm (swap 0.0 %, iowait 1.2 %, MemAvailable 84.0 %, PSI -);
      tokens: cortex 1200 prompt / 340 generated (engine 0.23.1rc1.dev672)
dot:
  description: The picture of the mesh, Graphviz DOT text.
  returned: always
  type: str
"""

import json  # noqa: E402 - modules keep imports below their documentation

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.urls import open_url  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.contract import (  # noqa: E402
    OFF,
    OWNERS,
    POOL,
    PROXY,
    REFER,
    SERVE,
)
from ansible_collections.lobes.fleet.plugins.module_utils.mesh_picture import (  # noqa: E402
    mesh_dot,
)

# How the status table says where a role is answered, by its route mode.
_WHERE = {PROXY: "proxied to ", POOL: "pooled over ", REFER: "referred to ",
          OWNERS: "forwarded to owners "}

COLUMNS = (
    ("box", "box"),
    ("role", "role"),
    ("where", "where"),
    ("ready", "ready"),
    ("context", "context"),
    ("in_flight", "in flight"),
)


def _get(origin, path, timeout):
    with open_url(origin + path, method="GET", timeout=timeout, validate_certs=True) as reply:
        return json.loads(reply.read())


def _where(role_plan):
    peers = [peer["host"] for peer in role_plan.get("peers") or []]
    mode = role_plan.get("mode") or OFF
    if mode == SERVE:
        return "here"
    return _WHERE.get(mode, mode) + ", ".join(peers)


def _in_flight(status, role, live):
    """Running + waiting on the local gear; for a role served by peers, what the gateway
    has out at them (its /capabilities in_flight)."""
    for backend in (status or {}).get("backends", []):
        if backend.get("name") == role and backend.get("metrics"):
            metrics = backend["metrics"]
            return int(metrics.get("running", 0) + metrics.get("waiting", 0))
    return live.get("in_flight")


def _box_rows(host, box, capabilities, status):
    rows = []
    advertised = capabilities.get("roles", {}) if capabilities else {}
    for role, role_plan in sorted(box.get("roles", {}).items()):
        if role_plan.get("mode") == OFF:
            continue
        live = advertised.get(role, {})
        rows.append(
            dict(
                box=host,
                role=role,
                where=_where(role_plan),
                ready=live.get("ready") if capabilities else None,
                context=live.get("context"),
                in_flight=_in_flight(status, role, live),
            )
        )
    return rows


def _reading(value, unit=" %"):
    return "-" if value is None else f"{value}{unit}"


def box_line(host, status):
    """The box's pressure block and its gears' token counts, in one line."""
    if status is None:
        return f"{host}: unreachable"
    block = status.get("pressure") or {}
    readings = block.get("pressure") or {}
    pressure = (f"pressure {block.get('mode', '-')}"
                + (f" ({block['reason']})" if block.get("reason") not in (None, "none") else "")
                + f" (swap {_reading(readings.get('swap_used_percent'))}, iowait "
                f"{_reading(readings.get('iowait_percent'))}, MemAvailable "
                f"{_reading(readings.get('mem_available_percent'))}, PSI "
                f"{_reading(readings.get('psi_memory_full_avg10'), '')})")
    tokens = [f"{backend['name']} {int(metrics.get('prompt_tokens_total', 0))} prompt / "
              f"{int(metrics.get('generation_tokens_total', 0))} generated"
              + (f" (engine {backend['engine_version']})" if backend.get("engine_version")
                 else "")
              for backend in status.get("backends", []) for metrics in [backend.get("metrics")]
              if metrics]
    return f"{host}: {pressure}; tokens: {', '.join(tokens) or 'none'}"


def _cell(value):
    if value is True:
        return "yes"
    if value is False:
        return "no"
    return "-" if value is None else str(value)


def format_table(rows):
    """Align the rows under a header; unknown values print as '-'."""
    cells = [[title for _key, title in COLUMNS]]
    cells += [[_cell(row[key]) for key, _title in COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return ["  ".join(c.ljust(widths[i]) for i, c in enumerate(line)).rstrip() for line in cells]


def main():
    module = AnsibleModule(
        argument_spec=dict(
            plan=dict(type="dict", required=True),
            timeout=dict(type="float", default=5.0),
        ),
        supports_check_mode=True,
    )
    plan = module.params["plan"]
    boxes = plan.get("boxes") or {}
    rows, unreachable, lines, live = [], {}, [], {}
    for host, box in sorted(boxes.items()):
        capabilities = status = None
        try:
            capabilities = _get(box["origin"], "/capabilities", module.params["timeout"])
            status = _get(box["origin"], "/status", module.params["timeout"])
        except Exception as exc:  # any failure to read a box is reported, never fatal
            unreachable[host] = str(getattr(exc, "reason", exc))
        live[host] = capabilities
        rows.extend(_box_rows(host, box, capabilities, status))
        lines.append(box_line(host, status))
    module.exit_json(changed=False, rows=rows, table=format_table(rows),
                     unreachable_boxes=unreachable, boxes=lines, dot=mesh_dot(plan, live))


if __name__ == "__main__":
    main()
