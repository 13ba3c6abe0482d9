#!/usr/bin/python
"""lobes.fleet.render: write one box's gateway .env and compose.yaml or services.json."""

from __future__ import annotations

DOCUMENTATION = r"""
module: render
short_description: Render a box's gateway environment and gear definitions from its plan
version_added: 0.1.0
description:
  - Writes, into O(dest), the files one box runs from, all derived from its plan
    (the box's entry of M(lobes.fleet.mesh_plan)'s RV(lobes.fleet.mesh_plan#module:plan)).
  - C(.env) (mode 0600), the gateway's whole configuration in the environment contract of
    DESIGN.md section 3; secret values never appear in the output or the diff.
  - For O(plan) runtime C(compose), C(compose.yaml) (mode 0644) with one vLLM service per
    gear served here (C(--served-model-name), C(--max-model-len),
    C(--gpu-memory-utilization), C(--max-num-seqs), C(--quantization),
    C(--tool-call-parser), MTP C(--speculative-config), YaRN rope scaling via
    C(--hf-overrides)), backends unpublished on the project network, and the gateway run
    from the collection's own C(gateway/) source (mounted from O(dest)/gateway), the only
    published port. When that source is present, a label carries its digest, so compose
    recreates the gateway whenever the deployed source it runs changes (C(lobes_gateway),
    C(lobes_contract.py)), and simulated gears whenever theirs does (C(lobes_sim),
    C(lobes_contract.py)); a change elsewhere in the source leaves them running.
  - For runtime C(process), C(services.json) (mode 0644) for the process supervisor, and the
    .env points the gateway at gears on 127.0.0.1. Its shape is an object with C(version),
    C(host) and a C(services) list, each service with C(name), C(argv),
    C(cwd), C(env), C(pidfile), C(log), C(watch) (paths relative to O(dest)), gears first
    (C(gear-<role>), one C(lobes_sim) each, C(gear-audio) for stt/tts), the C(gateway) last
    with C(env_file=.env).
  - Idempotent; reports a per-file diff.
  - Used through its action plugin, which fills O(secrets) from the host's and its peers'
    variables when the task does not give them.
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.files
options:
  plan:
    description:
      - This box's plan, C(plan.boxes[inventory_hostname]) of M(lobes.fleet.mesh_plan).
    type: dict
    required: true
  dest:
    description:
      - The deployment directory; created (mode 0750) when missing.
    type: path
    required: true
  secrets:
    description:
      - The keys the plan needs. Filled by the action from the variables
        C(fleet_gateway_api_key), C(fleet_mesh_key) and the C(key) of each C(fleet_client_keys)
        entry of this host and C(fleet_gateway_api_key) of each peer in the plan's
        C(key_hosts) when omitted.
    type: dict
    suboptions:
      gateway_api_key:
        description: This box's inbound key (C(GATEWAY_API_KEY)).
        type: str
      fleet_key:
        description: The mesh-wide key between boxes (C(GATEWAY_FLEET_KEY)).
        type: str
      peer_keys:
        description: Inbound key of each peer this box dials, by inventory hostname.
        type: dict
      client_keys:
        description:
          - Each named client key of the plan's C(gateway.client_keys), by name
            (rendered into C(GATEWAY_CLIENT_KEYS)).
        type: dict
  gateway_dir:
    description:
      - Where the gateway source lies, relative to O(dest) (the process runtime's
        C(PYTHONPATH)).
    type: str
    default: gateway
"""

EXAMPLES = r"""
- name: Render this box's files from the mesh plan
  lobes.fleet.render:
    plan: "{{ mesh.plan.boxes[inventory_hostname] }}"
    dest: /opt/lobes/fleet

- name: Render with explicit keys (no action-side lookup)
  lobes.fleet.render:
    plan: "{{ mesh.plan.boxes[inventory_hostname] }}"
    dest: /opt/lobes/fleet
    secrets:
      gateway_api_key: "{{ fleet_gateway_api_key }}"
      peer_keys:
        spark: "{{ hostvars['spark'].fleet_gateway_api_key }}"
"""

RETURN = r"""
files:
  description: Each rendered file, its path and whether it changed.
  returned: success
  type: list
  elements: dict
  sample:
    - {path: /opt/lobes/fleet/.env, changed: true}
    - {path: /opt/lobes/fleet/compose.yaml, changed: false}
env_names:
  description: The variable names written to .env, in order (values are not returned).
  returned: success
  type: list
  elements: str
  sample: [GATEWAY_HOST, GATEWAY_PORT, PRIMARY_FEASIBLE, PRIMARY_BASE_URL]
services:
  description: The compose services or supervised processes rendered, in order.
  returned: success
  type: list
  elements: str
  sample: [vllm-cortex, vllm-embedder, gateway]
"""

# Ansible wants the documentation strings before any import (validate-modules).
import json  # noqa: E402
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils import render  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.contract import (  # noqa: E402
    is_secret_env,
)
from ansible_collections.lobes.fleet.plugins.module_utils.files import (  # noqa: E402
    read_with_mode,
    replace_atomically,
)

ENV_MODE = 0o600
FILE_MODE = 0o644


def rendered_files(plan: dict, secrets: dict, gateway_dir: str, dest: str) -> tuple:
    """(files, env, service names): files as (name, text, masked text, mode)."""
    env = render.render_env(plan, secrets)
    files = [(".env", render.format_env(env), render.format_env(env, mask_secrets=True),
              ENV_MODE)]
    if plan["runtime"] == "compose":
        sources = render.source_digests(os.path.join(dest, gateway_dir))
        compose = render.render_compose(plan, sources)
        text = render.to_yaml(compose)
        files.append(("compose.yaml", text, text, FILE_MODE))
        names = list(compose["services"])
    else:
        services = render.render_services(plan, gateway_dir)
        text = json.dumps(services, indent=2) + "\n"
        files.append(("services.json", text, text, FILE_MODE))
        names = [service["name"] for service in services["services"]]
    return files, env, names


def _masked_before(name: str, before: str | None) -> str:
    if before is None or name != ".env":
        return before or ""
    return "\n".join(_mask_line(line) for line in before.splitlines()) + "\n"


def _mask_line(line: str) -> str:
    name, sep, value = line.partition("=")
    if sep and is_secret_env(name):
        return f"{name}=********" if value.strip('",') else line
    return line


def run(module: AnsibleModule) -> dict:
    params = module.params
    dest = params["dest"]
    try:
        files, env, names = rendered_files(params["plan"], params["secrets"] or {},
                                           params["gateway_dir"], dest)
    except (render.RenderError, KeyError, TypeError) as error:
        module.fail_json(msg=f"cannot render the plan: {error}")
    for value in render.secret_values(env):
        module.no_log_values.add(value)
    results, diffs = [], []
    if not os.path.isdir(dest) and not module.check_mode:
        os.makedirs(dest, mode=0o750)
    for name, text, masked, mode in files:
        path = os.path.join(dest, name)
        before, before_mode = read_with_mode(path)
        changed = before != text or before_mode != mode
        if changed:
            diffs.append({"before_header": path, "after_header": path,
                          "before": _masked_before(name, before), "after": masked})
            if not module.check_mode:
                replace_atomically(path, text, mode)
        results.append({"path": path, "changed": changed})
    return {"changed": any(item["changed"] for item in results), "files": results,
            "env_names": [pair[0] for pair in env], "services": names,
            "diff": diffs}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "plan": {"type": "dict", "required": True},
            "dest": {"type": "path", "required": True},
            "secrets": {"type": "dict", "no_log": True, "options": {
                "gateway_api_key": {"type": "str", "no_log": True},
                "fleet_key": {"type": "str", "no_log": True},
                "peer_keys": {"type": "dict", "no_log": True},
                "client_keys": {"type": "dict", "no_log": True},
            }},
            "gateway_dir": {"type": "str", "default": "gateway"},
        },
        supports_check_mode=True,
    )
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
