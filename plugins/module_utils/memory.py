"""A unified-memory box's free memory, read from meminfo, against the gears about to start.

Pure functions over meminfo text: the memory_gate module reads the file and asks the box which
gears already run. The gateway reads the same file for shedding with its own stdlib parser.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB_PER_GIB = 1024 * 1024


@dataclass(frozen=True)
class MemoryReading:
    """What meminfo says now, in GiB."""

    total_gib: float
    available_gib: float
    page_cache_gib: float  # Cached + SReclaimable - Shmem: what dropping caches could free
    swap_free_gib: float

    def as_dict(self) -> dict:
        return {name: round(value, 2) for name, value in self.__dict__.items()}


def parse_meminfo(text: str) -> MemoryReading:
    """The reading of a meminfo file's text; a missing field reads as 0."""
    kib: dict[str, int] = {}
    for line in text.splitlines():
        name, _colon, rest = line.partition(":")
        if rest.split():
            kib[name] = int(rest.split()[0])
    cache = kib.get("Cached", 0) + kib.get("SReclaimable", 0) - kib.get("Shmem", 0)
    return MemoryReading(
        total_gib=kib.get("MemTotal", 0) / KIB_PER_GIB,
        available_gib=kib.get("MemAvailable", 0) / KIB_PER_GIB,
        page_cache_gib=max(0, cache) / KIB_PER_GIB,
        swap_free_gib=kib.get("SwapFree", 0) / KIB_PER_GIB,
    )


def refusal(host: str, reading: MemoryReading, to_start: dict[str, float]) -> str | None:
    """Why the gears about to start (name -> GiB share) cannot, or None when they fit."""
    need = sum(to_start.values())
    if need <= reading.available_gib:
        return None
    gears = ", ".join(f"{name} ({gib:.1f} GiB)" for name, gib in to_start.items())
    return (f"host {host}: the gears to start, {gears}, need {need:.1f} GiB but "
            f"{reading.available_gib:.1f} GiB is available now (MemAvailable of "
            f"{reading.total_gib:.1f} GiB; page cache {reading.page_cache_gib:.1f} GiB, swap "
            f"free {reading.swap_free_gib:.1f} GiB). Stop what else holds the memory, lower the "
            "gears' gpu_memory_utilization, or set fleet_drop_caches_before_start to free the "
            "page cache first")


def headroom(reading: MemoryReading, gears: list, stands_for: str | None = None) -> str:
    """One line for status and verify: free memory against the gears' shares (name, GiB,
    running). `stands_for` names the box simulated gears are budgeted for: their shares are
    that box's figures and hold none of this machine's memory, which the line then says."""
    shares = sum(share for _name, share, _running in gears)
    listed = ", ".join(f"{name} {share:.1f} {'running' if running else 'stopped'}"
                       for name, share, running in gears) or "none"
    line = (f"{reading.available_gib:.1f} of {reading.total_gib:.1f} GiB available (page cache "
            f"{reading.page_cache_gib:.1f}, swap free {reading.swap_free_gib:.1f}); gears' "
            f"shares {shares:.1f} GiB: {listed}")
    if stands_for:
        line += (f" (simulated gears: the shares are budgeted for {stands_for} and hold none of "
                 f"this machine's {reading.total_gib:.1f} GiB)")
    return line
