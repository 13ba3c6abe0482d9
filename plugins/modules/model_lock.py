#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.model_lock: record a fetched checkpoint in the fleet's lock."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_lock
short_description: Record a checkpoint's revision and files in the fleet's lock file
version_added: 0.1.0
description:
  - Sets one checkpoint's entry of the lock file (C(fleet.lock.yml) beside the inventory), the
    revision a box fetched from the hub and every file's size and sha256, as
    M(lobes.fleet.model_fetch) returned them after checking each one. Every later copy, on
    every box, is held to this entry.
  - The file is rewritten whole, keys sorted, so its diff in review shows only what changed;
    an entry already equal leaves it untouched (changed=false).
  - A revision the lock already holds for the checkpoint is never replaced by another unless
    O(replace) says so (moving a pin is an explicit step, docs/operations.md).
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.changes
  - lobes.fleet.lock
  - lobes.fleet.lock.controller
options:
  checkpoint:
    description: The hub repo id, C(org/name).
    type: str
    required: true
  revision:
    description: The 40-hex commit the files are of.
    type: str
    required: true
  files:
    description: "Every file of the revision, C({path: {size, sha256}})."
    type: dict
    required: true
  replace:
    description: Replace an entry locked at another revision (moving the pin).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Lock what the seed box fetched
  lobes.fleet.model_lock:
    lock_file: "{{ inventory_dir }}/fleet.lock.yml"
    checkpoint: Qwen/Qwen3.5-4B
    revision: "{{ fetched.revision }}"
    files: "{{ fetched.files }}"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
path:
  description: The lock file written (or, in check mode, that would be).
  returned: always
  type: str
revision:
  description: The revision the lock holds for the checkpoint now.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.models import (  # noqa: E402
    LOCK_FILE_OPTION,
    LockError,
    read_lock_file,
    save_lock,
    with_model,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            **LOCK_FILE_OPTION,
            checkpoint=dict(type="str", required=True),
            revision=dict(type="str", required=True),
            files=dict(type="dict", required=True),
            replace=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    path = params["lock_file"]
    try:
        lock = read_lock_file(path)
        held = lock.model(params["checkpoint"])
        if held is not None and held.revision != params["revision"] and not params["replace"]:
            module.fail_json(
                msg=f"{path}: {params['checkpoint']} is locked at {held.revision}, not "
                    f"{params['revision']}; to move the pin set replace (docs/operations.md)")
        updated = with_model(lock, params["checkpoint"], params["revision"], params["files"])
    except LockError as error:
        module.fail_json(msg=str(error))
    changed, diff = save_lock(path, lock, updated, module.check_mode)
    result = dict(changed=changed, path=path, revision=params["revision"])
    if module._diff:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
