"""Fault knobs (what the serving port does wrong) and the recorder of what it received."""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import asdict, dataclass, fields
from typing import Any

RECORDED_REQUESTS = 200


class FaultError(ValueError):
    """A fault set that cannot be applied; the message names the field and the fix."""


@dataclass(frozen=True)
class Faults:
    """The active fault set; the default value is a healthy server."""

    refuse: bool = False  # stop listening on the serving port (connection refused)
    error_status: int = 0  # answer every request with this 5xx status
    hang: bool = False  # accept the request, never send a byte
    hang_s: float = 0.0  # wait this long (simulated seconds) before the first byte
    die_after_chunks: int = 0  # close the socket after this many SSE chunks of a stream
    die_mid_body: bool = False  # a POST's JSON answer: its head and half its body, then close
    slow_factor: float = 1.0  # every engine step takes this many times longer
    reject_strict_tools: bool = False  # chat requests with a strict tool get vLLM's 400
    # The engine core dies: streams end in-band with vLLM's error event, then the process exits.
    engine_dead: bool = False

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


_KNOBS = {field.name: field for field in fields(Faults)}


def _check(name: str, value: Any, expected: type) -> Any:
    if expected is bool and not isinstance(value, bool):
        raise FaultError(f"fault {name!r} must be true or false, got {value!r}")
    if expected in (int, float) and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise FaultError(f"fault {name!r} must be a number, got {value!r}")
    return expected(value)


def parse_faults(document: Any) -> Faults:
    """Faults from the JSON body of POST /admin/faults; unknown or ill-typed knobs are refused."""
    if not isinstance(document, dict):
        raise FaultError("the fault set must be a JSON object, e.g. {} to clear every fault")
    unknown = sorted(set(document) - set(_KNOBS))
    if unknown:
        raise FaultError(f"unknown fault knob(s) {unknown}; known knobs: {sorted(_KNOBS)}")
    values = {
        name: _check(name, value, type(getattr(Faults(), name)))
        for name, value in document.items()
    }
    faults = Faults(**values)
    if faults.error_status and not 500 <= faults.error_status <= 599:
        raise FaultError(f"error_status must be a 5xx status, got {faults.error_status}")
    if faults.slow_factor <= 0:
        raise FaultError(f"slow_factor must be positive, got {faults.slow_factor}")
    if faults.hang_s < 0 or faults.die_after_chunks < 0:
        raise FaultError("hang_s and die_after_chunks must not be negative")
    return faults


class RequestRecorder:
    """The last requests the serving port received, for tests that check what a gateway sent."""

    def __init__(self, limit: int = RECORDED_REQUESTS) -> None:
        self._entries: deque[dict[str, Any]] = deque(maxlen=limit)

    def record(self, method: str, target: str, headers: dict[str, str], body: bytes) -> None:
        self._entries.append(
            {
                "method": method,
                "path": target,
                "headers": dict(headers),
                "body": body.decode("utf-8", errors="replace"),
                "body_length": len(body),
                "body_sha256": hashlib.sha256(body).hexdigest(),
            }
        )

    def entries(self) -> list[dict[str, Any]]:
        return list(self._entries)

    def clear(self) -> None:
        self._entries.clear()
