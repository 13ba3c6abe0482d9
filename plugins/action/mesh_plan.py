"""Controller side of lobes.fleet.mesh_plan: read every fleet host's variables, plan the mesh.

An action rather than a module so the hosts' vault keys never travel as module arguments: the
plan checks a key's shape through a masked wrapper and records only whether it is set. Each
variable is read (templated, decrypted) on its own, so a template that does not resolve or a
vault value without its password is reported against its host and variable, like any other
refused value, and never as a raw templating error.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible_collections.lobes.fleet.plugins.module_utils.errors import FleetErrors
from ansible_collections.lobes.fleet.plugins.module_utils.images import (
    gear_images,
    group_splits,
    lock_contradictions,
    with_images_to_run,
)
from ansible_collections.lobes.fleet.plugins.module_utils.inventory import Unreadable
from ansible_collections.lobes.fleet.plugins.module_utils.models import (
    LOCK_FILE,
    FleetLock,
    LockError,
    model_pins,
    pin_findings,
    read_lock_file,
)
from ansible_collections.lobes.fleet.plugins.module_utils.plan import plan_mesh
from ansible_collections.lobes.fleet.plugins.module_utils.schema import (
    ANSIBLE_VARS,
    BOX_FIELDS,
    SecretValue,
    suspect_names,
)

# Variables holding secrets inside: fleet_client_keys' entries carry a `key` each.
CLIENT_KEYS_VAR = "fleet_client_keys"


def plain(value):
    """A templated value as plain Python data, read through once here, inside the caller's
    error handling (not later, wherever the value happens to be read)."""
    if isinstance(value, Mapping):
        return {plain(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return value


def _secret(value):
    return SecretValue(value) if isinstance(value, str) else value


def _masked_client_keys(client_keys):
    """fleet_client_keys with each entry's key wrapped, so it is checked and never shown."""
    if not isinstance(client_keys, dict):
        return client_keys
    return {name: ({**entry, "key": _secret(entry.get("key"))} if isinstance(entry, dict)
                   else entry)
            for name, entry in client_keys.items()}


def _reason(error: AnsibleError) -> str:
    """The first line of an Ansible error's message: what went wrong, without the task and
    file excerpts it comes wrapped in."""
    message = getattr(error, "message", None) or str(error)
    return str(message).strip().splitlines()[0] if str(message).strip() else type(error).__name__


def read_variable(hostvars, name: str):
    """One variable of a host, templated and decrypted, or Unreadable saying why not."""
    try:
        value = plain(hostvars[name])
    except AnsibleError as error:
        return Unreadable(_reason(error))
    if BOX_FIELDS.get(name) is not None and BOX_FIELDS[name].secret:
        return _secret(value)
    if name == CLIENT_KEYS_VAR:
        return _masked_client_keys(value)
    return value


def fleet_vars(hostvars) -> dict:
    """The variables the fleet model reads from one host: its fleet_* variables, the Ansible
    ones the plan reads, and those that look like misspelt fleet variables."""
    names = list(hostvars)
    wanted = [name for name in names if name.startswith("fleet_") or name in ANSIBLE_VARS]
    wanted += [name for name in suspect_names(names) if name not in wanted]
    return {name: read_variable(hostvars, name) for name in wanted}


def fleet_hosts(task_vars: dict) -> list:
    """Every host of the inventory, whatever --limit or serial say: a box's peers belong to the
    mesh even when this run does not touch them, and the playbooks run on every host."""
    return list(task_vars["groups"]["all"])


def lock_path(args: dict, task_vars: dict) -> str | None:
    """The lock file: the option's, else fleet.lock.yml in the inventory's directory."""
    if args.get("lock_file"):
        return args["lock_file"]
    inventory_dir = task_vars.get("inventory_dir")
    return os.path.join(inventory_dir, LOCK_FILE) if inventory_dir else None


def check_pins(plan: dict, lock: FleetLock) -> tuple:
    """(pins as dicts, warnings, errors): each gear's checkpoint revision against the lock."""
    pins = model_pins(plan, lock)
    findings = pin_findings(pins)
    return ([{**vars(pin)} for pin in pins], [str(item) for item in findings.warnings],
            [str(item) for item in findings.errors])


def check_images(plan: dict, lock: FleetLock) -> tuple:
    """(each gear container's image as a GearImage, errors): the lock's images section read
    against itself, and every box of a hardware group running one image."""
    images, errors = gear_images(plan, lock)
    problems = lock_contradictions(lock)
    return images, problems + [str(error) for error in [*errors, *group_splits(images)]]


def with_pinned_revisions(plan: dict, pins: list) -> None:
    """Each pinned gear's plan names the revision it loads (declared, else locked): the gear
    starts from the box's copy of it (render.pinned_model_dir)."""
    for pin in pins:
        if pin["revision"]:
            plan["boxes"][pin["host"]]["roles"][pin["role"]]["gear"]["pinned_revision"] = \
                pin["revision"]


class ActionModule(ActionBase):
    """Plan the mesh on the controller; changes nothing anywhere."""

    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self.validate_argument_spec(
            argument_spec={"hosts": {"type": "list", "elements": "str"},
                           "lock_file": {"type": "path"}},
        )[1]
        task_vars = task_vars or {}
        hostvars = task_vars["hostvars"]
        hosts = args["hosts"] or fleet_hosts(task_vars)
        unknown = [host for host in hosts if host not in hostvars]
        if unknown:
            return {**result, "failed": True,
                    "msg": f"hosts not in the inventory: {', '.join(unknown)}"}
        try:
            plan = plan_mesh({host: fleet_vars(hostvars[host]) for host in hosts})
        except FleetErrors as errors:
            return {**result, "failed": True, "msg": f"the mesh cannot work:\n{errors}",
                    "errors": [str(error) for error in errors.errors]}
        path = lock_path(args, task_vars)
        try:
            lock = read_lock_file(path) if path else FleetLock()
        except LockError as error:
            return {**result, "failed": True, "msg": f"the lock file cannot be used:\n{error}"}
        pins, warnings, errors = check_pins(plan, lock)
        images, image_errors = check_images(plan, lock)
        errors += image_errors
        if errors:
            return {**result, "failed": True, "msg": "the mesh cannot work:\n" + "\n".join(errors),
                    "errors": errors}
        if warnings:
            result["warnings"] = [*result.get("warnings", []), *warnings]
        with_pinned_revisions(plan, pins)
        with_images_to_run(plan, images)
        return {**result, "changed": False, "plan": plan, "pins": pins,
                "images": [{**vars(image)} for image in images], "lock_file": path}
