"""Heads parsed once per shape (transport/heads.py): the per-message lines are split off
exactly, a shape is shared only where nothing else differs, and the memo stays bounded."""

from __future__ import annotations

import pytest
from lobes_gateway.transport import heads
from lobes_gateway.transport.heads import ShapeMemo, split_head
from lobes_gateway.transport.http import HttpError, parse_head

HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nAuthorization: Bearer k\r\n\r\n")


def test_the_length_and_the_id_are_split_off_in_any_case_and_the_rest_is_kept():
    head = (b"POST / HTTP/1.1\r\ncontent-LENGTH:  12 \r\nHost: x\r\nX-Request-ID: abc\r\n"
            b"Content-Length: 13\r\n\r\n")
    shape, lengths, ids = split_head(head)
    assert shape == b"POST / HTTP/1.1\r\nHost: x\r\n\r\n"
    assert lengths == (b"12", b"13")
    assert ids == (b"abc",)


def test_a_head_without_per_message_lines_is_its_own_shape():
    head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    assert split_head(head) == (head, (), ())


@pytest.mark.parametrize("line", [
    b"Content-Length : 5",  # space before the colon: the parser refuses it
    b"Content-Length:",  # no value
    b"Content-Length: \t",
    b"X-Content-Length: 5",  # another header that merely ends so
])
def test_a_line_that_is_not_a_clean_per_message_line_stays_in_the_shape(line):
    head = b"POST / HTTP/1.1\r\nHost: x\r\n" + line + b"\r\n\r\n"
    shape, lengths, ids = split_head(head)
    assert shape == head and lengths == () and ids == ()


def test_the_first_line_is_never_taken_for_a_header():
    head = b"Content-Length: 5 / HTTP/1.1\r\nHost: x\r\n\r\n"
    assert split_head(head)[0] == head
    with pytest.raises(HttpError):
        parse_head(head)


def test_requests_of_one_shape_each_get_their_own_length_and_headers():
    first, second = parse_head(HEAD % 10), parse_head(HEAD % 2048)
    assert first.headers["content-length"] == "10"
    assert second.headers["content-length"] == "2048"
    first.headers["x-request-id"] = "mine"  # the trace writes its id into its request's headers
    assert "x-request-id" not in second.headers
    assert "x-request-id" not in parse_head(HEAD % 10).headers
    # The block forwarded upstream carries neither line (each hop frames its own body), nor the
    # caller's key; the request's own headers keep both.
    assert second.header_block == "Content-Type: application/json\r\n"
    assert second.headers["authorization"] == "Bearer k"


def test_a_length_sent_twice_is_refused_even_when_the_shape_is_known():
    parse_head(HEAD % 5)
    head = HEAD.replace(b"Host: x\r\n", b"Host: x\r\nContent-Length: 5\r\n") % 5
    with pytest.raises(HttpError, match="more than once"):
        parse_head(head)


def test_chunked_framing_with_a_length_is_refused_also_once_its_shape_is_known():
    chunked = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
               b"\r\n")
    assert parse_head(chunked).headers["transfer-encoding"] == "chunked"
    with pytest.raises(HttpError, match="both Transfer-Encoding and Content-Length"):
        parse_head(chunked[:-2] + b"Content-Length: 4\r\n\r\n")


def test_the_memo_keeps_at_most_its_bound_dropping_the_oldest_and_no_long_shape():
    parses: list[bytes] = []

    def parse(key: bytes) -> int:
        parses.append(key)
        return len(parses)

    memo: ShapeMemo[int] = ShapeMemo(parse)
    for number in range(heads.MAX_SHAPES + 10):
        memo.parsed(b"shape %d" % number)
    assert memo.parsed(b"shape 10") == 11  # kept: not parsed again
    assert memo.parsed(b"shape %d" % (heads.MAX_SHAPES + 9)) == heads.MAX_SHAPES + 10
    assert len(parses) == heads.MAX_SHAPES + 10
    assert memo.parsed(b"shape 0") == heads.MAX_SHAPES + 11  # dropped first: parsed again
    assert memo.parsed(b"shape 9") == heads.MAX_SHAPES + 12
    long_shape = b"x" * (heads.MAX_SHAPE_BYTES + 1)
    assert memo.parsed(long_shape) == memo.parsed(long_shape) - 1  # never kept
