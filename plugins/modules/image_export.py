#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.image_export: a pinned image this box holds, saved once to a file
other boxes copy it from."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: image_export
short_description: Save each pinned image the box holds to a file other boxes can copy
version_added: 0.1.0
description:
  - For boxes that cannot reach a registry (inventory C(fleet_images_from=boxes)). For each
    reference of O(refs) (C(repository@sha256:...)), makes C(<model_dir>/.images/<hex>.tar)
    hold the image, as C(docker save) of its image ID writes it, with a manifest beside it
    (C(<hex>.json)) giving the tar's size and sha256 and the image ID. C(<hex>) is the hex of
    the registry digest. The tar is written in C(<model_dir>/.images/.partial) and renamed
    when whole; the manifest is written last.
  - A tar already whole (its manifest's size) is kept and nothing is run. The engine's image is
    found by the reference (pulled from a registry) or by its copy tag (loaded from another
    box's copy, M(lobes.fleet.image_pull)).
  - With O(pull), a reference the engine does not hold is pulled first (a box that reaches
    the registry). A reference neither held nor pulled is reported in RV(missing).
  - With O(tag) (a box that copies its images), the engine is also made to hold each image
    under its copy tag C(repository:lobes-sha256-<hex>), what the box's gears run. An image
    held by its reference is tagged, and a whole tar the engine lacks (an engine emptied since
    the copy) is loaded, its image ID checked against the manifest, and tagged.
  - The box's read-only copy server (C(lobes_model_serve.py)) serves only these whole tars,
    by digest hex, to the fleet's copy keys.
  - Check mode pulls and writes nothing; it reports what a run would export.
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.changes
  - lobes.fleet.attributes.posix
  - lobes.fleet.model
options:
  refs:
    description: Pinned image references, C(repository@sha256:<64 hex>).
    type: list
    elements: str
    required: true
  pull:
    description: Pull a reference the engine does not hold first.
    type: bool
    default: false
  tag:
    description: Make the engine hold each image under its copy tag (a box that copies its images).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Export the pinned gear image for the boxes that copy it
  lobes.fleet.image_export:
    refs: ["{{ lock_ref }}"]  # nvcr.io/nvidia/vllm@sha256:<64 hex>, pinned
    pull: true
    model_dir: /var/lib/lobes/models
"""

RETURN = r"""
held:
  description: The references whose whole tar the box holds after the run (check mode, would).
  returned: always
  type: list
  elements: str
exported:
  description: The references saved to a tar by this run (in check mode, that a run would save).
  returned: always
  type: list
  elements: str
missing:
  description: The references the engine neither holds nor pulled.
  returned: always
  type: list
  elements: str
"""

import os  # noqa: E402 - modules keep imports below their documentation

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
from ansible_collections.lobes.fleet.plugins.module_utils.model_files import (  # noqa: E402
    MODEL_DIR_OPTION,
    digest,
    image_paths,
    image_staging,
    read_image_manifest,
    write_image_manifest,
)


def engine_image(engine: Engine, ref: str, pull: bool) -> tuple:
    """(the image ID the engine holds for ref, pulled): by the reference, else its copy tag."""
    image_id = engine.image_id(ref) or engine.image_id(copy_tag(ref))
    if image_id or not pull:
        return image_id, False
    engine.must("pull", ref)
    return engine.image_id(ref), True


def export(engine: Engine, model_dir: str, ref: str, image_id: str) -> None:
    """Save the image to staging, hash it, rename it into place, then write its manifest."""
    hex_digest = digest_hex(ref)
    tar, _manifest = image_paths(model_dir, hex_digest)
    staging = image_staging(model_dir)
    os.makedirs(staging, mode=0o755, exist_ok=True)
    partial = os.path.join(staging, os.path.basename(tar))
    if os.path.lexists(partial):
        os.remove(partial)
    # By ID: the tar names no tag, so loading it elsewhere tags nothing by itself.
    engine.must("save", "--output", partial, image_id)
    found = digest(partial)
    os.replace(partial, tar)
    write_image_manifest(model_dir, hex_digest, {
        "size": found.size, "sha256": found.sha256, "id": image_id, "ref": ref})


def tagged(engine: Engine, model_dir: str, ref: str, entry: dict | None, check: bool) -> bool:
    """Make the engine hold the image under its copy tag, from the image held by its reference
    or from the whole tar; whether that changed (would change, in check mode) anything."""
    tag = copy_tag(ref)
    if engine.image_id(tag):
        return False
    held = engine.image_id(ref)
    if check or not (held or entry):
        return bool(held or entry)
    if held:
        engine.must("tag", held, tag)
        return True
    engine.tag_copy(load_checked(engine, model_dir, ref, entry,
                                 f"{ref} (its tar in {model_dir})"), ref)
    return True


def run(module: AnsibleModule) -> dict:
    params = module.params
    engine = Engine(module)
    held, exported, missing = [], [], []
    changed = False
    for ref in sorted(set(params["refs"])):
        entry = read_image_manifest(params["model_dir"], digest_hex(ref))
        if params["tag"]:
            changed = tagged(engine, params["model_dir"], ref, entry, module.check_mode) or changed
        if entry:
            held.append(ref)
            continue
        image_id, pulled = engine_image(engine, ref, params["pull"] and not module.check_mode)
        changed = changed or pulled
        if not image_id and not (params["pull"] and module.check_mode):
            missing.append(ref)
            continue
        if not module.check_mode:
            export(engine, params["model_dir"], ref, image_id)
        held.append(ref)
        exported.append(ref)
        changed = True
    return {"changed": changed, "held": held, "exported": exported, "missing": missing}


def main():
    module = AnsibleModule(
        argument_spec={
            **MODEL_DIR_OPTION,
            "refs": {"type": "list", "elements": "str", "required": True},
            "pull": {"type": "bool", "default": False},
            "tag": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    for ref in module.params["refs"]:
        try:
            digest_hex(ref)
        except (ImageRefError, ValueError) as error:
            module.fail_json(msg=f"refs: {ref!r} {error}")
    try:
        result = run(module)
    except (RuntimeError, OSError, ValueError) as error:
        module.fail_json(msg=str(error))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
