#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.systemd_units: services.json as systemd unit files."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: systemd_units
short_description: Write (or remove) one systemd unit per service of a box's services.json
version_added: 0.1.0
description:
  - The C(process) runtime of lobes.fleet on boxes where systemd runs. Turns each service of
    the C(services.json) written by M(lobes.fleet.render) into a unit
    C(<prefix>-<name>.service) in O(unit_dir) with C(ExecStart) (the argv), C(WorkingDirectory),
    C(EnvironmentFile) (the service's C(env_file)), C(Environment) (its C(env)),
    C(Restart=on-failure) with C(RestartSec=2) and its output appended to
    O(state_dir)C(/log/<log>).
  - Each unit carries a fingerprint of the content its service reads at start (the C(env_file)
    and the C(watch) paths, for example the deployed gateway source) in a comment, so a new
    C(.env) or new code changes the unit; RV(changed_units) lists the units to restart.
  - It only writes files; start, restart and stop the units with
    M(ansible.builtin.systemd_service) (the gears and gateway roles do).
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.changes
  - lobes.fleet.attributes.posix
  - lobes.fleet.services
options:
  state:
    description:
      - V(present) writes the units of the selected services and, when O(names) is empty,
        removes the units with O(prefix) whose service C(services.json) no longer lists.
      - V(absent) removes the units with O(prefix) (only those of O(names) when given).
        Stop them first.
    type: str
    choices: [present, absent]
    default: present
  services_file:
    description: Path of the C(services.json) on the managed host. Required when
      O(state=present); relative paths in it are relative to its directory.
    type: path
  state_dir:
    description: The service logs go to its C(log/) directory (created when missing).
    type: path
    required: true
  unit_dir:
    description: Where the unit files go.
    type: path
    default: /etc/systemd/system
  prefix:
    description: Unit name prefix, unique per box so that several boxes on one host never
      collide; characters a unit name cannot hold become C(-).
    type: str
    required: true
  watch:
    description: Files or directories added to every unit's inputs fingerprint.
    type: list
    elements: path
    default: []
notes:
  - Writes files only; it runs and needs no C(systemctl), so check mode works anywhere.
"""

EXAMPLES = r"""
- name: Write the units of the box's gears
  lobes.fleet.systemd_units:
    services_file: /srv/lobes/services.json
    state_dir: /srv/lobes/state
    prefix: lobes-spark1
    exclude: [gateway]
  register: gear_units

- name: Remove the box's units
  lobes.fleet.systemd_units:
    state: absent
    state_dir: /srv/lobes/state
    prefix: lobes-spark1
"""

RETURN = r"""
units:
  description: The units of the selected services (present), or those removed (absent).
  returned: always
  type: list
  elements: str
  sample: [lobes-spark1-gear-cortex.service, lobes-spark1-gateway.service]
changed_units:
  description: Units written because they are new or their text (or inputs) changed.
  returned: always
  type: list
  elements: str
  sample: [lobes-spark1-gateway.service]
removed_units:
  description: Units removed (stale ones for V(present), the selected ones for V(absent)).
  returned: always
  type: list
  elements: str
  sample: []
"""

import json  # noqa: E402 - modules keep imports below their documentation
import os  # noqa: E402 - modules keep imports below their documentation

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.systemd import (  # noqa: E402
    UnitError,
    UnitLayout,
    prefix_marker,
    render_units,
    unit_name,
    unit_prefix,
)


def _read(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _existing(unit_dir, prefix):
    """This box's units in unit_dir: named with its prefix and carrying its prefix marker."""
    if not os.path.isdir(unit_dir):
        return []
    start = unit_prefix(prefix) + "-"
    marker = prefix_marker(prefix)
    return sorted(
        f for f in os.listdir(unit_dir)
        if f.startswith(start) and f.endswith(".service")
        and marker in (_read(os.path.join(unit_dir, f)) or "").splitlines()
    )


def _wanted(module):
    params = module.params
    path = params["services_file"]
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
        layout = UnitLayout(
            base_dir=os.path.dirname(os.path.abspath(path)),
            log_dir=os.path.join(params["state_dir"], "log"),
            prefix=params["prefix"],
            host=document.get("host", "") if isinstance(document, dict) else "",
        )
        return render_units(document, layout, params["names"], params["exclude"],
                            tuple(params["watch"]))
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"{path}: cannot write systemd units: {exc}")


def _present(module):
    params = module.params
    if module.check_mode and not os.path.exists(params["services_file"]):
        # A --check run before the first render: every unit would be written.
        module.exit_json(changed=True, units=[], changed_units=[], removed_units=[],
                         msg="not rendered yet: every service's unit would be written")
    wanted = _wanted(module)
    current = {name: _read(os.path.join(params["unit_dir"], name)) for name in wanted}
    changed = sorted(name for name, text in wanted.items() if current[name] != text)
    stale = []
    if not params["names"]:
        kept = {unit_name(params["prefix"], n) for n in params["exclude"]}
        stale = [u for u in _existing(params["unit_dir"], params["prefix"])
                 if u not in wanted and u not in kept]
    diff = dict(
        before="".join(f"--- {n}\n{current[n] or ''}" for n in changed)
        + "".join(f"--- {n}\n" for n in stale),
        after="".join(f"--- {n}\n{wanted[n]}" for n in changed),
    )
    if not module.check_mode:
        os.makedirs(params["unit_dir"], exist_ok=True)
        os.makedirs(os.path.join(params["state_dir"], "log"), exist_ok=True)
        for name in changed:
            _write(module, os.path.join(params["unit_dir"], name), wanted[name])
        for name in stale:
            os.remove(os.path.join(params["unit_dir"], name))
    return dict(units=sorted(wanted), changed_units=changed, removed_units=stale, diff=diff)


def _write(module, path, text):
    temporary = f"{path}.lobes-tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(temporary, 0o644)
    module.atomic_move(temporary, path)


def _absent(module):
    params = module.params
    existing = _existing(params["unit_dir"], params["prefix"])
    if params["names"]:
        chosen = {unit_name(params["prefix"], n) for n in params["names"]}
        existing = [u for u in existing if u in chosen]
    dropped = {unit_name(params["prefix"], n) for n in params["exclude"]}
    removed = [u for u in existing if u not in dropped]
    before = {u: _read(os.path.join(params["unit_dir"], u)) or "" for u in removed}
    if not module.check_mode:
        for name in removed:
            os.remove(os.path.join(params["unit_dir"], name))
    diff = dict(before="".join(f"--- {n}\n{t}" for n, t in before.items()), after="")
    return dict(units=removed, changed_units=[], removed_units=removed, diff=diff)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["present", "absent"], default="present"),
            services_file=dict(type="path"),
            state_dir=dict(type="path", required=True),
            unit_dir=dict(type="path", default="/etc/systemd/system"),
            prefix=dict(type="str", required=True),
            names=dict(type="list", elements="str", default=[]),
            exclude=dict(type="list", elements="str", default=[]),
            watch=dict(type="list", elements="path", default=[]),
        ),
        required_if=[("state", "present", ["services_file"])],
        supports_check_mode=True,
    )
    try:
        result = _present(module) if module.params["state"] == "present" else _absent(module)
    except UnitError as exc:
        module.fail_json(msg=str(exc))
    changed = bool(result["changed_units"] or result["removed_units"])
    if not (module._diff and changed):
        result.pop("diff")
    module.exit_json(changed=changed, **result)


if __name__ == "__main__":
    main()
