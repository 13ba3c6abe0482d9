#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.source_tree: mirror a controller directory onto the box."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: source_tree
short_description: Mirror a directory of the controller onto the managed host in one run
version_added: 0.1.0
description:
  - Copies every file of O(src) (a directory on the controller; bytecode and
    C(__pycache__) left out) to O(dest) on the managed host, writing only the files whose
    content differs, and removing files under O(dest) that O(src) no longer has.
  - The roles use it to deploy the collection's own C(gateway/) source (lobes_gateway,
    lobes_sim, lobes_supervisor) to each box, so the gateway a box runs is always the
    collection's.
  - Runs through its action plugin, which bundles O(src) into one compressed argument; one
    module run whatever the number of files.
  - With O(backup_dir), the tree as it was is kept there before a run changes it, so a
    rollback can put it back with O(remote_src).
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.changes
  - lobes.fleet.attributes.posix
options:
  src:
    description: The directory on the controller to mirror (on the managed host with O(remote_src)).
    type: path
    required: true
  remote_src:
    description: O(src) is a directory on the managed host (a rollback from O(backup_dir)).
    type: bool
    default: false
  backup_dir:
    description:
      - A directory on the managed host that receives a mirror of O(dest) as it was, each
        time this run changes O(dest). Left as it is when nothing changes.
    type: path
  dest:
    description: The directory on the managed host; created (mode 0755) when missing.
    type: path
    required: true
  delete:
    description: Remove files under O(dest) that O(src) does not have (C(__pycache__) kept).
    type: bool
    default: true
  bundle:
    description:
      - Filled by the action plugin from O(src); not set by hand.
    type: str
"""

EXAMPLES = r"""
- name: Deploy the collection's gateway source to the box, keeping the one it replaces
  lobes.fleet.source_tree:
    src: "{{ role_path }}/../../gateway"
    dest: /srv/lobes/gateway
    backup_dir: /srv/lobes/previous/gateway

- name: Put the kept source back
  lobes.fleet.source_tree:
    src: /srv/lobes/previous/gateway
    remote_src: true
    dest: /srv/lobes/gateway
"""

RETURN = r"""
written:
  description: Files (relative to O(dest)) written because they were missing or differed.
  returned: always
  type: list
  elements: str
  sample: [lobes_gateway/app/gateway.py]
removed:
  description: Files (relative to O(dest)) removed because O(src) no longer has them.
  returned: always
  type: list
  elements: str
  sample: [lobes_gateway/old.py]
"""

import base64  # noqa: E402 - modules keep imports below their documentation
import gzip  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def _read(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def _existing(dest):
    """Relative paths of the files under dest, caches left out."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(dest):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            found.add(os.path.relpath(os.path.join(dirpath, name), dest))
    return found


def _tree(root):
    """Relative path -> content of every file under root (caches left out); {} when absent."""
    return {rel: _read(os.path.join(root, rel)) for rel in _existing(root)}


def _wanted(module):
    if module.params["remote_src"]:
        if not os.path.isdir(module.params["src"]):
            module.fail_json(msg=f"src {module.params['src']} is not a directory on the host")
        return _tree(module.params["src"])
    if not module.params["bundle"]:
        module.fail_json(
            msg="no bundle: run lobes.fleet.source_tree as a task (its action "
            "plugin reads src on the controller)"
        )
    files = json.loads(gzip.decompress(base64.b64decode(module.params["bundle"])))
    return {rel: base64.b64decode(data) for rel, data in files.items()}


def _mirror(dest, wanted, delete):
    """Write the files of wanted that differ under dest and remove (with delete) the others."""
    written = sorted(rel for rel, data in wanted.items() if _read(os.path.join(dest, rel)) != data)
    removed = sorted(_existing(dest) - set(wanted)) if delete and os.path.isdir(dest) else []
    return written, removed


def _apply(dest, wanted, written, removed):
    for rel in written:
        _write(os.path.join(dest, rel), wanted[rel])
    for rel in removed:
        os.unlink(os.path.join(dest, rel))


def _write(path, content):
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=directory, prefix=".source_tree.")
    with os.fdopen(handle, "wb") as out:
        out.write(content)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            src=dict(type="path", required=True),
            dest=dict(type="path", required=True),
            delete=dict(type="bool", default=True),
            remote_src=dict(type="bool", default=False),
            backup_dir=dict(type="path"),
            bundle=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    dest = module.params["dest"]
    wanted = _wanted(module)
    written, removed = _mirror(dest, wanted, module.params["delete"])
    replaced = [rel for rel in written if os.path.exists(os.path.join(dest, rel))]
    changed = bool(written or removed)
    backup = module.params["backup_dir"]
    if changed and not module.check_mode:
        if backup:
            kept = _tree(dest)
            _apply(backup, kept, *_mirror(backup, kept, delete=True))
        _apply(dest, wanted, written, removed)
    result = dict(changed=changed, written=written, removed=removed)
    if module._diff and changed:
        # File names only: the content is the collection's own source, diffable in git.
        result["diff"] = dict(
            before="".join(f"{rel}\n" for rel in sorted(replaced + removed)),
            after="".join(f"{rel}\n" for rel in written),
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
