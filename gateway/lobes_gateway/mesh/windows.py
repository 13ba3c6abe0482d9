"""The context window each local backend really serves, read from its own /v1/models, and
the engine version it reports on /version.

P_MAX_MODEL_LEN is a mirror of what the box was configured to start with; the backend may
serve another window (a 1048576 mirror has been seen in front of a 262144 backend). What this
gateway advertises (/capabilities context, /v1/models max_model_len) comes from here, so
pooling peers build their fingerprints from the window that is actually served. Probed in
the background, never on the request path; null until the backend has answered once.
"""

from __future__ import annotations

import asyncio
import json
import time

from lobes_contract import AUDIO_TASKS

from ..policy.config import GatewayConfig
from ..transport.upstream import Connections, Origin, UpstreamError, fetch


def listed_models(body: bytes) -> dict[str, dict]:
    """The models a vLLM /v1/models answer lists, by id ({} when it is not one)."""
    try:
        data = json.loads(body).get("data")
    except (ValueError, UnicodeDecodeError, AttributeError, RecursionError):
        return {}
    models = data if isinstance(data, list) else []
    return {model["id"]: model for model in models
            if isinstance(model, dict) and isinstance(model.get("id"), str)}


# An engine's version string longer than this is cut: it is shown and compared, never parsed.
MAX_VERSION_CHARS = 64
# A model root (a path or hub name) longer than this is cut likewise.
MAX_ROOT_CHARS = 256


def engine_version(body: bytes) -> str | None:
    """The "version" string of an engine's /version answer; None for anything else."""
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    version = answer.get("version") if isinstance(answer, dict) else None
    return version[:MAX_VERSION_CHARS] if isinstance(version, str) else None


def served_window(body: bytes, served_name: str) -> int | None:
    """max_model_len of served_name in a vLLM /v1/models answer; None when absent."""
    window = listed_models(body).get(served_name, {}).get("max_model_len")
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
        # What each backend listed when it last answered its probe: only one that lists the
        # served name it is configured with is advertised (advertised implies reachable).
        self._listed: dict[tuple[Origin, str], frozenset[str]] = {}
        # What each backend runs, read at every probe (an engine restarted as another version
        # or on other weights between two probes answers for the new one at the next): its
        # version, the root /v1/models names for its served model (vLLM's --model), and when.
        self._engines: dict[tuple[Origin, str], tuple[str | None, str | None, float]] = {}

    def get(self, origin: Origin, served_name: str) -> int | None:
        """The window the backend last reported serving; None until it has answered."""
        return self._windows.get((origin, served_name))

    def serves(self, origin: Origin, served_name: str) -> bool:
        """Whether the backend answered its last probe listing `served_name`."""
        return served_name in self._listed.get((origin, served_name), ())

    def engine_version(self, origin: Origin, served_name: str) -> str | None:
        """The engine version the backend reported at its last probe (None while it lists
        another name, does not answer, or answers no version)."""
        seen = self._engines.get((origin, served_name))
        return seen[0] if seen else None

    def model_root(self, origin: Origin, served_name: str) -> str | None:
        """The root its /v1/models named for the served model at the last probe: the path or
        hub name the engine loaded (None while it does not serve the name)."""
        seen = self._engines.get((origin, served_name))
        return seen[1] if seen else None

    def engine_age(self, origin: Origin, served_name: str) -> float | None:
        """Seconds since the backend's version and root were read (None when unknown): a
        reader that restarted the backend trusts only a reading younger than the restart."""
        seen = self._engines.get((origin, served_name))
        return round(time.monotonic() - seen[2], 1) if seen else None

    def not_serving(self, origin: Origin, served_name: str) -> str | None:
        """Why a backend that answers is not ready (it lists other models than the one it is
        configured with), or None."""
        listed = self._listed.get((origin, served_name))
        if listed is None or served_name in listed:
            return None
        names = ", ".join(sorted(listed)) or "no model"
        return (f"the gear at {origin.url} serves {names}, not {served_name} (P_SERVED_NAME): "
                "set the served name the gear is started with")

    async def _probe(self, origin: Origin, served_name: str) -> None:
        key = (origin, served_name)
        try:
            # No key: the gateway's inbound key is not its gears' (none is declared for them).
            status, body = await fetch(self._connections, origin, "/v1/models", [],
                                       self._timeout)
        except UpstreamError:
            # Down: not advertised; the window it served last is still its window.
            self._listed.pop(key, None)
            self._engines.pop(key, None)
            return
        listed = listed_models(body) if status == 200 else {}
        self._listed[key] = frozenset(listed)
        window = served_window(body, served_name) if status == 200 else None
        if window is not None:
            self._windows[key] = window
        if served_name not in listed:
            self._engines.pop(key, None)
            return
        root = listed[served_name].get("root")
        shown_root = root[:MAX_ROOT_CHARS] if isinstance(root, str) else None
        self._engines[key] = (await self._ask_version(origin), shown_root, time.monotonic())

    async def _ask_version(self, origin: Origin) -> str | None:
        try:
            status, body = await fetch(self._connections, origin, "/version", [], self._timeout)
        except UpstreamError:
            return None
        return engine_version(body) if status == 200 else None

    async def probe_once(self) -> None:
        """One pass over every local backend."""
        await asyncio.gather(*(self._probe(o, s) for o, s in self._targets))

    async def run(self) -> None:
        """Probe forever (a background task); the first pass ran at start-up."""
        while self._targets:
            await asyncio.sleep(self._interval)
            await self.probe_once()
