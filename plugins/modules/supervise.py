#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.supervise: the process runtime, driving lobes_supervisor."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: supervise
short_description: Keep a box's gateway and simulated gears running without Docker
version_added: 0.1.0
description:
  - The C(process) runtime of lobes.fleet. Runs the services listed in a C(services.json)
    (written by M(lobes.fleet.render)) as supervised processes on the managed host, through the
    stdlib supervisor C(lobes_supervisor) that the collection ships in its C(gateway/) source.
  - Each service gets one monitor process that restarts it when it exits (exponential backoff
    from 0.5 s up to 30 s), keeps pidfiles under O(state_dir)C(/run) holding the pid and the
    kernel start time, and appends the output to O(state_dir)C(/log/<name>.log).
  - Processes are also found by what they are (a monitor by its command line, a service's
    processes by the C(LOBES_STATE_DIR) and C(LOBES_SERVICE) marks of their environment), so a
    lost, emptied or corrupt pidfile never leaves a second copy of a service running, and
    V(stopped) stops every process of the deployment. A service not running as exactly one
    monitor is stopped whole and started once.
  - One run at a time holds O(state_dir) (a lock file in it); another waits for it, and fails
    naming the holder after 15 minutes.
  - A service with a health URL is healthy only when what answers there is the process it
    started; one that exits during its start fails the task at once, quoting its log.
  - A running service whose fingerprint (argv, cwd, env, the content of its C(env_file) and of
    every O(watch) path) changed is restarted; services the file no longer lists are stopped.
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
      - V(started) starts missing services and restarts changed ones.
      - V(restarted) restarts the selected services whatever their fingerprint.
      - V(stopped) stops the selected services (all services found in O(state_dir) when
        O(names) is empty); it needs no O(services_file).
    type: str
    choices: [started, restarted, stopped]
    default: started
  services_file:
    description:
      - Path of the C(services.json) on the managed host. Required unless O(state=stopped).
      - 'Shape: C({"services": [{"name", "argv", "env", "env_file", "cwd", "pidfile", "log",
        "watch"}]}); C(name) and C(argv) are required; relative paths (C(cwd), C(env_file),
        C(watch)) are relative to the file''s own directory; C(cwd) defaults to that directory;
        C(pidfile) and C(log) are bare file names (defaults C(<name>.pid), C(<name>.log)).'
      - The child's environment is PATH, HOME, LANG, LC_ALL and TZ from the supervisor, then the
        variables of C(env_file), then C(env). C(env_file) holds C(NAME=value) lines (optional
        C(export), C(#) comments, single or double quotes); a line that is not is refused.
    type: path
  state_dir:
    description: Directory for pidfiles (C(run/)) and logs (C(log/)).
    type: path
    required: true
  source_dir:
    description: Directory on the managed host holding the C(lobes_supervisor) package.
    type: path
    required: true
  watch:
    description: Files or directories whose content is part of every service's fingerprint
      (for example the deployed gateway source, so new code restarts the gateway).
    type: list
    elements: path
    default: []
notes:
  - Linux only (reads C(/proc/<pid>/stat) for process identity).
"""

EXAMPLES = r"""
- name: Run the box's gateway and gears as supervised processes
  lobes.fleet.supervise:
    services_file: /srv/lobes/services.json
    state_dir: /srv/lobes/state
    source_dir: /srv/lobes/gateway
    watch:
      - /srv/lobes/gateway

- name: Stop everything supervised on the box
  lobes.fleet.supervise:
    state: stopped
    state_dir: /srv/lobes/state
    source_dir: /srv/lobes/gateway
"""

RETURN = r"""
actions:
  description: What was (or, in check mode, would be) done to each service.
  returned: always
  type: list
  elements: dict
  sample:
    - {"name": "gateway", "action": "restarted"}
    - {"name": "gear-cortex", "action": "unchanged"}
running:
  description: Services running after the call, with monitor and child pids and restart counts.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "gateway", "running": true, "pid": 4242, "child_pid": 4243, "restarts": 0}]
"""

import json  # noqa: E402 - modules keep imports below their documentation
import os  # noqa: E402 - modules keep imports below their documentation
import sys  # noqa: E402 - modules keep imports below their documentation

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

_CHANGING = frozenset({"started", "restarted", "stopped"})


def _supervisor(module, *args):
    params = module.params
    argv = [sys.executable, "-m", "lobes_supervisor", "--state-dir", params["state_dir"]]
    if params["services_file"]:
        argv += ["--services", params["services_file"]]
    for path in params["watch"]:
        argv += ["--watch", path]
    for name in params["exclude"]:
        argv += ["--exclude", name]
    argv += list(args)
    env = {"PYTHONPATH": params["source_dir"]}
    rc, out, err = module.run_command(argv, environ_update=env)
    try:
        result = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        module.fail_json(msg=f"lobes_supervisor failed (rc={rc}): {err.strip() or out.strip()}")
    if result.get("failed"):
        module.fail_json(msg=result["msg"])
    return result


def _running(module):
    rows = _supervisor(module, "status")["status"]
    return [row for row in rows if row["running"]]


def _describe(rows):
    return "".join(f"{row['name']}: running ({row['fingerprint']})\n" for row in rows)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["started", "restarted", "stopped"], default="started"),
            services_file=dict(type="path"),
            state_dir=dict(type="path", required=True),
            source_dir=dict(type="path", required=True),
            names=dict(type="list", elements="str", default=[]),
            exclude=dict(type="list", elements="str", default=[]),
            watch=dict(type="list", elements="path", default=[]),
        ),
        required_if=[
            ("state", "started", ["services_file"]),
            ("state", "restarted", ["services_file"]),
        ],
        supports_check_mode=True,
    )
    run_dir = os.path.join(module.params["state_dir"], "run")
    if module.params["state"] == "stopped" and not os.path.isdir(run_dir):
        # Never deployed (or already cleaned away): nothing runs, nothing to stop.
        module.exit_json(changed=False, actions=[], running=[])
    deployed = os.path.isdir(os.path.join(module.params["source_dir"], "lobes_supervisor"))
    if module.check_mode and not deployed:
        # A --check run on a box not deployed yet: nothing runs, everything would start.
        module.exit_json(
            changed=True, actions=[], running=[], msg="not deployed yet: every service would start"
        )
    if not deployed:
        module.fail_json(
            msg=f"source_dir {module.params['source_dir']} holds no lobes_supervisor "
            "package: deploy the collection's gateway/ source there first"
        )
    before = _running(module)
    command = {"started": "up", "restarted": "restart", "stopped": "down"}[module.params["state"]]
    flags = ["--dry-run"] if module.check_mode else []
    actions = _supervisor(module, *flags, command, *module.params["names"])[command]
    changed = any(a["action"] in _CHANGING for a in actions)
    after = before if module.check_mode else _running(module)
    result = dict(changed=changed, actions=actions, running=after)
    if module._diff and changed:
        planned = "".join(f"{a['name']}: {a['action']}\n" for a in actions)
        result["diff"] = dict(
            before=_describe(before), after=planned if module.check_mode else _describe(after)
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
