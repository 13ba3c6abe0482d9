"""The load generator holds every stream of the gateway bench in one process: a connect that
failed on the client's own limits (descriptors, ephemeral ports, memory) is counted as the
client's, so a proxy is not blamed for what the client could not do."""

from __future__ import annotations

import errno
import importlib.util
import sys
from collections import Counter
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

# bench/ is not a package: its loadgen module is loaded from its file.
_SPEC = importlib.util.spec_from_file_location(
    "bench_loadgen", Path(__file__).resolve().parents[2] / "bench" / "loadgen.py")
loadgen = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = loadgen  # its dataclasses look their module up there
_SPEC.loader.exec_module(loadgen)


def test_running_out_of_descriptors_is_the_clients_failure():
    assert loadgen.connect_failure(OSError(errno.EMFILE, "Too many open files")) == \
        "client: connect: EMFILE"


def test_a_refused_connect_is_the_proxys_failure():
    assert loadgen.connect_failure(ConnectionRefusedError(errno.ECONNREFUSED, "refused")) == \
        "connect: ECONNREFUSED"


def test_an_error_without_an_errno_is_named_by_its_type():
    assert loadgen.connect_failure(TimeoutError()) == "connect: TimeoutError"


@given(st.sampled_from(sorted(errno.errorcode)))
def test_only_the_clients_own_limits_count_as_its_failures(code):
    label = loadgen.connect_failure(OSError(code, "any"))

    assert label.startswith(loadgen.CLIENT_FAILURE) == (code in loadgen.CLIENT_ERRNOS)
    assert label.endswith(errno.errorcode[code])


def test_a_result_counts_the_clients_failures_apart_from_all():
    failures = Counter({"client: connect: EADDRNOTAVAIL": 3, "connect: ECONNRESET": 2,
                        "stalled or ended before the sample": 4})
    result = loadgen.StreamsResult(opened=10, live_at_sample=6, open_s=1.0, failures=failures,
                                   sample=None)

    assert (result.failed, result.client_failed) == (9, 3)
