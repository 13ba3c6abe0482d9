"""A checkpoint's files on a box: where they live, whether each is whole, and promoting a
checked staging directory into place.

Each rule here is written once. The collection's modules (model_fetch, model_files, model_pull)
import this module as module_utils; the box-side file server that other boxes copy a
checkpoint from imports the same file as ``lobes_model_files`` (gateway/lobes_model_files.py is
a link to it), so a file name the server accepts is one the modules would write. Standard
library only: it runs on a box that has no Ansible.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass, field

# The argument specs of the options doc fragment lobes.fleet.model documents.
MODEL_DIR_OPTION = {"model_dir": {"type": "path", "default": "/var/lib/lobes/models"}}
CHECKPOINT_OPTION = {"checkpoint": {"type": "str", "required": True}}
MANIFEST = ".lobes-manifest.json"
PARTIAL = ".partial"
# The private key a box copies checkpoints from other boxes with, under its model_dir.
COPY_KEY = os.path.join(".ssh", "lobes_model_copy")
CHUNK = 1 << 20
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_CHECKPOINT = re.compile(rf"^{_NAME}/{_NAME}\Z")  # \Z: "$" would let a final newline through
COMMIT = re.compile(r"^[0-9a-f]{40}\Z")


SHA256 = re.compile(r"^[0-9a-f]{64}\Z")


class UnsafePath(ValueError):
    """A file name that could write outside the model's directory."""


def safe_relpath(path: object) -> str:
    """The path itself when it names a file strictly inside a directory, else UnsafePath.

    Names come from the hub (hostile input): absolute paths, `..`, `.` or empty components,
    backslashes, NUL and other control characters are refused, and so is our manifest's name.
    """
    if not isinstance(path, str) or not path:
        raise UnsafePath(f"file name {path!r} is empty or not a string")
    if any(ord(char) < 0x20 or char in "\x7f\\" for char in path):
        raise UnsafePath(f"file name {path!r} holds a backslash or a control character")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise UnsafePath(f"file name {path!r} is absolute or has an empty, '.' or '..' component")
    if path == MANIFEST:
        raise UnsafePath(f"file name {path!r} is reserved for the manifest")
    return path


def inside(root: str, rel: str) -> str:
    """root/rel after checking rel, and that no symlink on the way leads out of root."""
    target = os.path.join(root, safe_relpath(rel))
    real_root = os.path.realpath(root)
    if not os.path.realpath(target).startswith(real_root + os.sep):
        raise UnsafePath(f"file name {rel!r} leads outside {root}")
    return target


def check_checkpoint(checkpoint: str) -> None:
    """A hub repo id `org/name` whose two parts are plain directory names."""
    if not _CHECKPOINT.match(checkpoint or "") or ".." in checkpoint:
        raise ValueError(f"checkpoint {checkpoint!r} is not a hub repo id like Qwen/Qwen3.5-4B")


def final_dir(model_dir: str, checkpoint: str, revision: str) -> str:
    """Where a whole, checked revision lives: <model_dir>/<org>/<name>/<revision>."""
    check_checkpoint(checkpoint)
    if not COMMIT.match(revision):
        raise ValueError(f"revision {revision!r} of {checkpoint} is not a 40-hex commit")
    return os.path.join(model_dir, checkpoint, revision)


def staging_dir(model_dir: str, checkpoint: str, revision: str) -> str:
    """Where a revision is assembled, kept across runs: <model_dir>/.partial/<org>/<name>/<rev>."""
    final_dir(model_dir, checkpoint, revision)
    return os.path.join(model_dir, PARTIAL, checkpoint, revision)


def lock_files(checkpoint: str, files: object) -> dict:
    """The lock's files {path: {size, sha256}} of a checkpoint, names and entries checked.

    Raises ValueError naming the first entry refused.
    """
    if not isinstance(files, dict):
        raise ValueError(f"the lock's files of {checkpoint} are not a mapping of path to "
                         "size and sha256")
    checked = {}
    for path, entry in files.items():
        try:
            safe_relpath(path)
        except UnsafePath as error:
            raise ValueError(f"the lock's files of {checkpoint}: {error}") from None
        size = entry.get("size") if isinstance(entry, dict) else None
        sha256 = str(entry.get("sha256", "")).lower() if isinstance(entry, dict) else ""
        bad_size = not isinstance(size, int) or isinstance(size, bool) or size < 0
        if bad_size or not SHA256.match(sha256):
            raise ValueError(f"the lock's entry for {path} needs a size (bytes) and a sha256")
        checked[path] = {"size": size, "sha256": sha256}
    return checked


@dataclass(frozen=True)
class Digest:
    """A file's size and hashes: sha256, and its git blob sha1 (what the hub calls blobId)."""

    size: int
    sha256: str
    blob_sha1: str


def digest(path: str) -> Digest:
    """Hash a file once for both sha256 and the git blob sha1 (`blob <size>\\0` + content)."""
    size = os.stat(path).st_size
    sha256 = hashlib.sha256()
    blob = hashlib.sha1(b"blob %d\0" % size)  # nosec - git's object id, not a security hash
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            sha256.update(chunk)
            blob.update(chunk)
    return Digest(size, sha256.hexdigest(), blob.hexdigest())


def read_manifest(directory: str) -> dict:
    """A directory's manifest {path: {size, sha256, mtime_ns}}; {} when absent or unreadable."""
    try:
        with open(os.path.join(directory, MANIFEST), encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def write_manifest(directory: str, entries: dict) -> None:
    """Record each file's size, sha256 and mtime, so a later check hashes only what changed."""
    tmp = os.path.join(directory, MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(entries, handle, indent=1, sort_keys=True)
    os.replace(tmp, os.path.join(directory, MANIFEST))


def manifest_entry(path: str, sha256: str) -> dict:
    """A manifest entry for a file just hashed."""
    stat = os.stat(path)
    return {"size": stat.st_size, "sha256": sha256, "mtime_ns": stat.st_mtime_ns}


@dataclass
class Report:
    """A directory checked against the files it should hold."""

    missing: list = field(default_factory=list)
    wrong_size: list = field(default_factory=list)
    corrupt: list = field(default_factory=list)
    found: dict = field(default_factory=dict)  # path -> sha256 found (files of the right size)
    manifest: dict = field(default_factory=dict)  # path -> manifest entry of every whole file

    @property
    def whole(self) -> bool:
        return not (self.missing or self.wrong_size or self.corrupt)

    def not_whole(self) -> list:
        return sorted(self.missing + self.wrong_size + self.corrupt)


def cached_sha256(path: str, cached: object) -> str | None:
    """The manifest's sha256 for a file whose size and mtime it recorded, else None."""
    if not isinstance(cached, dict):
        return None
    stat = os.stat(path)
    if cached.get("size") == stat.st_size and cached.get("mtime_ns") == stat.st_mtime_ns:
        return cached.get("sha256")
    return None


def check_dir(directory: str, files: dict, *, use_manifest: bool) -> Report:
    """Check every file of `files` {path: {size, sha256}} under directory.

    With use_manifest, a file whose size and mtime match the manifest is not re-hashed.
    """
    report = Report()
    manifest = read_manifest(directory) if use_manifest else {}
    for rel in sorted(files):
        want = files[rel]
        path = inside(directory, rel)
        if not os.path.isfile(path):
            report.missing.append(rel)
            continue
        if os.stat(path).st_size != want["size"]:
            report.wrong_size.append(rel)
            continue
        sha256 = cached_sha256(path, manifest.get(rel)) or digest(path).sha256
        report.found[rel] = sha256
        if sha256 != want["sha256"]:
            report.corrupt.append(rel)
        else:
            report.manifest[rel] = manifest_entry(path, sha256)
    return report


def promote(staging: str, final: str, manifest: dict) -> None:
    """Write the manifest into the checked staging directory and rename it into place.

    A final directory already there (not whole, or the caller would not promote) is moved
    aside first and removed after, so the final name never holds a half model.
    """
    write_manifest(staging, manifest)
    os.makedirs(os.path.dirname(final), mode=0o755, exist_ok=True)
    old = None
    if os.path.lexists(final):
        old = f"{staging}.replaced-{os.getpid()}"
        os.rename(final, old)
    os.rename(staging, final)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def free_bytes(path: str) -> int:
    """Bytes free to an unprivileged writer on the filesystem that holds (or will hold) path."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    stat = os.statvfs(probe)
    return stat.f_bavail * stat.f_frsize


# ---------------------------------------------------------------- exported engine images

# A gear image exported for boxes that cannot reach a registry lives beside the checkpoints, in
# its own directory no checkpoint can be named (an org never starts with a dot): one tar per
# image, named by the hex of the registry digest it was pulled by, and a manifest beside it.
IMAGES = ".images"
IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}\Z")


def image_paths(model_dir: str, digest_hex: str) -> tuple:
    """(the tar, its manifest) of the image pulled by registry digest sha256:<digest_hex>."""
    if not SHA256.match(digest_hex or ""):
        raise ValueError(f"image digest {digest_hex!r} is not 64 lowercase hex digits")
    base = os.path.join(model_dir, IMAGES, digest_hex)
    return base + ".tar", base + ".json"


def image_staging(model_dir: str) -> str:
    """Where image tars are written (exported or copied) until they are whole."""
    return os.path.join(model_dir, IMAGES, PARTIAL)


def check_image_manifest(entry: object) -> dict:
    """An image manifest {size, sha256, id, ref} with every field checked, else ValueError."""
    if not isinstance(entry, dict):
        raise ValueError("the image manifest is not a JSON object")
    size, sha256, image_id = entry.get("size"), entry.get("sha256"), entry.get("id")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise ValueError("the image manifest's size is not a positive count of bytes")
    if not isinstance(sha256, str) or not SHA256.match(sha256):
        raise ValueError("the image manifest's sha256 is not 64 lowercase hex digits")
    if not isinstance(image_id, str) or not IMAGE_ID.match(image_id):
        raise ValueError("the image manifest's id is not sha256:<64 lowercase hex digits>")
    ref = entry.get("ref")
    return {"size": size, "sha256": sha256, "id": image_id,
            "ref": ref if isinstance(ref, str) else ""}


def read_image_manifest(model_dir: str, digest_hex: str) -> dict | None:
    """The checked manifest of an exported image whose tar is whole by size; None otherwise."""
    tar, manifest = image_paths(model_dir, digest_hex)
    try:
        with open(manifest, encoding="utf-8") as handle:
            entry = check_image_manifest(json.load(handle))
        if os.stat(tar).st_size != entry["size"]:
            return None
    except (OSError, ValueError):
        return None
    return entry


def write_image_manifest(model_dir: str, digest_hex: str, entry: dict) -> None:
    """Write the manifest of a whole tar (the tar already in place): written last, so a
    manifest always speaks of a whole file."""
    _tar, manifest = image_paths(model_dir, digest_hex)
    tmp = manifest + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(check_image_manifest(entry), handle, indent=1, sort_keys=True)
    os.replace(tmp, manifest)
