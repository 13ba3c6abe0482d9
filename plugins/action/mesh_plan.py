"""Controller side of lobes.fleet.mesh_plan: read every fleet host's variables, plan the mesh.

An action rather than a module so the hosts' vault keys never travel as module arguments:
the plan only records whether a host has a key, never its value.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible_collections.lobes.fleet.plugins.module_utils.errors import FleetErrors
from ansible_collections.lobes.fleet.plugins.module_utils.plan import plan_mesh

SECRET_VARS = ("fleet_gateway_api_key", "fleet_mesh_key")
# Variables holding secrets inside: fleet_client_keys' entries carry a `key` each.
CLIENT_KEYS_VAR = "fleet_client_keys"
READ_VARS = ("ansible_host",)


def _without_keys(client_keys):
    """fleet_client_keys with each entry's key reduced to whether it is set."""
    if not isinstance(client_keys, dict):
        return client_keys
    return {name: ({**entry, "key": bool(entry.get("key"))} if isinstance(entry, dict) else entry)
            for name, entry in client_keys.items()}


def fleet_vars(hostvars) -> dict:
    """The variables the fleet model reads from one host, secrets reduced to their presence."""
    picked = {}
    for name in hostvars:
        if name in SECRET_VARS:
            picked[name] = bool(hostvars[name])
        elif name == CLIENT_KEYS_VAR:
            picked[name] = _without_keys(hostvars[name])
        elif name.startswith("fleet_") or name in READ_VARS:
            picked[name] = hostvars[name]
    return picked


def fleet_hosts(task_vars: dict) -> list:
    """Every inventory host that declares fleet_hardware, whatever --limit or serial say:
    a box's peers belong to the mesh even when this run does not touch them."""
    hostvars = task_vars["hostvars"]
    return [host for host in task_vars["groups"]["all"]
            if "fleet_hardware" in hostvars[host]]


class ActionModule(ActionBase):
    """Plan the mesh on the controller; changes nothing anywhere."""

    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self.validate_argument_spec(
            argument_spec={"hosts": {"type": "list", "elements": "str"}},
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
        return {**result, "changed": False, "plan": plan}
