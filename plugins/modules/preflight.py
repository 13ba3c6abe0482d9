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
  - Every port of O(ports) must be free or held by this deployment (a process started from
    one of O(deploy_dirs), or, under compose, a container of a project there); a port held by
    another program fails the check, naming the port, the service that needs it and the holder
    where the box can see it. On a C(process) box, an address to bind that the box does not
    have fails the check too.
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
  ports:
    description:
      - The ports the box's services listen on, from its plan (RV(lobes.fleet.mesh_plan#module:plan)
        C(boxes[host].ports)).
    type: list
    elements: dict
    default: []
    suboptions:
      port:
        description: The TCP port.
        type: int
        required: true
      address:
        description: The address the service binds (C(0.0.0.0) for every address).
        type: str
        default: 0.0.0.0
      service:
        description: The service that listens there (C(gateway), C(gear-<role>), C(prometheus)).
        type: str
        required: true
      field:
        description: The inventory variable that sets the port, for the message.
        type: str
        default: ""
  deploy_dirs:
    description:
      - The box's deployment directories (inventory C(fleet_deploy_dir), and on the monitoring
        box C(fleet_monitoring_dir)); processes started from one of them, and under compose the
        containers of a project there, are this deployment's.
    type: list
    elements: path
    default: [/srv/lobes]
"""

EXAMPLES = r"""
- name: Check the box before anything is deployed
  lobes.fleet.preflight:
    hardware: "{{ fleet_hardware }}"
    runtime: "{{ fleet_runtime | default('compose') }}"

- name: Check the box and that its ports are free or this deployment's
  lobes.fleet.preflight:
    hardware: "{{ mesh.plan.boxes[inventory_hostname].hardware.name }}"
    runtime: "{{ mesh.plan.boxes[inventory_hostname].runtime }}"
    ports: "{{ mesh.plan.boxes[inventory_hostname].ports }}"
    deploy_dirs: [/srv/lobes]
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
        ports_held: {}
        docker_compose: "2.39.1"
        docker_engine: "28.3.2"
        systemd: true
        python: /usr/bin/python3
        python_version: "3.12.3"
"""

import errno  # noqa: E402 - modules keep imports below their documentation
import os  # noqa: E402
import re  # noqa: E402
import socket  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils import processes  # noqa: E402
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


def _inside(path, directories):
    """Whether `path` is one of `directories` or lies under one."""
    real = os.path.realpath(path)
    return any(real == top or real.startswith(top.rstrip("/") + "/") for top in directories)


def _ours(pid, deploy_dirs):
    """Whether a process is this deployment's: started by its supervisor (its marks name a
    state directory of the deployment) or from a deployment directory (a systemd unit's)."""
    state = processes.environ(pid).get(processes.STATE_DIR_MARK)
    cwd = processes.cwd(pid)
    return any(path is not None and _inside(path, deploy_dirs) for path in (state, cwd))


def _publishers(module, port):
    """(container name, compose project directory) of the containers publishing `port` on
    the Docker engine the box drives; [] without one."""
    docker = module.get_bin_path("docker")
    if not docker:
        return []
    rc, out, _err = module.run_command(
        [docker, "ps", "--format",
         '{{.Names}}\t{{.Ports}}\t{{.Label "com.docker.compose.project.working_dir"}}'])
    found = []
    for line in out.splitlines() if rc == 0 else []:
        name, _tab, rest = line.partition("\t")
        ports, _tab, workdir = rest.partition("\t")
        if re.search(rf":{port}->", ports):
            found.append((name, workdir))
    return found


def _answers(address, port):
    """Whether something accepts a connection on address:port (a wildcard: the loopback)."""
    target = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(address, address)
    try:
        with socket.create_connection((target, port), timeout=2):
            return True
    except OSError:
        return False


def _holder(module, entry, deploy_dirs, runtime):
    """Who holds the entry's port when it is not this deployment, else None."""
    port, address = entry["port"], entry["address"]
    listeners, pids = processes.port_holders(port, address)
    if not listeners and not _answers(address, port):
        return None
    strangers = sorted(pid for pid in pids if not _ours(pid, deploy_dirs))
    if listeners and pids and not strangers:
        return None
    if runtime == "compose" or not listeners:
        containers = _publishers(module, port)
        if containers and all(workdir and _inside(workdir, deploy_dirs)
                              for _name, workdir in containers):
            return None
        if containers:
            return "container " + ", ".join(name for name, _workdir in containers)
    if strangers:
        return ", ".join(processes.describe(pid) for pid in strangers)
    if listeners:
        return "a process of another user (run as root to name it)"
    return f"a program outside this box's view (something answers on {address}:{port})"


def _address_here(address):
    """Whether a socket can bind `address` on this box (a wildcard always can)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError as error:
            return error.errno != errno.EADDRNOTAVAIL
    return True


def _port_problems(module, facts):
    """A problem per port of the plan that another program holds, or whose address the box
    does not have (under compose the published address is the engine's: not checked)."""
    params = module.params
    deploy_dirs = [os.path.realpath(path) for path in params["deploy_dirs"]]
    problems, holders = [], {}
    for entry in params["ports"]:
        if params["runtime"] == "process" and not _address_here(entry["address"]):
            field = "fleet_gateway_host" if entry["service"] == "gateway" else entry["field"]
            problems.append(f"{entry['service']} binds {entry['address']} ({field}), which is "
                            "not an address of this box")
            continue
        holder = _holder(module, entry, deploy_dirs, params["runtime"])
        if holder is None:
            continue
        holders[str(entry["port"])] = holder
        field = entry["field"] or "its port"
        problems.append(
            f"port {entry['port']} ({entry['service']}) is held by {holder}, not by this "
            f"deployment; stop it, or move the port ({field})"
        )
    facts["ports_held"] = holders
    return problems


def main():
    module = AnsibleModule(
        argument_spec=dict(
            hardware=dict(type="str", required=True),
            runtime=dict(type="str", required=True, choices=["compose", "process"]),
            python=dict(type="str", default="python3"),
            ports=dict(type="list", elements="dict", default=[], options=dict(
                port=dict(type="int", required=True),
                address=dict(type="str", default="0.0.0.0"),
                service=dict(type="str", required=True),
                field=dict(type="str", default=""),
            )),
            deploy_dirs=dict(type="list", elements="path", default=["/srv/lobes"]),
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
    problems = _problems(module.params, facts, profile) + _port_problems(module, facts)
    if problems:
        module.fail_json(msg="preflight failed: " + "; ".join(problems), lobes_preflight=facts)
    module.exit_json(changed=False, ansible_facts=dict(lobes_preflight=facts))


if __name__ == "__main__":
    main()
