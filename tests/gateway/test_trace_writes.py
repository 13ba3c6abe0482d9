"""A trace's hold on the client channel's writes (transport/trace.py, app/metrics.py): without an
access log, the channel's writes go straight to its transport once the answer's head is through
(a streamed chunk costs no call of the trace's); with one, every byte is counted."""

from __future__ import annotations

from types import SimpleNamespace

from lobes_gateway.app.access_log import AccessLog
from lobes_gateway.app.metrics import Metrics

HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
CHUNKS = [b"5\r\nhello\r\n", b"0\r\n\r\n"]


def channel(sent: list[bytes]) -> SimpleNamespace:
    """A client channel as a trace uses it: a `write` attribute, its transport's own write."""
    return SimpleNamespace(write=sent.append)


def test_without_an_access_log_writes_after_the_head_go_straight_to_the_transport():
    sent: list[bytes] = []
    client = channel(sent)
    transport_write = client.write
    metrics = Metrics(None)
    trace = metrics.begin(client)
    assert client.write == trace.write
    client.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert client.write == trace.write  # an interim head is not the answer's
    client.write(HEAD)
    assert client.write is transport_write
    for chunk in CHUNKS:
        client.write(chunk)
    assert trace.status == 200 and trace.first_byte > 0
    named = b"\r\nX-Request-Id: %s\r\n" % trace.request_id.encode()
    assert sent[1] == HEAD.replace(b"\r\n", named, 1)
    assert sent[2:] == CHUNKS
    metrics.end(trace, client)
    assert client.write is transport_write


def test_with_an_access_log_every_byte_goes_through_the_trace_and_is_counted(tmp_path):
    sent: list[bytes] = []
    client = channel(sent)
    access_log = AccessLog(str(tmp_path / "access.log"))
    try:
        metrics = Metrics(access_log)
        trace = metrics.begin(client)
        client.write(HEAD)
        assert client.write == trace.write
        for chunk in CHUNKS:
            client.write(chunk)
        assert trace.bytes == sum(map(len, sent)) and sent[-2:] == CHUNKS
        metrics.end(trace, client)
    finally:
        access_log.close()
