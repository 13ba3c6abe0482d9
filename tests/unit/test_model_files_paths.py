"""File names from the hub never lead outside a model's directory (generated: hypothesis),
and the module's messages never hold the token."""

from __future__ import annotations

import os
from email.message import Message
from urllib.error import HTTPError

import pytest
from ansible_collections.lobes.fleet.plugins.module_utils.model_files import (
    MANIFEST,
    UnsafePath,
    check_dir,
    inside,
    safe_relpath,
)
from ansible_collections.lobes.fleet.plugins.modules.model_fetch import Hub, _hub_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = "/srv/models/org/name/" + "0" * 40

# Parts an attacker would combine, and arbitrary text besides.
PARTS = st.sampled_from(["..", ".", "", "a", "b.bin", "\\", "..\\x", "/", "\x00", "\n", "~", " "])
NAMES = st.one_of(st.lists(PARTS, min_size=1, max_size=6).map("/".join),
                  st.lists(PARTS, min_size=1, max_size=6).map("".join), st.text(max_size=40))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(NAMES)
def test_a_name_is_refused_or_stays_strictly_inside_the_directory(name):
    try:
        rel = safe_relpath(name)
    except UnsafePath:
        return
    joined = os.path.join(ROOT, rel)
    # Accepted: normalising changes nothing, and the file is below the root, never the root.
    assert os.path.normpath(joined) == joined
    assert joined.startswith(ROOT + "/") and len(joined) > len(ROOT) + 1
    assert "\\" not in rel and "\x00" not in rel and ".." not in rel.split("/")


@pytest.mark.parametrize("name", ["../x", "/x", "a/../../x", "a//b", "a/./b", "a\\b", "x\x00",
                                  "a/", "", MANIFEST, "..", "line\nbreak"])
def test_known_hostile_names_are_refused(name):
    with pytest.raises(UnsafePath):
        safe_relpath(name)


def test_plain_names_are_taken_as_they_are():
    assert safe_relpath("model-00001-of-00002.safetensors") == "model-00001-of-00002.safetensors"
    assert safe_relpath("tokenizer/vocab.json") == "tokenizer/vocab.json"
    assert safe_relpath("..hidden/...") == "..hidden/..."


def test_a_symlink_out_of_the_directory_is_refused(tmp_path):
    root = tmp_path / "staging"
    root.mkdir()
    (root / "sub").symlink_to(tmp_path)
    with pytest.raises(UnsafePath):
        inside(str(root), "sub/escape.bin")
    with pytest.raises(UnsafePath):
        check_dir(str(root), {"sub/escape.bin": {"size": 1, "sha256": "0" * 64}},
                  use_manifest=False)


def test_an_error_that_echoes_the_token_is_reported_without_it():
    token = "hf_abcdefSECRET"
    headers = Message()
    headers["X-Error-Message"] = f"bad credentials: Bearer {token}"
    error = HTTPError("http://hub/api", 403, "Forbidden", headers, None)

    message = _hub_error(Hub("http://hub", token, 5), error, "org/name", "main", "resolving")

    assert token not in message
    assert "org/name" in message and "main" in message and "HTTP 403" in message


@pytest.mark.parametrize(("status", "code", "fix"), [
    (401, "RepoNotFound", "check the repo id"),
    (401, "GatedRepo", "accept its terms"),
    (401, None, "give the token"),
    (404, "RevisionNotFound", "the revision is a branch or a commit"),
    (403, None, "has no access"),
])
def test_the_hub_error_code_picks_the_fix_the_message_names(status, code, fix):
    headers = Message()
    if code:
        headers["X-Error-Code"] = code
    error = HTTPError("http://hub/api", status, "No", headers, None)

    message = _hub_error(Hub("http://hub", None, 5), error, "org/name", "v2", "resolving")

    assert fix in message and f"HTTP {status}" in message and "org/name at revision v2" in message
