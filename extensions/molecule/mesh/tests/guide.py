"""docs/getting-started.md as the checks read it: its checked commands and what each shows.

A command block is checked when the line before it is `<!-- checked -->`, or
`<!-- checked: break=NAME -->` for a failure the guide shows (the check makes that failure in
a copy of the inventory first: `BREAKS`). The `text` block right after a checked command is what
a person should see: each of its lines must appear in the command's output (in any order: hosts
print as they finish), where `...` stands for any text and a run of spaces for any run of
spaces. A line `...` alone says lines are left out.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

GUIDE_INVENTORY = "inventories/mymesh"
_MARK = re.compile(r"^<!-- checked(?:: break=(?P<brk>[a-z-]+))? -->$")
_FENCE = re.compile(r"^```(?P<lang>[a-z]*)$")


@dataclass(frozen=True)
class Step:
    """One checked command of the guide, what it must print, and the break it needs."""

    command: str
    expected: tuple[str, ...]
    failure: str | None
    line: int


def _blocks(lines: list[str]) -> list[tuple[int, str, list[str], str | None]]:
    """(line, language, body, mark's break or "" when checked, None when not) per fenced block."""
    blocks, index = [], 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        end = lines.index("```", index + 1)
        mark = _MARK.match(lines[index - 1]) if index else None
        blocks.append((index + 1, fence["lang"], lines[index + 1:end],
                       (mark["brk"] or "") if mark else None))
        index = end + 1
    return blocks


def read_steps(guide: Path) -> list[Step]:
    """The guide's checked commands in the order a person runs them."""
    blocks = _blocks(guide.read_text().splitlines())
    steps = []
    for position, (line, lang, body, mark) in enumerate(blocks):
        if mark is None:
            continue
        if lang != "bash" or len(body) != 1:
            raise ValueError(f"line {line}: a checked block is one bash command")
        after = blocks[position + 1] if position + 1 < len(blocks) else None
        expected = tuple(after[2]) if after and after[1] == "text" and after[3] is None else ()
        steps.append(Step(body[0], expected, mark or None, line))
    return steps


def _pattern(line: str) -> re.Pattern[str]:
    parts = [r"\s+".join(re.escape(word) for word in part.split())
             for part in line.strip().split("...")]
    return re.compile(".*?".join(parts))


def missing_lines(expected: tuple[str, ...], output: str) -> list[str]:
    """The expected lines no line of `output` matches (empty when all match). In any order:
    Ansible prints hosts as they finish."""
    lines = output.splitlines()
    return [want for want in expected if want.strip() != "..."
            and not any(_pattern(want).search(line) for line in lines)]


def copy_inventory(source: Path, target: Path) -> Path:
    """A writable copy of the scenario's inventory (its links followed)."""
    shutil.copytree(source, target, symlinks=False)
    return target


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if old not in text:
        raise AssertionError(f"{path} has no {old!r} to break")
    path.write_text(text.replace(old, new, 1))


# The failures the guide shows, made as a person would make them, in the inventory's files.
BREAKS: dict[str, Callable[[Path], None]] = {
    "ssh": lambda inv: _append(inv / "host_vars" / "agx-thor.yml",
                               "ansible_host: agx-thor.invalid\n"),
    "role-name": lambda inv: _replace(inv / "host_vars" / "spark.yml",
                                      "  senses:\n    context: 32768",
                                      "  sensse:\n    context: 32768"),
    "memory": lambda inv: _replace(inv / "host_vars" / "spark.yml",
                                   "gpu_memory_utilization: 0.30",
                                   "gpu_memory_utilization: 0.70"),
}
