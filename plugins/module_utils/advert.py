"""A box's plan vs what its gateway advertises on /health and /capabilities.

expected_roles(plan) says, per declared role, what the gateway must advertise;
compare() lists the differences; table() prints declared vs advertised per role.
"""

from __future__ import annotations

import re

from ansible_collections.lobes.fleet.plugins.module_utils.contract import (
    OFF,
    OWNERS,
    POOL,
    POOL_POLICIES,
    PROXY,
    SERVE,
    SIM_ENGINE_VERSION,
)
from ansible_collections.lobes.fleet.plugins.module_utils.engines import (
    SIM,
    VLLM_CPU,
    VLLM_CPU_BUILD,
)

FIELDS = ("route", "feasible", "ready", "proxied", "hosted_by", "served_name", "context",
          "replicas", "policy", "stream_resume", "engine_version", "model_revision")
ANY = object()  # a field whose advertised value the plan does not constrain
# The version a gear's engine must report on /version, by engine. The vLLM image's is the
# image's own (pinned by digest, not by a version the plan knows): not compared here.
ENGINE_VERSIONS = {VLLM_CPU: VLLM_CPU_BUILD.version, SIM: SIM_ENGINE_VERSION}


def expected_roles(plan: dict, peers_must_be_ready: bool = True) -> dict:
    """role -> field -> the value the gateway must advertise (ANY when unconstrained)."""
    policy = plan["gateway"].get("pool_policy") or POOL_POLICIES[0]
    return {name: _expected(role, peers_must_be_ready, policy)
            for name, role in plan["roles"].items()}


def _expected(role: dict, peers_must_be_ready: bool, policy: str) -> dict:
    mode = role["mode"]
    remote = mode in (PROXY, POOL, OWNERS) and not role["feasible"]
    served = mode in (SERVE, POOL, PROXY, OWNERS)
    # A remote role's readiness and window are what its peers answered: waived together while
    # the peers may not be up yet (the window stays null until a peer has answered a probe).
    peers_waived = remote and not peers_must_be_ready
    expected = {
        "route": mode,
        "feasible": role["feasible"],
        "ready": True if served and not peers_waived else ANY,
        "proxied": remote,
        "hosted_by": role["hosted_by"],
        "served_name": role["served_name"] if role["served_name"] else ANY,
        "context": role["context"] if role["context"] and mode != OFF and not peers_waived
        else ANY,
        "replicas": sorted(peer["origin"] for peer in role["peers"]) if mode == POOL else ANY,
        # A pool places by the box's policy and resumes streams as declared.
        "policy": policy if mode == POOL else ANY,
        "stream_resume": role["stream_resume"] if mode == POOL else ANY,
        "engine_version": _engine_version(role, peers_waived),
        # A pinned gear loads <models>/<org>/<name>/<revision>: its /v1/models root ends so.
        "model_revision": (role["gear"] or {}).get("pinned_revision") or ANY,
    }
    if role["task"] in ("stt", "tts"):
        # Audio lanes have no served id or window on the gateway.
        expected.update(served_name=ANY, context=ANY)
    return expected


def _engine_version(role: dict, peers_waived: bool) -> object:
    """What the role's gear on this box must report: the pinned build of its engine."""
    gear = role["gear"]
    if gear is None or role["task"] in ("stt", "tts") or peers_waived:
        return ANY
    return ENGINE_VERSIONS.get(gear.get("engine"), ANY)


# An engine version the gateway read before the reader's own start (it may describe the engine
# a restart replaced): shown so, and never equal to a declared version.
STALE = "(read before verify began)"


def _revision_of(root: object) -> str | None:
    """The revision a gear's model root names (its last part, when a 40-hex commit), else the
    root itself (a hub name: loaded unpinned), else None."""
    if not isinstance(root, str):
        return None
    last = root.rstrip("/").rsplit("/", 1)[-1]
    return last if re.fullmatch(r"[0-9a-f]{40}", last) else root


def advertised_roles(capabilities: dict, self_origin: str,
                     read_within_s: float | None = None) -> dict:
    """role -> field -> value, from a /capabilities body; replicas as peer origins. With
    `read_within_s`, an engine version read longer ago than that is STALE."""
    roles = capabilities.get("roles") or {}
    advertised = {}
    for name, entry in roles.items():
        replicas = entry.get("replicas")
        peer_origins = (sorted(item.get("origin") for item in replicas
                               if item.get("origin") != self_origin)
                        if isinstance(replicas, list) else None)
        advertised[name] = {field: entry.get(field) for field in FIELDS if field != "replicas"}
        advertised[name]["replicas"] = peer_origins
        advertised[name]["model_revision"] = _revision_of(entry.get("model_root"))
        age = entry.get("engine_version_age_s")
        if read_within_s is not None and (not isinstance(age, int | float)
                                          or age > read_within_s):
            for read in ("engine_version", "model_revision"):
                if advertised[name][read] is not None:
                    advertised[name][read] = STALE
        # Why the gateway says a role is not ready (shown, never compared).
        advertised[name]["reason"] = entry.get("reason")
    return advertised


def compare(expected: dict, advertised: dict) -> dict:
    """role -> [mismatching fields]; a declared role the gateway does not list mismatches all."""
    differences = {}
    for role, fields in expected.items():
        seen = advertised.get(role)
        wrong = [field for field, value in fields.items()
                 if value is not ANY and (seen is None or seen.get(field) != value)]
        if wrong:
            differences[role] = wrong
    return differences


def explained(expected: dict, advertised: dict, differences: dict) -> list[str]:
    """One line per mismatching field: role, field, declared, advertised, and the gateway's
    reason where it gives one."""
    lines = []
    for role, fields in differences.items():
        seen = advertised.get(role) or {}
        reason = seen.get("reason")
        for field in fields:
            line = (f"role {role}, field {field}: declared {_cell(expected[role][field])}, "
                    f"advertised {_cell(seen.get(field))}")
            lines.append(f"{line} ({reason})" if reason and field == "ready" else line)
    return lines


def _cell(value) -> str:
    if value is ANY:
        return "*"
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return f"{len(value)} peer(s)" if value else "none"
    return str(value)


def table(expected: dict, advertised: dict, differences: dict, fields: tuple = FIELDS) -> str:
    """Per role: a declared row and an advertised row of `fields`; mismatching fields are
    flagged."""
    header = ["role", "side", *fields]
    rows = [header]
    for role, declared in expected.items():
        seen = advertised.get(role) or {}
        rows.append([role, "declared", *(_cell(declared[field]) for field in fields)])
        flagged = differences.get(role, [])
        rows.append(["", "advertised",
                     *(_cell(seen.get(field)) + ("  <-" if field in flagged else "")
                       for field in fields)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(row[i].ljust(widths[i]) for i in range(len(row))).rstrip()
                     for row in rows)
