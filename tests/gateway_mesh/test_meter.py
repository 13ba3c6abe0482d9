"""Counting a relayed stream's completion tokens without parsing its chunks."""

import pytest
from lobes_gateway.app.meter import CountingWriter, completion_tokens


class Sink:
    """The client side: what the relay wrote, and the transport relay() looks at."""

    transport = object()

    def __init__(self):
        self.written = []

    def write(self, data):
        self.written.append(data)


def event(json_text):
    return b"data: " + json_text.encode() + b"\n\n"


def test_content_events_are_counted_and_done_is_not():
    sink = Sink()
    counted = CountingWriter(sink)
    counted.write(b"HTTP/1.1 200 OK\r\n\r\n")
    counted.write(b"a\r\n" + event('{"choices":[{"delta":{"content":"x"}}]}') * 3 + b"\r\n")
    counted.write(event('{"choices":[{"delta":{"content":"y"}}]}') + b"data: [DONE]\n\n")
    assert (counted.completion_tokens, counted.done) == (4, 1)
    assert b"".join(sink.written).count(b"data: ") == 5  # relayed untouched


def test_a_usage_chunk_wins_over_the_event_count():
    counted = CountingWriter(Sink())
    counted.write(event('{"choices":[{"delta":{"content":"x"}}]}') * 2)
    counted.write(event('{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":7}}'))
    counted.write(b"data: [DONE]\n\n")
    assert counted.completion_tokens == 7


@pytest.mark.parametrize(("body", "tokens"), [
    (b'{"usage": {"prompt_tokens": 9, "completion_tokens": 7, "total_tokens": 16}}', 7),
    (b'{"usage": {"completion_tokens" :\n 12}}', 12),
    # The last key counts: an answer quoting an earlier usage in its own fields.
    (b'{"a": {"completion_tokens": 3}, "usage": {"completion_tokens": 5}}', 5),
    # The last key has no count: the one before it that has one.
    (b'{"a": {"completion_tokens": 3}, "usage": {"completion_tokens": null}}', 3),
    (b'{"usage": {"completion_tokens": null}}', 0),
    (b'{"usage": null}', 0),
    (b'{"content": "\\"completion_tokens\\": 99"}', 0),  # quoted inside a string
    (b"", 0),
])
def test_a_json_answers_completion_tokens_are_its_last_counted_key(body, tokens):
    assert completion_tokens(body) == tokens
