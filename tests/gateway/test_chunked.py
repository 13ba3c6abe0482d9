"""Chunked bodies from upstream (transport/chunked.py): the fast scan passes only whole chunks
with plain size lines; the decoder reads any split of any well-formed body to the same data,
refuses what the grammar does not allow, and never holds chunk data."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lobes_gateway.transport.chunked import (
    MAX_CHUNK_LINE,
    MAX_TRAILER_BYTES,
    ChunkDecoder,
    scan_chunks,
    unfinished_chunk,
)

TWO_EVENTS = b"6\r\ndata:1\r\n6\r\ndata:2\r\n"


def test_complete_chunks_pass_and_the_last_chunk_is_found():
    assert scan_chunks(TWO_EVENTS) == (len(TWO_EVENTS), False)
    assert scan_chunks(TWO_EVENTS + b"0\r\n\r\n") == (len(TWO_EVENTS), True)


def test_the_scan_stops_before_anything_not_whole_and_plain():
    assert scan_chunks(TWO_EVENTS + b"6\r\nda") == (len(TWO_EVENTS), False)
    assert scan_chunks(TWO_EVENTS + b"1") == (len(TWO_EVENTS), False)
    assert scan_chunks(b"6;name=v\r\ndata:1\r\n") == (0, False)  # extensions: the decoder's
    assert scan_chunks(b"6\r\ndata:1XY") == (0, False)  # data not followed by CRLF


@pytest.mark.parametrize("line", [b"-a", b"-1", b"+2d", b"0x2d", b" 2d", b"2d ", b"2_d", b"zz",
                                  b"", b"1" * 17, b"2d;", b"2d;=v", b"2d;a=\"\x00\""])
def test_a_size_line_outside_the_grammar_is_refused(line):
    decoder = ChunkDecoder()
    with pytest.raises(ValueError):
        decoder.feed(line + b"\r\n" + b"x" * 45 + b"\r\n0\r\n\r\n")


def test_a_negative_size_never_moves_the_scan_backwards():
    """A size of -10 made the old scanner loop forever (100% CPU, every client hung)."""
    buffer = TWO_EVENTS + b"-10\r\n" + b"data:3\r\n" * 4
    assert scan_chunks(buffer) == (len(TWO_EVENTS), False)
    with pytest.raises(ValueError):
        ChunkDecoder().feed(buffer[len(TWO_EVENTS):])


def test_data_not_followed_by_crlf_is_refused_even_split_at_the_crlf():
    decoder = ChunkDecoder()
    assert decoder.feed(b"5\r\nhello\r") == b"hello"
    with pytest.raises(ValueError):
        decoder.feed(b"X0\r\n\r\n")


def test_lines_past_their_bounds_are_refused():
    with pytest.raises(ValueError):
        ChunkDecoder().feed(b"5;" + b"e" * MAX_CHUNK_LINE + b"\r\nhello\r\n")
    with pytest.raises(ValueError):  # still unfinished, and already too long
        ChunkDecoder().feed(b"5;" + b"e" * (MAX_CHUNK_LINE + 10))
    decoder = ChunkDecoder()
    decoder.feed(b"0\r\n")
    with pytest.raises(ValueError):
        decoder.feed((b"X-Trailer: " + b"t" * 1000 + b"\r\n") * (MAX_TRAILER_BYTES // 1000 + 1))


def test_a_malformed_trailer_is_refused_and_a_good_one_ends_the_body():
    with pytest.raises(ValueError):
        ChunkDecoder().feed(b"0\r\nBad Name: 1\r\n\r\n")
    decoder = ChunkDecoder()
    assert decoder.feed(b"5\r\nhello\r\n0\r\nX-Checksum: 1\r\n\r\n") == b"hello"
    assert decoder.done and decoder.clean


def test_bytes_after_the_end_make_the_body_unclean():
    decoder = ChunkDecoder()
    decoder.feed(b"0\r\n\r\nHTTP/1.1 200 OK\r\n")
    assert decoder.done and not decoder.clean
    late = ChunkDecoder()
    late.feed(b"0\r\n\r\n")
    assert late.clean
    late.feed(b"HTTP/1.1 200 OK\r\n")
    assert not late.clean


def test_a_huge_chunk_is_decoded_as_it_comes_without_holding_its_data():
    decoder = ChunkDecoder()
    size = 8 * 1024 * 1024
    assert decoder.feed(b"%x\r\n" % size) == b""
    piece = b"x" * 65536
    for _piece_number in range(size // len(piece)):
        assert decoder.feed(piece) == piece  # each piece comes out at once, in one pass
    assert decoder.feed(b"\r\n0\r\n\r\n") == b"" and decoder.done and decoder.clean


def test_only_small_plain_chunks_still_coming_are_worth_holding():
    assert unfinished_chunk(b"6\r\nda", 64)
    assert unfinished_chunk(b"1", 64)
    assert not unfinished_chunk(b"6\r\ndata:1XY", 64)  # whole, yet not followed by CRLF
    assert not unfinished_chunk(b"ffff\r\nda", 64)  # too large: passed on as it comes
    assert not unfinished_chunk(b"6;e=1\r\nda", 64)  # extensions: the decoder's


_CHUNKS = st.lists(st.binary(min_size=1, max_size=40), max_size=8)
_EXTENSION = st.sampled_from([b"", b";a", b";a=b", b' ; a = "q \\" x"', b";a;b=c"])


def _encode(chunks: list[bytes], extensions: list[bytes], trailers: bool) -> bytes:
    pairs = zip(chunks, extensions[:len(chunks)], strict=True)
    body = b"".join(b"%x%s\r\n%s\r\n" % (len(c), e, c) for c, e in pairs)
    return body + b"0\r\n" + (b"X-T: 1\r\nX-U:\r\n" if trailers else b"") + b"\r\n"


@settings(max_examples=300, deadline=None)
@given(chunks=_CHUNKS, extensions=st.lists(_EXTENSION, min_size=8, max_size=8),
       trailers=st.booleans(), cuts=st.lists(st.integers(min_value=0, max_value=400)))
def test_any_split_of_a_well_formed_body_decodes_to_its_data(chunks, extensions, trailers, cuts):
    body = _encode(chunks, extensions, trailers)
    decoder = ChunkDecoder()
    points = sorted({min(cut, len(body)) for cut in cuts} | {0, len(body)})
    data = b"".join(decoder.feed(body[a:b]) for a, b in itertools.pairwise(points))
    assert data == b"".join(chunks)
    assert decoder.done and decoder.clean
