"""The pieces of /metrics and the access log that need no process: buckets, escaping, the
access log's bounded queue."""

from __future__ import annotations

import json

from lobes_gateway.app import access_log
from lobes_gateway.app.access_log import AccessLog
from lobes_gateway.app.exposition import Exposition
from lobes_gateway.app.metrics import BUCKETS, Histogram
from lobes_gateway.transport.trace import Trace
from prometheus_client.parser import text_string_to_metric_families


def test_a_value_on_a_bucket_bound_counts_in_that_bucket():
    histogram = Histogram()
    for value in (0.001, 0.0010001, 300.0, 301.0):
        histogram.observe(value)
    assert histogram.counts[0] == 1  # le="0.001"
    assert histogram.counts[1] == 1  # le="0.0025"
    assert histogram.counts[len(BUCKETS) - 1] == 1  # le="300.0"
    assert histogram.counts[-1] == 1  # +Inf only
    assert histogram.sum == 0.001 + 0.0010001 + 300.0 + 301.0


def test_label_values_are_escaped_so_a_parser_reads_them_back():
    value = 'a "quoted"\\ value\nwith a newline'
    out = Exposition()
    out.family("lobes_gateway_example_total", "counter", "An example.",
               [((("target", value),), 3)])
    [family] = text_string_to_metric_families(out.text().decode())
    assert [(dict(s.labels), s.value) for s in family.samples] == [({"target": value}, 3.0)]


def finished(n: int) -> Trace:
    trace = Trace(lambda data: None, 100.0, f"id-{n}")
    trace.ended = 100.5
    return trace


def test_a_full_queue_drops_and_counts_lines_and_close_writes_the_rest(tmp_path, monkeypatch):
    monkeypatch.setattr(access_log, "MAX_PENDING", 5)
    path = tmp_path / "access.log"
    log = AccessLog(str(path))  # the writer never started: nothing is written until close
    for n in range(8):
        log.push(finished(n))
    assert log.dropped == 3
    log.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["request_id"] for line in lines] == [f"id-{n}" for n in range(5)]
    assert (lines[0]["status"], lines[0]["duration_s"], lines[0]["ttfb_s"]) == (499, 0.5, None)
