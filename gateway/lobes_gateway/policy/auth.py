"""The bearer gate, the fleet key, named client keys, and per-key in-flight limits."""

from __future__ import annotations

import hmac
from collections import Counter
from dataclasses import dataclass

from .admission import STANDARD
from .config import ClientKey

ANONYMOUS = "anonymous"
CLIENT = "client"
FLEET = "fleet"
# Exempt from in-flight limits: the boxes of the mesh, and a gateway with no gate.
_EXEMPT = frozenset({FLEET, ANONYMOUS})


@dataclass(frozen=True)
class Caller:
    """Who sent a request, as far as keys tell: anonymous, the box's client key, the fleet key,
    or a named client key (key_id is then its name, never the key)."""

    key_id: str
    priority: str = STANDARD  # the class its requests run in unless they ask for a weaker one
    inflight_limit: int | None = None  # a named key's own limit; None: the gateway's

    @property
    def is_fleet(self) -> bool:
        return self.key_id == FLEET


_ANONYMOUS = Caller(ANONYMOUS)
_CLIENT = Caller(CLIENT)
_FLEET = Caller(FLEET)
# Authorization values remembered once they identified a caller: a client sends the same one
# on every request. Bounded: the keys are the configured few, their spellings a few more.
MAX_KNOWN_AUTHORIZATIONS = 64


class Gate:
    """Identifies callers; with no GATEWAY_API_KEY there is no gate at all."""

    def __init__(self, api_key: str | None, fleet_key: str | None,
                 client_keys: tuple[ClientKey, ...] = ()) -> None:
        self._key = api_key.encode() if api_key else None
        self._fleet = fleet_key.encode() if fleet_key else None
        self._named = [(c.key.encode(), Caller(c.name, c.priority, c.inflight_limit))
                       for c in client_keys]
        # A value is found here only when it equals one that identified a caller: a dict lookup
        # compares whole strings of equal hash (keyed per process), so its time tells an
        # unknown value nothing about a key; unknown values take the constant-time path.
        self._known: dict[str, Caller] = {}

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def identify(self, authorization: str | None) -> Caller | None:
        """The caller, or None when the gate is on and the key is missing or wrong."""
        if authorization is None:
            return _ANONYMOUS if self._key is None else None
        caller = self._known.get(authorization)
        if caller is None:
            caller = self._compared(authorization)
            if caller is not None and len(self._known) < MAX_KNOWN_AUTHORIZATIONS:
                self._known[authorization] = caller
        return caller

    def _compared(self, authorization: str) -> Caller | None:
        """identify() for a value not seen to identify a caller: every key compared in
        constant time."""
        token = None
        if authorization:
            scheme, _sep, rest = authorization.partition(" ")
            if scheme.lower() == "bearer" and (rest := rest.strip()):
                token = rest.encode()
        if (token is not None and self._fleet is not None
                and hmac.compare_digest(token, self._fleet)):
            return _FLEET
        if self._key is None:
            return _ANONYMOUS
        if token is None:
            return None
        if hmac.compare_digest(token, self._key):
            return _CLIENT
        # Every named key is compared, so the time taken does not tell which one matched.
        found = None
        for key, caller in self._named:
            if hmac.compare_digest(token, key):
                found = caller
        return found


class InflightLimits:
    """Counts requests in flight per client key (the box's and each named one); the fleet key
    and the ungated are exempt. A named key's own limit replaces the gateway's."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._counts: Counter[str] = Counter()
        self._limits: dict[str, int] = {}

    def limit_of(self, caller: Caller) -> int:
        """The caller's limit; 0 means none."""
        if caller.key_id in _EXEMPT:
            return 0
        return caller.inflight_limit if caller.inflight_limit is not None else self.limit

    def acquire(self, caller: Caller) -> bool:
        """Count one more request for `caller`; False when its limit is reached."""
        limit = self._limits.get(caller.key_id)
        if limit is None:
            limit = self._limit(caller)
        if limit <= 0:
            return True
        counts = self._counts
        if counts[caller.key_id] >= limit:
            return False
        counts[caller.key_id] += 1
        return True

    def release(self, caller: Caller) -> None:
        if self._limits[caller.key_id] > 0:  # resolved by its acquire
            self._counts[caller.key_id] -= 1

    def _limit(self, caller: Caller) -> int:
        """limit_of, resolved once per key (the keys are the configured few) and kept."""
        limit = self._limits[caller.key_id] = self.limit_of(caller)
        return limit

    def in_flight(self, caller: Caller) -> int:
        return self._counts[caller.key_id]
