"""Controller side of lobes.fleet.render: find the keys the plan needs in the inventory.

The plan names, by inventory hostname, the peers whose inbound key this box carries
(key_hosts); their keys live in those peers' own variables (vault), which only the
controller can read. The module then receives them as its no_log `secrets` option.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase


def _value(variables, name: str) -> str:
    return str(variables[name]) if variables.get(name) else ""


def secrets_for(plan: dict, task_vars: dict) -> dict:
    """This host's keys and copies of its dialled peers' inbound keys, from hostvars."""
    hostvars = task_vars["hostvars"]
    return {
        "gateway_api_key": _value(task_vars, "fleet_gateway_api_key"),
        "fleet_key": _value(task_vars, "fleet_mesh_key"),
        "peer_keys": {peer: _value(hostvars[peer], "fleet_gateway_api_key")
                      for peer in plan.get("key_hosts", []) if peer in hostvars},
        "client_keys": {str(name): _value(entry, "key")
                        for name, entry in (task_vars.get("fleet_client_keys") or {}).items()
                        if isinstance(entry, dict)},
    }


class ActionModule(ActionBase):
    """Add the secrets, then run the render module on the box."""

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = dict(self._task.args)
        if not args.get("secrets") and isinstance(args.get("plan"), dict):
            args["secrets"] = secrets_for(args["plan"], task_vars)
        result.update(self._execute_module(module_name="lobes.fleet.render", module_args=args,
                                           task_vars=task_vars))
        return result
