#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.model_prune: remove the revisions no gear of the box loads."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_prune
short_description: Remove the checkpoint revisions no gear of the box loads, never one in use
version_added: 0.1.0
description:
  - Lists the revision directories under O(model_dir), whole (C(<org>/<name>/<revision>)) and
    being assembled (C(.partial/<org>/<name>/<revision>)), and removes each that O(planned)
    does not name, so a role removed from a box, or a pin moved, leaves no files behind once
    a prune is asked for; the progress file of a copy of it that never finished goes too.
  - A revision a running process uses is never removed, planned or not; it is reported in
    RV(in_use), naming the path and the processes. A process uses a revision when an argument
    of its command line names a path in it (vLLM's C(--model)), directly, through a link or
    through a container's mount of O(model_dir) (O(mounts)), or when it maps one of its files.
  - Only plain directories are listed; a link is never followed nor removed, and nothing
    outside O(model_dir) is ever touched. Directories that are not revisions (C(.ssh),
    C(.progress), a checkpoint's unpinned files) are left alone.
  - With O(remove=false) nothing is removed and RV(unplanned) says what a prune would remove.
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.changes
  - lobes.fleet.attributes.posix
  - lobes.fleet.model
options:
  planned:
    description:
      - "The checkpoints the box's gears load, C({checkpoint: revision}); a null revision keeps
        every revision of that checkpoint (the plan's is not known yet)."
    type: dict
    required: true
  remove:
    description: Remove what is unplanned and unused; V(false) only reports it.
    type: bool
    default: true
  mounts:
    description: Where containers see O(model_dir), so their gears' paths count as uses.
    type: list
    elements: str
    default: [/models]
  proc_root:
    description: Where the box's process table is read.
    type: path
    default: /proc
"""

EXAMPLES = r"""
- name: Remove every revision no gear of the box loads
  lobes.fleet.model_prune:
    planned:
      Qwen/Qwen3.5-4B: 0123456789abcdef0123456789abcdef01234567
  register: pruned

- name: Say what a prune would remove, removing nothing
  lobes.fleet.model_prune:
    planned: {}
    remove: false
"""

RETURN = r"""
unplanned:
  description:
    - The revision directories no gear of the box loads and no process uses (removed, or
      what a prune would remove).
  returned: always
  type: list
  elements: str
  sample: [/var/lib/lobes/models/Qwen/Qwen3-8B/0123456789abcdef0123456789abcdef01234567]
removed:
  description: The directories removed by this run (none in check mode or with O(remove=false)).
  returned: always
  type: list
  elements: str
in_use:
  description: Unplanned revision directories kept because a running process uses them.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: The directory kept.
      type: str
    checkpoint:
      description: Its checkpoint.
      type: str
    revision:
      description: Its revision.
      type: str
    used_by:
      description: The processes that use it, C(pid N (command line)).
      type: list
      elements: str
"""

import os  # noqa: E402 - modules keep imports below their documentation

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.model_files import MODEL_DIR_OPTION  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.model_prune import (  # noqa: E402
    decide,
    listing,
    remove,
    users,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            **MODEL_DIR_OPTION,
            planned=dict(type="dict", required=True),
            remove=dict(type="bool", default=True),
            mounts=dict(type="list", elements="str", default=["/models"]),
            proc_root=dict(type="path", default="/proc"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    model_dir = params["model_dir"]
    planned = {str(name): (str(rev) if rev else None) for name, rev in params["planned"].items()}
    found = listing(model_dir)
    decision = decide(found, planned, users(model_dir, params["proc_root"], params["mounts"]))
    unplanned = [os.path.join(model_dir, held.rel) for held in decision.remove]
    in_use = [dict(path=os.path.join(model_dir, held.rel), checkpoint=held.checkpoint,
                   revision=held.revision, used_by=used) for held, used in decision.in_use]
    removing = params["remove"] and bool(unplanned)
    removed = []
    if removing and not module.check_mode:
        try:
            for held in decision.remove:
                removed.append(remove(model_dir, held))
        except (OSError, ValueError) as error:
            module.fail_json(msg=f"pruning {model_dir}: {error}", unplanned=unplanned,
                             removed=removed, in_use=in_use)
    result = dict(changed=removing, unplanned=unplanned, removed=removed, in_use=in_use)
    if removing and module._diff:
        before = [os.path.join(model_dir, rel) for rel in found]
        after = [path for path in before if path not in unplanned]
        result["diff"] = dict(before="".join(f"{path}\n" for path in before),
                              after="".join(f"{path}\n" for path in after))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
