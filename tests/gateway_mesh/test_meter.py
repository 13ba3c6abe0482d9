"""Counting a relayed stream's completion tokens without parsing its chunks."""

from lobes_gateway.app.meter import CountingWriter


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
