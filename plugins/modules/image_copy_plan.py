#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.image_copy_plan: which box copies each pinned image from which."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: image_copy_plan
short_description: Plan the box-to-box copies of the gears' pinned images, round by round
version_added: 0.1.0
description:
  - For the boxes whose gears' images come from other boxes (inventory
    C(fleet_images_from=boxes)). From the plan's images (M(lobes.fleet.mesh_plan) return value
    C(images), C(copy) naming the pinned reference a box copies) and what each box holds
    (M(lobes.fleet.image_export) return value C(held)), the copies to make in doubling rounds, as
    checkpoints are copied (a box filled in a round serves from the next).
  - A reference some box copies that no box holds fails the run, naming it, the boxes that
    wait for it and the fix. Changes nothing anywhere.
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.changes
options:
  plan:
    description: The mesh plan (M(lobes.fleet.mesh_plan) return value C(plan)), for addresses.
    type: dict
    required: true
  images:
    description: The plan's gear images (M(lobes.fleet.mesh_plan) return value C(images)).
    type: list
    elements: dict
    required: true
  held:
    description: Host -> the pinned references whose exported tar it holds.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Plan the image copies
  lobes.fleet.image_copy_plan:
    plan: "{{ site_plan.plan }}"
    images: "{{ site_plan.images }}"
    held: "{{ dict(ansible_play_hosts | zip(exported | map(attribute='held'))) }}"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
pulls:
  description: Host -> its copies, each C({round, ref, source, address}).
  returned: always
  type: dict
rounds:
  description: How many rounds the copies take.
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 - below the documentation
from ansible_collections.lobes.fleet.plugins.module_utils.image_copy import (  # noqa: E402
    copy_pulls,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "plan": {"type": "dict", "required": True},
            "images": {"type": "list", "elements": "dict", "required": True},
            "held": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    params = module.params
    held = {str(host): list(refs or []) for host, refs in params["held"].items()
            if isinstance(refs, list)}
    pulls, rounds, errors = copy_pulls(params["images"], held,
                                       params["plan"].get("boxes") or {})
    result = {"changed": False, "pulls": pulls, "rounds": rounds}
    if errors:
        module.fail_json(msg="the gear images cannot be copied:\n" + "\n".join(errors), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
