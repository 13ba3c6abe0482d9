"""A simulated gear's memory share, held in a fake meminfo while it runs.

On a unified-memory box every gear takes its share of the one pool the CPU uses too. A sim gear
started with --proc-root DIR --hold-memory-gib G takes G GiB off MemAvailable and MemFree of
DIR/meminfo when it starts and gives them back when it stops, so start-up ordering, the
collection's memory gate and the gateway's memory shedding meet real numbers in tests. Gears
of one box share the file: every change is made under an exclusive lock.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

KIB_PER_GIB = 1024 * 1024
_TAKEN = ("MemAvailable", "MemFree")


def adjust(meminfo: str, delta_kib: int) -> None:
    """Add delta_kib (negative: take) to MemAvailable and MemFree, never below zero."""
    with open(meminfo + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(meminfo, encoding="ascii") as handle:
            lines = handle.read().splitlines()
        lines = [_adjusted(line, delta_kib) for line in lines]
        temporary = f"{meminfo}.{os.getpid()}"
        with open(temporary, "w", encoding="ascii") as handle:
            handle.write("\n".join(lines) + "\n")
        os.replace(temporary, meminfo)


def _adjusted(line: str, delta_kib: int) -> str:
    name, _colon, rest = line.partition(":")
    if name not in _TAKEN:
        return line
    value = max(0, int(rest.split()[0]) + delta_kib)
    return f"{name}:{value:>16} kB"


@contextmanager
def holding(proc_root: str | None, gib: float) -> Iterator[None]:
    """Hold gib GiB of proc_root/meminfo for the duration (nothing without a proc_root)."""
    if not proc_root or gib <= 0:
        yield
        return
    meminfo = os.path.join(proc_root, "meminfo")
    kib = int(gib * KIB_PER_GIB)
    adjust(meminfo, -kib)
    try:
        yield
    finally:
        adjust(meminfo, kib)
