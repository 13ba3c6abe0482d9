"""A relayed stream's meter: its tokens from the engine's usage alone (never from counting
events), its usage chunk left out where only the gateway asked for it, and a stream that ends
without its answer told from one that ended whole."""

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lobes_gateway.app.meter import StreamMeter, asking_usage, completion_tokens
from lobes_gateway.transport.chunked import ChunkDecoder


class Sink:
    """The client side: what the relay wrote, and the transport relay() looks at."""

    transport = object()

    def __init__(self):
        self.written = []

    def write(self, data):
        self.written.append(data)

    def events(self) -> list[bytes]:
        """The events written, chunk framing taken off."""
        payload = ChunkDecoder().feed(b"".join(self.written))
        return [event for event in payload.split(b"\n\n") if event]


def chunk(*events: str) -> bytes:
    payload = b"".join(b"data: " + e.encode() + b"\n\n" for e in events)
    return b"%x\r\n%s\r\n" % (len(payload), payload)


TOKEN = '{"choices":[{"index":0,"delta":{"content":"xy"},"finish_reason":null}]}'
ENGINE_ERROR_EVENT = ('{"error":{"message":"EngineCore encountered an issue",'
                      '"type":"InternalServerError","code":500}}')
FINISH = '{"choices":[{"index":0,"delta":{"content":"z"},"finish_reason":"stop"}]}'
USAGE = '{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":7,"total_tokens":16}}'


def test_tokens_come_from_the_usage_never_from_the_events():
    meter = StreamMeter(Sink(), strip_usage=False)
    meter.write(chunk(TOKEN, TOKEN, TOKEN))  # three events: not three tokens
    assert meter.usage_tokens is None
    meter.write(chunk(FINISH))
    meter.write(chunk(USAGE))
    meter.write(chunk("[DONE]"))
    assert (meter.usage_tokens, meter.finished, meter.done, meter.cut) == (7, True, True, False)


def test_a_usage_only_the_gateway_asked_for_is_read_and_left_out():
    sink = Sink()
    meter = StreamMeter(sink, strip_usage=True)
    for each in (chunk(TOKEN), chunk(FINISH), chunk(USAGE), chunk("[DONE]")):
        meter.write(each)
    assert meter.usage_tokens == 7
    assert b"usage" not in b"".join(sink.written)
    assert [json.loads(e[6:]) for e in sink.events()[:-1]] == [json.loads(TOKEN),
                                                               json.loads(FINISH)]
    assert sink.events()[-1] == b"data: [DONE]"


def test_several_events_in_one_chunk_keep_all_but_the_usage():
    sink = Sink()
    meter = StreamMeter(sink, strip_usage=True)
    meter.write(chunk(TOKEN, FINISH, USAGE, "[DONE]"))
    assert sink.events() == [b"data: " + TOKEN.encode(), b"data: " + FINISH.encode(),
                             b"data: [DONE]"]


@pytest.mark.parametrize("ending", [
    pytest.param([chunk(TOKEN), chunk("[DONE]")], id="done-after-a-content-event"),
    pytest.param([chunk(TOKEN), chunk(ENGINE_ERROR_EVENT), chunk("[DONE]")],
                 id="error-event-then-done"),
])
def test_an_engine_that_stops_ends_its_stream_cut_not_answered(ending):
    sink = Sink()
    meter = StreamMeter(sink, strip_usage=True)
    for each in ending:
        meter.write(each)
    assert meter.cut and not meter.finished
    assert b"[DONE]" not in b"".join(sink.written)  # the relay writes its own error event
    assert b"EngineCore" not in b"".join(sink.written)


@pytest.mark.parametrize(("options", "sent", "strip"), [
    (None, {"include_usage": True}, True),
    ({"continuous_usage_stats": True}, {"continuous_usage_stats": True, "include_usage": True},
     True),
    ({"include_usage": True}, {"include_usage": True}, False),
    ({"include_usage": False}, {"include_usage": True}, True),
])
def test_every_stream_asks_for_its_usage_and_remembers_who_asked(options, sent, strip):
    payload = {"stream": True} if options is None else {"stream": True,
                                                        "stream_options": options}
    asked, stripped = asking_usage(payload)
    assert (asked["stream_options"], stripped) == (sent, strip)
    assert asking_usage({"stream": True, "stream_options": "bad"}) == (
        {"stream": True, "stream_options": "bad"}, False)  # the engine refuses it


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


def test_an_aborted_request_is_cut_and_its_abort_never_reaches_the_caller():
    """vLLM stopping (SIGTERM) may end a stream with finish_reason "abort" and [DONE]."""
    sink = Sink()
    meter = StreamMeter(sink, strip_usage=True)
    aborted = TOKEN.replace('"finish_reason":null', '"finish_reason":"abort"')
    for each in (chunk(TOKEN), chunk(aborted), chunk("[DONE]")):
        meter.write(each)
    assert meter.cut and not meter.finished
    events = [json.loads(e[6:]) for e in sink.events()]
    assert [c["finish_reason"] for e in events for c in e["choices"]] == [None, None]
    assert [c["delta"]["content"] for e in events for c in e["choices"]] == ["xy", "xy"]


# The rule the meter's cheaper scans stand for: a chunk is read further when it carries a usage,
# the end, an upstream error event or an abort; a finish_reason with a value, but an abort,
# marks the stream finished.
_NOTABLE = re.compile(rb'"usage"|data: \[DONE\]|data: \{"error"|"finish_reason"\s*:\s*"abort"')
_FINISHED = re.compile(rb'"finish_reason"\s*:\s*"(?!abort")')


class RuleMeter(StreamMeter):
    """The meter as that rule says it, one search per rule, to hold the fast one to."""

    __slots__ = ()

    def write(self, data):
        if self.first_event_at is None and b"data: " in data:
            self.first_event_at = 0.0
        if _FINISHED.search(data) is not None:
            self.finished = True
        if _NOTABLE.search(data) is not None:
            data = self._read_notable(data)
        if data:
            self._client.write(data)


_EVENTS = st.sampled_from([
    TOKEN, FINISH, USAGE, "[DONE]", ENGINE_ERROR_EVENT,
    TOKEN.replace('"finish_reason":null', '"finish_reason":"abort"'),
    TOKEN.replace('"finish_reason":null', '"finish_reason" :\t"abort"'),
    TOKEN.replace('"finish_reason":null', '"finish_reason" : "length"'),
    '{"choices":[],"usage":null}',
    '{"choices":[{"index":0,"delta":{"content":"\\"usage\\" data: [DONE]"},"finish_reason":null}]}',
])


@given(st.lists(st.lists(_EVENTS, min_size=1, max_size=3), max_size=8), st.booleans())
def test_the_meters_scans_read_the_chunks_its_rule_names(chunks, strip):
    fast_sink, rule_sink = Sink(), Sink()
    fast, rule = StreamMeter(fast_sink, strip), RuleMeter(rule_sink, strip)
    for events in chunks:
        fast.write(chunk(*events))
        rule.write(chunk(*events))
    assert fast_sink.written == rule_sink.written
    seen = ("finished", "done", "cut", "usage_tokens", "usage_data", "upstream_error")
    assert [getattr(fast, name) for name in seen] == [getattr(rule, name) for name in seen]
