#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.model_progress: the checkpoint copies under way on a box."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_progress
short_description: The checkpoint copies under way or stalled on the box, bytes, rate, time left
version_added: 0.1.0
description:
  - Reads the progress files M(lobes.fleet.model_fetch) and M(lobes.fleet.model_pull) write
    under C(<model_dir>/.progress/) while bytes arrive, and says of each copy
    C(N MiB of M MiB, R MiB/s, T s left), or that it is stalled when its file was last
    rewritten more than O(stall_after) seconds ago (a copy cut or failed leaves its file until
    a later run makes the revision whole). A finished copy has no file, so none is shown.
  - With O(jobs), the ids of copies started asynchronously (C(async) with C(poll) 0), it follows
    them instead, and every O(poll_s) seconds prints each copy's line for the box, until every
    job has finished, and returns their results; it fails when one failed, with its message.
  - Reads only; a progress file that is not one (torn, hostile) is skipped.
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.model
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
options:
  stall_after:
    description: Seconds without a rewrite after which a copy is reported stalled.
    type: int
    default: 120
  jobs:
    description:
      - Async job ids of copies to follow until they finish (action plugin); an empty list
        follows nothing and returns RV(results) empty.
    type: list
    elements: str
  poll_s:
    description: Seconds between two looks at the copies followed with O(jobs).
    type: int
    default: 2
"""

EXAMPLES = r"""
- name: The copies under way on the box
  lobes.fleet.model_progress:
    model_dir: /var/lib/lobes/models
  register: copies

- name: Follow pulls started with async and poll 0, printing their progress
  lobes.fleet.model_progress:
    jobs: "{{ pulling.results | map(attribute='ansible_job_id') }}"
"""

RETURN = r"""
copies:
  description: The copies with a progress file, by file name.
  returned: always
  type: list
  elements: dict
  contains:
    checkpoint:
      description: The checkpoint copied.
      type: str
    revision:
      description: Its revision.
      type: str
    source:
      description: The box (or hub) it is copied from.
      type: str
    bytes_done:
      description: Bytes the box holds of the revision.
      type: int
    bytes_total:
      description: Bytes of the whole revision.
      type: int
    rate:
      description: Bytes per second since the copy started.
      type: float
    seconds_left:
      description: Seconds left at that rate; null when stalled or no byte has come yet.
      type: float
    age:
      description: Seconds since the file was last rewritten.
      type: float
    stalled:
      description: Whether it was last rewritten more than O(stall_after) seconds ago.
      type: bool
lines:
  description: One line per copy, C(N MiB of M MiB, R MiB/s, T s left).
  returned: always
  type: list
  elements: str
  sample: ["acme/tiny-chat@0123456789ab from box-a: 1.5 MiB of 4.0 MiB, 0.50 MiB/s, 5 s left"]
results:
  description: With O(jobs), each job's final result, in order.
  returned: when O(jobs) is given
  sample: [{"checkpoint": "acme/tiny-chat", "changed": true, "finished": true}]
  type: list
  elements: dict
"""

from dataclasses import asdict  # noqa: E402 - modules keep imports below their documentation

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.model_files import MODEL_DIR_OPTION  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.model_progress import copies  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(
            **MODEL_DIR_OPTION,
            stall_after=dict(type="int", default=120),
            jobs=dict(type="list", elements="str"),
            poll_s=dict(type="int", default=2),
        ),
        supports_check_mode=True,
    )
    found = copies(module.params["model_dir"], module.params["stall_after"])
    module.exit_json(changed=False, copies=[asdict(copy) for copy in found],
                     lines=[copy.line() for copy in found])


if __name__ == "__main__":
    main()
