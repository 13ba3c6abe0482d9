"""Engine images pinned by digest: which image each gear container runs, through the lock file.

An image named by digest runs as named. An image named by tag is pinned by the lock file's
`images` section (beside the inventory): the first deploy pulls it on the boxes, reads the digest
each box actually holds (`docker image inspect`, RepoDigests), and locks it; later deploys run
`repository@digest`. Nothing here makes a digest up: one comes from the inventory, the lock or a
registry's answer to a pull, and an image without one (built on the box) stays unlocked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ansible_collections.lobes.fleet.plugins.module_utils.engines import SIM, VLLM
from ansible_collections.lobes.fleet.plugins.module_utils.errors import FleetError
from ansible_collections.lobes.fleet.plugins.module_utils.hardware import planned_hardware
from ansible_collections.lobes.fleet.plugins.module_utils.models import (
    DIGEST,
    LOCK_FILE,
    MAX_TEXT,
    FleetLock,
)

# How the image came to be what runs: named by digest, a tag the lock pins, a tag to resolve
# on the next deploy (pull it, read the digest, lock it).
NAMED, LOCKED, RESOLVE = "digest", "locked", "resolve"
# The plan's gears section holds one image per kind of gear container.
GEAR_SLOT, AUDIO_SLOT, SIM_SLOT = "image", "audio_image", "sim_image"
# The inventory variable that declares each.
SLOT_FIELDS = {GEAR_SLOT: "fleet_gear_image", AUDIO_SLOT: "fleet_audio_image",
               SIM_SLOT: "fleet_sim_image"}
UPDATE_STEP = (f"delete the image's entry from {LOCK_FILE} and deploy (the boxes pull the tag "
               "again and the new digest is locked), or declare the new reference "
               "(fleet_gear_image, fleet_audio_image, fleet_sim_image)")

# Docker's reference grammar, in parts: a name of /-separated components (the first may be a
# registry host[:port]), an optional :tag, an optional @digest.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = rf"{_LABEL}(?:\.{_LABEL})*(?::[0-9]{{1,5}})?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_NAME = re.compile(rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
DEFAULT_REGISTRY = "docker.io"
# fleet_images_from: where a box gets its gears' images.
FROM_REGISTRY, FROM_BOXES = "registry", "boxes"
# The tag a copied image is given on a box that loaded it: `docker load` keeps no registry
# digest, so `repository@digest` cannot resolve there without a registry; this tag can.
COPY_TAG_PREFIX = "lobes-sha256-"


class ImageRefError(ValueError):
    """A text that is not an image reference; the message says what is wrong."""


@dataclass(frozen=True)
class ImageRef:
    """An image reference in its parts: name (registry/path), tag, digest (sha256:...)."""

    name: str
    tag: str | None = None
    digest: str | None = None

    @property
    def canonical(self) -> str:
        """The name as the registry knows it: docker.io and library/ written out."""
        return canonical_name(self.name)


def parse_ref(ref: object) -> ImageRef:
    """The parts of an image reference; ImageRefError for anything compose would refuse."""
    if not isinstance(ref, str) or not ref:
        raise ImageRefError("is not an image reference (empty or not text)")
    if len(ref) > MAX_TEXT:
        raise ImageRefError(f"is {len(ref)} characters long; at most {MAX_TEXT}")
    rest, at, digest = ref.partition("@")
    if at and not DIGEST.fullmatch(digest):
        raise ImageRefError("names a digest that is not sha256:<64 lowercase hex digits>")
    name, tag = rest, None
    if ":" in rest.rsplit("/", 1)[-1]:
        name, tag = rest.rsplit(":", 1)
        if not _TAG.fullmatch(tag):
            raise ImageRefError(f"has a tag {tag!r} that is not letters, digits and _ . - "
                                "(at most 128, not starting with . or -)")
    if not _NAME.fullmatch(name):
        raise ImageRefError("has a name that is not registry/path: lowercase components "
                            "of letters and digits joined by . _ -")
    return ImageRef(name, tag, digest or None)


def canonical_name(name: str) -> str:
    """docker.io/library/python for python: two spellings of one repository compare equal."""
    first, slash, _rest = name.partition("/")
    # Docker's rule: the first component is a registry when it has a dot, a port, capitals or
    # is localhost.
    has_domain = slash and ("." in first or ":" in first or first == "localhost"
                            or first != first.lower())
    if has_domain:
        return name
    return f"{DEFAULT_REGISTRY}/{name if slash else 'library/' + name}"


def image_to_run(ref: str, lock: FleetLock) -> tuple:
    """(the reference compose runs, how: NAMED, LOCKED or RESOLVE) for a planned reference."""
    parts = parse_ref(ref)
    if parts.digest:
        return ref, NAMED
    locked = lock.image(ref)
    if locked:
        return f"{parts.name}@{locked}", LOCKED
    return ref, RESOLVE


def copy_tag(ref: str) -> str:
    """The local tag a box that loads a copied `repository@sha256:<hex>` runs it by:
    `repository:lobes-sha256-<hex>` (the digest in the tag, so it names one image)."""
    parts = parse_ref(ref)
    if not parts.digest:
        raise ImageRefError("names no digest: only an image pinned by digest is copied")
    return f"{parts.name}:{COPY_TAG_PREFIX}{parts.digest.split(':', 1)[1]}"


def digest_of(ref: str) -> str | None:
    """The digest a reference names, or None (named by tag)."""
    return parse_ref(ref).digest


# ---------------------------------------------------------------- the plan's gear images


@dataclass(frozen=True)
class GearImage:
    """One gear container's image on one box: as planned, and what it runs after the lock."""

    host: str
    group: str  # the box's hardware group; "" where its plan names no profile (no group)
    role: str
    service: str
    slot: str  # which image of the box's gears section
    ref: str
    run: str
    state: str
    copy: str = ""  # on a box whose images come from boxes: the repository@digest copied


def gear_slot(gear: Mapping) -> str | None:
    """Which of the box's images a gear container runs; None for a gear with no container."""
    if gear.get("engine") == SIM:
        return SIM_SLOT
    if gear.get("engine") == VLLM:
        return AUDIO_SLOT if gear.get("service") == "audio" else GEAR_SLOT
    return None


def gear_images(plan: dict, lock: FleetLock) -> tuple:
    """(a GearImage per gear container of every compose box, by host then role; FleetErrors
    for a planned image that is no reference)."""
    images, errors = [], []
    for host, box in sorted(plan.get("boxes", {}).items()):
        if box.get("runtime") != "compose":
            continue  # the process runtime runs no image: its engine version is its pin
        for role, role_plan in box.get("roles", {}).items():
            gear = role_plan.get("gear")
            slot = gear_slot(gear) if gear else None
            if slot is None:
                continue
            ref = box["gears"].get(slot)
            try:
                run, state = image_to_run(ref, lock)
            except ImageRefError as error:
                errors.append(FleetError(host, role, SLOT_FIELDS[slot], str(error),
                                         value=repr(ref)))
                continue
            group = planned_hardware(box).get("name") or ""
            image = GearImage(host, group, role, gear["service"], slot, ref, run, state)
            if box["gears"].get("images_from") == FROM_BOXES:
                if state == RESOLVE:
                    errors.append(_not_copyable(image))
                    continue
                image = replace(image, copy=run)
            images.append(image)
    return images, errors


def _not_copyable(image: GearImage) -> FleetError:
    """A tag-named image not locked yet, on a box that cannot pull it to read its digest."""
    return FleetError(
        image.host, image.role, SLOT_FIELDS[image.slot],
        f"{image.ref} is named by tag and not locked, and this box copies its images from "
        f"other boxes (fleet_images_from: {FROM_BOXES}): only a pinned digest can be copied; "
        f"name the image by digest (repository@sha256:...), or add its digest to the "
        f"{LOCK_FILE} images section, or deploy once with fleet_images_from: "
        f"{FROM_REGISTRY} on a box that reaches the registry")


def lock_contradictions(lock: FleetLock) -> list:
    """Entries of the lock's images section that cannot all hold: a reference named by digest
    locked to another digest, or one repository:tag written twice (two spellings) with two
    digests. Each message names the entries and the fix."""
    problems, seen = [], {}
    for ref, digest in lock.images:
        try:
            parts = parse_ref(ref)
        except ImageRefError as error:
            problems.append(f"{LOCK_FILE}: images[{ref!r}] {error}; write the reference compose "
                            "runs")
            continue
        if parts.digest and parts.digest != digest:
            problems.append(f"{LOCK_FILE}: images[{ref!r}] names {parts.digest} but is locked to "
                            f"{digest}; an image named by digest needs no entry: delete it")
            continue
        key = (parts.canonical, parts.tag or "latest", parts.digest)
        first = seen.setdefault(key, (ref, digest))
        if first[1] != digest:
            problems.append(f"{LOCK_FILE}: images[{first[0]!r}] is locked to {first[1]} and "
                            f"images[{ref!r}], the same image, to {digest}; keep one entry")
    return problems


def group_splits(images: list) -> list:
    """FleetErrors for a hardware group whose boxes would run two images in one kind of gear
    container: every box of a group runs the same digest."""
    first, errors = {}, []
    for image in images:
        if not image.group:
            continue  # a box whose plan names no hardware profile shares a group with none
        seen = first.setdefault((image.group, image.slot), image)
        if seen.run != image.run:
            field = SLOT_FIELDS[image.slot]
            errors.append(FleetError(
                image.host, image.role, field,
                f"runs {image.run} but host {seen.host} of the same hardware group "
                f"{image.group} runs {seen.run}; every box of a group runs the same image: "
                f"declare one {field} for the group"))
    return errors


def with_images_to_run(plan: dict, images: list) -> None:
    """The plan names what each gear container runs: the box's image slots (what render
    writes) and each gear's `image`, `image_state` (what verify holds it to). A box whose
    images are copied runs the copy's local tag, and its gear names the digest copied."""
    for image in images:
        box = plan["boxes"][image.host]
        run = copy_tag(image.copy) if image.copy else image.run
        box["gears"][image.slot] = run
        gear = box["roles"][image.role]["gear"]
        gear["image"] = run
        gear["image_state"] = image.state
        if image.copy:
            gear["image_copy"] = image.copy


# ---------------------------------------------------------------- what the boxes hold


def held_digests(name: str, repo_digests: object) -> list:
    """The digests of `repo_digests` (RepoDigests of `docker image inspect`) that are of the
    repository `name`, sorted, each once."""
    wanted = canonical_name(name)
    found = set()
    for entry in repo_digests if isinstance(repo_digests, list) else ():
        if not isinstance(entry, str):
            continue
        repo, at, digest = entry.partition("@")
        if at and DIGEST.fullmatch(digest) and _NAME.fullmatch(repo) \
                and canonical_name(repo) == wanted:
            found.add(digest)
    return sorted(found)


@dataclass(frozen=True)
class Resolution:
    """What the boxes' pulls lock: (ref, digest) entries, errors, and notes (refs left out)."""

    entries: tuple = ()
    errors: tuple = ()
    notes: tuple = ()


def resolve_from_boxes(images: list, found: Mapping) -> Resolution:
    """The lock entries for the tag-named references to resolve, from `found` (host -> ref ->
    the digest the box holds, or None). One reference locks one digest, so every box running
    it (every box of its group) must report the same one; a box that reports none for a
    reference others hold a digest of, or that did not report, is an error; a reference no box
    holds a registry digest for (a locally built image) is left unlocked, with a note."""
    hosts_of = {}
    for image in images:
        if image.state == RESOLVE:
            hosts_of.setdefault(image.ref, set()).add(image.host)
    entries, errors, notes = [], [], []
    for ref, hosts in sorted(hosts_of.items()):
        reported = {host: _reported(found, host, ref) for host in sorted(hosts)}
        missing = [host for host, said in reported.items() if said is _NOT_REPORTED]
        digests = {host: said for host, said in reported.items() if said is not _NOT_REPORTED}
        distinct = sorted({digest for digest in digests.values() if digest})
        if missing:
            errors.append(f"{ref}: not read on host {', '.join(missing)}; every box that runs "
                          "it reports its digest before it is locked")
        elif len(distinct) > 1 or (distinct and None in digests.values()):
            table = "; ".join(f"host {host}: {digest or 'no registry digest'}"
                              for host, digest in digests.items())
            errors.append(f"{ref}: the boxes hold different images ({table}); every box of a "
                          "group runs the same digest: pull the tag again on the odd boxes, or "
                          "name the image by digest")
        elif distinct:
            entries.append((ref, distinct[0]))
        else:
            notes.append(f"{ref}: no box reported a registry digest for it (built on the box, "
                         "or not pulled in check mode); it stays unlocked")
    return Resolution(tuple(entries), tuple(errors), tuple(notes))


_NOT_REPORTED = object()


def _reported(found: Mapping, host: str, ref: str) -> object:
    """The digest a host reported for a reference: the digest, None (it has none), or
    _NOT_REPORTED; a value that is no digest counts as none reported."""
    said = found.get(host) if isinstance(found, Mapping) else None
    if not isinstance(said, Mapping) or ref not in said:
        return _NOT_REPORTED
    digest = said[ref]
    if digest is None:
        return None
    return digest if isinstance(digest, str) and DIGEST.fullmatch(digest) else _NOT_REPORTED


# ---------------------------------------------------------------- verify


def expected_digest(gear: Mapping | None) -> str | None:
    """The digest a gear container must run: its image's, when named by digest or locked."""
    if not gear or not gear.get("image"):
        return None
    try:
        return parse_ref(gear.get("image_copy") or gear["image"]).digest
    except ImageRefError:
        return None


def running_digest(gear: Mapping, containers: Mapping) -> str:
    """What the gear's container runs, as verify shows it: the digest of its image for the
    gear's repository (the expected one where the image holds several), else why none. A
    copied image has no registry digest on the box: its container runs the digest copied when
    its image is the one the copy's local tag names (by image ID: a tag names one image)."""
    container = containers.get(gear["service"]) if isinstance(containers, Mapping) else None
    if not isinstance(container, Mapping):
        return "no container"
    expected = expected_digest(gear)
    copied = gear.get("image_copy")
    tags = container.get("repo_tags")
    if copied and isinstance(tags, list) and copy_tag(copied) in tags:
        return expected
    name = parse_ref(gear["image"]).name
    held = held_digests(name, container.get("repo_digests"))
    if expected in held:
        return expected
    if held:
        return ", ".join(held)
    return f"image {container.get('image_id') or '?'} without a digest of {name}"
