#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.image_lock: lock the digests the boxes pulled for image tags."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: image_lock
short_description: Record the digests the boxes pulled for tag-named images in the lock file
version_added: 0.1.0
description:
  - Takes the gear images of the plan (RV(lobes.fleet.mesh_plan#module:images)) and, from every
    box, the digest it holds for each tag-named image still to resolve
    (RV(lobes.fleet.image_digest#module:digests)), and writes one entry per reference in the
    C(images) section of the lock file (C(fleet.lock.yml) beside the inventory).
  - One reference is locked to one digest, so every box that runs it (every box of its hardware
    group) must report the same digest; otherwise it fails naming each host and its digest, and
    writes nothing. A reference no box holds a registry digest for (an image built on the box)
    is left unlocked, with a warning.
  - The file is rewritten whole, keys sorted; an entry already equal leaves it untouched
    (changed=false). An entry the lock holds is never replaced here; to move it, delete it
    (docs/operations.md).
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.changes
  - lobes.fleet.lock
  - lobes.fleet.lock.controller
options:
  images:
    description: The plan's gear images, as M(lobes.fleet.mesh_plan) returns them.
    type: list
    elements: dict
    required: true
  found:
    description: Host -> reference -> the digest the box holds (null where it has none).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Lock the digests the boxes pulled
  lobes.fleet.image_lock:
    lock_file: "{{ inventory_dir }}/fleet.lock.yml"
    images: "{{ site_plan.images }}"
    found: "{{ dict(ansible_play_hosts | zip(ansible_play_hosts | map('extract', hostvars, 'pulled')
              | map(attribute='digests', default={}))) }}"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
path:
  description: The lock file written (or, in check mode, that would be).
  returned: always
  type: str
locked:
  description: The references this run locked, each with its digest.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.images import (  # noqa: E402
    RESOLVE,
    GearImage,
    resolve_from_boxes,
)
from ansible_collections.lobes.fleet.plugins.module_utils.models import (  # noqa: E402
    LOCK_FILE_OPTION,
    LockError,
    read_lock_file,
    save_lock,
    with_image,
)

_IMAGE_KEYS = ("host", "group", "role", "service", "slot", "ref", "run", "state")


def gear_image(entry: dict) -> GearImage:
    """One of the plan's gear images; ValueError naming what is missing."""
    missing = [key for key in _IMAGE_KEYS if not isinstance(entry.get(key), str)]
    if missing:
        raise ValueError(f"images: an entry lacks {', '.join(missing)}; pass mesh_plan's images")
    return GearImage(**{key: entry[key] for key in _IMAGE_KEYS})


def main():
    module = AnsibleModule(
        argument_spec={
            **LOCK_FILE_OPTION,
            "images": {"type": "list", "elements": "dict", "required": True},
            "found": {"type": "dict", "required": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    path = params["lock_file"]
    try:
        images = [gear_image(entry) for entry in params["images"]]
        lock = read_lock_file(path)
    except (ValueError, LockError) as error:
        module.fail_json(msg=str(error))
    # A reference the lock pins already is not resolved again (the plan says `locked`).
    resolution = resolve_from_boxes(
        [image for image in images if image.state == RESOLVE and not lock.image(image.ref)],
        params["found"])
    if resolution.errors:
        module.fail_json(msg="the image digests cannot be locked:\n" + "\n".join(resolution.errors))
    updated = lock
    for ref, digest in resolution.entries:
        updated = with_image(updated, ref, digest)
    changed, diff = save_lock(path, lock, updated, module.check_mode)
    result = {"changed": changed, "path": path, "locked": dict(resolution.entries)}
    if resolution.notes:
        result["warnings"] = list(resolution.notes)
    if module._diff:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
