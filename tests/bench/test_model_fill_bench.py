"""The model-fill benchmark's machinery on two boxes with a tiny checkpoint and no rate limit:
each of the three ways leaves every box holding the whole revision (every file's size and sha256
against the lock), the box-to-box copies go over the seed's sshd, the links get the rate asked,
and the teardown leaves no namespace behind."""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.lobes.fleet.plugins.module_utils.model_files import check_dir

# bench/ is not a package: the benchmark is loaded from its file.
_SPEC = importlib.util.spec_from_file_location(
    "model_fill_bench", Path(__file__).resolve().parents[2] / "bench" / "model_fill_bench.py")
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench  # its dataclasses look their module up there
_SPEC.loader.exec_module(bench)

PREFIX = "lfilltest"


def _require_namespaces() -> None:
    """Skip, saying why, where network namespaces and qdiscs cannot be made."""
    if os.geteuid() != 0:
        pytest.skip("the model-fill benchmark makes network namespaces and tc qdiscs: "
                    "it needs root")
    unmet = bench.unmet_needs()
    if unmet:
        pytest.skip(f"the model-fill benchmark cannot run here: {unmet}")


def _namespaces(prefix: str) -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30,
                            check=True).stdout.split()
    return [name for name in listed if name.startswith(f"{prefix}-")]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    _require_namespaces()
    layout = bench.Layout(prefix=PREFIX, subnet="10.231.78", count=2, rate_mbit=0)
    bench.teardown(layout)
    try:
        yield bench.start_fleet(layout, tmp_path_factory.mktemp("fill"), 3 << 20, 600)
    finally:
        bench.teardown(layout)


@pytest.mark.slow
@pytest.mark.parametrize("way", bench.WAYS)
def test_each_way_leaves_every_box_whole_and_box_to_box_copies_go_over_the_seeds_sshd(fleet, way):
    for box in fleet.boxes:  # nothing left from the way before
        shutil.rmtree(box.model_dir / bench.CHECKPOINT.split("/")[0], ignore_errors=True)
        assert not fleet.whole(box)
    logins = [box.sshd.connections() for box in fleet.boxes]

    bench.fill(fleet, way, 2)

    for box in fleet.boxes:
        report = check_dir(str(box.final(fleet.commit)), fleet.files, use_manifest=False)
        assert report.whole, (way, box.name, report)
    gained = [box.sshd.connections() - before
              for box, before in zip(fleet.boxes, logins, strict=True)]
    # The seed (b1) fetches from the hub; b2 pulls each file from it over ssh, one login a file,
    # in both ways that copy box to box, and opens no ssh at all when it fetches from the hub.
    assert gained == ([0, 0] if way == bench.HUB else [len(fleet.files), 0])


@pytest.mark.slow
def test_every_link_gets_the_rate_and_the_teardown_leaves_nothing_twice():
    _require_namespaces()
    layout = bench.Layout(prefix=f"{PREFIX}r", subnet="10.231.79", count=1, rate_mbit=250)
    bench.teardown(layout)
    try:
        bench.build(layout)
        for netns, device in ((layout.box(1), "eth0"), (layout.hub, "eth0"),
                              (layout.switch, "vb1"), (layout.switch, "vhub")):
            shown = subprocess.run(["tc", "-n", netns, "qdisc", "show", "dev", device],
                                   capture_output=True, text=True, timeout=30, check=True).stdout
            assert "tbf" in shown and "rate 250Mbit" in shown, (netns, device, shown)
    finally:
        bench.teardown(layout)
    assert _namespaces(layout.prefix) == []
    bench.teardown(layout)  # a second teardown (a crashed run's) finds nothing and fails not
    assert _namespaces(layout.prefix) == []


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 8, 15, 16])
def test_box_to_boxs_bar_is_the_whole_rounds_of_copies_a_fill_needs(count):
    # The hub fetch to the seed, then the rounds the benchmark runs (fill_rounds' schedule).
    rounds = bench.fill_rounds(["b1"], [f"b{i}" for i in range(2, count + 1)])
    assert bench.whole_rounds(count) == 1 + len(rounds) == 1 + math.ceil(math.log2(count))
    assert bench.Row(count, bench.BOX_TO_BOX, 1.0, 1.2 * bench.whole_rounds(count)).verdict \
        == "PASS"
    assert bench.Row(count, bench.BOX_TO_BOX, 1.0, 1.21 * bench.whole_rounds(count)).verdict \
        == "MISS"


def test_the_lock_holds_every_file_of_the_checkpoint_with_its_size_and_sha256():
    files = bench.checkpoint_files(3 << 20)
    lock = bench.lock_files("ab" * 20, files)
    assert set(lock) == set(files) and len(files) == 4
    assert sum(entry["size"] for entry in lock.values()) == sum(map(len, files.values()))
    assert all(entry["size"] == len(files[path]) for path, entry in lock.items())
    assert bench.checkpoint_files(3 << 20) == files  # the hub's process makes the same bytes
