"""The copy server's command parser takes only well-formed requests (generated: hypothesis)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lobes_model_serve import Refused, parse

CKPT = "acme/tiny-chat"
REV = "0123456789abcdef0123456789abcdef01234567"
ROOT = "/srv/models/" + CKPT + "/" + REV

# Pieces an attacker would combine into a command, and arbitrary text besides.
PIECES = st.sampled_from(
    [
        "read",
        "list",
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
