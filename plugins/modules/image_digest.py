#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.image_digest: the image digests a box holds and its gears run."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: image_digest
short_description: Read the digest a box holds for each image tag, and what its gears run
version_added: 0.1.0
description:
  - For each reference of O(refs) (an image named by tag), the digest the box holds for it,
    the registry digest of that repository in C(docker image inspect)'s C(RepoDigests). With
    O(pull), a reference the box does not hold yet is pulled first (changed=true).
  - Nothing is made up. An image with no registry digest of its repository (built on the box,
    or loaded from a file) gets null and a reason, and the lock gets no entry for it.
  - With O(project_dir), what every container of the compose project there runs, its image id
    and that image's C(RepoDigests), by compose service. M(lobes.fleet.verify) compares them
    with the digests the plan and the lock pin.
  - Check mode pulls nothing; it reads what the box holds.
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.changes
options:
  refs:
    description: Image references named by tag, as the plan names them.
    type: list
    elements: str
    default: []
  pull:
    description: Pull each reference the box does not hold yet.
    type: bool
    default: false
  project_dir:
    description: A compose project's directory whose containers to read.
    type: path
"""

EXAMPLES = r"""
- name: Pull the gears' tag-named images and read the digests the box got
  lobes.fleet.image_digest:
    refs: [nvcr.io/nvidia/vllm:26.04-py3]
    pull: true
  register: pulled

- name: Read what the gear containers run
  lobes.fleet.image_digest:
    project_dir: /srv/lobes
  register: running
"""

RETURN = r"""
digests:
  description: Each reference of O(refs) -> the digest the box holds (null where it has none).
  returned: always
  type: dict
  sample: {"nvcr.io/nvidia/vllm:26.04-py3": "sha256:3f1c...e9"}
reasons:
  description: Each reference with a null digest -> why.
  returned: always
  type: dict
containers:
  description:
    - Compose service -> its container (C(container)), the image it was created from
      (C(config_image)), the image id it runs (C(image_id)) and that image's C(repo_digests)
      and C(repo_tags) (a copied image is known by its local tag; it has no registry digest).
  returned: when O(project_dir) is given
  type: dict
"""

import json  # noqa: E402 - modules keep imports below their documentation

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.images import (  # noqa: E402
    ImageRefError,
    held_digests,
    parse_ref,
)
from ansible_collections.lobes.fleet.plugins.module_utils.service_files import (  # noqa: E402
    ps_rows,
)


class Docker:
    """The docker CLI on the box, through the module's run_command."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.binary = module.get_bin_path("docker", required=True)

    def run(self, *args: str) -> tuple:
        return self.module.run_command([self.binary, *args])

    def inspect(self, kind: str, *names: str) -> list:
        """`docker <kind> inspect` of each name, as JSON; [] when none exists."""
        rc, out, _err = self.run(kind, "inspect", *names)
        if rc != 0 and not out.strip():
            return []
        try:
            found = json.loads(out)
        except ValueError:
            return []
        return found if isinstance(found, list) else []


def read_digest(docker: Docker, ref: str, pull: bool) -> tuple:
    """(digest or None, reason or None, pulled) for one tag-named reference."""
    name = parse_ref(ref).name
    found = docker.inspect("image", ref)
    pulled = False
    if not found and pull:
        rc, _out, err = docker.run("pull", ref)
        if rc != 0:
            return None, f"the pull failed: {err.strip() or rc}", False
        pulled = True
        found = docker.inspect("image", ref)
    if not found:
        return None, "the box does not hold it" + ("" if pull else " (not pulled)"), pulled
    held = held_digests(name, found[0].get("RepoDigests"))
    if not held:
        return None, (f"image {found[0].get('Id')} holds no registry digest of {name} "
                      "(built or loaded on the box): nothing to lock"), pulled
    if len(held) > 1:
        return None, (f"image {found[0].get('Id')} holds {len(held)} digests of {name} "
                      f"({', '.join(held)}): name the one to run by digest"), pulled
    return held[0], None, pulled


def read_containers(docker: Docker, module: AnsibleModule, project: str) -> dict:
    """service -> what its container runs, for every container of the compose project."""
    rc, out, err = docker.run("compose", "--project-directory", project, "ps", "--all",
                              "--format", "json")
    if rc != 0:
        module.fail_json(msg=f"the containers of {project} could not be listed: {err.strip()}")
    containers = {}
    for row in ps_rows(out):
        details = docker.inspect("container", row["ID"])
        image_id = details[0].get("Image") if details else None
        image = docker.inspect("image", image_id) if image_id else []
        containers[row["Service"]] = {
            "container": row["ID"],
            "config_image": (details[0].get("Config") or {}).get("Image") if details else None,
            "image_id": image_id,
            "repo_digests": sorted(image[0].get("RepoDigests") or []) if image else [],
            "repo_tags": sorted(image[0].get("RepoTags") or []) if image else [],
        }
    return containers


def main():
    module = AnsibleModule(
        argument_spec={
            "refs": {"type": "list", "elements": "str", "default": []},
            "pull": {"type": "bool", "default": False},
            "project_dir": {"type": "path"},
        },
        supports_check_mode=True,
    )
    params = module.params
    for ref in params["refs"]:
        try:
            parse_ref(ref)
        except ImageRefError as error:
            module.fail_json(msg=f"refs: {ref!r} {error}")
    docker = Docker(module)
    pull = params["pull"] and not module.check_mode
    digests, reasons, changed = {}, {}, False
    for ref in sorted(set(params["refs"])):
        digests[ref], reason, pulled = read_digest(docker, ref, pull)
        changed = changed or pulled
        if reason:
            reasons[ref] = reason
    result = {"changed": changed, "digests": digests, "reasons": reasons}
    if params["project_dir"]:
        result["containers"] = read_containers(docker, module, params["project_dir"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
