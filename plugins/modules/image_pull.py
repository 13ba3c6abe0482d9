#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.image_pull: copy a pinned image from another box over SSH, load it."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: image_pull
short_description: Copy a pinned image from a box that exported it, over SSH, and load it
version_added: 0.1.0
description:
  - For a box that cannot reach a registry (inventory C(fleet_images_from=boxes)). Makes the
    engine hold the image O(ref) (C(repository@sha256:...)) names, tagged
    C(repository:lobes-sha256-<hex>), the reference the box's gears run it by.
  - The image's tar (M(lobes.fleet.image_export)) is copied from O(source) with the same
    resumable, sha256-checked code and SSH options as M(lobes.fleet.model_pull), the copy key
    and the read-only copy server as its forced command (C(imageinfo <hex>) for the manifest,
    C(image <hex> <offset>) for the bytes). A tar cut midway is resumed from its size; one
    whose sha256 differs from the source's manifest is copied once more from its start, then
    the run fails naming it. The whole tar is kept in C(<model_dir>/.images) so this box serves
    it to boxes of later rounds.
  - The tar is loaded (C(docker load)) and the loaded image's ID must be the manifest's;
    otherwise the image is removed (when the engine did not hold it before) with the tar, and
    the run fails naming the host, the reference, the ID expected and the ID found.
  - C(docker load) keeps no registry digest (no C(RepoDigests)), so C(repository@digest)
    cannot resolve on this box without a registry; the local tag stands in for it, and
    M(lobes.fleet.verify) accepts a container whose image is the one that tag names.
  - An engine that already holds the image (the tag, or the reference itself) changes
    nothing and opens no SSH connection. In check mode no SSH connection is opened; the run
    reports the reference it would copy and from where.
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.changes
  - lobes.fleet.attributes.posix
  - lobes.fleet.model
  - lobes.fleet.model.copy
options:
  ref:
    description: The pinned image reference, C(repository@sha256:<64 hex>).
    type: str
    required: true
  source:
    description: The host name or address of a box that exported the image.
    type: str
    required: true
  host:
    description: This box's inventory name, for messages.
    type: str
  headroom_bytes:
    description:
      - What must stay free on the models filesystem once the tar has landed. A box whose
        free space is less than the bytes of the tar it still needs plus this is refused before
        its first byte moves, naming host, path, both sizes and the shortfall (the checkpoints'
        disk preflight, in its words). The room C(docker load) then takes in the engine's own
        storage is not checked here.
    type: int
    default: 2147483648
"""

EXAMPLES = r"""
- name: Copy the pinned gear image from a box of an earlier round
  lobes.fleet.image_pull:
    ref: "{{ lock_ref }}"  # nvcr.io/nvidia/vllm@sha256:<64 hex>, pinned
    source: box-a.tailnet.example
    host: "{{ inventory_hostname }}"
    model_dir: /var/lib/lobes/models
"""

RETURN = r"""
tag:
  description: The local tag the image carries on this box.
  returned: always
  type: str
  sample: nvcr.io/nvidia/vllm:lobes-sha256-3f1c0e7d...
image_id:
  description: The image ID loaded (null in check mode, or when the engine held the image).
  returned: always
  type: str
pulled:
  description: Whether the tar was copied from O(source) (in check mode, would be).
  returned: always
  type: bool
resumed:
  description: Whether the copy went on from an offset past 0, what a cut run left.
  returned: always
  type: bool
bytes_copied:
  description: Bytes received from O(source).
  returned: always
  type: int
"""

import json  # noqa: E402 - modules keep imports below their documentation
import os  # noqa: E402
import tempfile  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.image_copy import (  # noqa: E402
    Engine,
    digest_hex,
    load_checked,
)
from ansible_collections.lobes.fleet.plugins.module_utils.images import (  # noqa: E402
    ImageRefError,
    copy_tag,
)
from ansible_collections.lobes.fleet.plugins.module_utils.model_copy import (  # noqa: E402
    COPY_SOURCE_OPTIONS,
    Puller,
    PullError,
    Source,
)
from ansible_collections.lobes.fleet.plugins.module_utils.model_files import (  # noqa: E402
    MODEL_DIR_OPTION,
    check_image_manifest,
    free_bytes,
    image_paths,
    image_staging,
    read_image_manifest,
    write_image_manifest,
)
from ansible_collections.lobes.fleet.plugins.module_utils.models import disk_shortfalls  # noqa: E402


def source_manifest(source: Source, hex_digest: str) -> dict:
    """The image's manifest as the source box serves it, every field checked."""
    with tempfile.TemporaryFile() as out:
        source.read(f"imageinfo {hex_digest}", out)
        out.seek(0)
        text = out.read(65536)
    try:
        return check_image_manifest(json.loads(text))
    except ValueError as error:
        raise PullError(f"{source.where} sent a manifest of image {hex_digest} that is not one: "
                        f"{error}") from None


def check_room(params: dict, size: int, staged: str) -> None:
    """Refuse (PullError) a box whose models filesystem cannot take the rest of the tar and the
    headroom, before its first byte moves."""
    have = os.path.getsize(staged) if os.path.isfile(staged) else 0
    where = (params["host"] or "this box", params["model_dir"])
    shortfalls = disk_shortfalls({where: size - have}, {where: free_bytes(params["model_dir"])},
                                 params["headroom_bytes"])
    if shortfalls:
        raise PullError(f"no room for image {params['ref']}: {shortfalls[0]}")


def copy_tar(params: dict, hex_digest: str) -> tuple:
    """(the manifest, the Puller) once the whole, checked tar is in .images (kept when whole)."""
    entry = read_image_manifest(params["model_dir"], hex_digest)
    if entry:
        return entry, None
    source = Source(params)
    entry = source_manifest(source, hex_digest)
    os.makedirs(os.path.join(params["model_dir"], ".ssh"), mode=0o700, exist_ok=True)
    staging = image_staging(params["model_dir"])
    os.makedirs(staging, mode=0o755, exist_ok=True)
    name = f"{hex_digest}.tar"
    check_room(params, entry["size"], os.path.join(staging, name))
    puller = Puller(source, f"(image {params['ref']})", staging,
                    lambda _path, offset: f"image {hex_digest} {offset}")
    puller.checked(name, entry)
    tar, _manifest = image_paths(params["model_dir"], hex_digest)
    os.replace(os.path.join(staging, name), tar)
    write_image_manifest(params["model_dir"], hex_digest, entry)
    return entry, puller


def run(module: AnsibleModule) -> dict:
    params = module.params
    hex_digest = digest_hex(params["ref"])
    tag = copy_tag(params["ref"])
    engine = Engine(module)
    result = {"tag": tag, "image_id": None, "pulled": False, "resumed": False, "bytes_copied": 0}
    if engine.image_id(tag) or engine.image_id(params["ref"]):
        return {"changed": False, **result}
    whole = read_image_manifest(params["model_dir"], hex_digest) is not None
    diff = {"before": f"{tag}: not on this box\n",
            "after": f"{tag}: loaded, copied from {params['source']}\n"}
    if module.check_mode:
        return {"changed": True, "diff": diff, **result, "pulled": not whole}
    entry, puller = copy_tar(params, hex_digest)
    where = f"{params['ref']} from {params['source']}"
    image_id = load_checked(engine, params["model_dir"], params["ref"], entry,
                            f"host {params['host'] or 'this box'}: {where}")
    engine.tag_copy(image_id, params["ref"])
    return {"changed": True, "diff": diff, **result, "image_id": image_id,
            "pulled": puller is not None, "resumed": bool(puller and puller.resumed),
            "bytes_copied": puller.bytes_copied if puller else 0}


def main():
    module = AnsibleModule(
        argument_spec={
            **MODEL_DIR_OPTION,
            "ref": {"type": "str", "required": True},
            "source": {"type": "str", "required": True},
            "host": {"type": "str"},
            **COPY_SOURCE_OPTIONS,
            "headroom_bytes": {"type": "int", "default": 2147483648},
        },
        supports_check_mode=True,
    )
    try:
        digest_hex(module.params["ref"])
    except (ImageRefError, ValueError) as error:
        module.fail_json(msg=f"ref: {module.params['ref']!r} {error}")
    try:
        result = run(module)
    except (PullError, RuntimeError, OSError, ValueError) as error:
        module.fail_json(msg=str(error))
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
