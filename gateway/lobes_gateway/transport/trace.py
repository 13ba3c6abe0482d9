"""One request's record, taken where the request already passes: its answer's status, bytes and
first-byte time from the client channel's writes, its id, and what routing made of it.

While a request is answered, the client Channel's `write` is the trace's: the answer's head gets
the request's `X-Request-Id` and gives its status and first-byte time; every byte is counted
where an access log reads the count (without one, the channel's later writes go straight to its
transport once the head is through: a streamed chunk costs no call of the trace's).
app/ fills in the role, route reason, replica and tokens; metrics and the access log read it
once the request has ended.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Protocol

# A caller's X-Request-Id is kept only when it is short and made of these characters.
_SAFE_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_STATUS_LINE = b"HTTP/1.1 "
_CONTINUE = 100
# Nothing was answered: the client left, or the connection broke first (nginx's convention).
CLIENT_CLOSED = 499
UNROUTED = "none"


class NamedRequest(Protocol):
    """What a trace reads of a request to name it (transport/http.py's Request), so the
    request's module may hold its trace without the two importing each other."""

    method: str
    path: str
    headers: dict[str, str]
    request_id: str | None


class Writing(Protocol):
    """What a trace takes the writes of (transport/channel.py's Channel)."""

    write: Callable[[bytes], None]


class Trace:
    """What metrics and the access log learn of one request.

    Fields start as class-level defaults: a trace begins per request, and setting only what
    differs (its write, start and id) is a third of the work of setting every field.
    """

    first_byte = 0.0
    status = 0
    bytes = 0
    method = ""
    path = ""
    served = ""
    # The caller's key by name (anonymous, client, fleet or a named key), never the key;
    # empty until the gate has identified it.
    client = ""
    lane = "other"
    role = UNROUTED
    reason = UNROUTED  # the pool's route reason (X-Lobes-Route-Reason), else none
    tokens: int | None = None
    # The channel whose writes this trace took, handed its transport's own write back once the
    # answer's head is through; None while the bytes are counted (an access log reads them).
    hands_back: Writing | None = None

    def __init__(self, write: Callable[[bytes], None], started: float, request_id: str) -> None:
        self.sink = write  # the client transport's own write
        self.started = self.ended = started
        self.request_id = request_id

    def identify(self, req: NamedRequest, lane: str) -> None:
        """Name the request: method, path, lane, and its id: the caller's when it is short and
        safe, else this trace's own, which is then what every upstream hop is sent."""
        self.method, self.path, self.lane = req.method, req.path[:256], lane
        given = req.headers.get("x-request-id")
        if given is not None and _SAFE_ID.fullmatch(given):
            self.request_id = given
        else:
            req.headers["x-request-id"] = self.request_id
        req.request_id = self.request_id

    def write(self, data: bytes) -> None:
        """The client channel's write while the request is answered. The answer's head (not a
        100 Continue) gives the status and first-byte time, and gets the request's id."""
        if not self.status and data.startswith(_STATUS_LINE):
            status = int(data[9:12])
            if status != _CONTINUE:
                self.status = status
                self.first_byte = time.monotonic()
                # After the status line: one call that copies the answer once (a format of its
                # two slices cost twice the instructions).
                data = data.replace(
                    b"\r\n", b"\r\nX-Request-Id: " + self.request_id.encode() + b"\r\n", 1)
                if self.hands_back is not None:
                    self.hands_back.write = self.sink
        self.bytes += len(data)
        self.sink(data)

    @property
    def code(self) -> int:
        """The status answered, or CLIENT_CLOSED when no answer was sent."""
        return self.status or CLIENT_CLOSED
