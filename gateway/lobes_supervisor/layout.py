"""Where a state directory keeps pidfiles, restart counters and logs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from lobes_service_files import Service


@dataclass(frozen=True)
class Layout:
    """state_dir/run holds pidfiles and restart counters, state_dir/log the service logs."""

    state_dir: Path

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    @property
    def lock_file(self) -> Path:
        """Held by the run that starts or stops services (lock.py)."""
        return self.state_dir / "deploy.lock"

    def ensure(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def monitor_pidfile(self, spec: Service) -> Path:
        return self.run_dir / spec.pidfile_name

    def child_pidfile(self, spec: Service) -> Path:
        return self.run_dir / f"{spec.name}.child.pid"

    def log(self, spec: Service) -> Path:
        return self.log_dir / spec.log_name

    def state_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.state.json"

    def write_state(self, spec: Service, *, restarts: int, last_exit: int | None) -> None:
        self.state_file(spec.name).write_text(
            json.dumps({"restarts": restarts, "last_exit": last_exit}) + "\n"
        )

    def read_state(self, name: str) -> dict:
        try:
            return json.loads(self.state_file(name).read_text())
        except (OSError, ValueError):
            return {"restarts": 0, "last_exit": None}
