"""Chunked bodies read from upstream, by the grammar (RFC 9112 7.1) and in linear time.

A gear or a peer writes the chunked framing of a streamed answer; the gateway relays it. Two
readers share one grammar here:
  - scan_chunks, the fast path: how much of a buffer is whole chunks with plain size lines,
    which the relay writes to the client as they came;
  - ChunkDecoder, everything else: any split of the bytes, chunk extensions, trailers, chunks
    too large to hold. It keeps only an unfinished size or trailer line (bounded), never chunk
    data, so a huge chunk costs one pass over its bytes.
Anything the grammar does not allow (a signed, prefixed or padded size, data not followed by
CRLF, a line past its bound) raises ValueError: the answer is broken, never passed on.
"""

from __future__ import annotations

import re

# chunk-size = 1*HEXDIG, bounded here; then CRLF (a plain line) or chunk extensions.
_PLAIN_LINE = re.compile(rb"[0-9A-Fa-f]{1,16}\r\n")
_UNFINISHED_LINE = re.compile(rb"[0-9A-Fa-f]{1,16}\r?")
_TCHAR = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]"
_QUOTED = rb'"(?:[^"\\\x00-\x08\x0a-\x1f\x7f]|\\[^\x00-\x08\x0a-\x1f\x7f])*"'
_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})((?:[ \t]*;[ \t]*" + _TCHAR + rb"+(?:[ \t]*=[ \t]*(?:"
                        + _TCHAR + rb"+|" + _QUOTED + rb"))?)*)\r\n")
_FIELD = re.compile(_TCHAR + rb"+:[ \t]*(?:[\x21-\x7e\x80-\xff](?:[ \t\x21-\x7e\x80-\xff]*"
                    rb"[\x21-\x7e\x80-\xff])?)?[ \t]*")
# A chunk-size line longer than this is malformed, and so is a trailer section longer than
# MAX_TRAILER_BYTES.
MAX_CHUNK_LINE = 4096
MAX_TRAILER_BYTES = 16 * 1024
_CRLF = b"\r\n"


def chunk_size(line: bytes) -> int:
    """The size a chunk-size line (ending CRLF) gives; a ValueError when it is not one."""
    found = _SIZE_LINE.fullmatch(line)
    if found is None:
        raise ValueError(f"malformed chunk-size line {line[:40]!r}")
    return int(found.group(1), 16)


def is_field_line(line: bytes) -> bool:
    """Whether `line` (without its CRLF) is a well-formed header or trailer field."""
    return _FIELD.fullmatch(line) is not None


def scan_chunks(buffer: bytes) -> tuple[int, bool]:
    """(where the whole chunks with plain size lines at the start of `buffer` end, whether the
    last chunk starts there). Past that point the decoder judges the bytes."""
    pos = 0
    size_of_buffer = len(buffer)
    plain = _PLAIN_LINE.match
    # pos < size first: a buffer of whole chunks (the usual read) ends with no failed match.
    while pos < size_of_buffer and (line := plain(buffer, pos)) is not None:
        eol = line.end()
        size = int(buffer[pos:eol - 2], 16)
        if size == 0:
            return pos, True
        after = eol + size + 2
        if after > size_of_buffer or not buffer.startswith(_CRLF, after - 2):
            return pos, False
        pos = after
    return pos, False


def unfinished_chunk(buffer: bytes, limit: int) -> bool:
    """Whether `buffer` is the start of one plain chunk of at most `limit` bytes in all, not
    whole yet (worth holding until it is, to pass it on as it came)."""
    line = _PLAIN_LINE.match(buffer)
    if line is None:  # a size line still coming, or one the decoder must judge
        return _UNFINISHED_LINE.fullmatch(buffer) is not None
    whole = line.end() + int(buffer[:line.end() - 2], 16) + 2
    return len(buffer) < whole <= limit


class ChunkDecoder:
    """Decodes a chunked body fed in pieces of any size into its data, strictly.

    `ended` once the last chunk came, `done` once its trailers ended too, and `clean` then when
    nothing followed them (the connection may carry another answer).
    """

    __slots__ = ("_crlf", "_held", "_left", "_trailers", "between_chunks", "clean", "done",
                 "ended")

    def __init__(self) -> None:
        self._held = b""  # an unfinished size or trailer line
        self._left = 0  # data bytes of the current chunk still to come
        self._crlf = 0  # bytes of the CRLF after the current chunk's data still to come
        self._trailers = 0  # trailer bytes read so far
        self.ended = False
        self.done = False
        self.clean = False
        # Whether the next byte starts a chunk-size line, with nothing held from before: kept
        # as a field, not a property, since the relay asks it on every read.
        self.between_chunks = True

    def feed(self, data: bytes) -> bytes:
        """The chunk data that `data` carries (b"" for none); raises ValueError on bad framing
        or on bytes after the end."""
        return self._run(data, False)[0]

    def take(self, data: bytes) -> tuple[bytes, int]:
        """As feed, but stopping where the current chunk ends: (its data, how many bytes of
        `data` were read), the rest left to the caller."""
        return self._run(data, True)

    def _run(self, data: bytes, one_chunk: bool) -> tuple[bytes, int]:
        if self.done:
            if data:
                self.clean = False
            return b"", len(data)
        held = len(self._held)
        if held:
            data, self._held = self._held + data, b""
        pieces: list[bytes] = []
        pos, size_of_data = 0, len(data)
        while pos < size_of_data and not self.done:
            if self._left:
                take = min(self._left, size_of_data - pos)
                pieces.append(data[pos:pos + take])
                pos += take
                self._left -= take
                if not self._left:
                    self._crlf = 2
            elif self._crlf:
                pos = self._expect_crlf(data, pos)
                if one_chunk and not self._crlf:
                    break
            elif self.ended:
                pos = self._trailer_line(data, pos)
            else:
                pos = self._size_line(data, pos)
        if self.done:
            self.clean = pos == size_of_data
        self.between_chunks = not (self._held or self._left or self._crlf or self.ended)
        payload = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        return payload, pos - held

    def _expect_crlf(self, data: bytes, pos: int) -> int:
        wanted = _CRLF[2 - self._crlf:]
        got = data[pos:pos + len(wanted)]
        if not wanted.startswith(got):
            raise ValueError("chunk data not followed by CRLF")
        self._crlf -= len(got)
        return pos + len(got)

    def _line(self, data: bytes, pos: int, limit: int, what: str) -> bytes | None:
        """The line (with its CRLF) at `pos`, or None when it is not whole yet (held)."""
        eol = data.find(_CRLF, pos)
        if eol < 0:
            if len(data) - pos > limit:
                raise ValueError(f"{what} longer than {limit} bytes")
            self._held = data[pos:]
            return None
        if eol + 2 - pos > limit:
            raise ValueError(f"{what} longer than {limit} bytes")
        return data[pos:eol + 2]

    def _size_line(self, data: bytes, pos: int) -> int:
        line = self._line(data, pos, MAX_CHUNK_LINE, "chunk-size line")
        if line is None:
            return len(data)
        size = chunk_size(line)
        if size:
            self._left = size
        else:
            self.ended = True
        return pos + len(line)

    def _trailer_line(self, data: bytes, pos: int) -> int:
        line = self._line(data, pos, MAX_TRAILER_BYTES - self._trailers, "trailer section")
        if line is None:
            return len(data)
        self._trailers += len(line)
        if line == _CRLF:
            self.done = True
        elif not is_field_line(line[:-2]):
            raise ValueError(f"malformed trailer field {line[:40]!r}")
        return pos + len(line)
