"""Controller side of lobes.fleet.model_progress: with `jobs` (an empty list too), follow
asynchronous copies until they finish, printing each box's progress lines as they move;
without, read the box once."""

from __future__ import annotations

import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()
MODULE = "lobes.fleet.model_progress"


class ActionModule(ActionBase):
    """Run the module on the box; with jobs, poll their async status and the progress files."""

    def _status(self, jid: str, task_vars: dict, mode: str = "status") -> dict:
        async_dir = self._remote_expand_user(self.get_shell_option("async_dir",
                                                                   default="~/.ansible_async"))
        return self._execute_module(module_name="ansible.legacy.async_status",
                                    module_args={"jid": jid, "mode": mode,
                                                 "_async_dir": async_dir},
                                    task_vars=task_vars)

    def _follow(self, args: dict, jobs: list, task_vars: dict) -> dict:
        """Every job's final result, printing the box's copies between looks."""
        host = task_vars.get("inventory_hostname", "?")
        finished: dict[str, dict] = {}
        while True:
            for jid in jobs:
                if jid not in finished:
                    status = self._status(jid, task_vars)
                    if status.get("finished") or status.get("failed"):
                        finished[jid] = status
            if len(finished) == len(jobs):
                break
            progress = self._execute_module(module_name=MODULE, module_args=args,
                                            task_vars=task_vars)
            for line in progress.get("lines", []):
                display.display(f"{host}: {line}")
            time.sleep(max(1, args.get("poll_s", 2)))
        for jid in jobs:
            self._status(jid, task_vars, mode="cleanup")
        results = [finished[jid] for jid in jobs]
        failures = [str(result.get("msg", "failed")) for result in results if result.get("failed")]
        outcome = {"changed": any(result.get("changed") for result in results),
                   "results": results, "copies": [], "lines": []}
        if failures:
            outcome.update(failed=True, msg="; ".join(failures))
        return outcome

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = dict(self._task.args)
        if "jobs" in args:  # a loop that started nothing follows nothing, with results []
            jobs = [str(jid) for jid in args.pop("jobs") or []]
            result.update(self._follow(args, jobs, task_vars))
        else:
            result.update(self._execute_module(module_name=MODULE, module_args=args,
                                               task_vars=task_vars))
        return result
