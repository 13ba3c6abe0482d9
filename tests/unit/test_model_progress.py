"""A copy's progress file: rewritten atomically at most a few times a second, read back as
bytes, rate and time left, stalled when old, gone when whole; hostile records are skipped."""

from __future__ import annotations

import json
from pathlib import Path

from ansible_collections.lobes.fleet.plugins.module_utils.model_progress import (
    MIB,
    Progress,
    copies,
    figures,
    progress_path,
)
from hypothesis import given
from hypothesis import strategies as st

REV = "d" * 40


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_progress_is_written_throttled_and_read_back_with_rate_and_time_left(tmp_path: Path):
    clock = Clock()
    progress = Progress(str(tmp_path), "acme/chat", REV, total=10 * MIB, done=2 * MIB,
                        source="box-a", clock=clock)
    path = Path(progress_path(str(tmp_path), "acme/chat", REV))
    assert path.name == f"acme__chat@{REV}.json"
    clock.now += 0.1
    progress.add(MIB)
    assert json.loads(path.read_text())["bytes_done"] == 2 * MIB  # not rewritten yet
    clock.now += 0.9
    progress.add(MIB)
    [copy] = copies(str(tmp_path), stall_after=60, now=clock.now)
    assert (copy.bytes_done, copy.bytes_total, copy.rate) == (4 * MIB, 10 * MIB, 2 * MIB)
    assert copy.seconds_left == 3.0 and not copy.stalled
    assert copy.line() == (f"acme/chat@{REV[:12]} from box-a: 4.0 MiB of 10.0 MiB, "
                           "2.00 MiB/s, 3 s left")
    [stalled] = copies(str(tmp_path), stall_after=60, now=clock.now + 61)
    assert stalled.stalled and stalled.seconds_left is None and "STALLED" in stalled.line()
    progress.done()
    assert copies(str(tmp_path), stall_after=60) == [] and not path.exists()


@given(st.one_of(st.dictionaries(st.sampled_from(["bytes_done", "bytes_total", "rate", "updated",
                                                  "checkpoint", "revision", "source"]),
                                 st.one_of(st.integers(), st.floats(), st.text(), st.none(),
                                           st.booleans())),
                 st.lists(st.integers()), st.text(), st.none()))
def test_a_hostile_record_is_skipped_or_read_with_sane_figures(record):
    copy = figures(record, now=5.0, stall_after=60)
    if copy is not None:
        assert copy.bytes_done >= 0 and copy.age >= 0 and copy.rate >= 0
        assert copy.seconds_left is None or copy.seconds_left >= 0
        assert isinstance(copy.line(), str)
