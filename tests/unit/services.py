"""Start what a rendered services.json describes, as real processes, for module tests."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from lobes_service_files import parse_env_file

from tests.support.wait import WaitTimeout, http_ok, wait_until

ROOT = Path(__file__).resolve().parents[2]


class Services:
    """The processes of one rendered box; stop() kills them all."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        self.procs: dict = {}
        gateway_link = dest / "gateway"
        if not gateway_link.exists():
            gateway_link.symlink_to(ROOT / "gateway")
        self.spec = json.loads((dest / "services.json").read_text())["services"]

    def start(self, name: str, extra_args: tuple[str, ...] = ()) -> None:
        """Start a rendered service, with `extra_args` after its own (a test's variation)."""
        service = next(item for item in self.spec if item["name"] == name)
        env = {"PATH": os.environ["PATH"], "PYTHONUNBUFFERED": "1"}
        if service.get("env_file"):
            env.update(parse_env_file((self.dest / service["env_file"]).read_text()))
        env.update(service["env"])
        log = open(self.dest / service["log"], "ab")  # noqa: SIM115 - lives with the process
        argv = [*service["argv"], *extra_args]
        self.procs[name] = (subprocess.Popen(argv, cwd=self.dest / service["cwd"], env=env,
                                             stdout=log, stderr=subprocess.STDOUT),
                            log)
        try:
            wait_health(health_url(service, env))
        except RuntimeError as error:
            log_text = (self.dest / service["log"]).read_text()
            raise RuntimeError(f"{name}: {error}: {log_text}") from error

    def start_all(self, skip: tuple = ()) -> None:
        for service in self.spec:
            if service["name"] not in skip:
                self.start(service["name"])

    def kill(self, name: str) -> None:
        proc, log = self.procs.pop(name)
        proc.kill()
        proc.wait(timeout=10)
        log.close()

    def stop(self) -> None:
        for proc, log in self.procs.values():
            proc.kill()
            proc.wait(timeout=10)
            log.close()
        self.procs.clear()


def health_url(service: dict, env: dict) -> str:
    argv = service["argv"]
    port = argv[argv.index("--port") + 1] if "--port" in argv else env["GATEWAY_PORT"]
    return f"http://127.0.0.1:{port}/health"


def wait_health(url: str, timeout: float = 20.0) -> None:
    """Return once `url` answers 200; raise RuntimeError naming it otherwise."""
    try:
        wait_until(lambda: http_ok(url), timeout=timeout, message=f"{url} to answer 200")
    except WaitTimeout as error:
        raise RuntimeError(str(error)) from error
