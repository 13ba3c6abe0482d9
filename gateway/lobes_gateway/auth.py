"""The bearer gate, the fleet key, and per-key in-flight limits."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

ANONYMOUS = "anonymous"
CLIENT = "client"
FLEET = "fleet"


@dataclass(frozen=True)
class Caller:
    """Who sent a request, as far as keys tell: anonymous, the client key, or the fleet key."""

    key_id: str

    @property
    def is_fleet(self) -> bool:
        return self.key_id == FLEET


_ANONYMOUS = Caller(ANONYMOUS)
_CLIENT = Caller(CLIENT)
_FLEET = Caller(FLEET)


def _bearer(header: str | None) -> bytes | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token.encode()


class Gate:
    """Identifies callers; with no GATEWAY_API_KEY there is no gate at all."""

    def __init__(self, api_key: str | None, fleet_key: str | None) -> None:
        self._key = api_key.encode() if api_key else None
        self._fleet = fleet_key.encode() if fleet_key else None

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def identify(self, authorization: str | None) -> Caller | None:
        """The caller, or None when the gate is on and the key is missing or wrong."""
        token = _bearer(authorization)
        if (token is not None and self._fleet is not None
                and hmac.compare_digest(token, self._fleet)):
            return _FLEET
        if self._key is None:
            return _ANONYMOUS
        if token is not None and hmac.compare_digest(token, self._key):
            return _CLIENT
        return None


class InflightLimits:
    """Counts requests in flight per client key; the fleet key and the ungated are exempt."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._counts: dict[str, int] = {}

    def acquire(self, caller: Caller) -> bool:
        """Count one more request for `caller`; False when its limit is reached."""
        if self.limit <= 0 or caller.key_id != CLIENT:
            return True
        count = self._counts.get(caller.key_id, 0)
        if count >= self.limit:
            return False
        self._counts[caller.key_id] = count + 1
        return True

    def release(self, caller: Caller) -> None:
        if self.limit > 0 and caller.key_id == CLIENT:
            self._counts[caller.key_id] -= 1

    def in_flight(self, caller: Caller) -> int:
        return self._counts.get(caller.key_id, 0)
