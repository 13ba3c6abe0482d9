"""Controller side of lobes.fleet.source_tree: bundle a local directory into one argument
(unless remote_src: then the module reads the directory on the box itself).

Copying a source tree file by file costs one or two module runs per file; this sends the
whole tree (without bytecode) in one compressed argument, and the module writes only the
files whose content differs.
"""

from __future__ import annotations

import base64
import gzip
import json
import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

_SKIPPED_DIRS = frozenset({"__pycache__", ".pytest_cache", ".ruff_cache"})
_SKIPPED_SUFFIXES = (".pyc", ".pyo")


def bundle_tree(root: str) -> str:
    """Every regular file under root (bytecode and caches left out), as base64 gzip JSON."""
    files = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED_DIRS)
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if name.endswith(_SKIPPED_SUFFIXES) or not os.path.isfile(path):
                continue
            with open(path, "rb") as handle:
                files[os.path.relpath(path, root)] = base64.b64encode(handle.read()).decode()
    payload = gzip.compress(json.dumps(files, sort_keys=True).encode(), mtime=0)
    return base64.b64encode(payload).decode()


class ActionModule(ActionBase):
    """Read src on the controller, then run the module on the box with the bundle."""

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        src = args.get("src")
        if not args.get("remote_src"):
            if not src or not os.path.isdir(src):
                raise AnsibleActionFail(f"src {src!r} is not a directory on the controller")
            args["bundle"] = bundle_tree(src)
        result.update(
            self._execute_module(
                module_name="lobes.fleet.source_tree", module_args=args, task_vars=task_vars
            )
        )
        return result
