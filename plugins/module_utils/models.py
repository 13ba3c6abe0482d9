"""Pinned models: the fleet's lock file, where each gear's checkpoint revision comes from, and
the arithmetic of placing checkpoints on boxes (disk room, box-to-box fill rounds).

The lock file (fleet.lock.yml, beside the inventory) holds the hub revision and file digests of
every checkpoint the fleet loads, and the digest of every image: generated, reviewed and
committed like any lock file. Nothing here makes a revision or a digest up: a pin comes from
the inventory, the catalog or the lock, and a gear with none is reported as unpinned.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ansible_collections.lobes.fleet.plugins.module_utils.errors import FleetError
from ansible_collections.lobes.fleet.plugins.module_utils.schema import closest

try:
    import yaml
except ImportError:  # the controller has PyYAML; a box running a module may not
    yaml = None

LOCK_FILE = "fleet.lock.yml"
LOCK_VERSION = 1
LOCK_HEADER = ("# Written by lobes.fleet (playbooks/models.yml, site.yml); review and commit it. "
               "docs/operations.md")
UPDATE_STEP = ("declare the wanted revision in the inventory, or delete the checkpoint's entry "
               f"from {LOCK_FILE} and run playbooks/models.yml to lock what the hub holds")

REVISION = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# A hub repository id: org/name, each part letters, digits and . _ -, neither starting nor
# ending with . or -, no '--' or '..' (the hub's own rule), at most 96 characters each.
_HUB_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
CHECKPOINT_ID = re.compile(rf"{_HUB_PART}/{_HUB_PART}")
# Checkpoints that never come from the hub: built on the box (lobes/tiny-*) or a local path.
LOCAL_NAMESPACE = "lobes/"
# A file path or an image reference, in characters: written as a YAML key, quoted with every
# character escaped it stays under the 1024 characters a YAML key may span.
MAX_TEXT = 400

DECLARED, LOCKED, UNPINNED = "declared", "locked", "unpinned"
_TOP_KEYS = ("version", "models", "images")
_MODEL_KEYS = ("revision", "files")
_FILE_KEYS = ("size", "sha256")
# A plain YAML scalar needs no quotes when it is one of these characters and reads back as
# the same text (not a number, a date, a boolean or null).
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]*")
GIB = 1024 ** 3


class LockError(ValueError):
    """A lock file that cannot be used: the file, the key path that is wrong, and the fix."""

    def __init__(self, source: str, path: str, message: str, fix: str) -> None:
        self.source = source
        self.path = path
        self.reason = message
        self.fix = fix
        super().__init__(f"{source}: {path or 'the file'}: {message}; {fix}")


@dataclass(frozen=True)
class LockedFile:
    size: int
    sha256: str


@dataclass(frozen=True)
class LockedModel:
    """One checkpoint as locked: its hub revision and its files, sorted by path."""

    revision: str
    files: tuple = ()  # ((relative path, LockedFile), ...)


@dataclass(frozen=True)
class FleetLock:
    """The lock file's content, each table sorted by its key."""

    models: tuple = ()  # ((checkpoint, LockedModel), ...)
    images: tuple = ()  # ((image reference, "sha256:..."), ...)

    def model(self, checkpoint: str) -> LockedModel | None:
        return dict(self.models).get(checkpoint)

    def image(self, ref: str) -> str | None:
        return dict(self.images).get(ref)


# ---------------------------------------------------------------- reading


def _key(name: object) -> str:
    """A mapping key as a key path shows it: quoted, escaped, cut when long."""
    text = json.dumps(name, ensure_ascii=True) if isinstance(name, str) else repr(name)
    return text if len(text) <= 80 else text[:60] + '..."'


def _child(path: str, name: object) -> str:
    """The key path of a mapping's key: path.name for a field name, path["name"] otherwise."""
    if isinstance(name, str) and re.fullmatch(r"[a-z0-9_]+", name):
        return f"{path}.{name}" if path else name
    return f"{path}[{_key(name)}]"


def _kind(value: object) -> str:
    return "empty" if value is None else type(value).__name__


class _Reader:
    """Checks one lock file's values, each against its key path."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, message: str, fix: str) -> LockError:
        return LockError(self.source, path, message, fix)

    def mapping(self, value: object, path: str, keys: tuple, required: tuple) -> dict:
        if not isinstance(value, dict):
            raise self.fail(path, f"is {_kind(value)}, not a mapping",
                            "write it as a mapping of " + ", ".join(keys))
        for name in value:
            if name not in keys:
                near = closest(name, keys)
                hint = f"did you mean {near!r}? " if near else ""
                raise self.fail(_child(path, name), "is not a known key",
                                f"{hint}the keys are " + ", ".join(keys))
        for name in required:
            if name not in value:
                raise self.fail(_child(path, name), "is missing",
                                "add it, or regenerate the entry with playbooks/models.yml")
        return value

    def table(self, value: object, path: str) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(path, f"is {_kind(value)}, not a mapping",
                            "write it as a mapping (`{}` when empty)")
        return value

    def text(self, value: object, path: str, pattern: re.Pattern, allowed: str) -> str:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise self.fail(path, f"{_key(value)} is not {allowed}",
                            f"write {allowed}, as the hub or registry gives it; never make one up")
        return value

    def read(self, data: object) -> FleetLock:
        top = self.mapping(data, "", _TOP_KEYS, ("version",))
        version = top["version"]
        if isinstance(version, bool) or version != LOCK_VERSION:
            raise self.fail("version", f"is {_key(version)}, not {LOCK_VERSION}",
                            f"this collection reads lock files of version {LOCK_VERSION}; "
                            "regenerate it with playbooks/models.yml")
        models = {self.checkpoint(name): self.model(entry, f"models[{_key(name)}]")
                  for name, entry in self.table(top.get("models"), "models").items()}
        images = {self.image_ref(ref): self.text(digest, f"images[{_key(ref)}]", DIGEST,
                                                 "a digest sha256:<64 lowercase hex digits>")
                  for ref, digest in self.table(top.get("images"), "images").items()}
        return FleetLock(tuple(sorted(models.items())), tuple(sorted(images.items())))

    def checkpoint(self, name: object) -> str:
        if not isinstance(name, str) or len(name) > 193 or not CHECKPOINT_ID.fullmatch(name) \
                or ".." in name or "--" in name:
            raise self.fail(f"models[{_key(name)}]", "is not a hub checkpoint id",
                            "name it org/name: letters, digits and . _ - (no '..' or '--')")
        return name

    def image_ref(self, ref: object) -> str:
        if not isinstance(ref, str) or not ref or len(ref) > MAX_TEXT or not ref.isprintable() \
                or any(char.isspace() for char in ref):
            raise self.fail(f"images[{_key(ref)}]", "is not an image reference",
                            "name the image as compose does: registry/name:tag, printable, "
                            "no spaces")
        return ref

    def model(self, entry: object, path: str) -> LockedModel:
        entry = self.mapping(entry, path, _MODEL_KEYS, _MODEL_KEYS)
        revision = self.text(entry["revision"], f"{path}.revision", REVISION,
                             "a revision of 40 lowercase hex digits")
        files = {self.file_path(name, f"{path}.files[{_key(name)}]"):
                 self.file(item, f"{path}.files[{_key(name)}]")
                 for name, item in self.table(entry["files"], f"{path}.files").items()}
        return LockedModel(revision, tuple(sorted(files.items())))

    def file_path(self, name: object, path: str) -> str:
        problem = _path_problem(name)
        if problem:
            raise self.fail(path, problem, "name the file by its path inside the checkpoint, "
                            "relative, with / between its parts")
        return name

    def file(self, item: object, path: str) -> LockedFile:
        item = self.mapping(item, path, _FILE_KEYS, _FILE_KEYS)
        size = item["size"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise self.fail(f"{path}.size", f"{_key(size)} is not a whole number of bytes",
                            "write the file's size in bytes (0 or more)")
        sha256 = self.text(item["sha256"], f"{path}.sha256", SHA256,
                           "a sha256 of 64 lowercase hex digits")
        return LockedFile(size, sha256)


def _path_problem(name: object) -> str | None:
    """Why `name` is not a file path inside a checkpoint, or None."""
    if not isinstance(name, str) or not name:
        return "is not a file path"
    if len(name) > MAX_TEXT:
        return f"is {len(name)} characters long; at most {MAX_TEXT}"
    if not name.isprintable():
        return "holds a control or unprintable character"
    if "\\" in name:
        return "holds a backslash"
    if name.startswith("/"):
        return "is an absolute path"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "has an empty, '.' or '..' part"
    return None


class _Duplicate(ValueError):
    """A mapping key written twice; _load says which file."""

    def __init__(self, key: object) -> None:
        super().__init__(key)
        self.key = key


def _refuse_aliases(text: str, source: str) -> None:
    """A lock file has no anchors or aliases (ours writes none): one that does is refused
    before it is built, so a few lines cannot expand into a huge document."""
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            raise LockError(source, "", "uses a YAML alias (*name)",
                            "write every value out; the lock file takes no anchors or aliases")


def _load(text: str, source: str) -> object:
    if yaml is None:
        raise LockError(source, "", "cannot be read without PyYAML", "run it on the controller")
    if not isinstance(text, str):
        raise LockError(source, "", "is not text", "give the file's content as text")
    try:
        _refuse_aliases(text, source)
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader
    except _Duplicate as duplicate:
        raise LockError(source, _key(duplicate.key), "is written twice",
                        "keep one entry (a merge left both)") from None
    # PyYAML's safe constructors raise plain errors of their own too: an impossible date
    # (ValueError), a key that cannot be one (TypeError), deep nesting (RecursionError).
    except (yaml.YAMLError, ValueError, TypeError, RecursionError, OverflowError) as exc:
        if isinstance(exc, LockError):
            raise
        reason = str(exc).strip().splitlines()
        raise LockError(source, "", f"is not YAML the lock file takes: "
                        f"{reason[0] if reason else type(exc).__name__}",
                        "fix the syntax, or regenerate the file with playbooks/models.yml") \
            from None


if yaml is not None:
    class _UniqueKeyLoader(yaml.SafeLoader):  # pylint: disable=too-many-ancestors
        """safe_load's loader that refuses a key written twice (a merge gone wrong) instead of
        keeping the last one."""

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _value_node in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:
                    duplicate = False  # unhashable: the base constructor refuses it
                if duplicate:
                    raise _Duplicate(key)
            return super().construct_mapping(node, deep=deep)


def parse_lock(text: str, source: str) -> FleetLock:
    """The lock file's content, every field checked; LockError naming file, key path and fix."""
    data = _load(text, source)
    try:
        return _Reader(source).read(data)
    except RecursionError:
        raise LockError(source, "", "is nested too deeply", "regenerate it with "
                        "playbooks/models.yml") from None


# ---------------------------------------------------------------- writing


def _scalar(text: str) -> str:
    """A YAML scalar that reads back as `text`: plain where it may be, else double-quoted."""
    if _PLAIN.fullmatch(text) and yaml is not None and yaml.safe_load(text) == text:
        return text
    return json.dumps(text, ensure_ascii=False)


def dump_lock(lock: FleetLock) -> str:
    """The lock file's text: the header, keys sorted, one line per file; parse_lock reads it
    back as `lock`."""
    lines = [LOCK_HEADER, f"version: {LOCK_VERSION}"]
    lines.append("models:" if lock.models else "models: {}")
    for checkpoint, model in sorted(lock.models):
        lines += [f"  {_scalar(checkpoint)}:", f"    revision: {_scalar(model.revision)}"]
        lines.append("    files:" if model.files else "    files: {}")
        lines += [f"      {_scalar(name)}: {{size: {item.size}, sha256: {_scalar(item.sha256)}}}"
                  for name, item in sorted(model.files)]
    lines.append("images:" if lock.images else "images: {}")
    lines += [f"  {_scalar(ref)}: {_scalar(digest)}" for ref, digest in sorted(lock.images)]
    return "\n".join(lines) + "\n"


# The lock file option of the modules that write it (documented in the doc fragment
# lobes.fleet.lock).
LOCK_FILE_OPTION = {"lock_file": {"type": "path", "required": True}}


def write_lock_file(path: str, text: str) -> None:
    """The whole file at once: a reader never sees half a lock."""
    directory = os.path.dirname(os.path.abspath(path))
    handle, staged = tempfile.mkstemp(prefix=".fleet.lock.", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(staged, 0o644)
        os.replace(staged, path)
    except BaseException:
        if os.path.exists(staged):
            os.unlink(staged)
        raise


def save_lock(path: str, lock: FleetLock, updated: FleetLock, check_mode: bool) -> tuple:
    """(changed, diff) of the lock file at path once it holds `updated` (read as `lock`),
    written unless check_mode; where there is no file yet, a lock with nothing new makes none."""
    old, text = dump_lock(lock), dump_lock(updated)
    before = old if os.path.exists(path) else ""
    after = text if before or text != old else ""
    changed = before != after
    if changed and not check_mode:
        write_lock_file(path, after)
    return changed, {"before": before, "after": after, "before_header": path, "after_header": path}


def _file_entry(item: object) -> object:
    if isinstance(item, LockedFile):
        return {"size": item.size, "sha256": item.sha256}
    return dict(item) if isinstance(item, Mapping) else item


def with_model(lock: FleetLock, checkpoint: str, revision: str, files: Mapping) -> FleetLock:
    """`lock` with the checkpoint's entry set (replaced): files maps each path to a LockedFile
    or {size, sha256}; every value is checked as parse_lock checks it."""
    reader = _Reader("the new lock entry")
    name = reader.checkpoint(checkpoint)
    entry = {"revision": revision,
             "files": {path: _file_entry(item) for path, item in dict(files).items()}}
    models = {**dict(lock.models), name: reader.model(entry, f"models[{_key(name)}]")}
    return replace(lock, models=tuple(sorted(models.items())))


def with_image(lock: FleetLock, ref: str, digest: str) -> FleetLock:
    """`lock` with the image's digest set (replaced), checked as parse_lock checks it."""
    reader = _Reader("the new lock entry")
    ref = reader.image_ref(ref)
    digest = reader.text(digest, f"images[{_key(ref)}]", DIGEST,
                         "a digest sha256:<64 lowercase hex digits>")
    return replace(lock, images=tuple(sorted({**dict(lock.images), ref: digest}.items())))


# ---------------------------------------------------------------- pins


@dataclass(frozen=True)
class ModelPin:
    """Where one gear's checkpoint revision comes from: declared (inventory or catalog),
    locked, or unpinned; `locked` is the lock's revision whatever the source."""

    host: str
    role: str
    checkpoint: str
    revision: str | None
    source: str
    locked: str | None = None
    required: bool = False  # the box sets fleet_models_require_pins


@dataclass(frozen=True)
class PinFindings:
    warnings: tuple = ()  # FleetError
    errors: tuple = ()  # FleetError


def is_hub_checkpoint(checkpoint: str) -> bool:
    """Whether a checkpoint comes from the hub: not built on the box (lobes/) nor a path."""
    return not checkpoint.startswith((LOCAL_NAMESPACE, "/"))


def model_pins(plan: dict, lock: FleetLock) -> list:
    """A ModelPin for every hub checkpoint a gear of the plan loads (simulated gears load
    none), by host then catalog order."""
    pins = []
    for host, box in sorted(plan.get("boxes", {}).items()):
        required = bool(box.get("gears", {}).get("require_pins"))
        for role, role_plan in box.get("roles", {}).items():
            gear = role_plan.get("gear")
            if not gear or gear.get("engine") == "sim":
                continue
            checkpoint = gear.get("checkpoint")
            if not checkpoint or not is_hub_checkpoint(checkpoint):
                continue
            declared = gear.get("revision")
            entry = lock.model(checkpoint)
            locked = entry.revision if entry else None
            source = DECLARED if declared else LOCKED if locked else UNPINNED
            pins.append(ModelPin(host, role, checkpoint, declared or locked, source, locked,
                                 required))
    return pins


def pin_findings(pins: list, require: bool = False) -> PinFindings:
    """Unpinned gears (warnings; errors where pins are required, by `require` or the box's
    fleet_models_require_pins), a declared revision the lock contradicts, and one checkpoint
    pinned to two revisions (errors)."""
    warnings, errors = [], []
    for pin in pins:
        if pin.source == UNPINNED:
            finding = FleetError(pin.host, pin.role, "revision",
                                 f"{pin.checkpoint} has no pinned revision, so vLLM loads "
                                 "whatever the hub holds at first start; declare revision, or "
                                 "lock it with playbooks/models.yml")
            (errors if require or pin.required else warnings).append(finding)
        elif pin.source == DECLARED and pin.locked and pin.locked != pin.revision:
            errors.append(FleetError(
                pin.host, pin.role, "revision",
                f"declares {pin.checkpoint} at {pin.revision} but {LOCK_FILE} locks "
                f"{pin.locked}; {UPDATE_STEP}"))
    errors += _split_pins(pins)
    return PinFindings(tuple(warnings), tuple(errors))


def _split_pins(pins: list) -> list:
    """A checkpoint pinned to different revisions on different gears: the lock holds one."""
    first, errors = {}, []
    for pin in pins:
        if pin.revision is None:
            continue
        seen = first.setdefault(pin.checkpoint, pin)
        if seen.revision != pin.revision:
            errors.append(FleetError(
                pin.host, pin.role, "revision",
                f"pins {pin.checkpoint} at {pin.revision} but host {seen.host}, role "
                f"{seen.role} pins it at {seen.revision}; one checkpoint has one revision "
                "in the fleet: declare the same one"))
    return errors


# ---------------------------------------------------------------- placing checkpoints


def _size(count: int) -> str:
    return f"{count / GIB:.2f} GiB ({count} bytes)"


def disk_shortfalls(needs: Mapping, free: Mapping, headroom_bytes: int) -> list:
    """For each (host, path) whose need plus the headroom exceeds its free bytes, a message
    naming host, path, both sizes and the shortfall; sorted by host and path."""
    messages = []
    for (host, path), need in sorted(needs.items()):
        if need <= 0:
            continue
        wanted = need + headroom_bytes
        room = free.get((host, path))
        if room is None:
            messages.append(f"host {host}, path {path}: needs {_size(wanted)} with "
                            f"{_size(headroom_bytes)} headroom, and its free space is unknown; "
                            "run the preflight there")
        elif wanted > room:
            messages.append(f"host {host}, path {path}: needs {_size(wanted)} with "
                            f"{_size(headroom_bytes)} headroom but {_size(room)} is free; "
                            f"free {_size(wanted - room)} there or point the models elsewhere")
    return messages


def fill_rounds(holders: list, needers: list) -> list:
    """Box-to-box copies of one checkpoint, round by round: (source, destination) pairs in
    which each holder sends to at most one needer and a filled needer holds it from the next
    round, so N needers from one holder take ceil(log2(N + 1)) rounds. Order is the lists'."""
    holding = list(dict.fromkeys(holders))
    waiting = [host for host in dict.fromkeys(needers) if host not in holding]
    if waiting and not holding:
        raise ValueError("no box holds the checkpoint: fetch it from the hub to one box first")
    rounds = []
    while waiting:
        pairs = [(holding[index], waiting[index])
                 for index in range(min(len(holding), len(waiting)))]
        rounds.append(pairs)
        waiting = waiting[len(pairs):]
        holding += [destination for _source, destination in pairs]
    return rounds


def rounds_needed(holders: int, needers: int) -> int:
    """The fewest doubling rounds that fill `needers` from `holders`: ceil(log2((holders +
    needers) / holders)), counted in whole numbers."""
    rounds = 0
    while holders << rounds < holders + needers:
        rounds += 1
    return rounds


# ---------------------------------------------------------------- the fleet's view


def read_lock_file(path: str) -> FleetLock:
    """The lock file at `path`; an empty lock where there is none yet (nothing locked)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return FleetLock()
    except (OSError, UnicodeDecodeError) as exc:
        raise LockError(path, "", f"cannot be read: {exc}",
                        "make it a readable UTF-8 file, or remove it and lock again") from None
    return parse_lock(text, path)


def model_summary(pins: list, present: Mapping, require: bool = False) -> dict:
    """checkpoint -> its revision (None: unpinned), where it comes from, the hosts that load
    it, the host that fetches it from the hub when no box holds it (None otherwise), the
    box-to-box fill rounds and the findings (warnings, errors) of its gears."""
    summary = {}
    for checkpoint in sorted({pin.checkpoint for pin in pins}):
        mine = [pin for pin in pins if pin.checkpoint == checkpoint]
        hosts = sorted({pin.host for pin in mine})
        holders = [host for host in present.get(checkpoint, ()) if host]
        fetch_to = None if holders else hosts[0]
        findings = pin_findings(mine, require)
        pinned = next((pin for pin in mine if pin.revision), None)
        summary[checkpoint] = {
            "revision": pinned.revision if pinned else None,
            "source": pinned.source if pinned else UNPINNED,
            "hosts": hosts,
            "fetch_from_hub": fetch_to,
            "rounds": [[list(pair) for pair in round_pairs] for round_pairs in
                       fill_rounds(holders or [fetch_to], hosts)],
            "warnings": [str(finding) for finding in findings.warnings],
            "errors": [str(finding) for finding in findings.errors],
        }
    return summary
