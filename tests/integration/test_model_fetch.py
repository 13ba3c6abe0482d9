"""lobes.fleet.model_fetch and model_files against the hub stand-in, over HTTP on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.hub_standin import HubStandin
from tests.support.wait import wait_until

from .conftest import ROOT, ansible_module

REPO = "acme/tiny-chat"
TOKEN = "hf_SecretTokenThatMustNeverShow"
WEIGHTS = bytes(range(256)) * 1200  # 300 KiB, an LFS file (served by the CDN)
FILES = {
    "config.json": b'{"model_type": "tiny"}\n',
    "tokenizer/vocab.txt": b"a\nb\nc\n" * 50,
    "model.safetensors": WEIGHTS,
}


@pytest.fixture
def hub() -> Iterator[HubStandin]:
    standin = HubStandin().start()
    yield standin
    standin.stop()


def _args_file(tmp_path: Path, args: dict, check: bool) -> Path:
    path = tmp_path / f"args-{time.monotonic_ns()}.json"
    args = {**args, "_ansible_check_mode": check, "_ansible_diff": True}
    path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    return path


def _module_argv(name: str, args_file: Path) -> list[str]:
    return [sys.executable, "-m", f"ansible_collections.lobes.fleet.plugins.modules.{name}",
            str(args_file)]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / ".collections")}


def run_module(name: str, tmp_path: Path, *, check: bool = False, **args: object) -> dict:
    """Run a module's entry point as ansible would on the box, and return its JSON result."""
    done = subprocess.run(_module_argv(name, _args_file(tmp_path, args, check)), env=_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert TOKEN not in done.stdout + done.stderr
    return json.loads(done.stdout)


def fetch(hub: HubStandin, tmp_path: Path, **args: object) -> dict:
    args = {"checkpoint": REPO, "endpoint": hub.endpoint, "model_dir": str(tmp_path / "models"),
            **args}
    return run_module("model_fetch", tmp_path, **args)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_resolves_main_fetches_checked_and_a_second_run_fetches_nothing(hub, tmp_path):
    hub.add_commit(REPO, {"config.json": b"old\n"})
    commit = hub.add_commit(REPO, FILES)

    first = fetch(hub, tmp_path)

    assert first.get("failed") is not True, first
    assert first["changed"] is True and first["revision"] == commit
    final = tmp_path / "models" / REPO / commit
    assert first["path"] == str(final)
    assert {p: d for p, d in _tree(final).items() if p != ".lobes-manifest.json"} == FILES
    assert first["files"] == {p: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                              for p, d in FILES.items()}
    assert first["bytes_fetched"] == first["bytes_total"] == sum(map(len, FILES.values()))
    assert first["diff"] == {"before": "revision: (none)\n", "after": f"revision: {commit}\n"}
    assert not (tmp_path / "models" / ".partial" / REPO / commit).exists()
    # The weights came from the CDN, after the hub's redirect.
    assert [r.status for r in hub.log("hub", "model.safetensors")] == [302]
    assert [r.bytes_sent for r in hub.log("cdn", "model.safetensors")] == [len(WEIGHTS)]

    sent = hub.file_bytes_sent()
    second = fetch(hub, tmp_path, revision=commit)

    assert second["changed"] is False and second["bytes_fetched"] == 0
    assert second["files"] == first["files"]
    assert hub.file_bytes_sent() == sent


def test_a_file_changed_after_the_manifest_is_hashed_again_and_refetched(hub, tmp_path):
    commit = hub.add_commit(REPO, FILES)
    fetch(hub, tmp_path)
    config = tmp_path / "models" / REPO / commit / "config.json"
    config.write_bytes(b'{"model_type": "TINY"}\n')  # same size, new mtime

    again = fetch(hub, tmp_path)

    assert again["changed"] is True
    assert again["bytes_fetched"] == len(FILES["config.json"])
    assert config.read_bytes() == FILES["config.json"]


def test_a_cut_connection_is_resumed_with_a_range(hub, tmp_path):
    hub.add_commit(REPO, FILES)
    hub.faults.cut_after["model.safetensors"] = [100_000]

    result = fetch(hub, tmp_path)

    assert result.get("failed") is not True, result
    served = hub.log("cdn", "model.safetensors")
    assert [(r.range_start, r.bytes_sent) for r in served] == [
        (None, 100_000), (100_000, len(WEIGHTS) - 100_000)]
    assert result["bytes_fetched"] == result["bytes_total"]


def test_a_server_that_answers_a_range_with_the_whole_file_is_not_appended_to(hub, tmp_path):
    hub.add_commit(REPO, FILES)
    hub.faults.cut_after["model.safetensors"] = [100_000]
    hub.faults.ignore_range.add("model.safetensors")

    result = fetch(hub, tmp_path)

    assert result.get("failed") is not True, result
    assert [r.status for r in hub.log("cdn", "model.safetensors")] == [200, 200]
    assert (Path(result["path"]) / "model.safetensors").read_bytes() == WEIGHTS


def test_a_file_served_wrong_once_is_fetched_again(hub, tmp_path):
    hub.add_commit(REPO, FILES)
    hub.faults.corrupt["config.json"] = 1

    result = fetch(hub, tmp_path)

    assert result.get("failed") is not True, result
    assert len(hub.log("hub", "config.json")) == 2
    assert (Path(result["path"]) / "config.json").read_bytes() == FILES["config.json"]


def test_a_file_always_served_wrong_fails_naming_it_and_nothing_is_final(hub, tmp_path):
    commit = hub.add_commit(REPO, FILES)
    hub.faults.corrupt["model.safetensors"] = -1

    result = fetch(hub, tmp_path)

    assert result["failed"] is True
    assert "model.safetensors" in result["msg"]
    assert hashlib.sha256(WEIGHTS).hexdigest() in result["msg"]
    wrong = bytes([WEIGHTS[0] ^ 0xFF]) + WEIGHTS[1:]
    assert hashlib.sha256(wrong).hexdigest() in result["msg"]
    assert not (tmp_path / "models" / REPO / commit).exists()


def test_a_fetch_killed_midway_leaves_no_final_directory_and_the_next_run_resumes(hub, tmp_path):
    commit = hub.add_commit(REPO, FILES)
    hub.faults.delay["model.safetensors"] = 0.05  # 4 KiB every 50 ms: seconds for the file
    args = {"checkpoint": REPO, "endpoint": hub.endpoint, "model_dir": str(tmp_path / "models")}
    staged = tmp_path / "models" / ".partial" / REPO / commit / "model.safetensors"
    proc = subprocess.Popen(_module_argv("model_fetch", _args_file(tmp_path, args, False)),
                            env=_env(), stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: staged.exists() and staged.stat().st_size >= 40_000,
                   message="the weights partly staged", timeout=60)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    have = staged.stat().st_size
    assert 0 < have < len(WEIGHTS)
    assert not (tmp_path / "models" / REPO / commit).exists()
    hub.faults.delay.clear()

    result = fetch(hub, tmp_path)

    assert result.get("failed") is not True, result
    assert hub.log("cdn", "model.safetensors")[-1].range_start == have
    assert (Path(result["path"]) / "model.safetensors").read_bytes() == WEIGHTS


def test_the_token_opens_a_gated_repo_and_never_reaches_the_cdn_or_the_output(hub, tmp_path):
    hub.add_commit(REPO, FILES, token=TOKEN)
    hub.faults.echo_auth_in_errors = True

    refused = fetch(hub, tmp_path)
    assert refused["failed"] is True
    assert REPO in refused["msg"] and "main" in refused["msg"] and "token" in refused["msg"]
    wrong = fetch(hub, tmp_path, token=TOKEN + "x")  # the hub echoes it in its error
    assert wrong["failed"] is True and "HTTP 403" in wrong["msg"]
    assert "TokenThatMustNeverShow" not in json.dumps(wrong)

    result = fetch(hub, tmp_path, token=TOKEN)

    assert result.get("failed") is not True, result
    assert all(r.headers.get("Authorization") == f"Bearer {TOKEN}" for r in hub.log("hub")[2:])
    assert hub.log("cdn") and all("Authorization" not in r.headers for r in hub.log("cdn"))


def test_an_unknown_repo_or_revision_fails_naming_both_and_the_fix(hub, tmp_path):
    hub.add_commit(REPO, FILES)

    unknown = fetch(hub, tmp_path, checkpoint="acme/nothing")
    assert unknown["failed"] is True
    assert "acme/nothing" in unknown["msg"] and "HTTP 404" in unknown["msg"]
    assert "check the repo id" in unknown["msg"]
    missing = fetch(hub, tmp_path, revision="a" * 40)
    assert missing["failed"] is True and "a" * 40 in missing["msg"] and REPO in missing["msg"]


def test_a_revision_ending_in_a_newline_is_refused_before_the_hub_is_asked(hub, tmp_path):
    hub.add_commit(REPO, FILES)
    refused = fetch(hub, tmp_path, revision="main\n")
    assert refused["failed"] is True and "is not a branch or a commit" in refused["msg"]
    assert not hub.log()


def test_check_mode_reports_the_bytes_and_writes_nothing(hub, tmp_path):
    commit = hub.add_commit(REPO, FILES)

    planned = ansible_module("lobes.fleet.model_fetch", json.dumps({
        "checkpoint": REPO, "endpoint": hub.endpoint, "model_dir": str(tmp_path / "models")}),
        check=True)

    assert planned["changed"] is True and planned["revision"] == commit
    assert planned["bytes_fetched"] == sum(map(len, FILES.values()))
    assert planned["diff"]["after"] == f"revision: {commit}\n"
    assert not (tmp_path / "models").exists()
    assert hub.file_bytes_sent() == 0


@pytest.mark.parametrize("name", ["../escape.txt", "/etc/evil", "a/../../escape.txt",
                                  "dir\\..\\escape.txt", "nul\x00.txt", "./config.json"])
def test_hostile_file_names_from_the_hub_are_refused(hub, tmp_path, name):
    commit = hub.add_commit(REPO, {**FILES, name: b"owned\n"})

    result = fetch(hub, tmp_path)

    assert result["failed"] is True and "refusing" in result["msg"]
    assert not (tmp_path / "escape.txt").exists()
    assert not (tmp_path / "models" / REPO / commit).exists()
    assert hub.file_bytes_sent() == 0


def _lock(files: dict[str, bytes]) -> dict:
    return {p: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for p, d in files.items()}


def files_module(tmp_path: Path, commit: str, **args: object) -> dict:
    args = {"checkpoint": REPO, "revision": commit, "model_dir": str(tmp_path / "models"),
            "files": _lock(FILES), **args}
    return run_module("model_files", tmp_path, **args)


def test_model_files_finds_a_flipped_byte_and_a_missing_file(hub, tmp_path):
    commit = hub.add_commit(REPO, FILES)
    fetch(hub, tmp_path)
    final = tmp_path / "models" / REPO / commit
    assert files_module(tmp_path, commit)["whole"] is True
    weights = final / "model.safetensors"
    stat = weights.stat()
    weights.write_bytes(bytes([WEIGHTS[0] ^ 1]) + WEIGHTS[1:])
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    (final / "config.json").unlink()

    report = files_module(tmp_path, commit)

    assert report["changed"] is False and report["whole"] is False
    assert report["corrupt"] == ["model.safetensors"] and report["missing"] == ["config.json"]
    assert report["wrong_size"] == []
    assert report["bytes_needed"] == len(WEIGHTS) + len(FILES["config.json"])
    assert report["free_bytes"] > 0


def test_model_files_promotes_a_whole_staging_dir_and_refuses_a_partial_one(tmp_path):
    commit = "c" * 40
    staging = tmp_path / "models" / ".partial" / REPO / commit
    for rel, data in FILES.items():
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging / rel).write_bytes(data)
    (staging / "config.json").write_bytes(b"short")

    refused = files_module(tmp_path, commit, state="present")
    assert refused["failed"] is True and "config.json" in refused["msg"]
    assert not (tmp_path / "models" / REPO / commit).exists()

    (staging / "config.json").write_bytes(FILES["config.json"])
    planned = files_module(tmp_path, commit, state="present", check=True)
    assert planned["changed"] is True and planned["promoted"] is True and staging.exists()

    promoted = files_module(tmp_path, commit, state="present")

    assert promoted["changed"] is True and promoted["whole"] is True
    assert not staging.exists()
    final = tmp_path / "models" / REPO / commit
    assert {p: d for p, d in _tree(final).items() if p != ".lobes-manifest.json"} == FILES
    again = files_module(tmp_path, commit, state="present")
    assert again["changed"] is False and again["whole"] is True


def test_a_new_revision_lands_beside_the_old_and_the_diff_shows_both(hub, tmp_path):
    old = hub.add_commit(REPO, {"config.json": b"v1\n"})
    fetch(hub, tmp_path)
    new = hub.add_commit(REPO, FILES)

    result = fetch(hub, tmp_path)

    assert result["revision"] == new
    assert result["diff"] == {"before": f"revision: {old}\n",
                              "after": "".join(f"revision: {r}\n" for r in sorted([old, new]))}
    assert (tmp_path / "models" / REPO / old / "config.json").read_bytes() == b"v1\n"


def test_model_files_refuses_a_lock_entry_without_a_size_or_sha256(tmp_path):
    result = files_module(tmp_path, "d" * 40, files={"config.json": {"size": "12"}})

    assert result["failed"] is True and "config.json" in result["msg"]
