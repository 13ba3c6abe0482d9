"""Chunk framing as the event-stream pass-through sees it: whole chunks only, then trailers."""

from __future__ import annotations

import pytest
from lobes_gateway.app.relay import _scan_chunks, _trailers_end

TWO_EVENTS = b"6\r\ndata:1\r\n6\r\ndata:2\r\n"


def test_complete_chunks_pass_and_the_last_chunk_is_found():
    assert _scan_chunks(TWO_EVENTS) == (len(TWO_EVENTS), False, 0)
    assert _scan_chunks(TWO_EVENTS + b"0\r\n\r\n") == (len(TWO_EVENTS), True, 0)


def test_a_chunk_split_mid_data_is_held_back_with_the_bytes_it_still_needs():
    partial = TWO_EVENTS + b"6\r\nda"
    assert _scan_chunks(partial) == (len(TWO_EVENTS), False, 6)


def test_a_split_size_line_is_held_back_until_it_ends():
    assert _scan_chunks(TWO_EVENTS + b"1") == (len(TWO_EVENTS), False, 0)


def test_chunk_extensions_are_passed_verbatim():
    data = b"6;name=v\r\ndata:1\r\n"
    assert _scan_chunks(data) == (len(data), False, 0)


def test_a_malformed_size_line_is_an_error():
    with pytest.raises(ValueError):
        _scan_chunks(b"zz\r\ndata\r\n")


def test_trailers_end_after_the_blank_line_and_extra_bytes_make_it_unclean():
    assert _trailers_end(b"0\r\n\r\n") is True
    assert _trailers_end(b"0\r\nX-Checksum: 1\r\n\r\n") is True
    assert _trailers_end(b"0\r\nX-Checksum: 1\r\n") is None
    assert _trailers_end(b"0\r\n") is None
    assert _trailers_end(b"0\r\n\r\nHTTP/1.1 200 OK") is False
