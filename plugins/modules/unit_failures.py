#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.unit_failures: which systemd units are not active, and why."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: unit_failures
short_description: Which systemd units of a box's services are not active, and how their logs end
version_added: 0.1.0
description:
  - For each selected service of the C(services.json) written by M(lobes.fleet.render), asks
    systemd (C(systemctl show)) for the state of its unit C(<prefix>-<name>.service), as
    M(lobes.fleet.systemd_units) names it, and lists the units not active (failed, still
    activating or restarting after a crash, inactive, not loaded) with the result, exit status
    and restart count systemd records.
  - For each unit not active, the last lines of its service's log O(state_dir)C(/log/<log>)
    (the unit appends its output there), with every secret value of the service's environment
    (its C(env) and C(env_file); the variables the contract calls secret) masked.
  - Read-only. The services role calls it when starting the units fails, and fails with its
    RV(summary), so the play says why a gear or the gateway did not come up.
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.read_only
  - lobes.fleet.attributes.posix
  - lobes.fleet.services
options:
  services_file:
    description: Path of the C(services.json) on the managed host.
    type: path
    required: true
  state_dir:
    description: The state directory whose C(log/) holds the services' logs.
    type: path
    required: true
  prefix:
    description: The units' name prefix, as given to M(lobes.fleet.systemd_units).
    type: str
    required: true
  lines:
    description: How many of the last lines of each log to quote.
    type: int
    default: 15
"""

EXAMPLES = r"""
- name: Start the units
  block:
    - name: Run the units
      ansible.builtin.systemd_service:
        name: lobes-spark1-gateway.service
        state: started
  rescue:
    - name: Read why the units are not active
      lobes.fleet.unit_failures:
        services_file: /srv/lobes/services.json
        state_dir: /srv/lobes/state
        prefix: lobes-spark1
      register: failures

    - name: Stop, saying why
      ansible.builtin.fail:
        msg: "{{ ansible_failed_result.msg }}. {{ failures.summary }}"
"""

RETURN = r"""
failures:
  description: The units not active, each with its service's log's end.
  returned: always
  type: list
  elements: dict
  sample:
    - unit: lobes-spark1-gateway.service
      service: gateway
      load_state: loaded
      state: failed
      sub_state: failed
      result: exit-code
      exit_status: "2"
      restarts: "5"
      log: /srv/lobes/state/log/gateway.log
      tail: "lobes_gateway: PRIMARY_MAX_ACTIVE must be an integer >= 1, got 'two'"
summary:
  description: The failures as one message.
  returned: always
  type: str
"""

import os  # noqa: E402 - modules keep imports below their documentation

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.contract import (  # noqa: E402
    is_secret_env,
)
from ansible_collections.lobes.fleet.plugins.module_utils.service_files import (  # noqa: E402
    LOG_TAIL_LINES,
    ServicesError,
    load_services,
    log_quote,
    masked_tail,
    select,
    service_secrets,
)
from ansible_collections.lobes.fleet.plugins.module_utils.systemd import (  # noqa: E402
    unit_name,
)

# What systemd is asked of each unit (systemctl show prints them as Key=Value lines).
PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "ExecMainStatus", "NRestarts")
# A unit serving or reloading is up; every other state is a failure to report.
_UP_STATES = frozenset({"active", "reloading"})


def shown_units(text):
    """`systemctl show` of several units: one dict of properties per unit, in the order the
    units were named (systemd separates them with a blank line)."""
    units = []
    for block in text.strip().split("\n\n"):
        properties = {}
        for line in block.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                properties[key] = value
        units.append(properties)
    return units


def not_active(units, shown):
    """(unit, its properties) for each unit that is not active; `shown` holds the units'
    properties in their order (a unit may be any value naming it)."""
    return [(unit, properties) for unit, properties in zip(units, shown, strict=True)
            if properties.get("ActiveState") not in _UP_STATES]


def describe(failure):
    """One unit not active: its state, how its main process ended and how its log ends."""
    state = failure["state"] if failure["state"] == failure["sub_state"] else (
        f"{failure['state']} ({failure['sub_state']})")
    said = f"{failure['unit']} ({failure['service']}): {state}"
    facts = []
    if failure["load_state"] not in ("", "loaded"):
        facts.append(f"unit {failure['load_state']}")
    if failure["result"] not in ("", "success"):
        facts.append(f"result {failure['result']}")
    if failure["exit_status"] not in ("", "0"):
        facts.append(f"exit status {failure['exit_status']}")
    if failure["restarts"] not in ("", "0"):
        facts.append(f"restarted {failure['restarts']} times")
    said += f", {', '.join(facts)}" if facts else ""
    return f"{said}; {log_quote(failure['log'], failure['tail'])}"


def summarise(failures):
    if not failures:
        return "every unit is active"
    return "\n".join(describe(failure) for failure in failures)


def main():
    module = AnsibleModule(
        argument_spec={"services_file": {"type": "path", "required": True},
                       "state_dir": {"type": "path", "required": True},
                       "prefix": {"type": "str", "required": True},
                       "names": {"type": "list", "elements": "str", "default": []},
                       "exclude": {"type": "list", "elements": "str", "default": []},
                       "lines": {"type": "int", "default": LOG_TAIL_LINES}},
        supports_check_mode=True,
    )
    params = module.params
    try:
        services = select(load_services(params["services_file"]).services, params["names"],
                          params["exclude"])
    except (OSError, ServicesError) as exc:  # a report, not a second failure
        module.exit_json(changed=False, failures=[],
                         summary=f"{params['services_file']} could not be read: {exc}")
    units = [unit_name(params["prefix"], service.name) for service in services]
    systemctl = module.get_bin_path("systemctl", required=True)
    rc, out, err = module.run_command(
        [systemctl, "show", "--property=" + ",".join(PROPERTIES), "--", *units])
    shown = shown_units(out) if rc == 0 else []
    if len(shown) != len(units):
        module.exit_json(changed=False, failures=[],
                         summary=f"the units' state could not be read: {err.strip() or out}")
    failures = []
    for (unit, service), properties in not_active(list(zip(units, services, strict=True)),
                                                  shown):
        log = os.path.join(params["state_dir"], "log", service.log_name)
        failures.append({
            "unit": unit, "service": service.name,
            "load_state": properties.get("LoadState", ""),
            "state": properties.get("ActiveState", ""),
            "sub_state": properties.get("SubState", ""),
            "result": properties.get("Result", ""),
            "exit_status": properties.get("ExecMainStatus", ""),
            "restarts": properties.get("NRestarts", ""),
            "log": log,
            "tail": masked_tail(log, service_secrets(service, is_secret_env), params["lines"]),
        })
    module.exit_json(changed=False, failures=failures, summary=summarise(failures))


if __name__ == "__main__":
    main()
