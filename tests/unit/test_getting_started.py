"""The reader of docs/getting-started.md's checks (extensions/molecule/mesh/tests/guide.py),
which the mesh scenario runs against its hosts: what it takes from the guide, how it matches
what a command printed, and that each failure the guide shows can be made in the example
inventory the guide copies."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location(
    "guide", ROOT / "extensions" / "molecule" / "mesh" / "tests" / "guide.py")
guide = importlib.util.module_from_spec(_SPEC)
sys.modules["guide"] = guide  # its dataclass looks its module up there
_SPEC.loader.exec_module(guide)


def test_the_guide_has_checked_steps_each_with_what_it_shows() -> None:
    steps = guide.read_steps(ROOT / "docs" / "getting-started.md")
    assert len(steps) >= 8
    assert all(guide.GUIDE_INVENTORY in step.command and step.expected for step in steps)
    assert {step.failure for step in steps if step.failure} == set(guide.BREAKS)


def test_a_checked_block_must_be_one_bash_command(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- checked -->\n```bash\nls\nls\n```\n")
    with pytest.raises(ValueError, match="line 2: a checked block is one bash command"):
        guide.read_steps(page)


def test_expected_lines_match_with_gaps_and_any_spacing() -> None:
    output = "PLAY RECAP\nspark    : ok=3  changed=0  unreachable=0  failed=0\nthor : failed=1\n"
    assert guide.missing_lines(("PLAY RECAP", "...", "spark ... unreachable=0 failed=0"),
                               output) == []
    assert guide.missing_lines(("thor ... failed=0",), output) == ["thor ... failed=0"]
    # A line's words must be there as written, not only somewhere in it.
    assert guide.missing_lines(("failed=0 spark",), output) == ["failed=0 spark"]
    assert guide.missing_lines(("spark : ok=3 changed=1",), output) == ["spark : ok=3 changed=1"]


@pytest.mark.parametrize("name", sorted(guide.BREAKS))
def test_each_failure_is_made_in_a_copy_of_the_example_inventory(name: str, tmp_path: Path) -> None:
    source = ROOT / "inventories" / "tailnet"
    copy = guide.copy_inventory(source, tmp_path / "mymesh")
    guide.BREAKS[name](copy)
    changed = [path.relative_to(copy) for path in copy.rglob("*.yml")
               if path.read_text() != (source / path.relative_to(copy)).read_text()]
    assert len(changed) == 1, changed
