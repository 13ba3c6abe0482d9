#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.model_copy_key: the key boxes copy checkpoints with, and its trust."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_copy_key
short_description: The box's checkpoint copy key, and the forced-command lines that trust others'
version_added: 0.1.0
description:
  - With O(state=keypair), makes C(<model_dir>/.ssh/lobes_model_copy) an ed25519 key pair
    (C(ssh-keygen), mode 0600, its directory 0700), generated when missing, and returns its
    public key. M(lobes.fleet.model_pull) logs in with it.
  - With O(state=authorized), writes one line per key of O(public_keys) into O(authorized_keys),
    each restricted (C(restrict)) to the forced command
    C(<python> <serve> <model_dir>), the read-only file server C(lobes_model_serve.py), so the
    key can read whole checkpoints and do nothing else. Lines of other keys, or of other
    commands, are never touched; with O(exclusive), this command's lines for keys no longer
    listed are removed.
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.changes
  - lobes.fleet.attributes.posix
  - lobes.fleet.model
options:
  state:
    description: C(keypair) to ensure this box's key, C(authorized) to trust O(public_keys).
    type: str
    choices: [keypair, authorized]
    default: keypair
  public_keys:
    description:
      - The public keys (C(ssh-ed25519 AAAA... comment)) to trust, with O(state=authorized).
    type: list
    elements: str
    default: []
  authorized_keys:
    description:
      - The authorized_keys file of the SSH user the keys log in as, with O(state=authorized).
    type: path
    default: /root/.ssh/authorized_keys
  serve:
    description: The path of C(lobes_model_serve.py) on this box (the deployed gateway source).
    type: path
    default: /srv/lobes/gateway/lobes_model_serve.py
  python:
    description: The interpreter that runs O(serve).
    type: path
    default: /usr/bin/python3
  exclusive:
    description: Remove the lines of this forced command whose key is not in O(public_keys).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Make this box's copy key
  lobes.fleet.model_copy_key:
    model_dir: /var/lib/lobes/models
  register: copy_key

- name: Trust every box's copy key, for reading checkpoints only
  lobes.fleet.model_copy_key:
    state: authorized
    public_keys: "{{ groups['boxes'] | map('extract', hostvars, ['copy_key', 'public_key'])
      | list }}"
    exclusive: true
"""

RETURN = r"""
public_key:
  description: The public key of the pair (O(state=keypair); null in check mode before it exists).
  returned: when state is keypair
  type: str
  sample: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI... lobes-model-copy@box-a
path:
  description: The private key's path (O(state=keypair)) or the authorized_keys file.
  returned: always
  type: str
  sample: /var/lib/lobes/models/.ssh/lobes_model_copy
added:
  description: The authorized_keys lines added (O(state=authorized)).
  returned: when state is authorized
  type: list
  elements: str
removed:
  description: The authorized_keys lines removed (O(state=authorized) with O(exclusive)).
  returned: when state is authorized
  type: list
  elements: str
"""

import os  # noqa: E402 - modules keep imports below their documentation
import re  # noqa: E402
import socket  # noqa: E402
import tempfile  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.model_files import (  # noqa: E402
    COPY_KEY,
    MODEL_DIR_OPTION,
)

# Key types ssh-keygen writes, a base64 blob and a plain comment (or none): nothing that could
# add options or a second line to authorized_keys.
_KEY = re.compile(
    r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(?:256|384|521)) ([A-Za-z0-9+/]+={0,2})"
    r"(?: ([A-Za-z0-9@._:-]{1,100}))?\Z"
)
# The forced command goes through the login shell: paths are kept to characters it leaves alone.
_PLAIN_PATH = re.compile(r"^/[A-Za-z0-9/._+-]*\Z")


def _keypair(module):
    """Ensure the ed25519 pair under <model_dir>/.ssh; (changed, public key or None)."""
    key = os.path.join(module.params["model_dir"], COPY_KEY)
    ssh_dir = os.path.dirname(key)
    pub = key + ".pub"
    changed = False
    if module.check_mode:
        have = os.path.isfile(key) and os.path.isfile(pub)
        return not have, (_read(pub).strip() if have else None), key
    if not os.path.isdir(ssh_dir) or (os.stat(ssh_dir).st_mode & 0o777) != 0o700:
        os.makedirs(ssh_dir, mode=0o700, exist_ok=True)
        os.chmod(ssh_dir, 0o700)
        changed = True
    if not os.path.isfile(key):
        comment = f"lobes-model-copy@{socket.gethostname()}"
        module.run_command(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", key], check_rc=True
        )
        changed = True
    if (os.stat(key).st_mode & 0o777) != 0o600:
        os.chmod(key, 0o600)
        changed = True
    if not os.path.isfile(pub):
        _rc, out, _err = module.run_command(["ssh-keygen", "-y", "-f", key], check_rc=True)
        _write(pub, out.strip() + "\n", 0o644)
        changed = True
    return changed, _read(pub).strip(), key


def _read(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


def _write(path, text, mode):
    directory = os.path.dirname(path)
    handle, tmp = tempfile.mkstemp(dir=directory, prefix=".lobes-keys.")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def forced_command(params):
    """The authorized_keys options that bind a key to the read-only file server."""
    for name in ("python", "serve", "model_dir"):
        if not _PLAIN_PATH.match(params[name]):
            raise ValueError(
                f"{name} {params[name]!r} must be an absolute path of letters, "
                "digits and / . _ + - (it goes through the login shell)"
            )
    return f'command="{params["python"]} {params["serve"]} {params["model_dir"]}",restrict'


def _key_line(options, public_key):
    match = _KEY.match(public_key.strip())
    if not match:
        raise ValueError(
            f"{public_key[:60]!r} is not a public key line like 'ssh-ed25519 AAAA... comment'"
        )
    return " ".join(part for part in (options, *match.groups()) if part)


def _key_of(line):
    """The key blob of an authorized_keys line (its second-to-last or last field), or None."""
    fields = line.split()
    return next((f for f in fields if f.startswith("AAAA")), None)


def _authorized(module):
    """Write the forced-command lines for the keys; (changed, added, removed, before, after)."""
    params = module.params
    options = forced_command(params)
    wanted = [_key_line(options, key) for key in params["public_keys"]]
    before = _read(params["authorized_keys"])
    lines = before.splitlines()
    ours = [line for line in lines if line.startswith(options + " ")]
    wanted_keys = {_key_of(line) for line in wanted}
    removed = [line for line in ours if params["exclusive"] and _key_of(line) not in wanted_keys]
    present = {_key_of(line) for line in ours if line not in removed}
    added = [line for line in wanted if _key_of(line) not in present]
    kept = [line for line in lines if line not in removed]
    after = "".join(f"{line}\n" for line in kept + added)
    changed = bool(added or removed)
    if changed and not module.check_mode:
        os.makedirs(os.path.dirname(params["authorized_keys"]), mode=0o700, exist_ok=True)
        _write(params["authorized_keys"], after, 0o600)
    return changed, added, removed, before, after


def main():
    module = AnsibleModule(
        argument_spec=dict(
            **MODEL_DIR_OPTION,
            state=dict(type="str", choices=["keypair", "authorized"], default="keypair"),
            public_keys=dict(type="list", elements="str", default=[]),
            authorized_keys=dict(type="path", default="/root/.ssh/authorized_keys"),
            serve=dict(type="path", default="/srv/lobes/gateway/lobes_model_serve.py"),
            python=dict(type="path", default="/usr/bin/python3"),
            exclusive=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    if module.params["state"] == "keypair":
        changed, public_key, key = _keypair(module)
        module.exit_json(changed=changed, public_key=public_key, path=key)
    try:
        changed, added, removed, before, after = _authorized(module)
    except ValueError as error:
        module.fail_json(msg=str(error))
    result = dict(
        changed=changed, added=added, removed=removed, path=module.params["authorized_keys"]
    )
    if module._diff and changed:
        result["diff"] = dict(
            before=before,
            after=after,
            before_header=module.params["authorized_keys"],
            after_header=module.params["authorized_keys"],
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
