#!/usr/bin/python
"""lobes.fleet.prometheus_config: the monitoring box's prometheus.yml, rules and services.json."""

from __future__ import annotations

DOCUMENTATION = r"""
module: prometheus_config
short_description: Render and check the monitoring box's Prometheus configuration from the plan
version_added: 0.1.0
description:
  - Writes, into O(dest), what the monitoring box's Prometheus runs from, derived from the whole
    mesh plan (RV(lobes.fleet.mesh_plan#module:plan)).
  - C(prometheus.yml) scrapes every box's gateway C(/metrics) at its origin (job
    C(lobes-gateway), label C(box)) and, when O(host) is a box of the mesh in the process
    runtime, its own gears on 127.0.0.1 (job C(lobes-gear), labels C(box) and C(role)). Gears
    of other boxes are not reachable from it (bound to their own loopback, or unpublished
    under compose). The gateway's C(/metrics) is keyless, so no key is written.
  - C(rules/<name>) for each entry of O(rules), listed in C(rule_files).
  - C(services.json) with one service, C(prometheus), for M(lobes.fleet.supervise) or the
    systemd units of the collection; it restarts when C(prometheus.yml) or a rule file changes.
  - When anything differs, the new set is first written to a temporary directory and checked
    with C(promtool check config) and C(promtool check rules); a set that fails is not written.
  - Idempotent; reports a per-file diff.
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.files
options:
  plan:
    description: The mesh plan, RV(lobes.fleet.mesh_plan#module:plan) (every box, not one).
    type: dict
    required: true
  host:
    description: The monitoring box's inventory hostname.
    type: str
    required: true
  dest:
    description: The monitoring directory; created (mode 0750) when missing.
    type: path
    required: true
  rules:
    description: Alerting rule files, by file name, their YAML text as the value.
    type: dict
    default: {}
  listen_address:
    description: Prometheus C(--web.listen-address), C(host:port).
    type: str
    default: 127.0.0.1:9090
  retention:
    description: Prometheus C(--storage.tsdb.retention.time) (data under O(dest)C(/data)).
    type: str
    default: 15d
  scrape_interval:
    description: C(global.scrape_interval).
    type: str
    default: 15s
  evaluation_interval:
    description: C(global.evaluation_interval), how often the alerting rules are evaluated.
    type: str
    default: 15s
  prometheus:
    description: The Prometheus binary on the box.
    type: path
    default: /usr/bin/prometheus
  promtool:
    description:
      - The promtool binary on the box. In check mode on a box where it is not installed yet,
        the validation is skipped (RV(validated) false).
    type: path
    default: /usr/bin/promtool
"""

EXAMPLES = r"""
- name: Render the monitoring box's Prometheus configuration
  lobes.fleet.prometheus_config:
    plan: "{{ mesh.plan }}"
    host: "{{ inventory_hostname }}"
    dest: /srv/lobes/monitoring
    rules:
      lobes-fleet.rules.yml: "{{ lookup('ansible.builtin.file', 'lobes-fleet.rules.yml') }}"
    listen_address: 0.0.0.0:9090
    retention: 30d
"""

RETURN = r"""
files:
  description: Each rendered file, its path and whether it changed.
  returned: success
  type: list
  elements: dict
  sample:
    - {path: /srv/lobes/monitoring/prometheus.yml, changed: true}
    - {path: /srv/lobes/monitoring/services.json, changed: false}
targets:
  description: Every scrape target, with its job, address and labels.
  returned: success
  type: list
  elements: dict
  sample:
    - {job: lobes-gateway, address: "127.0.0.1:8000", labels: {box: spark}}
    - {job: lobes-gear, address: "127.0.0.1:18100", labels: {box: spark, role: cortex}}
local_url:
  description: Where a client on the monitoring box reaches this Prometheus.
  returned: success
  type: str
  sample: http://127.0.0.1:9090
validated:
  description:
    - Whether promtool checked a changed set; false when nothing changed, or in check mode
      without promtool.
  returned: success
  type: bool
"""

# Ansible wants the documentation strings before any import (validate-modules).
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils import monitoring  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.files import (  # noqa: E402
    read_with_mode,
    replace_atomically,
)
from ansible_collections.lobes.fleet.plugins.module_utils.render import to_yaml  # noqa: E402

FILE_MODE = 0o644
DIR_MODE = 0o750
RULES_DIR = "rules"


def rendered_files(params: dict) -> list:
    """(relative path, text) of every file, prometheus.yml first."""
    rule_files = [f"{RULES_DIR}/{name}" for name in sorted(params["rules"])]
    settings = {key: params[key] for key in ("scrape_interval", "evaluation_interval",
                                             "listen_address", "retention")}
    settings["rule_files"] = rule_files
    config = monitoring.prometheus_config(params["plan"], settings)
    services = monitoring.services_file(params["host"], params["prometheus"], settings)
    files = [("prometheus.yml", to_yaml(config))]
    files += [(path, _text(params["rules"][path.split("/", 1)[1]])) for path in rule_files]
    files.append(("services.json", json.dumps(services, indent=2) + "\n"))
    return files


def _text(value: str) -> str:
    return value if value.endswith("\n") else value + "\n"


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), mode=DIR_MODE, exist_ok=True)
    replace_atomically(path, text, FILE_MODE)


def validate(module: AnsibleModule, files: list) -> bool:
    """promtool check config and check rules on the whole set, in a scratch directory."""
    promtool = module.params["promtool"]
    if not os.access(promtool, os.X_OK):
        if module.check_mode:
            module.warn(f"{promtool} is not installed yet: the configuration was not validated")
            return False
        module.fail_json(msg=f"{promtool} is not installed: install the prometheus package")
    scratch = tempfile.mkdtemp(prefix="lobes-prometheus-")
    try:
        for name, text in files:
            _write(os.path.join(scratch, name), text)
        rules = [name for name, _content in files if name.startswith(RULES_DIR + "/")]
        for argv in ([promtool, "check", "config", "prometheus.yml"],
                     *([[promtool, "check", "rules", *rules]] if rules else [])):
            rc, out, err = module.run_command(argv, cwd=scratch)
            if rc != 0:
                module.fail_json(msg=f"{' '.join(argv[1:3])} refused the rendered configuration; "
                                 f"nothing was written: {(out + err).strip()}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return True


def run(module: AnsibleModule) -> dict:
    params = module.params
    dest = params["dest"]
    try:
        files = rendered_files(params)
        targets = monitoring.scrape_targets(params["plan"])
        local_url = "http://" + monitoring.local_address(params["listen_address"])
    except (monitoring.MonitoringError, KeyError, TypeError) as error:
        module.fail_json(msg=f"cannot render the monitoring configuration: {error}")
    results, diffs, pending = [], [], []
    for name, text in files:
        path = os.path.join(dest, name)
        before, mode = read_with_mode(path)
        changed = before != text or mode != FILE_MODE
        if changed:
            diffs.append({"before_header": path, "after_header": path,
                          "before": before or "", "after": text})
            pending.append((path, text))
        results.append({"path": path, "changed": changed})
    validated = validate(module, files) if pending else False
    if not module.check_mode:
        os.makedirs(dest, mode=DIR_MODE, exist_ok=True)
        for path, text in pending:
            _write(path, text)
    return {"changed": bool(pending), "files": results, "targets": targets,
            "local_url": local_url, "validated": validated, "diff": diffs}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "plan": {"type": "dict", "required": True},
            "host": {"type": "str", "required": True},
            "dest": {"type": "path", "required": True},
            "rules": {"type": "dict", "default": {}},
            "listen_address": {"type": "str", "default": "127.0.0.1:9090"},
            "retention": {"type": "str", "default": "15d"},
            "scrape_interval": {"type": "str", "default": "15s"},
            "evaluation_interval": {"type": "str", "default": "15s"},
            "prometheus": {"type": "path", "default": "/usr/bin/prometheus"},
            "promtool": {"type": "path", "default": "/usr/bin/promtool"},
        },
        supports_check_mode=True,
    )
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
