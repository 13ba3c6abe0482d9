"""A small deterministic model of replicas under a burst: slots, FIFO queue, batch-dependent rate.

Used by the placement tests to compute a burst's makespan without wall time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelReplica:
    """slots run at once; per_stream_rate(active) is each running stream's tok/s."""

    slots: int
    per_stream_rate: Callable[[int], float]


def replica_makespan(replica: ModelReplica, jobs: int, tokens: float) -> float:
    """Seconds until `jobs` requests of `tokens` each, all queued at t=0, have finished."""
    remaining = [tokens] * jobs
    clock = 0.0
    while remaining:
        running = remaining[: replica.slots]
        rate = replica.per_stream_rate(len(running))
        step = min(running) / rate
        clock += step
        running = [left - step * rate for left in running]
        remaining = [left for left in running if left > 1e-9] + remaining[replica.slots :]
    return clock


def burst_makespan(
    assignment: Sequence[str], replicas: dict[str, ModelReplica], tokens: float
) -> float:
    """Makespan of a burst whose i-th request was placed on assignment[i]."""
    return max(
        replica_makespan(replica, assignment.count(name), tokens)
        for name, replica in replicas.items()
    )


# Seed 000's pair, as measured: Spark 48.9 tok/s single stream and 88.1 tok/s aggregate with
# 2 running; Thor 11.0 tok/s single stream and 155 tokens in ~14.4 s with 2 running.
SPARK = ModelReplica(slots=2, per_stream_rate=lambda active: 48.9 if active == 1 else 88.1 / 2)
THOR = ModelReplica(slots=2, per_stream_rate=lambda active: 11.0 if active == 1 else 155 / 14.4)
SEED_TOKENS = 155
