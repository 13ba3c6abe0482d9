"""The tests' own port picker: each pytest-xdist worker draws from its own slice, so a port one
worker's test frees for a moment (a service it restarts) is never drawn by the other's."""

from __future__ import annotations

import pytest

from tests.support import ports


@pytest.fixture
def two_workers(monkeypatch):
    def as_worker(name: str) -> tuple[int, int]:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", name)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
        return ports._this_workers_range()
    return as_worker


def test_two_workers_draw_from_disjoint_slices_below_the_ephemeral_range(two_workers):
    first, second = two_workers("gw0"), two_workers("gw1")

    assert first[0] == ports._LOWEST
    assert first[1] <= second[0]
    assert second[1] <= ports._ephemeral_floor()


def test_a_block_is_drawn_within_its_workers_slice(two_workers):
    low, high = two_workers("gw1")

    base = ports.free_block(8)

    assert low <= base and base + 8 <= high


def test_a_single_process_draws_from_the_whole_range(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)

    assert ports._this_workers_range() == (ports._LOWEST, ports._ephemeral_floor())
