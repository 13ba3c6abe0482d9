"""The /proc pressure sampler (background) and the shed decision."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from lobes_contract import SHEDDABLE_TIERS

from .config import PressureConfig


@dataclass(frozen=True)
class Sample:
    """One reading, in percent: swap used, iowait share since the previous reading, MemAvailable
    of MemTotal (None without both), and PSI memory `full avg10` (None without PSI)."""

    swap_used_percent: float
    iowait_percent: float
    mem_available_percent: float | None = None
    psi_memory_full: float | None = None


_MEMINFO_FIELDS = ("SwapTotal", "SwapFree", "MemTotal", "MemAvailable")


def read_meminfo(proc_root: str) -> tuple[float, float | None]:
    """(swap used % of swap total, 0 with no swap; MemAvailable % of MemTotal or None)."""
    fields: dict[str, int] = {}
    with open(os.path.join(proc_root, "meminfo"), encoding="ascii") as fh:
        for line in fh:
            name, _, rest = line.partition(":")
            if name in _MEMINFO_FIELDS:
                fields[name] = int(rest.split()[0])
    swap_total = fields.get("SwapTotal", 0)
    swap = (100.0 * (swap_total - fields.get("SwapFree", swap_total)) / swap_total
            if swap_total > 0 else 0.0)
    total, available = fields.get("MemTotal", 0), fields.get("MemAvailable")
    memory = 100.0 * available / total if total > 0 and available is not None else None
    return swap, memory


def read_memory_kb(proc_root: str) -> tuple[int | None, int | None]:
    """(MemTotal, MemAvailable) in kB, None for a field the kernel does not give."""
    fields: dict[str, int] = {}
    with open(os.path.join(proc_root, "meminfo"), encoding="ascii") as fh:
        for line in fh:
            name, _, rest = line.partition(":")
            if name in ("MemTotal", "MemAvailable"):
                fields[name] = int(rest.split()[0])
    return fields.get("MemTotal"), fields.get("MemAvailable")


def read_psi_memory_full(proc_root: str) -> float | None:
    """`full avg10` of the memory pressure stall information; None where the kernel has none."""
    try:
        with open(os.path.join(proc_root, "pressure", "memory"), encoding="ascii") as fh:
            for line in fh:
                if line.startswith("full "):
                    return float(line.split()[1].partition("=")[2])
    except OSError:
        return None
    return None


def read_cpu_times(proc_root: str) -> tuple[int, int]:
    """(iowait, total) jiffies from the aggregate cpu line of stat."""
    with open(os.path.join(proc_root, "stat"), encoding="ascii") as fh:
        for line in fh:
            if line.startswith("cpu "):
                values = [int(v) for v in line.split()[1:9]]  # user..steal; guest is inside user
                return values[4], sum(values)
    raise ValueError("no aggregate cpu line in stat")


class PressureMonitor:
    """Samples in the background so the request path only reads `busy`."""

    def __init__(self, config: PressureConfig) -> None:
        self.config = config
        self.sample = Sample(0.0, 0.0)
        self.busy = False
        # Why it sheds: "memory" (MemAvailable or PSI), "pressure" (swap or iowait), or "none".
        self.reason = "none"
        self.error: str | None = None
        self._last_cpu: tuple[int, int] | None = None

    def take_sample(self) -> None:
        """Read swap and the iowait delta since the last call; unreadable files mean no pressure."""
        root = self.config.proc_root
        try:
            swap, memory = read_meminfo(root)
            cpu = read_cpu_times(root)
            psi = read_psi_memory_full(root)
        except (OSError, ValueError, IndexError) as exc:
            self.error = f"cannot read {root}: {exc}"
            self.sample, self.busy, self.reason = Sample(0.0, 0.0), False, "none"
            return
        self.error = None
        iowait = 0.0
        if self._last_cpu is not None:
            d_io, d_total = cpu[0] - self._last_cpu[0], cpu[1] - self._last_cpu[1]
            iowait = 100.0 * d_io / d_total if d_total > 0 else 0.0
        self._last_cpu = cpu
        self.sample = Sample(swap, iowait, memory, psi)
        self.reason = self._reason(self.sample)
        self.busy = self.reason != "none"

    def _reason(self, sample: Sample) -> str:
        """A reading exactly at a threshold does not trigger: MemAvailable strictly under
        its threshold, every other reading strictly over its own."""
        config = self.config
        memory = sample.mem_available_percent
        if (memory is not None and memory < config.memavailable_degraded) or (
                sample.psi_memory_full is not None
                and sample.psi_memory_full > config.psi_memory_full):
            return "memory"
        if sample.swap_used_percent > config.swap_degraded \
                or sample.iowait_percent > config.iowait_degraded:
            return "pressure"
        return "none"

    async def run(self) -> None:
        while True:
            self.take_sample()
            await asyncio.sleep(self.config.sample_interval_s)

    def sheds(self, requested_tier: str | None, served_tier: str | None) -> bool:
        """Whether a request for these tiers is shed now (minor is the floor, never shed)."""
        if not self.busy or requested_tier == "minor":
            return False
        return served_tier in SHEDDABLE_TIERS

    def block(self, floor_model: str | None) -> dict[str, object]:
        """The /status pressure block; floor_model is what an explicit minor request gets."""
        busy = self.busy
        return {
            "mode": "busy" if busy else "warm",
            "shed": busy,
            "servable_tier": "minor" if busy else "main",
            "model": floor_model,
            "reason": self.reason,
            "retry_after": self.config.retry_after_s,
            "pressure": {"swap_used_percent": round(self.sample.swap_used_percent, 1),
                         "iowait_percent": round(self.sample.iowait_percent, 1),
                         "mem_available_percent": _rounded(self.sample.mem_available_percent),
                         "psi_memory_full_avg10": _rounded(self.sample.psi_memory_full)},
            "thresholds": {"swap_degraded": self.config.swap_degraded,
                           "iowait_degraded": self.config.iowait_degraded,
                           "swap_no_hard": self.config.swap_no_hard,
                           "swap_prefer_cheap": self.config.swap_prefer_cheap,
                           "iowait_no_hard": self.config.iowait_no_hard,
                           "memavailable_degraded": self.config.memavailable_degraded,
                           "psi_memory_full": self.config.psi_memory_full},
            "error": self.error,
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
