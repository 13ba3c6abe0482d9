"""The simulator's shared state: the profile it serves, its engine, faults and recorder."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from lobes_contract import SIM_ENGINE_VERSION

from .engine import Engine
from .faults import Faults, RequestRecorder
from .profiles import Profile


class ClientGone(Exception):
    """The client disconnected (or a fault dropped it): close without answering."""


@dataclass
class SimState:
    profile: Profile
    time_scale: float
    seed: int
    faults: Faults = field(default_factory=Faults)
    engine_version: str = SIM_ENGINE_VERSION  # what /version reports
    model_root: str | None = None  # /v1/models' root: vLLM's --model (None: the served name)
    recorder: RequestRecorder = field(default_factory=RequestRecorder)
    started: int = field(default_factory=lambda: int(time.time()))
    # Set to stop the process (SIGTERM, SIGINT, or the engine_dead fault).
    shutdown: asyncio.Event = field(default_factory=asyncio.Event)
    engine: Engine = field(init=False)

    def __post_init__(self) -> None:
        self.engine = Engine(self.profile, self.time_scale, lambda: self.faults.slow_factor)

    def sim_seconds(self, seconds: float) -> float:
        """Wall-clock seconds for ``seconds`` of simulated time."""
        return seconds / self.time_scale
