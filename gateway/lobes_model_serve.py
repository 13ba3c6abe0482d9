"""Serve the whole checkpoints of this box, read only, to the fleet's other boxes over SSH.

sshd runs it as the forced command of the fleet's copy key (lobes.fleet.model_copy_key writes
the line), so whatever a client asks arrives in SSH_ORIGINAL_COMMAND and nothing else runs:

    command="python3 /srv/lobes/gateway/lobes_model_serve.py /var/lib/lobes/models",restrict \
        ssh-ed25519 AAAA...        (one line in authorized_keys)

Four commands, fields split by single spaces:

    read <org>/<name> <revision> <relpath> <offset>   the file's bytes from offset to its end
    list <org>/<name> <revision>                      {relpath: size} of the revision, as JSON
    image <64 hex> <offset>      an exported image's tar (.images/<hex>.tar) from offset
    imageinfo <64 hex>           that tar's manifest {size, sha256, id, ref}, as JSON

Only files the manifest of a promoted (final, whole) revision lists are served, and only image
tars whose manifest says they are whole (size): never a staging directory, never a symlink,
never a path that leads out. Anything else exits 2 with one line on stderr naming what was
refused. Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from dataclasses import dataclass

from lobes_model_files import (
    CHUNK,
    COMMIT,
    IMAGES,
    MANIFEST,
    SHA256,
    UnsafePath,
    check_checkpoint,
    final_dir,
    image_paths,
    read_image_manifest,
    read_manifest,
    safe_relpath,
)

REFUSED = 2
_ARITY = {"read": 5, "list": 3, "image": 3, "imageinfo": 2}
_VERBS = ", ".join(f"'{verb}'" for verb in _ARITY)
_OFFSET = re.compile(r"^[0-9]{1,19}\Z")
_MAX_COMMAND = 4096


class Refused(Exception):
    """A request this server does not serve; the message says why, in one line."""


@dataclass(frozen=True)
class Request:
    """One checked request: a `read` names relpath and offset, a `list` neither; an `image`
    names the image (digest hex) and offset, an `imageinfo` the image alone."""

    verb: str
    checkpoint: str = ""
    revision: str = ""
    relpath: str = ""
    offset: int = 0
    image: str = ""


def _one_line(text: str) -> str:
    """Text shown in a refusal: control characters escaped, so a refusal is one line."""
    return ascii(text[:200])


def parse(command: object) -> Request:
    """The request SSH_ORIGINAL_COMMAND holds, every field checked, else Refused."""
    if not isinstance(command, str) or not command:
        raise Refused(f"no command: only {_VERBS} are served")
    if len(command) > _MAX_COMMAND:
        raise Refused(f"a command of {len(command)} characters")
    fields = command.split(" ")
    verb = fields[0]
    arity = _ARITY.get(verb)
    if arity is None:
        raise Refused(f"command {_one_line(verb)}: only {_VERBS} are served")
    if len(fields) != arity:
        raise Refused(
            f"{verb} takes {arity - 1} fields separated by single spaces, not {_one_line(command)}"
        )
    if verb in ("image", "imageinfo"):
        return _parse_image(verb, fields)
    checkpoint, revision = fields[1], fields[2]
    try:
        check_checkpoint(checkpoint)
    except ValueError:
        raise Refused(f"checkpoint {_one_line(checkpoint)} is not a hub repo id org/name") from None
    if not COMMIT.match(revision):
        raise Refused(f"revision {_one_line(revision)} is not a 40-hex commit")
    if verb == "list":
        return Request(verb, checkpoint, revision)
    try:
        relpath = safe_relpath(fields[3])
    except UnsafePath:
        raise Refused(
            f"file name {_one_line(fields[3])} is not a plain path inside a revision"
        ) from None
    return Request(verb, checkpoint, revision, relpath, _offset(fields[4]))


def _offset(field: str) -> int:
    if not _OFFSET.match(field):
        raise Refused(f"offset {_one_line(field)} is not a decimal count of bytes")
    return int(field)


def _parse_image(verb: str, fields: list) -> Request:
    """An `image` or `imageinfo` request: the image is named by its digest's hex alone."""
    if not SHA256.match(fields[1]):
        raise Refused(f"image {_one_line(fields[1])} is not the 64 hex digits of a digest")
    offset = _offset(fields[2]) if verb == "image" else 0
    return Request(verb, offset=offset, image=fields[1])


def _whole_dir(model_dir: str, request: Request) -> str:
    """The final directory of the revision, reached through no symlink, with its manifest."""
    final = final_dir(model_dir, request.checkpoint, request.revision)
    real = os.path.join(os.path.realpath(model_dir), request.checkpoint, request.revision)
    name = f"{request.checkpoint} at {request.revision}"
    if os.path.realpath(final) != real or not os.path.isdir(real):
        raise Refused(f"{name} is not a whole revision on this box")
    manifest = read_manifest(real)
    if not manifest:
        raise Refused(f"{name} has no manifest: not a whole revision on this box")
    return real


def _open_listed(root: str, relpath: str) -> int:
    """A descriptor of root/relpath: in the manifest, a regular file, reached through no symlink."""
    if relpath not in read_manifest(root):
        raise Refused(f"{relpath} is not a file of the revision")
    path = os.path.join(root, relpath)
    if os.path.realpath(path) != path:
        raise Refused(f"{relpath} is a symlink or lies under one")
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as error:
        raise Refused(f"{relpath} cannot be opened: {error.strerror}") from None
    if not stat.S_ISREG(os.fstat(handle).st_mode):
        os.close(handle)
        raise Refused(f"{relpath} is not a regular file")
    return handle


def serve_read(model_dir: str, request: Request, out: int) -> None:
    """Write the file's bytes from the request's offset to its end to the descriptor out."""
    handle = _open_listed(_whole_dir(model_dir, request), request.relpath)
    with os.fdopen(handle, "rb") as source:
        size = os.fstat(handle).st_size
        if request.offset > size:
            raise Refused(
                f"offset {request.offset} is past the end of {request.relpath} ({size} bytes)"
            )
        source.seek(request.offset)
        _send(source, out)


def serve_list(model_dir: str, request: Request) -> dict:
    """{relpath: size} of the manifest's files that are regular files reached through no symlink."""
    root = _whole_dir(model_dir, request)
    sizes = {}
    for relpath in sorted(read_manifest(root)):
        if relpath == MANIFEST:
            continue
        path = os.path.join(root, relpath)
        try:
            safe_relpath(relpath)
            info = os.lstat(path)
        except (UnsafePath, OSError):
            continue
        if stat.S_ISREG(info.st_mode) and os.path.realpath(path) == path:
            sizes[relpath] = info.st_size
    return sizes


def _whole_image(model_dir: str, request: Request) -> tuple:
    """(a descriptor of the image's whole tar, its manifest), both reached through no symlink."""
    root = os.path.realpath(model_dir)
    tar, _manifest = image_paths(root, request.image)
    if os.path.realpath(os.path.join(model_dir, IMAGES)) != os.path.join(root, IMAGES):
        raise Refused(f"{IMAGES} of this box leads elsewhere (a symlink)")
    entry = read_image_manifest(root, request.image)
    if entry is None or os.path.realpath(tar) != tar:
        raise Refused(f"image {request.image} is not exported whole on this box")
    try:
        handle = os.open(tar, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as error:
        raise Refused(f"image {request.image} cannot be opened: {error.strerror}") from None
    info = os.fstat(handle)
    if not stat.S_ISREG(info.st_mode) or info.st_size != entry["size"]:
        os.close(handle)
        raise Refused(f"image {request.image} is not exported whole on this box")
    return handle, entry


def serve_image(model_dir: str, request: Request, out: int) -> None:
    """Write the image tar's bytes from the request's offset to its end to the descriptor out."""
    handle, entry = _whole_image(model_dir, request)
    with os.fdopen(handle, "rb") as source:
        if request.offset > entry["size"]:
            raise Refused(f"offset {request.offset} is past the end of image {request.image} "
                          f"({entry['size']} bytes)")
        source.seek(request.offset)
        _send(source, out)


def serve_image_info(model_dir: str, request: Request) -> dict:
    """The manifest of an image exported whole."""
    handle, entry = _whole_image(model_dir, request)
    os.close(handle)
    return entry


def _send(source, out: int) -> None:
    """Copy the rest of the open file source to the descriptor out."""
    for chunk in iter(lambda: source.read(CHUNK), b""):
        view = memoryview(chunk)
        while view:
            view = view[os.write(out, view) :]


def main(argv: list[str] | None = None) -> int:
    """Serve one request from SSH_ORIGINAL_COMMAND; 0 when served, 2 with one line when refused."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if len(args) != 1 or not os.path.isabs(args[0]):
            raise Refused(
                "usage: lobes_model_serve.py <absolute model_dir> (as sshd's forced command)"
            )
        request = parse(os.environ.get("SSH_ORIGINAL_COMMAND"))
        if request.verb == "list":
            sys.stdout.write(json.dumps(serve_list(args[0], request), sort_keys=True) + "\n")
        elif request.verb == "imageinfo":
            sys.stdout.write(json.dumps(serve_image_info(args[0], request), sort_keys=True) + "\n")
        elif request.verb == "image":
            serve_image(args[0], request, sys.stdout.fileno())
        else:
            serve_read(args[0], request, sys.stdout.fileno())
    except Refused as refusal:
        sys.stderr.write(f"lobes_model_serve: refused: {refusal}\n")
        return REFUSED
    except BrokenPipeError:
        return 1  # the client went away: it resumes from what it holds
    return 0


if __name__ == "__main__":
    sys.exit(main())
