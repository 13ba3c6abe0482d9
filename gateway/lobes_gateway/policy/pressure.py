"""The /proc pressure sampler (background) and the shed decision."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from lobes_contract import SHEDDABLE_TIERS

from .config import PressureConfig


@dataclass(frozen=True)
class Sample:
    """One reading: swap used and iowait share since the previous reading, in percent."""

    swap_used_percent: float
    iowait_percent: float


def read_swap_percent(proc_root: str) -> float:
    """Swap used as a percentage of swap total (0 with no swap) from meminfo."""
    fields: dict[str, int] = {}
    with open(os.path.join(proc_root, "meminfo"), encoding="ascii") as fh:
        for line in fh:
            name, _, rest = line.partition(":")
            if name in ("SwapTotal", "SwapFree"):
                fields[name] = int(rest.split()[0])
    total = fields.get("SwapTotal", 0)
    if total <= 0:
        return 0.0
    return 100.0 * (total - fields.get("SwapFree", total)) / total


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
        self.error: str | None = None
        self._last_cpu: tuple[int, int] | None = None

    def take_sample(self) -> None:
        """Read swap and the iowait delta since the last call; unreadable files mean no pressure."""
        root = self.config.proc_root
        try:
            swap = read_swap_percent(root)
            cpu = read_cpu_times(root)
        except (OSError, ValueError, IndexError) as exc:
            self.error = f"cannot read {root}: {exc}"
            self.sample, self.busy = Sample(0.0, 0.0), False
            return
        self.error = None
        iowait = 0.0
        if self._last_cpu is not None:
            d_io, d_total = cpu[0] - self._last_cpu[0], cpu[1] - self._last_cpu[1]
            iowait = 100.0 * d_io / d_total if d_total > 0 else 0.0
        self._last_cpu = cpu
        self.sample = Sample(swap, iowait)
        # Strictly greater: a reading exactly at a threshold does not trigger.
        self.busy = (swap > self.config.swap_degraded
                     or iowait > self.config.iowait_degraded)

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
            "reason": "pressure" if busy else "none",
            "retry_after": self.config.retry_after_s,
            "pressure": {"swap_used_percent": round(self.sample.swap_used_percent, 1),
                         "iowait_percent": round(self.sample.iowait_percent, 1)},
            "thresholds": {"swap_degraded": self.config.swap_degraded,
                           "iowait_degraded": self.config.iowait_degraded,
                           "swap_no_hard": self.config.swap_no_hard,
                           "swap_prefer_cheap": self.config.swap_prefer_cheap,
                           "iowait_no_hard": self.config.iowait_no_hard},
            "error": self.error,
        }
