"""What a prune of a box's models directory removes: only revision directories no gear of the
box plans and no running process uses, never anything a hostile listing or link points at
outside the directory (generated: hypothesis)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.lobes.fleet.plugins.module_utils.model_progress import progress_path
from ansible_collections.lobes.fleet.plugins.module_utils.model_prune import (
    Held,
    decide,
    listing,
    parse,
    remove,
    users,
    uses,
)
from hypothesis import given, settings
from hypothesis import strategies as st

OLD, NEW, OTHER = "a" * 40, "b" * 40, "c" * 40
PARTS = st.sampled_from(["..", ".", "", "org", "name", ".partial", OLD, "/", "\x00", "~", "a b",
                         "-x", "org\\name", "/etc", ".ssh"])
ENTRIES = st.lists(PARTS, min_size=0, max_size=6).map("/".join)


def test_unplanned_revisions_go_and_the_planned_one_and_those_in_use_stay():
    entries = [f"acme/chat/{OLD}", f"acme/chat/{NEW}", f".partial/acme/chat/{OTHER}",
               f"acme/embed/{OLD}", f"acme/gone/{OLD}", ".ssh/known_hosts", "acme/chat/config.json"]
    used = {f"acme/gone/{OLD}": ["pid 7 (vllm)"]}
    decision = decide(entries, {"acme/chat": NEW, "acme/embed": None}, used)
    assert [held.rel for held in decision.remove] == [f".partial/acme/chat/{OTHER}",
                                                      f"acme/chat/{OLD}"]
    assert decision.in_use == [(Held("acme/gone", OLD, False), ["pid 7 (vllm)"])]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(ENTRIES, st.text(max_size=60)), max_size=8))
def test_a_hostile_listing_yields_only_plain_revision_paths_inside_the_directory(entries):
    root = "/srv/models"
    for held in decide(entries, {}, {}).remove:
        path = os.path.join(root, held.rel)
        assert os.path.normpath(path) == path and path.startswith(root + "/")
        assert parse(held.rel) == held and held.rel in entries


def test_a_process_uses_a_revision_by_argument_link_target_or_mount():
    roots = ["/srv/models", "/models"]
    assert uses(["vllm", "--model", f"/srv/models/acme/chat/{OLD}"], [], roots) == {
        f"acme/chat/{OLD}"}
    assert uses([f"--model=/models/acme/chat/{OLD}/"], [], roots) == {f"acme/chat/{OLD}"}
    assert uses([], [f"/srv/models/acme/chat/{NEW}/model.safetensors"], roots) == {
        f"acme/chat/{NEW}"}
    elsewhere = ["/srv/models", "/srv/models/acme", "/elsewhere/acme/chat/" + OLD]
    assert uses(elsewhere, [], roots) == set()


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    for rel in (f"acme/chat/{OLD}", f"acme/chat/{NEW}", f".partial/acme/chat/{OTHER}"):
        (root / rel).mkdir(parents=True)
        (root / rel / "model.safetensors").write_bytes(b"w" * 64)
    return root


def test_links_are_never_listed_followed_or_removed_through(models: Path, tmp_path: Path):
    outside = tmp_path / "outside" / "acme" / "chat" / OTHER
    outside.mkdir(parents=True)
    (outside / "keep").write_text("mine")
    (models / "evil").symlink_to(tmp_path / "outside" / "acme")  # an org that is a link
    (models / "acme" / "chat" / OTHER).symlink_to(outside)  # a revision that is a link
    assert sorted(listing(str(models))) == [f".partial/acme/chat/{OTHER}", f"acme/chat/{OLD}",
                                            f"acme/chat/{NEW}"]
    with pytest.raises(ValueError, match="link"):
        remove(str(models), Held("evil/chat", OTHER, False))
    with pytest.raises(ValueError, match="link"):
        remove(str(models), Held("acme/chat", OTHER, False))
    assert (outside / "keep").read_text() == "mine"


def test_removing_takes_empty_checkpoint_directories_and_a_stale_progress_file_along(
        models: Path):
    stale = Path(progress_path(str(models), "acme/chat", OTHER))
    stale.parent.mkdir()
    stale.write_text("{}")
    remove(str(models), Held("acme/chat", OTHER, True))
    assert not stale.exists()
    assert not (models / ".partial" / "acme").exists() and (models / ".partial").is_dir()
    remove(str(models), Held("acme/chat", OLD, False))
    assert (models / "acme" / "chat" / NEW).is_dir()


def test_a_running_process_naming_a_revision_is_found(models: Path):
    path = models / "acme" / "chat" / OLD
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(path)])
    try:
        for _try in range(50):  # until its command line is in /proc
            found = users(str(models), "/proc")
            if found:
                break
            time.sleep(0.1)
        assert list(found) == [f"acme/chat/{OLD}"]
        assert found[f"acme/chat/{OLD}"][0].startswith(f"pid {proc.pid} (")
    finally:
        proc.kill()
        proc.wait()
    assert users(str(models), "/proc") == {}
