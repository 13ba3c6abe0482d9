"""Pidfiles that identify a process by pid AND kernel start time, so a reused pid never matches."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class PidRecord:
    """What a pidfile holds: the process, when the kernel started it, and what it runs."""

    pid: int
    start_ticks: int
    name: str
    kind: str  # "monitor" or "child"
    fingerprint: str = ""


def start_ticks(pid: int) -> int | None:
    """The kernel start time of pid (clock ticks since boot); None when gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def write(path: Path, record: PidRecord) -> None:
    """Write atomically so a reader never sees half a pidfile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(record)) + "\n")
    tmp.replace(path)


def read(path: Path) -> PidRecord | None:
    try:
        return PidRecord(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def alive(record: PidRecord | None) -> bool:
    """True when the recorded process still runs (same pid, same start time)."""
    return record is not None and start_ticks(record.pid) == record.start_ticks


def record_for(pid: int, name: str, kind: str, fingerprint: str = "") -> PidRecord:
    ticks = start_ticks(pid)
    if ticks is None:
        raise ProcessLookupError(f"process {pid} is not running")
    return PidRecord(pid=pid, start_ticks=ticks, name=name, kind=kind, fingerprint=fingerprint)


def remove(path: Path) -> None:
    path.unlink(missing_ok=True)


def remove_own(path: Path, pid: int) -> None:
    """Remove the pidfile only while it names `pid`: a second monitor of the same service
    (an overlapping run) must not take the first one's pidfile with it when it stops."""
    record = read(path)
    if record is not None and record.pid == pid:
        remove(path)
