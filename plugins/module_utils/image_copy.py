"""Gear images copied box to box, for boxes that cannot reach a registry (fleet_images_from:
boxes): which boxes hold each pinned image, the rounds that fill the others (as checkpoints are
filled: models.fill_rounds), and the docker commands that export, load and tag an image.

An image travels as the tar `docker save` writes, named by the hex of its registry digest under
the models directory (model_files.image_paths), with a manifest of its size, sha256 and image
ID. `docker load` keeps the image ID (the digest of its config) but no registry digest, so the
box that loads it checks the ID against the manifest and tags it (images.copy_tag).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from ansible_collections.lobes.fleet.plugins.module_utils.images import copy_tag, parse_ref
from ansible_collections.lobes.fleet.plugins.module_utils.model_files import image_paths
from ansible_collections.lobes.fleet.plugins.module_utils.models import fill_rounds

# `docker load` names each image it loaded without a tag on a line of its own.
_LOADED_ID = re.compile(r"^Loaded image ID: (sha256:[0-9a-f]{64})$", re.MULTILINE)


def digest_hex(ref: str) -> str:
    """The 64 hex digits of the digest a pinned `repository@sha256:<hex>` names."""
    digest = parse_ref(ref).digest
    if not digest:
        raise ValueError(f"{ref} names no digest: only an image pinned by digest is copied")
    return digest.split(":", 1)[1]


def copy_pulls(images: list, held: Mapping, boxes: Mapping) -> tuple:
    """(host -> its pulls {round, ref, source, address}, rounds, errors): each copied
    reference goes from the boxes that hold it (`held`: host -> refs) to the boxes that copy it
    and do not, in doubling rounds; a reference no box holds is an error naming the fix."""
    needers: dict = {}
    for image in images:
        if image.get("copy"):
            needers.setdefault(image["copy"], []).append(image["host"])
    pulls: dict = {}
    errors, rounds = [], 0
    for ref, hosts in sorted(needers.items()):
        holders = sorted(host for host, refs in held.items() if ref in (refs or []))
        waiting = sorted({host for host in hosts if host not in holders})
        if waiting and not holders:
            errors.append(
                f"{ref}: no box holds it to copy to host {', '.join(waiting)} "
                "(fleet_images_from: boxes); let one box that runs it pull it "
                "(fleet_images_from: registry), or pull it by hand on one of them")
            continue
        plan = fill_rounds(holders, waiting)
        rounds = max(rounds, len(plan))
        for number, pairs in enumerate(plan):
            for source, destination in pairs:
                origin = (boxes.get(source) or {}).get("origin") or ""
                pulls.setdefault(destination, []).append({
                    "round": number, "ref": ref, "source": source,
                    "address": urlsplit(origin).hostname or source})
    return pulls, rounds, errors


class Engine:
    """The docker CLI on the box, through the module's run_command."""

    def __init__(self, module) -> None:
        self.module = module
        self.binary = module.get_bin_path("docker", required=True)

    def run(self, *args: str) -> tuple:
        return self.module.run_command([self.binary, *args])

    def image_id(self, ref: str) -> str | None:
        """The ID of the image `ref` names on this engine, or None."""
        rc, out, _err = self.run("image", "inspect", "--format", "{{.Id}}", ref)
        return out.strip() if rc == 0 and out.strip() else None

    def ids(self) -> set:
        """The IDs of every image the engine holds."""
        rc, out, _err = self.run("image", "ls", "--all", "--quiet", "--no-trunc")
        return set(out.split()) if rc == 0 else set()

    def must(self, *args: str) -> str:
        """Run a docker command that must succeed; its output, else RuntimeError naming it."""
        rc, out, err = self.run(*args)
        if rc != 0:
            raise RuntimeError(f"docker {' '.join(args)}: {err.strip() or f'exited {rc}'}")
        return out

    def load(self, tar: str) -> list:
        """`docker load` the tar; the IDs it says it loaded."""
        return _LOADED_ID.findall(self.must("load", "--input", tar))

    def tag_copy(self, image_id: str, ref: str) -> None:
        """Give the loaded image the local tag the box's gears run it by."""
        self.must("tag", image_id, copy_tag(ref))


def load_checked(engine: Engine, model_dir: str, ref: str, entry: dict, where: str) -> str:
    """Load the image's whole tar and check the ID it loaded is the manifest's: the ID. Else
    remove what this load added, and the tar with its manifest (copied again next run), and
    fail (RuntimeError) naming `where` (host, reference), the ID expected and the ID found."""
    tar, manifest = image_paths(model_dir, digest_hex(ref))
    before = engine.ids()
    try:
        loaded = engine.load(tar)
    except RuntimeError:
        _remove(manifest, tar)  # not a tar the engine reads
        raise
    if loaded == [entry["id"]]:
        return entry["id"]
    for image_id in loaded:
        if image_id not in before:
            engine.run("image", "rm", "--force", image_id)
    _remove(manifest, tar)
    raise RuntimeError(f"{where} loaded image {', '.join(loaded) or 'none'}, expected "
                       f"{entry['id']} (the exporting box's manifest); the image and the tar "
                       "were removed")


def _remove(*paths: str) -> None:
    for path in paths:
        if os.path.lexists(path):
            os.remove(path)
