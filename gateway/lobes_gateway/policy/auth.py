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
        if token is not None and hmac.compare_digest(token, self._key):
            return _CLIENT
        return None


class InflightLimits:
    """Counts requests in flight per client key; the fleet key and the ungated are exempt.

    One key is counted (the client key), so its count is one integer.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._client_count = 0

    def acquire(self, caller: Caller) -> bool:
        """Count one more request for `caller`; False when its limit is reached."""
        if caller.key_id != CLIENT or self.limit <= 0:
            return True
        if self._client_count >= self.limit:
            return False
        self._client_count += 1
        return True

    def release(self, caller: Caller) -> None:
        if caller.key_id == CLIENT and self.limit > 0:
            self._client_count -= 1

    def in_flight(self, caller: Caller) -> int:
        return self._client_count if caller.key_id == CLIENT else 0
