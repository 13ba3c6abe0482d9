"""A picture of the mesh as Graphviz DOT: boxes, the roles each serves, and an edge for every
proxy, pool membership, referral and owner forwarding, coloured by its live state.

Pure: the plan says what is declared, each box's /capabilities (None when it did not answer)
says what is live. status.yml writes the text and has Graphviz draw it.
"""

from __future__ import annotations

import json

from ansible_collections.lobes.fleet.plugins.module_utils.contract import (
    OWNERS,
    POOL,
    PROXY,
    REFER,
)
from ansible_collections.lobes.fleet.plugins.module_utils.hardware import planned_hardware

READY, INCOMPATIBLE, DOWN = "ready", "not compatible", "unreachable"
NOT_READY, UNKNOWN = "not ready", "unknown"
COLOURS = {READY: "forestgreen", INCOMPATIBLE: "darkorange", DOWN: "red3", NOT_READY: "orangered",
           UNKNOWN: "gray50"}
# How each route mode is drawn: a pool's members bold, a proxy solid, owners dotted, a
# referral dashed (it sends nothing: it names where to go).
STYLES = {POOL: "bold", PROXY: "solid", OWNERS: "dotted", REFER: "dashed"}
_VERBS = {POOL: "pools", PROXY: "proxies", OWNERS: "forwards", REFER: "refers"}


def _quote(text: str) -> str:
    return json.dumps(text)


def _served(box: dict) -> list:
    return [role for role, plan in sorted(box.get("roles", {}).items()) if plan.get("gear")]


def _replica_state(capabilities: dict | None, role: str, origin: str) -> str:
    """A pool member as the pooling box's own /capabilities row judges it (unknown when the
    pooling box itself does not answer)."""
    if capabilities is None:
        return UNKNOWN
    rows = capabilities.get("roles", {}).get(role, {}).get("replicas", [])
    row = next((row for row in rows if row.get("origin") == origin), None)
    if row is None or not row.get("ready"):
        return DOWN
    return READY if row.get("compatible", True) else INCOMPATIBLE


def _peer_state(peer_capabilities: dict | None, role: str) -> str:
    """A proxied, referred or owner peer: does it answer, and does it serve the role?"""
    if peer_capabilities is None:
        return DOWN
    live = peer_capabilities.get("roles", {}).get(role, {})
    return READY if live.get("ready") else NOT_READY


def _edges(host: str, box: dict, live: dict) -> list:
    lines = []
    for role, plan in sorted(box.get("roles", {}).items()):
        mode = plan.get("mode")
        if mode not in STYLES:
            continue
        for peer in plan.get("peers") or []:
            state = (_replica_state(live.get(host), role, peer.get("origin")) if mode == POOL
                     else _peer_state(live.get(peer["host"]), role))
            label = f"{role}: {_VERBS[mode]} ({state})"
            lines.append(f"  {_quote(host)} -> {_quote(peer['host'])} [label={_quote(label)}, "
                         f"style={STYLES[mode]}, color={COLOURS[state]}, "
                         f"fontcolor={COLOURS[state]}];")
    return lines


def _node(host: str, box: dict, capabilities: dict | None) -> str:
    served = ", ".join(_served(box)) or "no gear"
    state = "unreachable" if capabilities is None else "up"
    colour = COLOURS[DOWN] if capabilities is None else "black"
    hardware = planned_hardware(box).get("name") or "unknown hardware"
    label = f"{host} ({hardware})\\nserves: {served}\\n{state}"
    return f"  {_quote(host)} [label=\"{label}\", color={colour}];"


def mesh_dot(plan: dict, live: dict) -> str:
    """The DOT text of the mesh; live maps each host to its /capabilities (None: no answer)."""
    boxes = plan.get("boxes") or {}
    lines = ["digraph mesh {", "  rankdir=LR;", "  node [shape=box, style=rounded];",
             "  edge [fontsize=10];"]
    lines += [_node(host, box, live.get(host)) for host, box in sorted(boxes.items())]
    for host, box in sorted(boxes.items()):
        lines += _edges(host, box, live)
    lines.append("}")
    return "\n".join(lines) + "\n"
