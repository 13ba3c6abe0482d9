"""The context window each local backend really serves, read from its own /v1/models.

P_MAX_MODEL_LEN is a mirror of what the box was configured to start with; the backend may
serve another window (seed 000: a 1048576 mirror in front of a 262144 backend). What this
gateway advertises (/capabilities context, /v1/models max_model_len) comes from here, so
pooling peers build their fingerprints from the window that is actually served. Probed in
the background, never on the request path; null until the backend has answered once.
"""

from __future__ import annotations

import asyncio
import json

from lobes_contract import AUDIO_TASKS

from ..policy.config import GatewayConfig
from ..transport.upstream import Connections, Origin, UpstreamError, fetch


def served_window(body: bytes, served_name: str) -> int | None:
    """max_model_len of served_name in a vLLM /v1/models answer; None when absent."""
    try:
        data = json.loads(body).get("data")
    except (ValueError, UnicodeDecodeError, AttributeError):
        return None
    for model in data if isinstance(data, list) else []:
        if isinstance(model, dict) and model.get("id") == served_name:
            window = model.get("max_model_len")
            if isinstance(window, int) and not isinstance(window, bool) and window > 0:
                return window
    return None


class BackendWindows:
    """Last window each local backend reported, keyed by (origin, served name)."""

    def __init__(self, config: GatewayConfig, connections: Connections) -> None:
        self._connections = connections
        self._timeout = config.limits.probe_timeout_s
        self._interval = config.limits.probe_interval_s
        self._targets = sorted({(rc.base_url, rc.served_name)
                                for rc in config.roles.values()
                                if rc.feasible and rc.base_url is not None
                                and rc.role.task not in AUDIO_TASKS},
                               key=lambda t: (t[0].url, t[1]))
        self._windows: dict[tuple[Origin, str], int] = {}
        # Backends whose last probe got an answer: only these are advertised (seed 004).
        self._answering: set[tuple[Origin, str]] = set()

    def get(self, origin: Origin, served_name: str) -> int | None:
        """The window the backend last reported serving; None until it has answered."""
        return self._windows.get((origin, served_name))

    def answering(self, origin: Origin, served_name: str) -> bool:
        """Whether the backend answered its last probe."""
        return (origin, served_name) in self._answering

    async def _probe(self, origin: Origin, served_name: str) -> None:
        try:
            # No key: the gateway's inbound key is not its gears' (none is declared for them).
            status, body = await fetch(self._connections, origin, "/v1/models", [],
                                       self._timeout)
        except UpstreamError:
            # Down: not advertised; the window it served last is still its window.
            self._answering.discard((origin, served_name))
            return
        self._answering.add((origin, served_name))
        window = served_window(body, served_name) if status == 200 else None
        if window is not None:
            self._windows[(origin, served_name)] = window

    async def probe_once(self) -> None:
        """One pass over every local backend."""
        await asyncio.gather(*(self._probe(o, s) for o, s in self._targets))

    async def run(self) -> None:
        """Probe forever (a background task); the first pass ran at start-up."""
        while self._targets:
            await asyncio.sleep(self._interval)
            await self.probe_once()
