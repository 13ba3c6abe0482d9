"""Heads parsed once per shape.

A keep-alive client, a backend and a peer gateway send the same head again and again, but for
the lines that differ from message to message: the body's length and the request id. A head is
split into those lines and the rest, its shape; a shape is parsed once and kept in a bounded
memo, so the usual request and response skip the header loop (about a tenth of the gateway's
per-request work).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Generic, TypeVar

# A per-message line with the CRLF before it, so a head's first line never matches: its value as
# group 1 (a length) or group 2 (an id). A line with an empty value, or space before its colon,
# stays in the shape, where the parsers refuse it.
_PER_MESSAGE = re.compile(rb"\r\n(?:content-length:[ \t]*([^ \t\r\n][^\r\n]*?)|"
                          rb"x-request-id:[ \t]*([^ \t\r\n][^\r\n]*?))[ \t]*(?=\r\n)", re.I)
# Heads longer than this are parsed each time rather than kept: a usual head is a few hundred
# bytes, and the memo's memory stays bounded whatever a hostile client sends.
MAX_SHAPE_BYTES = 4096
MAX_SHAPES = 256

Shape = TypeVar("Shape")
Key = bytes | str


def split_head(head: bytes) -> tuple[bytes, tuple[bytes, ...], tuple[bytes, ...]]:
    """A head's shape (the head without its per-message lines), then the values of its
    Content-Length lines and of its X-Request-Id lines, each in order."""
    parts = _PER_MESSAGE.split(head)
    if len(parts) == 1:
        return head, (), ()
    if len(parts) == 4:  # the usual: one line, a length or an id
        before, length, request_id, after = parts
        if request_id is None:
            return before + after, (length,), ()
        return before + after, (), (request_id,)
    # A match's values are never empty: filter(None) drops the other group's Nones.
    return b"".join(parts[::3]), tuple(filter(None, parts[1::3])), tuple(filter(None, parts[2::3]))


class ShapeMemo(Generic[Shape]):
    """Shapes parsed by `parse`, kept by their bytes (or text); the oldest dropped first beyond
    MAX_SHAPES, and none longer than MAX_SHAPE_BYTES kept."""

    __slots__ = ("_parse", "_shapes")

    def __init__(self, parse: Callable[[Any], Shape]) -> None:
        self._parse = parse
        self._shapes: dict[Key, Shape] = {}

    def parsed(self, key: Key) -> Shape:
        """The shape of `key`: kept, or parsed now (its errors raised, nothing kept)."""
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._parse(key)
            self._keep(key, shape)
        return shape

    def _keep(self, key: Key, shape: Shape) -> None:
        if len(key) > MAX_SHAPE_BYTES:
            return
        if len(self._shapes) >= MAX_SHAPES:
            del self._shapes[next(iter(self._shapes))]
        self._shapes[key] = shape
