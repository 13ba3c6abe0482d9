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


@dataclass
class Job:
    """One request on a model replica: its tokens, those left to decode, when it was placed
    and when it finished (None while it runs or waits)."""

    key: int
    tokens: int
    left: float
    placed_at: float
    done_at: float | None = None


class ModelBox:
    """A replica as the model runs it: FIFO, its first `slots` jobs decoding at the batch's
    per-stream rate."""

    def __init__(self, replica: ModelReplica) -> None:
        self.replica = replica
        self.jobs: list[Job] = []

    def _rate(self) -> float:
        return self.replica.per_stream_rate(min(len(self.jobs), self.replica.slots))

    def next_end_s(self) -> float | None:
        """Seconds until the next running job ends; None when idle."""
        running = self.jobs[: self.replica.slots]
        return min(job.left for job in running) / self._rate() if running else None

    def advance(self, seconds: float, now: float) -> list[Job]:
        """Run `seconds` of decode; the jobs that ended, stamped `now`."""
        rate = self._rate()
        for job in self.jobs[: self.replica.slots]:
            job.left -= seconds * rate
        ended = [job for job in self.jobs[: self.replica.slots] if job.left <= 1e-9]
        for job in ended:
            job.done_at = now
            self.jobs.remove(job)
        return ended


def finish_times(replica: ModelReplica, tokens: Sequence[int]) -> list[float]:
    """When each of the requests, all queued at t=0 in this order on one replica, finishes."""
    box = ModelBox(replica)
    box.jobs = [Job(i, n, float(n), 0.0) for i, n in enumerate(tokens)]
    done = [0.0] * len(tokens)
    clock = 0.0
    while (step := box.next_end_s()) is not None:
        clock += step
        for job in box.advance(step, clock):
            done[job.key] = clock
    return done


# A mid-speed box for a 3-replica mix: 4 slots at 25 tok/s, 3% slower per stream batched.
MID = ModelReplica(slots=4, per_stream_rate=lambda active: 25.0 / (1 + 0.03 * (active - 1)))
