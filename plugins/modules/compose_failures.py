#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.compose_failures: which containers are not up, and why."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: compose_failures
short_description: Which containers of a box's compose project are not up, and how their logs end
version_added: 0.1.0
description:
  - Lists the services of the compose project in O(project_dir) whose container is not up
    (exited, restarting after a crash, unhealthy, or still starting) and the ones never started
    (created only, waiting on one that is not up).
  - For each service not up, the last lines of its log C(state/log/<service>.log) (every
    container of the project appends its output there), with every secret value of the
    project's C(.env) (the variables the contract calls secret) masked.
  - Read-only. The services role calls it when C(docker compose up --wait) fails, and fails
    with its RV(summary), so the play says why a gear or the gateway did not come up.
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.read_only
  - lobes.fleet.attributes.posix
options:
  project_dir:
    description: The deploy directory holding C(compose.yaml), C(.env) and C(state/log).
    type: path
    required: true
  lines:
    description: How many of the last lines of each log to quote.
    type: int
    default: 15
"""

EXAMPLES = r"""
- name: Start the containers and wait until they are healthy
  block:
    - name: Run the compose project
      community.docker.docker_compose_v2:
        project_src: /srv/lobes
        wait: true
  rescue:
    - name: Read why the containers are not up
      lobes.fleet.compose_failures:
        project_dir: /srv/lobes
      register: failures

    - name: Stop, saying why
      ansible.builtin.fail:
        msg: "{{ ansible_failed_result.msg }}. {{ failures.summary }}"
"""

RETURN = r"""
failures:
  description: The services whose container is not up, each with its log's end.
  returned: always
  type: list
  elements: dict
  sample:
    - service: vllm-senses
      state: restarting
      status: Restarting (2) 1 second ago
      health: starting
      log: /srv/lobes/state/log/vllm-senses.log
      tail: "python3 -m lobes_sim: error: argument --profile: invalid choice: 'no-such-profile'"
not_started:
  description: Services created but never started (they wait on a service that is not up).
  returned: always
  type: list
  elements: str
  sample: [vllm-embedder, vllm-reranker]
summary:
  description: The failures and the services not started, as one message.
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
    env_file_secrets,
    log_quote,
    masked_tail,
    ps_rows,
)

# Container states of a service that is not up; "created" is one never started.
_DOWN_STATES = frozenset({"exited", "restarting", "dead", "paused", "removing"})
_NOT_HEALTHY = frozenset({"unhealthy", "starting"})
# Compose 2.26 leaves Health empty for a container that has just (re)started, while its Status
# says "(health: starting)": a crash loop caught right after a restart reads so.
_HEALTH_IN_STATUS = (("(health: starting)", "starting"), ("(unhealthy)", "unhealthy"))


def health(row):
    """The row's health, from its Status when its Health field is empty."""
    if row.get("Health"):
        return row["Health"]
    status = row.get("Status", "")
    return next((said for mark, said in _HEALTH_IN_STATUS if status.endswith(mark)), "")


def not_up(rows):
    """(the rows of services not up, the services never started), each sorted by service."""
    down = [row for row in rows
            if row.get("State") in _DOWN_STATES or health(row) in _NOT_HEALTHY]
    created = [row["Service"] for row in rows if row.get("State") == "created"]
    return sorted(down, key=lambda row: row["Service"]), sorted(created)


def describe(failure):
    """One service not up: its state, health and how its log ends."""
    health = f", health {failure['health']}" if failure["health"] else ""
    said = f"{failure['service']}: {failure['state']} ({failure['status']}){health}; "
    return said + log_quote(failure["log"], failure["tail"])


def summarise(failures, not_started):
    parts = [describe(failure) for failure in failures]
    if not_started:
        parts.append(f"not started (waiting on the above): {', '.join(not_started)}")
    return "\n".join(parts) if parts else "every container of the project is up"


def main():
    module = AnsibleModule(
        argument_spec={"project_dir": {"type": "path", "required": True},
                       "lines": {"type": "int", "default": LOG_TAIL_LINES}},
        supports_check_mode=True,
    )
    project = module.params["project_dir"]
    docker = module.get_bin_path("docker", required=True)
    rc, out, err = module.run_command(
        [docker, "compose", "--project-directory", project, "ps", "--all", "--format", "json"])
    if rc != 0:  # a report, not a second failure: the caller fails with what it has
        module.exit_json(changed=False, failures=[], not_started=[],
                         summary=f"the project's containers could not be listed: {err.strip()}")
    rows, not_started = not_up(ps_rows(out))
    secrets = env_file_secrets(os.path.join(project, ".env"), is_secret_env)
    failures = []
    for row in rows:
        log = os.path.join(project, "state", "log", f"{row['Service']}.log")
        failures.append({"service": row["Service"], "state": row.get("State", ""),
                         "status": row.get("Status", ""), "health": health(row),
                         "log": log, "tail": masked_tail(log, secrets, module.params["lines"])})
    module.exit_json(changed=False, failures=failures, not_started=not_started,
                     summary=summarise(failures, not_started))


if __name__ == "__main__":
    main()
