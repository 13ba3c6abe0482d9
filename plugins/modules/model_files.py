#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.model_files: check a checkpoint's files against the lock."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_files
short_description: Check a checkpoint's files on the box against the lock, or promote a copy
version_added: 0.1.0
description:
  - Checks C(<model_dir>/<org>/<name>/<revision>) against O(files) (the lock's size and
    sha256 of every file) and reports the files missing, of the wrong size and corrupt, the
    bytes still needed and the bytes free on the filesystem that holds O(model_dir) (for the
    disk preflight).
  - A file whose size and mtime match the directory's C(.lobes-manifest.json) is not hashed
    again.
  - With O(state=present), a revision that is not whole is put in place from O(staging) (where
    a copy from another box lands); every file there is hashed, and only when all are whole
    is the staging directory renamed to the final name, so it never holds half a model.
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.changes
  - lobes.fleet.attributes.posix
  - lobes.fleet.model
  - lobes.fleet.model.checkpoint
options:
  revision:
    description:
      - The 40-hex commit pinned in the lock.
      - Omitted (with O(state=checked)), only the room is reported (RV(free_bytes)), where a
        checkpoint not locked yet will land.
    type: str
  files:
    description: "The lock's files of the revision, C({path: {size, sha256}})."
    type: dict
    default: {}
  state:
    description:
      - V(checked) reports and changes nothing; a revision that is not whole does not fail
        the task (RV(whole) says it).
      - V(present) promotes O(staging) when the final directory is not whole, and fails
        naming the files when neither is.
    type: str
    choices: [checked, present]
    default: checked
  staging:
    description:
      - The staging directory to promote; C(<model_dir>/.partial/<org>/<name>/<revision>)
        when not given.
    type: path
"""

EXAMPLES = r"""
- name: How much of the pinned chat checkpoint is on the box, and room for the rest
  lobes.fleet.model_files:
    checkpoint: Qwen/Qwen3.5-4B
    revision: "{{ lock.checkpoints['Qwen/Qwen3.5-4B'].revision }}"
    files: "{{ lock.checkpoints['Qwen/Qwen3.5-4B'].files }}"
  register: chat_files

- name: Put the copy another box sent into place
  lobes.fleet.model_files:
    checkpoint: Qwen/Qwen3.5-4B
    revision: "{{ lock.checkpoints['Qwen/Qwen3.5-4B'].revision }}"
    files: "{{ lock.checkpoints['Qwen/Qwen3.5-4B'].files }}"
    state: present
"""

RETURN = r"""
checkpoint:
  description: The checkpoint checked (as given), so a loop's results name what each says.
  returned: always
  type: str
revision:
  description: The revision checked, or null when only the room was asked.
  returned: always
  type: str
model_dir:
  description: The models directory (as given).
  returned: always
  type: str
path:
  description: The final directory of the revision.
  returned: always
  type: str
  sample: /var/lib/lobes/models/Qwen/Qwen3.5-4B/0123456789abcdef0123456789abcdef01234567
whole:
  description: Whether the final directory holds every file whole (after a promotion too).
  returned: always
  type: bool
missing:
  description: Files of the lock the final directory does not hold.
  returned: always
  type: list
  elements: str
wrong_size:
  description: Files whose size differs from the lock's.
  returned: always
  type: list
  elements: str
corrupt:
  description: Files of the right size whose sha256 differs from the lock's.
  returned: always
  type: list
  elements: str
bytes_needed:
  description: The lock's size of every file missing, of the wrong size or corrupt.
  returned: always
  type: int
free_bytes:
  description: Bytes free on the filesystem that holds O(model_dir).
  returned: always
  type: int
promoted:
  description: Whether the staging directory was (in check mode, would be) renamed into place.
  returned: always
  type: bool
"""

import os  # noqa: E402 - modules keep imports below their documentation

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.model_files import (  # noqa: E402
    CHECKPOINT_OPTION,
    MODEL_DIR_OPTION,
    check_dir,
    final_dir,
    free_bytes,
    lock_files,
    promote,
    read_manifest,
    staging_dir,
    write_manifest,
)


def _lock_files(module):
    """The lock's files, each with an int size and a 64-hex sha256, names checked."""
    try:
        return lock_files(module.params["checkpoint"], module.params["files"])
    except ValueError as error:
        module.fail_json(msg=str(error))
    return {}  # not reached: fail_json exits


def _report(report, files):
    return dict(missing=report.missing, wrong_size=report.wrong_size, corrupt=report.corrupt,
                whole=report.whole,
                bytes_needed=sum(files[p]["size"] for p in report.not_whole()))


def _promote(module, files, final, result):
    """Promote the staging directory when it is whole; fail naming the files when not."""
    params = module.params
    checkpoint, revision = params["checkpoint"], params["revision"]
    staging = params["staging"] or staging_dir(params["model_dir"], checkpoint, revision)
    name = f"{checkpoint} at {revision}"
    if not os.path.isdir(staging):
        module.fail_json(msg=f"{name} is not whole in {final} and there is no staging "
                         f"directory {staging}", **result)
    staged = check_dir(staging, files, use_manifest=False)
    if not staged.whole:
        module.fail_json(msg=f"{name}: staging {staging} is not whole: missing {staged.missing}, "
                         f"wrong size {staged.wrong_size}, corrupt {staged.corrupt}", **result)
    if not module.check_mode:
        promote(staging, final, staged.manifest)
    return dict(result, missing=[], wrong_size=[], corrupt=[], whole=True, bytes_needed=0,
                promoted=True, changed=True,
                diff=dict(before=f"{final}: not whole\n",
                          after=f"{final}: whole (from {staging})\n"))


def room_only(module):
    """No revision yet: the bytes free where the checkpoint will land, and nothing held."""
    params = module.params
    if params["state"] != "checked" or params["files"]:
        module.fail_json(msg=f"{params['checkpoint']}: a revision is needed to check or put "
                         "files in place")
    module.exit_json(checkpoint=params["checkpoint"], revision=None,
                     model_dir=params["model_dir"], path=None,
                     free_bytes=free_bytes(params["model_dir"]), promoted=False, changed=False,
                     missing=[], wrong_size=[], corrupt=[], whole=False, bytes_needed=0)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            **CHECKPOINT_OPTION,
            **MODEL_DIR_OPTION,
            revision=dict(type="str"),
            files=dict(type="dict", default={}),
            state=dict(type="str", choices=["checked", "present"], default="checked"),
            staging=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["revision"] is None:
        room_only(module)
    try:
        final = final_dir(params["model_dir"], params["checkpoint"], params["revision"])
    except ValueError as error:
        module.fail_json(msg=str(error))
    files = _lock_files(module)
    report = check_dir(final, files, use_manifest=True)
    if report.whole and report.manifest != read_manifest(final) and not module.check_mode:
        write_manifest(final, report.manifest)  # files re-hashed: spare it next time
    result = dict(checkpoint=params["checkpoint"], revision=params["revision"],
                  model_dir=params["model_dir"], path=final,
                  free_bytes=free_bytes(params["model_dir"]), promoted=False, changed=False,
                  **_report(report, files))
    if params["state"] == "present" and not report.whole:
        result = _promote(module, files, final, result)
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
