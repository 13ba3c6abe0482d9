#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.model_pull: copy one checkpoint revision from another box over SSH."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_pull
short_description: Copy a checkpoint revision from a box that holds it, over SSH, resumable
version_added: 0.1.0
description:
  - Runs on the box that needs the revision. Makes C(<model_dir>/<org>/<name>/<revision>)
    hold every file of O(files) (the lock's sizes and sha256), copying each file not already
    whole from O(source), a box that holds the whole revision, so the hub is asked once per
    fleet, not once per box.
  - Each file is streamed by C(ssh <ssh_user>@<source> read <org>/<name> <revision> <path> <offset>)
    into C(<model_dir>/.partial/<org>/<name>/<revision>). On O(source) that key's forced
    command is C(lobes_model_serve.py), which serves only whole revisions, read only
    (M(lobes.fleet.model_copy_key) writes that line).
  - A file the staging directory already holds in part is resumed from its size; one larger
    than the lock's size is truncated first. A cut connection leaves the part copied for the
    next run. A file whose sha256 differs from the lock's is copied once more from its start,
    then the run fails naming it with the hash expected and the hash found.
  - When every file is whole the staging directory is renamed into place with its manifest.
    A final directory already whole changes nothing and opens no SSH connection.
  - SSH reads no config file (C(-F none)), uses only O(ssh_key), never asks for a password
    and accepts a host key it has not seen before into C(<model_dir>/.ssh/known_hosts)
    (C(StrictHostKeyChecking=accept-new)); a changed host key fails the run.
  - In check mode no SSH connection is opened at all; the run reports the files it would copy.
  - While bytes arrive, C(<model_dir>/.progress/<org>__<name>@<revision>.json) says the bytes
    done and in all, the rate, when the copy started and last moved, and its source; it is
    rewritten at most four times a second and removed once the revision is whole. A failed
    run leaves it, so status.yml shows the copy stalled (M(lobes.fleet.model_progress)).
  - File names holding a space cannot be copied box to box (the request's fields are
    separated by spaces) and fail the run.
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.changes
  - lobes.fleet.attributes.posix
  - lobes.fleet.model
  - lobes.fleet.model.copy
  - lobes.fleet.model.checkpoint
options:
  revision:
    description: The 40-hex commit, as the lock pins it.
    type: str
    required: true
  files:
    description: "The lock's files of the revision, C({path: {size, sha256}})."
    type: dict
    required: true
  source:
    description: The host name or address of a box that holds the whole revision.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Copy the chat checkpoint from a box of an earlier round
  lobes.fleet.model_pull:
    checkpoint: Qwen/Qwen3.5-4B
    revision: "{{ lock.checkpoints['Qwen/Qwen3.5-4B'].revision }}"
    files: "{{ lock.checkpoints['Qwen/Qwen3.5-4B'].files }}"
    source: box-a.tailnet.example
    model_dir: /var/lib/lobes/models
"""

RETURN = r"""
path:
  description: The final directory of the revision.
  returned: always
  type: str
  sample: /var/lib/lobes/models/Qwen/Qwen3.5-4B/0123456789abcdef0123456789abcdef01234567
pulled:
  description: The files copied from O(source) (in check mode, the files a run would copy).
  returned: always
  type: list
  elements: str
  sample: [model-00001-of-00002.safetensors]
resumed:
  description: The files whose copy went on from an offset past 0, what a cut run left.
  returned: always
  type: list
  elements: str
  sample: [model-00001-of-00002.safetensors]
bytes_copied:
  description: Bytes received from O(source) (in check mode, the bytes a run would copy).
  returned: always
  type: int
  sample: 8053063680
bytes_total:
  description: The size of the whole revision.
  returned: always
  type: int
  sample: 8053063680
seconds:
  description: Wall time of the run.
  returned: always
  type: float
  sample: 41.7
rate:
  description: Bytes copied per second.
  returned: always
  type: float
  sample: 193118194.2
"""

import os  # noqa: E402 - modules keep imports below their documentation
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.model_copy import (  # noqa: E402
    COPY_SOURCE_OPTIONS,
    Puller,
    PullError,
    Source,
)
from ansible_collections.lobes.fleet.plugins.module_utils.model_files import (  # noqa: E402
    CHECKPOINT_OPTION,
    MODEL_DIR_OPTION,
    check_dir,
    final_dir,
    lock_files,
    promote,
    read_manifest,
    staging_dir,
    write_manifest,
)
from ansible_collections.lobes.fleet.plugins.module_utils.model_progress import Progress  # noqa: E402


def _staged_bytes(staging, files, paths):
    """Bytes of paths the staging directory already holds, up to each file's size."""
    total = 0
    for path in paths:
        target = os.path.join(staging, path)
        if os.path.isfile(target) and os.path.getsize(target) <= files[path]["size"]:
            total += os.path.getsize(target)
    return total


def _result(final, pulled, resumed, copied, total, started):
    seconds = round(time.monotonic() - started, 3)
    return dict(
        path=final,
        pulled=pulled,
        resumed=resumed,
        bytes_copied=copied,
        bytes_total=total,
        seconds=seconds,
        rate=round(copied / seconds, 1) if seconds > 0 else 0.0,
    )


def run(module):
    """The module's work; raises PullError (or ValueError) for a failure to report."""
    params = module.params
    started = time.monotonic()
    checkpoint, revision = params["checkpoint"], params["revision"]
    final = final_dir(params["model_dir"], checkpoint, revision)
    staging = staging_dir(params["model_dir"], checkpoint, revision)
    files = lock_files(checkpoint, params["files"])
    total = sum(entry["size"] for entry in files.values())
    report = check_dir(final, files, use_manifest=True)
    if report.whole:
        if report.manifest != read_manifest(final) and not module.check_mode:
            write_manifest(final, report.manifest)  # files re-hashed: spare it next time
        return dict(changed=False, **_result(final, [], [], 0, total, started))
    need = report.not_whole()
    diff = dict(
        before=f"{final}: not whole ({len(need)} of {len(files)} files to copy)\n",
        after=f"{final}: whole (copied from {params['source']})\n",
    )
    if module.check_mode:
        would = sum(files[p]["size"] for p in need) - _staged_bytes(staging, files, need)
        return dict(changed=True, diff=diff, **_result(final, need, [], would, total, started))
    os.makedirs(os.path.join(params["model_dir"], ".ssh"), mode=0o700, exist_ok=True)
    if os.path.isdir(final) and not os.path.exists(staging):
        # Not whole: its good files are kept by checking them again in staging.
        os.makedirs(os.path.dirname(staging), mode=0o755, exist_ok=True)
        os.rename(final, staging)
    os.makedirs(staging, mode=0o755, exist_ok=True)
    for path in files:
        if " " in path:
            raise PullError(
                f"{path!r} of {checkpoint} holds a space: it cannot be copied "
                "box to box; fetch it from the hub (lobes.fleet.model_fetch)"
            )
    progress = Progress(params["model_dir"], checkpoint, revision, total=total,
                        done=_staged_bytes(staging, files, files), source=params["source"])
    puller = Puller(Source(params), f"of {checkpoint} at {revision}", staging,
                    lambda path, offset: f"read {checkpoint} {revision} {path} {offset}",
                    progress.add)
    manifest = {path: puller.checked(path, files[path]) for path in sorted(files)}
    promote(staging, final, manifest)
    progress.done()
    return dict(
        changed=True,
        diff=diff,
        **_result(final, puller.pulled, puller.resumed, puller.bytes_copied, total, started),
    )


def main():
    module = AnsibleModule(
        argument_spec=dict(
            **CHECKPOINT_OPTION,
            **MODEL_DIR_OPTION,
            revision=dict(type="str", required=True),
            files=dict(type="dict", required=True),
            source=dict(type="str", required=True),
            **COPY_SOURCE_OPTIONS,
        ),
        supports_check_mode=True,
    )
    try:
        result = run(module)
    except (PullError, ValueError, OSError) as error:
        module.fail_json(msg=str(error))
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
