"""A checkpoint copy's progress on a box: a small JSON file per revision being copied,
`<model_dir>/.progress/<org>__<name>@<revision>.json`, that model_fetch and model_pull rewrite
while bytes arrive and remove once the revision is whole, and that the play and status.yml read
back as "N MiB of M MiB, R MiB/s, T s left".
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

PROGRESS = ".progress"
MIB = 1 << 20
# Rewrites at most this often: the file is read by people and plays, not a meter.
EVERY_S = 0.25


def progress_path(model_dir: str, checkpoint: str, revision: str) -> str:
    """Where a revision's copy writes its progress."""
    org, _slash, name = checkpoint.partition("/")
    return os.path.join(model_dir, PROGRESS, f"{org}__{name}@{revision}.json")


class Progress:
    """The progress file of one copy, rewritten (atomically) as bytes arrive."""

    def __init__(self, model_dir: str, checkpoint: str, revision: str, *, total: int, done: int,
                 source: str, clock: Callable[[], float] = time.time) -> None:
        self.path = progress_path(model_dir, checkpoint, revision)
        self.clock = clock
        self.started = clock()
        self.record = {"checkpoint": checkpoint, "revision": revision, "source": source,
                       "bytes_total": total, "bytes_done": min(done, total),
                       "bytes_at_start": min(done, total), "started": self.started,
                       "updated": self.started, "rate": 0.0}
        self.written = 0.0
        self.write()

    def add(self, count: int) -> None:
        """Count bytes arrived (negative: bytes thrown away to copy again)."""
        done = self.record["bytes_done"] + count
        self.record["bytes_done"] = max(0, min(done, self.record["bytes_total"]))
        if self.clock() - self.written >= EVERY_S:
            self.write()

    def write(self) -> None:
        now = self.clock()
        seconds = now - self.started
        copied = self.record["bytes_done"] - self.record["bytes_at_start"]
        self.record.update(updated=now, rate=round(copied / seconds, 1) if seconds > 0 else 0.0)
        os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(self.record, handle, sort_keys=True)
        os.replace(tmp, self.path)
        self.written = now

    def done(self) -> None:
        """The revision is whole: the file goes."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


@dataclass(frozen=True)
class Copy:
    """A copy's figures as read back: what a line about it says."""

    checkpoint: str
    revision: str
    source: str
    bytes_done: int
    bytes_total: int
    rate: float
    seconds_left: float | None
    age: float
    stalled: bool

    def line(self) -> str:
        """"N MiB of M MiB, R MiB/s, T s left" (and how long ago it moved, when stalled)."""
        left = ("time left unknown" if self.seconds_left is None
                else f"{self.seconds_left:.0f} s left")
        text = (f"{self.checkpoint}@{self.revision[:12]} from {self.source}: "
                f"{self.bytes_done / MIB:.1f} MiB of {self.bytes_total / MIB:.1f} MiB, "
                f"{self.rate / MIB:.2f} MiB/s, {left}")
        return f"{text}; STALLED, no bytes for {self.age:.0f} s" if self.stalled else text


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def figures(record: object, now: float, stall_after: float) -> Copy | None:
    """A progress record's figures; None for a record that is not one (hostile or torn)."""
    if not isinstance(record, dict):
        return None
    numbers = [_number(record.get(key)) for key in ("bytes_done", "bytes_total", "rate", "updated")]
    texts = [record.get(key) for key in ("checkpoint", "revision", "source")]
    if None in numbers or not all(isinstance(text, str) for text in texts):
        return None
    done, total, rate, updated = numbers
    age = max(0.0, now - updated)
    stalled = age > stall_after
    left = max(0.0, total - done) / rate if rate > 0 and not stalled else None
    return Copy(*texts, bytes_done=int(done), bytes_total=int(total), rate=rate,
                seconds_left=None if left is None else round(left, 1), age=round(age, 1),
                stalled=stalled)


def copies(model_dir: str, stall_after: float, now: float | None = None) -> list[Copy]:
    """Every copy with a progress file under model_dir, by file name."""
    directory = os.path.join(model_dir, PROGRESS)
    try:
        names = sorted(name for name in os.listdir(directory) if name.endswith(".json"))
    except OSError:
        return []
    found = []
    for name in names:
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            continue
        copy = figures(record, time.time() if now is None else now, stall_after)
        if copy:
            found.append(copy)
    return found
