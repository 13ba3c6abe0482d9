#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.preflight: does this box match what the inventory declares?"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight
short_description: Check a box against its declared hardware profile and runtime
version_added: 0.1.0
description:
  - Gathers what a lobes.fleet deployment depends on (GPU arch, memory, container runtime,
    systemd, the Python that runs the gateway) and fails, naming the host and the field to
    fix, when the box cannot run what the inventory declares.
  - The hardware profiles come from the collection's fleet model
    (C(plugins/module_utils/hardware.py)); a profile without a GPU (C(sim)) skips the GPU and
    memory checks.
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.read_only
  - lobes.fleet.attributes.posix
options:
  hardware:
    description: The box's declared hardware profile (inventory C(fleet_hardware)).
    type: str
    required: true
  runtime:
    description: The box's runtime (inventory C(fleet_runtime)).
    type: str
    choices: [compose, process]
    required: true
  python:
    description: The interpreter that runs the gateway and the simulator on a C(process) box
      (inventory C(fleet_python)); it must be Python 3.10 or newer.
    type: str
    default: python3
"""

EXAMPLES = r"""
- name: Check the box before anything is deployed
  lobes.fleet.preflight:
    hardware: "{{ fleet_hardware }}"
    runtime: "{{ fleet_runtime | default('compose') }}"
"""

RETURN = r"""
ansible_facts:
  description: The facts gathered, under C(lobes_preflight).
  returned: always
  type: dict
  contains:
    lobes_preflight:
      description: GPU, memory, runtime and Python facts of the box.
      type: dict
      sample:
        gpu_arch: sm_121
        gpu_name: NVIDIA GB10
        memory_gib: 119.6
        docker_compose: "2.39.1"
        docker_engine: "28.3.2"
        systemd: true
        python: /usr/bin/python3
        python_version: "3.12.3"
"""

import os  # noqa: E402 - modules keep imports below their documentation
import re  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.hardware import (  # noqa: E402
    PROFILES,
)

# Jetson boards name themselves in the device tree; nvidia-smi there may be absent.
_JETSON_ARCH = (("AGX Thor", "sm_110"), ("AGX Orin", "sm_87"))
MIN_PYTHON = (3, 10)
# Unified memory reported by the kernel sits below the nominal size; allow for that.
MEMORY_TOLERANCE = 0.85


def _gpu(module):
    """(arch, name) of the first GPU, or (None, None) when the box has none we can see."""
    smi = module.get_bin_path("nvidia-smi")
    if smi:
        rc, out, _err = module.run_command(
            [smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"]
        )
        line = out.strip().splitlines()[0] if rc == 0 and out.strip() else ""
        match = re.match(r"(.+),\s*(\d+)\.(\d+)$", line)
        if match:
            return f"sm_{match.group(2)}{match.group(3)}", match.group(1).strip()
    try:
        with open("/proc/device-tree/model", encoding="utf-8", errors="replace") as handle:
            model = handle.read().strip("\x00\n ")
    except OSError:
        return None, None
    for marker, arch in _JETSON_ARCH:
        if marker in model:
            return arch, model
    return None, None


def _memory_gib():
    with open("/proc/meminfo", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    return 0.0


def _docker(module):
    """(compose plugin version, engine version); None for whichever is missing."""
    docker = module.get_bin_path("docker")
    if not docker:
        return None, None
    rc, out, _err = module.run_command([docker, "compose", "version", "--short"])
    compose = out.strip() if rc == 0 and out.strip() else None
    rc, out, _err = module.run_command([docker, "info", "--format", "{{.ServerVersion}}"])
    engine = out.strip() if rc == 0 and out.strip() else None
    return compose, engine


def _python(module, python):
    path = module.get_bin_path(python) if not os.path.isabs(python) else python
    if not path or not os.access(path, os.X_OK):
        return path, None
    rc, out, _err = module.run_command(
        [path, "-c", "import platform; print(platform.python_version())"]
    )
    return path, out.strip() if rc == 0 else None


def _problems(params, facts, profile):
    problems = []
    if profile.has_gpu:
        if facts["gpu_arch"] is None:
            problems.append(
                f"fleet_hardware {profile.name} expects a GPU ({profile.arch}); none "
                "found (no nvidia-smi answer, no Jetson device-tree model)"
            )
        elif facts["gpu_arch"] != profile.arch:
            problems.append(
                f"fleet_hardware {profile.name} expects {profile.arch}, the box has "
                f"{facts['gpu_arch']} ({facts['gpu_name']}): fix the host's group"
            )
        if facts["memory_gib"] < profile.memory_gib * MEMORY_TOLERANCE:
            problems.append(
                f"fleet_hardware {profile.name} expects about {profile.memory_gib} GiB,"
                f" the box has {facts['memory_gib']} GiB"
            )
    if params["runtime"] == "compose" and not (facts["docker_compose"] and facts["docker_engine"]):
        problems.append(
            "fleet_runtime compose needs a running Docker Engine and its compose plugin "
            f"(compose: {facts['docker_compose'] or 'missing'}, engine: "
            f"{facts['docker_engine'] or 'unreachable'}); install them or set "
            "fleet_runtime: process"
        )
    version = facts["python_version"]
    if version is None:
        problems.append(f"fleet_python {params['python']!r} does not run on the box")
    elif tuple(int(p) for p in version.split(".")[:2]) < MIN_PYTHON:
        problems.append(
            f"fleet_python {facts['python']} is Python {version}; the gateway needs "
            f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer"
        )
    return problems


def main():
    module = AnsibleModule(
        argument_spec=dict(
            hardware=dict(type="str", required=True),
            runtime=dict(type="str", required=True, choices=["compose", "process"]),
            python=dict(type="str", default="python3"),
        ),
        supports_check_mode=True,
    )
    profile = PROFILES.get(module.params["hardware"])
    if profile is None:
        module.fail_json(
            msg=f"fleet_hardware {module.params['hardware']!r} is not a hardware "
            "profile; one of " + ", ".join(sorted(PROFILES))
        )
    arch, name = _gpu(module)
    compose, engine = _docker(module)
    python, version = _python(module, module.params["python"])
    facts = dict(
        gpu_arch=arch,
        gpu_name=name,
        memory_gib=_memory_gib(),
        docker_compose=compose,
        docker_engine=engine,
        systemd=os.path.isdir("/run/systemd/system"),
        python=python,
        python_version=version,
    )
    problems = _problems(module.params, facts, profile)
    if problems:
        module.fail_json(msg="preflight failed: " + "; ".join(problems), lobes_preflight=facts)
    module.exit_json(changed=False, ansible_facts=dict(lobes_preflight=facts))


if __name__ == "__main__":
    main()
