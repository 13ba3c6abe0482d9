#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.model_plan: which checkpoint goes where, at which revision."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_plan
short_description: Plan how each pinned checkpoint reaches the boxes that load it
version_added: 0.1.0
description:
  - Reads the mesh plan and the fleet's lock file (C(fleet.lock.yml) beside the inventory) and
    returns, per hub checkpoint the plan's gears load, its revision, the hosts that load it, the
    host that fetches it from the hub when no box holds it yet, and the box-to-box copy rounds
    that fill the others (each holder sends to one box a round, so the boxes holding it double
    every round).
  - A revision comes from the inventory (role C(revision)), the catalog or the lock; none is
    ever made up. A gear with none is reported as unpinned, a warning, or an error with
    O(require_pins) or on a box with C(fleet_models_require_pins). A declared revision the lock
    contradicts, or one checkpoint pinned at two revisions, is an error naming host, role and
    field.
  - Simulated gears, and checkpoints under C(lobes/) (built on the box) or given as a path, load
    nothing from the hub and are left out.
  - It writes nothing; the lock file is written by the step that fetches and checks the files.
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.pure
  - lobes.fleet.lock.controller
options:
  plan:
    description: The mesh plan, as RV(lobes.fleet.mesh_plan#module:plan) returns it.
    type: dict
    required: true
  lock_file:
    description: The lock file; a path that does not exist means nothing is locked yet.
    type: path
    required: true
  present:
    description:
      - Checkpoint -> the hosts that already hold its files, checked against the lock. They are
        the first sources of the copy rounds; with none, the first host that loads it fetches it
        from the hub.
    type: dict
    default: {}
  held:
    description:
      - "Host -> what M(lobes.fleet.model_files) reported there, one result per checkpoint
        the host loads (C(checkpoint), C(model_dir), C(whole), C(bytes_needed),
        C(free_bytes)): a host holding a checkpoint whole is a source of its copies, and the
        bytes each host still needs against those free are the disk preflight."
    type: dict
    default: {}
  resolved:
    description:
      - "Host -> M(lobes.fleet.model_fetch)'s check-mode results (C(checkpoint),
        C(bytes_total)) for the checkpoints not locked yet: every host that loads one needs
        its whole size."
    type: dict
    default: {}
  fetched:
    description:
      - "Host -> M(lobes.fleet.model_fetch)'s results: the host holds each checkpoint it
        fetched."
    type: dict
    default: {}
  require_pins:
    description: Refuse every unpinned gear, whatever each box's C(fleet_models_require_pins).
    type: bool
    default: false
  headroom_bytes:
    description:
      - What must stay free on a models filesystem after the copies. A host whose need plus
        this exceeds what is free is an error naming host, path, both sizes and the shortfall,
        before any byte moves.
    type: int
    default: 2147483648
"""

EXAMPLES = r"""
- name: Plan the mesh once
  lobes.fleet.mesh_plan:
  run_once: true
  register: mesh

- name: Plan where each checkpoint goes, refusing any gear without a pinned revision
  lobes.fleet.model_plan:
    plan: "{{ mesh.plan }}"
    lock_file: "{{ inventory_dir }}/fleet.lock.yml"
    require_pins: true
  delegate_to: localhost
  run_once: true
  register: models
"""

RETURN = r"""
models:
  description: Each hub checkpoint the plan's gears load, by name.
  returned: always
  type: dict
  contains:
    revision:
      description: The pinned revision (40 hex), or null when unpinned.
      type: str
    source:
      description:
        - Where the revision comes from, declared (inventory or catalog), locked or unpinned.
      type: str
    hosts:
      description: The hosts whose gears load it, sorted.
      type: list
      elements: str
    fetch_from_hub:
      description: The host that fetches it from the hub (no box holds it yet), or null.
      type: str
    rounds:
      description: The copy rounds, each a list of [source host, destination host].
      type: list
      elements: list
    files:
      description: "The lock's files of the revision, C({path: {size, sha256}}); empty when
        the checkpoint is not locked yet."
      type: dict
    warnings:
      description: Unpinned gears, where pins are not required.
      type: list
      elements: str
    errors:
      description: What stops the rollout, each naming host, role and field.
      type: list
      elements: str
  sample:
    Qwen/Qwen3-Embedding-0.6B:
      revision: null
      source: unpinned
      hosts: [orin, spark, thor]
      fetch_from_hub: orin
      rounds: [[[orin, spark]], [[orin, thor]]]
      warnings:
        - "host orin, role embedder, field revision: Qwen/Qwen3-Embedding-0.6B has no pinned
          revision, ..."
      errors: []
pulls:
  description:
    - "Host -> the copies it makes, each C({round, checkpoint, revision, source, address,
      files}): from which box (C(source), reached at C(address), the host of its origin) in
      which round (0 first); a round starts once the one before has ended on every box."
  returned: always
  type: dict
rounds:
  description: How many copy rounds the fleet needs (the most any checkpoint needs).
  returned: always
  type: int
pins:
  description:
    - Every gear that loads a hub checkpoint (host, role, checkpoint, revision, source, locked,
      required).
  returned: always
  type: list
  elements: dict
"""

# Modules keep their imports below their documentation.
from urllib.parse import urlsplit  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.models import (  # noqa: E402
    LockError,
    disk_shortfalls,
    model_pins,
    model_summary,
    read_lock_file,
)


def _results(by_host: dict) -> list:
    """(host, result) for every loop result given per host (a skipped one says nothing)."""
    return [(str(host), result) for host, results in by_host.items()
            for result in results or [] if isinstance(result, dict) and "checkpoint" in result]


def merged_present(present: dict, held: dict, fetched: dict) -> dict:
    """checkpoint -> hosts holding it whole: as given, as model_files found, as fetched."""
    merged = {str(name): [str(host) for host in hosts or []] for name, hosts in present.items()}
    holding = [(host, result) for host, result in _results(held) if result.get("whole")]
    holding += _results(fetched)
    for host, result in holding:
        hosts = merged.setdefault(str(result["checkpoint"]), [])
        if host not in hosts:
            hosts.append(host)
    return merged


def disk_errors(models: dict, held: dict, resolved: dict, headroom_bytes: int) -> list:
    """The disk preflight: what each host must still receive against what is free there."""
    sizes = {str(result["checkpoint"]): int(result.get("bytes_total") or 0)
             for _host, result in _results(resolved)}
    needs, free = {}, {}
    for host, result in _results(held):
        where = (host, str(result.get("model_dir")))
        unlocked = not models.get(result["checkpoint"], {}).get("files")
        need = sizes.get(str(result["checkpoint"]), 0) if unlocked else result.get("bytes_needed")
        needs[where] = needs.get(where, 0) + int(need or 0)
        free[where] = max(free.get(where, 0), int(result.get("free_bytes") or 0))
    return disk_shortfalls(needs, free, headroom_bytes)


def planned_pulls(models: dict, plan: dict) -> dict:
    """host -> its copies, round by round, each naming its source box and where to reach it."""
    boxes = plan.get("boxes") or {}
    pulls: dict = {}
    for checkpoint, entry in models.items():
        for number, pairs in enumerate(entry["rounds"]):
            for source, destination in pairs:
                origin = (boxes.get(source) or {}).get("origin") or ""
                pulls.setdefault(destination, []).append({
                    "round": number, "checkpoint": checkpoint, "revision": entry["revision"],
                    "source": source, "address": urlsplit(origin).hostname or source,
                    "files": entry["files"]})
    return pulls


def main():
    module = AnsibleModule(
        argument_spec=dict(
            plan=dict(type="dict", required=True),
            lock_file=dict(type="path", required=True),
            present=dict(type="dict", default={}),
            held=dict(type="dict", default={}),
            resolved=dict(type="dict", default={}),
            fetched=dict(type="dict", default={}),
            require_pins=dict(type="bool", default=False),
            headroom_bytes=dict(type="int", default=2 << 30),
        ),
        supports_check_mode=True,
    )
    try:
        lock = read_lock_file(module.params["lock_file"])
    except LockError as error:
        module.fail_json(msg=f"the lock file cannot be used: {error}")
    params = module.params
    present = merged_present(params["present"], params["held"], params["fetched"])
    pins = model_pins(module.params["plan"], lock)
    models = model_summary(pins, present, module.params["require_pins"])
    for checkpoint, entry in models.items():
        locked = lock.model(checkpoint)
        entry["files"] = ({path: {"size": item.size, "sha256": item.sha256}
                           for path, item in locked.files} if locked else {})
    errors = [error for entry in models.values() for error in entry["errors"]]
    errors += disk_errors(models, params["held"], params["resolved"], params["headroom_bytes"])
    result = dict(changed=False, models=models, pins=[dict(vars(pin)) for pin in pins],
                  pulls=planned_pulls(models, module.params["plan"]),
                  rounds=max((len(entry["rounds"]) for entry in models.values()), default=0))
    if errors:
        module.fail_json(msg="the models cannot be placed:\n" + "\n".join(errors), **result)
    warnings = [warning for entry in models.values() for warning in entry["warnings"]]
    for warning in warnings:
        module.warn(warning)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
