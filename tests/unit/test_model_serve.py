"""The copy server's command parser takes only well-formed requests (generated: hypothesis)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lobes_model_files import image_paths, write_image_manifest
from lobes_model_serve import Refused, parse, serve_image, serve_image_info

CKPT = "acme/tiny-chat"
REV = "0123456789abcdef0123456789abcdef01234567"
ROOT = "/srv/models/" + CKPT + "/" + REV
IMAGE = "3ba9cbd016542038b5cf96a847adbddab9b5a1f40cf7ebb1276642418f8d8588"

# Pieces an attacker would combine into a command, and arbitrary text besides.
PIECES = st.sampled_from(
    [
        "read",
        "list",
        "image",
        "imageinfo",
        IMAGE,
        IMAGE.upper(),
        "sha256:" + IMAGE,
        IMAGE + ".tar",
        "ls",
        CKPT,
        REV,
        REV.upper(),
        "main",
        "a.bin",
        "../x",
        "..",
        ".partial/acme",
        "/etc/passwd",
        "0",
        "-1",
        "+5",
        "0x10",
        "9" * 25,
        "",
        " ",
        ";",
        "|",
        "$(id)",
        "`id`",
        "\n",
        "\x00",
        "a\\b",
        "~",
    ]
)
SEPARATORS = st.sampled_from([" ", "  ", "\t", "", "/", "\n"])
COMMANDS = st.one_of(
    st.lists(st.tuples(PIECES, SEPARATORS), min_size=1, max_size=7).map(
        lambda pairs: "".join(piece + sep for piece, sep in pairs)
    ),
    st.text(max_size=120),
    st.builds(
        lambda path, offset: f"read {CKPT} {REV} {path} {offset}",
        st.text(max_size=40),
        st.text(max_size=12),
    ),
    st.builds(lambda name, offset: f"image {name} {offset}", st.text(max_size=70),
              st.text(max_size=12)),
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(COMMANDS)
def test_a_command_is_refused_or_is_exactly_a_well_formed_request(command):
    try:
        request = parse(command)
    except Refused as refusal:
        assert "\n" not in str(refusal)  # one line on stderr, whatever the input held
        return
    # Accepted: the fields join back into the very command, each within its rules.
    if request.verb in ("image", "imageinfo"):
        _check_image_request(request, command)
        return
    fields = [request.verb, request.checkpoint, request.revision]
    if request.verb == "read":
        fields += [request.relpath, str(request.offset)]
    assert " ".join(fields) == command
    assert request.verb in ("read", "list")
    assert len(request.revision) == 40 and all(c in "0123456789abcdef" for c in request.revision)
    assert ".." not in request.checkpoint and not request.checkpoint.startswith(".")
    if request.verb == "read":
        joined = os.path.join(ROOT, request.relpath)
        assert os.path.normpath(joined) == joined and joined.startswith(ROOT + "/")
        assert request.offset >= 0 and " " not in request.relpath


def _check_image_request(request, command):
    """An accepted image request names 64 lowercase hex digits and, for `image`, an offset."""
    fields = [request.verb, request.image]
    if request.verb == "image":
        fields.append(str(request.offset))
    assert " ".join(fields) == command
    assert len(request.image) == 64 and all(c in "0123456789abcdef" for c in request.image)
    assert request.offset >= 0 and not (request.checkpoint or request.revision or request.relpath)


@pytest.mark.parametrize(
    "command",
    [
        None,
        "",
        "ls",
        "sh -c id",
        "bash",
        "scp -f /etc/passwd",
        f"read {CKPT} {REV} a.bin",
        f"read {CKPT} {REV} a.bin 0 extra",
        f"read  {CKPT} {REV} a.bin 0",
        f"read {CKPT} main a.bin 0",
        f"read {CKPT} {REV.upper()} a.bin 0",
        f"read {CKPT} {REV[:39]} a.bin 0",
        f"read {CKPT} {REV} ../../../.partial/{CKPT}/{REV}/a.bin 0",
        f"read {CKPT} {REV} /etc/passwd 0",
        f"read {CKPT} {REV} a.bin -1",
        f"read {CKPT} {REV} a.bin +5",
        f"read {CKPT} {REV} a.bin 0x10",
        f"read {CKPT} {REV} .lobes-manifest.json 0",
        f"read .partial/acme {REV} a.bin 0",
        f"read ../acme {REV} a.bin 0",
        f"read {CKPT} {REV} a.bin 0;id",
        f"list {CKPT} {REV} extra",
        f"read {CKPT} {REV} a.bin\t0",
        f"read {CKPT} {REV} a.bin 0\n",
        f"image {IMAGE}",
        f"image {IMAGE} 0 extra",
        f"image sha256:{IMAGE} 0",
        f"image {IMAGE.upper()} 0",
        f"image {IMAGE[:63]} 0",
        f"image {IMAGE}.tar 0",
        f"image ../{IMAGE[3:]} 0",
        f"image {IMAGE} -1",
        f"imageinfo {IMAGE} 0",
        "imageinfo ../../etc/passwd",
        f"imageinfo {IMAGE}\n",
    ],
)
def test_known_hostile_commands_are_refused(command):
    with pytest.raises(Refused):
        parse(command)


def test_well_formed_requests_are_read():
    read = parse(f"read {CKPT} {REV} sub/model.safetensors 1048576")
    assert (read.verb, read.checkpoint, read.revision, read.relpath, read.offset) == (
        "read",
        CKPT,
        REV,
        "sub/model.safetensors",
        1048576,
    )
    assert parse(f"list {CKPT} {REV}").verb == "list"
    image = parse(f"image {IMAGE} 4096")
    assert (image.verb, image.image, image.offset) == ("image", IMAGE, 4096)
    assert parse(f"imageinfo {IMAGE}").image == IMAGE


def _exported(model_dir, data: bytes, name: str = IMAGE):
    """An image tar and its manifest, as image_export leaves them."""
    tar, _manifest = image_paths(str(model_dir), name)
    os.makedirs(os.path.dirname(tar), exist_ok=True)
    with open(tar, "wb") as handle:
        handle.write(data)
    write_image_manifest(str(model_dir), name, {
        "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
        "id": "sha256:" + "e" * 64, "ref": "registry.example/x@sha256:" + name})
    return tar


def _served(model_dir, command: str) -> bytes:
    request = parse(command)
    with tempfile.TemporaryFile() as out:
        if request.verb == "imageinfo":
            out.write(json.dumps(serve_image_info(str(model_dir), request)).encode())
        else:
            serve_image(str(model_dir), request, out.fileno())
        out.seek(0)
        return out.read()


def test_a_whole_exported_image_is_served_from_an_offset_with_its_manifest(tmp_path):
    data = bytes(range(256)) * 64
    _exported(tmp_path, data)
    assert _served(tmp_path, f"image {IMAGE} 0") == data
    assert _served(tmp_path, f"image {IMAGE} 1000") == data[1000:]
    info = json.loads(_served(tmp_path, f"imageinfo {IMAGE}"))
    assert (info["size"], info["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    with pytest.raises(Refused, match="past the end"):
        _served(tmp_path, f"image {IMAGE} {len(data) + 1}")


def test_an_image_not_whole_staged_or_linked_out_is_refused(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"root only\n")
    # A tar whose size is not its manifest's (still being written, or cut).
    tar = _exported(tmp_path / "short", b"x" * 100)
    with open(tar, "r+b") as handle:
        handle.truncate(50)
    # A tar that is a symlink to a file out of the models directory, manifest and all.
    linked = _exported(tmp_path / "linked", secret.read_bytes())
    os.remove(linked)
    os.symlink(secret, linked)
    # An images directory that is a symlink to another box's.
    _exported(tmp_path / "elsewhere", b"y" * 10)
    (tmp_path / "outer").mkdir()
    os.symlink(tmp_path / "elsewhere" / ".images", tmp_path / "outer" / ".images")
    # Only staged: written by a copy still under way, no manifest.
    staged = tmp_path / "staged" / ".images" / ".partial"
    staged.mkdir(parents=True)
    (staged / f"{IMAGE}.tar").write_bytes(b"z" * 10)
    for root in ("short", "linked", "outer", "staged", "none"):
        for command in (f"image {IMAGE} 0", f"imageinfo {IMAGE}"):
            with pytest.raises(Refused):
                _served(tmp_path / root, command)
