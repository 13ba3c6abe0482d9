"""A request's JSON body: read once, within bounds, and changed member by member.

The gateway routes by a few top-level members (model, priority, stream, ...) and sometimes
changes them (the served model's name, the request's priority, usage asked of a stream). It
reads the body once, strictly: a JSON object, its top-level keys each once (a front proxy that
reads the first `model` and this gateway the last would disagree about where a request goes),
finite numbers only (NaN, Infinity and overflowing numbers are not JSON a gear can read back),
nested within the parser's depth and, for a large body, within MAX_ELEMENTS values. What it
sends on is the caller's own bytes, with only the members it changed written anew: nothing
else is altered, and a large body is never encoded again.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from json.decoder import scanstring
from typing import AnyStr

from .errors import ApiError

# A body larger than this has its values counted before it is parsed (a 30 MB array of {}
# would take about 800 MB as Python objects); smaller ones cannot hold enough to matter.
COUNTED_BODY_BYTES = 1024 * 1024
MAX_ELEMENTS = 1_000_000
_WS = r"[ \t\n\r]*"
# The common top-level member: a key without escapes or control characters (JSON allows none
# raw in a string), its colon and the value's start; any other key, escaped or refused, is left
# to the standard scanner.
_FIRST = re.compile(_WS + r"\{" + _WS + r'(?:"([^"\\\x00-\x1f]*)"' + _WS + ":" + _WS + r"|\})")
_NEXT = re.compile(_WS + r'(?:,' + _WS + r'"([^"\\\x00-\x1f]*)"' + _WS + ":" + _WS
                   + r"|\}" + _WS + ")")
# Strings, taken out before the structure of a large body is counted.
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BOM = b"\xef\xbb\xbf"
_WHITESPACE = re.compile(_WS).match


class BodyError(Exception):
    """A body the gateway will not read: the error to answer with."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


def _invalid(detail: str, param: str | None = None) -> BodyError:
    return BodyError(ApiError(400, "invalid_request_error", "invalid_json",
                              f"request body is not valid JSON ({detail}); send a JSON object",
                              param=param))


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:24]} is out of range")
    return value


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite)
_SCAN = _DECODER.scan_once
# A body this small with at most this many objects (the usual chat request) is read by one call
# of the C scanner, its members' spans found only if a member is changed: the member-by-member
# walk cost three times as much. A body of many objects is walked: the pairs hook below is a
# Python call per object. Objects are counted only past _UNCOUNTED_BYTES (a pass over the bytes
# that costs more than the few objects such a body can hold).
_WHOLE_BYTES = 16 * 1024
_WHOLE_OBJECTS = 8
_UNCOUNTED_BYTES = 512


class _RepeatedKey(ValueError):
    """An object of the body read whole names a key twice: the walk reads it instead."""


def _object(pairs: list[tuple[str, object]]) -> dict:
    """The scanner's object_pairs_hook: an object as the default decoder makes it, unless it
    names a key twice. Any object, nested ones too, sends the body to the walk, which refuses
    a repeated top-level key only (a nested one goes on as the caller sent it)."""
    made = dict(pairs)
    if len(made) != len(pairs):
        raise _RepeatedKey
    return made


_SCAN_WHOLE = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite,
                               object_pairs_hook=_object).scan_once


class JsonBody:
    """A parsed JSON object body: its payload, and where each top-level member's value lies in
    the caller's text, so a changed member is written without encoding the rest."""

    __slots__ = ("_spans", "_text", "payload", "raw")

    def __init__(self, raw: bytes, text: str, payload: dict,
                 spans: list[tuple[str, int, int]] | None) -> None:
        self.raw = raw  # the caller's bytes (without a byte-order mark)
        self._text = text
        self.payload = payload
        # (key, start, end) of each member's value in _text, in order; None until a changed
        # member needs them (a body read whole).
        self._spans = spans

    def encode(self, sent: dict) -> bytes:
        """The bytes for `sent`, a payload made from this one by replacing or adding top-level
        members: the caller's bytes, with each member whose value is not the very object
        parsed written anew (replaced where it stands, or added at the end)."""
        original = self.payload
        if sent is original:
            return self.raw
        edits = [(start, end, _dumps(sent[key])) for key, start, end in self._changed(sent)]
        added = [f"{_dumps(key)}:{_dumps(value)}" for key, value in sent.items()
                 if key not in original]
        if added:
            close = self._text.rindex("}")
            edits.append((close, close, ("," if original else "") + ",".join(added)))
        if len(self.raw) == len(self._text):
            # ASCII text (the usual body): its offsets are the bytes' own, so the bytes are cut
            # and joined once, never decoded or encoded again.
            return _spliced(self.raw, [(start, end, new.encode()) for start, end, new in edits])
        return _spliced(self._text, edits).encode()

    def _changed(self, sent: dict) -> list[tuple[str, int, int]]:
        """The spans of the members whose value in `sent` is not the one parsed."""
        original = self.payload
        if self._spans is None:
            if all(sent[key] is value for key, value in original.items()):
                return []
            self._spans = _walk(self._text, _scan)[1]
        return [span for span in self._spans if sent[span[0]] is not original[span[0]]]


def _spliced(whole: AnyStr, edits: list[tuple[int, int, AnyStr]]) -> AnyStr:
    """`whole` with each (start, end) span, in order, replaced by its new text."""
    pieces = []
    at = 0
    for start, end, new in edits:
        pieces += [whole[at:start], new]
        at = end
    pieces.append(whole[at:])
    return whole[:0].join(pieces)


# ASCII: a lone surrogate the caller escaped is carried as its escape, never re-encoded. One
# encoder for all: json.dumps with arguments builds a new one per call (a stream's added
# stream_options cost two of them).
_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def parse_body(raw: bytes, sliced: bool = False) -> JsonBody:
    """Read a request body as a JSON object, within bounds; raises BodyError (a 400 or 413
    that names what is wrong). `sliced`: each top-level array is read value by value, so a
    thread reading a large body lets others run between its values."""
    if raw.startswith(_BOM):  # allowed, never passed on (RFC 8259 8.1)
        raw = raw[3:]
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise _invalid(f"not UTF-8 at byte {exc.start}") from None
    size = len(raw)
    if size > COUNTED_BODY_BYTES:
        _check_elements(raw)
    if not sliced and (size <= _UNCOUNTED_BYTES
                       or (size <= _WHOLE_BYTES and raw.count(b"{") <= _WHOLE_OBJECTS)):
        # Read whole by one call of the C scanner; anything but an object of unique keys with
        # nothing around it (or an error) is left to the walk, which words why.
        try:
            payload, end = _SCAN_WHOLE(text, 0)
        except (StopIteration, ValueError, RecursionError):
            end = -1
        if end == len(text) and isinstance(payload, dict):
            return JsonBody(raw, text, payload, None)
    try:
        payload, spans = _walk(text, _scan_sliced if sliced else _scan)
    except RecursionError:
        raise _invalid("nested too deeply; flatten the request") from None
    except ValueError as exc:
        raise _invalid(str(exc)) from None
    return JsonBody(raw, text, payload, spans)


def _check_elements(raw: bytes) -> None:
    """A large body's values, counted first: every value past the first in a container follows
    a comma, so commas and containers bound them; strings are taken out only when that bound
    is over the limit."""
    if raw.count(b",") + raw.count(b"[") + raw.count(b"{") <= MAX_ELEMENTS:
        return
    bare = _STRINGS.sub(b"", raw)
    if bare.count(b",") + bare.count(b"[") + bare.count(b"{") > MAX_ELEMENTS:
        raise BodyError(ApiError(413, "invalid_request_error", "too_many_elements",
                                 f"the request body holds more than {MAX_ELEMENTS} JSON values; "
                                 "send fewer (split the batch)"))


Scan = Callable[[str, int], tuple[object, int]]


def _walk(text: str, scan: Scan) -> tuple[dict, list[tuple[str, int, int]]]:
    """The top-level object, member by member (each value parsed by `scan`): the payload and
    its members' spans; a ValueError for anything but one object of unique keys."""
    found = _FIRST.match(text)
    if found is None:
        return _walk_escaped(text, scan)
    payload: dict = {}
    spans: list[tuple[str, int, int]] = []
    while (key := found.group(1)) is not None:
        start = found.end()
        value, end = scan(text, start)
        payload[key] = value
        spans.append((key, start, end))
        found = _NEXT.match(text, end)
        if found is None:
            return _walk_escaped(text, scan)
    if len(payload) != len(spans):
        raise _duplicate(spans)
    if found.end() != len(text):
        raise ValueError("extra data after the object")
    return payload, spans


def _walk_escaped(text: str, scan: Scan) -> tuple[dict, list[tuple[str, int, int]]]:
    """The walk for any other spelling (escaped keys, malformed text): slower, and it words the
    error exactly."""
    index = _skip(text, 0)
    if text[index:index + 1] != "{":
        if index < len(text):
            _DECODER.decode(text)  # words a syntax error; a valid value is not an object
        raise ValueError("expected a JSON object")
    payload: dict = {}
    spans: list[tuple[str, int, int]] = []
    index = _skip(text, index + 1)
    if text[index:index + 1] == "}":
        return payload, spans
    while True:
        if text[index:index + 1] != '"':
            raise ValueError(f"expected a member name at char {index}")
        key, index = scanstring(text, index + 1)
        index = _skip(text, index)
        if text[index:index + 1] != ":":
            raise ValueError(f"expected ':' at char {index}")
        start = _skip(text, index + 1)
        value, end = scan(text, start)
        payload[key] = value
        spans.append((key, start, end))
        index = _skip(text, end)
        if text[index:index + 1] == "}":
            break
        if text[index:index + 1] != ",":
            raise ValueError(f"expected ',' or '}}' at char {index}")
        index = _skip(text, index + 1)
    if len(payload) != len(spans):
        raise _duplicate(spans)
    if _skip(text, index + 1) != len(text):
        raise ValueError("extra data after the object")
    return payload, spans


def _scan(text: str, start: int) -> tuple[object, int]:
    try:
        return _SCAN(text, start)
    except StopIteration:
        raise ValueError(f"expected a value at char {start}") from None


def _scan_sliced(text: str, start: int) -> tuple[object, int]:
    """A value as _scan reads it, an array one value at a time."""
    if not text.startswith("[", start):
        return _scan(text, start)
    items: list[object] = []
    index = _skip(text, start + 1)
    if text.startswith("]", index):
        return items, index + 1
    while True:
        value, index = _scan(text, index)
        items.append(value)
        index = _skip(text, index)
        if text.startswith("]", index):
            return items, index + 1
        if not text.startswith(",", index):
            raise ValueError(f"expected ',' or ']' at char {index}")
        index = _skip(text, index + 1)


def _skip(text: str, index: int) -> int:
    """Where the whitespace at `index` ends."""
    return _WHITESPACE(text, index).end()


def _duplicate(spans: list[tuple[str, int, int]]) -> BodyError:
    seen: set[str] = set()
    key = next(key for key, _start, _end in spans if key in seen or seen.add(key))
    return _invalid(f"the member {key[:64]!r} appears more than once; send it once", key)
