"""Which checkpoint revisions on a box a prune removes: every revision (final or staging) under
the models directory that no gear of the box's plan loads, never one a running process uses.

The deciding is a pure function over a listing (`decide`), so hostile listings can be tested
without a disk; `listing`, `users` and `remove` are the few steps that touch the box. Used by
lobes.fleet.model_prune.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ansible_collections.lobes.fleet.plugins.module_utils.model_files import (
    COMMIT,
    PARTIAL,
    check_checkpoint,
)
from ansible_collections.lobes.fleet.plugins.module_utils.model_progress import progress_path

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")


@dataclass(frozen=True)
class Held:
    """A revision directory under the models directory: `<org>/<name>/<rev>`, or the same
    under `.partial/` when it is a copy being assembled."""

    checkpoint: str
    revision: str
    staging: bool

    @property
    def rel(self) -> str:
        """Its path relative to the models directory."""
        final = f"{self.checkpoint}/{self.revision}"
        return f"{PARTIAL}/{final}" if self.staging else final


def parse(rel: object) -> Held | None:
    """A listing entry as a revision directory, or None for anything else (never a candidate):
    only `<org>/<name>/<40-hex>` and `.partial/<org>/<name>/<40-hex>` with plain names."""
    if not isinstance(rel, str):
        return None
    parts = rel.split("/")
    staging = parts[0] == PARTIAL
    if staging:
        parts = parts[1:]
    if len(parts) != 3 or not COMMIT.match(parts[2]):
        return None
    if not all(_NAME.match(part) for part in parts[:2]):
        return None
    checkpoint = f"{parts[0]}/{parts[1]}"
    try:
        check_checkpoint(checkpoint)
    except ValueError:
        return None
    return Held(checkpoint, parts[2], staging)


@dataclass
class Decision:
    """What a prune removes, and what it keeps although unplanned because a process uses it."""

    remove: list[Held] = field(default_factory=list)
    in_use: list[tuple[Held, list[str]]] = field(default_factory=list)


def decide(entries: Iterable[object], planned: Mapping[str, str | None],
           used: Mapping[str, list[str]]) -> Decision:
    """Decide over a listing of entries relative to the models directory.

    planned: checkpoint -> the revision the box's gears load; None keeps every revision of
    that checkpoint (the plan's revision is not known yet). used: an entry -> the
    processes that use that directory. An entry that is not a revision directory is left alone.
    """
    decision = Decision()
    for held in sorted({h for h in map(parse, entries) if h}, key=lambda h: h.rel):
        if held.checkpoint in planned and planned[held.checkpoint] in (None, held.revision):
            continue
        users = used.get(held.rel)
        if users:
            decision.in_use.append((held, sorted(users)))
        else:
            decision.remove.append(held)
    return decision


def revision_of(path: str, roots: Iterable[str]) -> str | None:
    """The `<org>/<name>/<rev>` (or `.partial/...`) a path names or lies in, under any root."""
    if not path.startswith("/"):
        return None
    normal = posixpath.normpath(path)
    for root in roots:
        root = posixpath.normpath(root)
        if normal.startswith(root + "/"):
            parts = normal[len(root) + 1:].split("/")
            size = 4 if parts[0] == PARTIAL else 3
            held = parse("/".join(parts[:size]))
            if held:
                return held.rel
    return None


def uses(argv: Iterable[str], mapped: Iterable[str], roots: Iterable[str]) -> set[str]:
    """The revisions a process uses: named by an argument (`--model=PATH` too) or a file it
    maps (weights are mmapped), under any of roots."""
    roots = list(roots)
    found = set()
    for item in [*argv, *mapped]:
        for candidate in (item, item.partition("=")[2]):
            rel = revision_of(candidate, roots)
            if rel:
                found.add(rel)
    return found


def _read(path: str, mode: str = "rb") -> bytes:
    try:
        with open(path, mode) as handle:
            return handle.read()
    except OSError:
        return b""


def _process(proc_root: str, pid: str) -> tuple[list[str], list[str]]:
    """A process's argv and the files it maps, as /proc shows them (empty when gone)."""
    raw = _read(os.path.join(proc_root, pid, "cmdline"))
    argv = [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]
    mapped = []
    for line in _read(os.path.join(proc_root, pid, "maps")).decode("utf-8", "replace").splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/"):
            mapped.append(fields[5])
    return argv, mapped


def users(model_dir: str, proc_root: str, mounts: Iterable[str] = ()) -> dict[str, list[str]]:
    """`<org>/<name>/<rev>` -> the running processes that use it ("pid N (argv)"), found by
    their command lines and mapped files under the models directory (its real path too) or a
    container's mount of it."""
    roots = {model_dir, os.path.realpath(model_dir), *mounts}
    found: dict[str, list[str]] = {}
    me = str(os.getpid())
    try:
        pids = [name for name in os.listdir(proc_root) if name.isdigit() and name != me]
    except OSError:
        return found
    for pid in pids:
        argv, mapped = _process(proc_root, pid)
        # An argument may be a link into the models directory: its target counts too.
        targets = [os.path.realpath(arg) for arg in argv if arg.startswith("/")]
        for rel in uses([*argv, *targets], mapped, roots):
            found.setdefault(rel, []).append(f"pid {pid} ({' '.join(argv)[:120]})")
    return found


def _walk(directory: str, depth: int) -> list[list[str]]:
    """Name paths of plain directories `depth` levels below directory, links never followed."""
    if depth == 0:
        return [[]]
    found = []
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except OSError:
        return found
    for entry in entries:
        if entry.is_dir(follow_symlinks=False) and _NAME.match(entry.name):
            found += [[entry.name, *rest] for rest in _walk(entry.path, depth - 1)]
    return found


def listing(model_dir: str) -> list[str]:
    """The revision directories under model_dir, final and staging, relative to it. A link is
    never followed nor listed, so nothing outside the models directory is ever a candidate."""
    found = ["/".join(parts) for parts in _walk(model_dir, 3)]
    partial = os.path.join(model_dir, PARTIAL)
    if os.path.isdir(partial) and not os.path.islink(partial):
        found += [f"{PARTIAL}/" + "/".join(parts) for parts in _walk(partial, 3)]
    return [rel for rel in found if parse(rel)]


def remove(model_dir: str, held: Held) -> str:
    """Remove one revision directory, its checkpoint's directories left empty and the progress
    file of a copy of it that never finished; its path.

    Refuses (ValueError) a path that is a link or whose parents lead out of the models
    directory through a link: rmtree itself never follows links inside it.
    """
    path = os.path.join(model_dir, held.rel)
    parent = os.path.dirname(path)
    real_parent = os.path.join(os.path.realpath(model_dir), os.path.dirname(held.rel))
    if os.path.islink(path) or os.path.realpath(parent) != real_parent:
        raise ValueError(f"{path} is a link or lies behind one: not removed")
    shutil.rmtree(path)
    with contextlib.suppress(FileNotFoundError):  # else status.yml shows it stalled for ever
        os.unlink(progress_path(model_dir, held.checkpoint, held.revision))
    for _level in range(2):  # <name>, then <org>, when nothing else is left in them
        try:
            os.rmdir(parent)
        except OSError:
            break
        parent = os.path.dirname(parent)
    return path
