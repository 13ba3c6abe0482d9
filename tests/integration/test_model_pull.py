"""lobes.fleet.model_pull, model_copy_key and the copy server over a real sshd on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from ansible_collections.lobes.fleet.plugins.module_utils.model_files import (
    check_dir,
    final_dir,
    promote,
    staging_dir,
)

from tests.support.sshd import Sshd, require_openssh, ssh
from tests.support.wait import wait_until

from .conftest import GATEWAY_SRC
from .test_model_fetch import _args_file, _env, _module_argv, run_module

CKPT = "acme/tiny-chat"
REV = "a1" * 20  # whole on the source
BAD = "b2" * 20  # whole on the source until a byte of its weights changed
HOSTILE = "c3" * 20  # a final directory holding symlinks out
STAGED = "d4" * 20  # only in the source's staging directory
SLOW = "e5" * 20  # whole on the source, served slowly from offset 0 (a copy to kill midway)
BIG = "model-00001-of-00002.safetensors"
_BYTES = random.Random(7).randbytes
FILES = {
    "config.json": b'{"model_type": "tiny"}\n',
    BIG: _BYTES(20 << 20),
    "model-00002-of-00002.safetensors": _BYTES(3 << 20),
    "tokenizer/tokenizer.json": _BYTES(1 << 20),
}
LOCK = {
    path: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    for path, data in FILES.items()
}
TOTAL = sum(map(len, FILES.values()))
SECRET = b"root-only secret that must never leave the box\n"


@dataclass
class Fleet:
    """A source box's model_dir served by sshd, the copy key, and the commands the server got."""

    base: Path
    source: Path
    key: Path
    sshd: Sshd
    commands: Path

    def served(self) -> list[str]:
        return self.commands.read_text().splitlines() if self.commands.exists() else []


def _whole_revision(
    model_dir: Path, checkpoint: str, revision: str, files: dict[str, bytes]
) -> Path:
    """A revision written to staging, checked with model_files' code and promoted."""
    staging = Path(staging_dir(str(model_dir), checkpoint, revision))
    for path, data in files.items():
        (staging / path).parent.mkdir(parents=True, exist_ok=True)
        (staging / path).write_bytes(data)
    lock = {p: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for p, d in files.items()}
    report = check_dir(str(staging), lock, use_manifest=False)
    assert report.whole, report
    final = final_dir(str(model_dir), checkpoint, revision)
    promote(str(staging), final, report.manifest)
    return Path(final)


def _hostile_source(source: Path, secret: Path) -> None:
    """Symlinks out of a final revision (listed in its manifest), a staged-only revision, and a
    final revision name that is a symlink to staging."""
    hostile = _whole_revision(source, CKPT, HOSTILE, {"ok.txt": b"fine\n"})
    (hostile / "leak.txt").symlink_to(secret)
    (hostile / "sub").symlink_to(secret.parent)
    manifest = json.loads((hostile / ".lobes-manifest.json").read_text())
    for rel in ("leak.txt", f"sub/{secret.name}"):
        manifest[rel] = {
            "size": len(SECRET),
            "sha256": hashlib.sha256(SECRET).hexdigest(),
            "mtime_ns": 0,
        }
    (hostile / ".lobes-manifest.json").write_text(json.dumps(manifest))
    staged = Path(staging_dir(str(source), CKPT, STAGED))
    staged.mkdir(parents=True)
    (staged / "ok.txt").write_bytes(SECRET)
    linked = source / "acme" / "linked"
    linked.mkdir(parents=True)
    (linked / STAGED).symlink_to(staged)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    require_openssh()
    base = tmp_path_factory.mktemp("copy")
    source = base / "source"
    _whole_revision(source, CKPT, REV, FILES)
    bad = _whole_revision(source, CKPT, BAD, FILES)
    with open(bad / BIG, "r+b") as weights:  # one byte flipped, size and manifest kept
        weights.seek(12345)
        weights.write(bytes([FILES[BIG][12345] ^ 0xFF]))
    secret = base / "secret" / "passwd"
    secret.parent.mkdir()
    secret.write_bytes(SECRET)
    _hostile_source(source, secret)
    _whole_revision(source, CKPT, SLOW, {BIG: FILES[BIG]})
    # The forced command's interpreter: a wrapper that records each command, then runs the
    # server (for SLOW from offset 0, through a throttle of 64 KiB every 20 ms).
    commands = base / "commands.log"
    throttle = base / "throttle.py"
    throttle.write_text(
        "import sys, time\n"
        "for chunk in iter(lambda: sys.stdin.buffer.read1(65536), b''):\n"
        "    sys.stdout.buffer.write(chunk); sys.stdout.buffer.flush(); time.sleep(0.02)\n"
    )
    wrapper = base / "python"
    wrapper.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$SSH_ORIGINAL_COMMAND" >> {commands}\n'
        f'case "$SSH_ORIGINAL_COMMAND" in\n'
        f'  *" {SLOW} "*" 0") {sys.executable} "$@" | {sys.executable} {throttle} ;;\n'
        f'  *) exec {sys.executable} "$@" ;;\n'
        "esac\n"
    )
    wrapper.chmod(0o755)
    keys = base / "keys"
    made = run_module("model_copy_key", base, model_dir=str(keys))
    assert made["changed"] is True and made["public_key"].startswith("ssh-ed25519 "), made
    server = Sshd(base / "sshd").start()
    trusted = run_module(
        "model_copy_key",
        base,
        state="authorized",
        public_keys=[made["public_key"]],
        authorized_keys=str(server.authorized_keys),
        python=str(wrapper),
        serve=str(GATEWAY_SRC / "lobes_model_serve.py"),
        model_dir=str(source),
    )
    assert trusted["changed"] is True, trusted
    yield Fleet(base, source, Path(made["path"]), server, commands)
    server.stop()


def pull(fleet: Fleet, dest: Path, tmp_path: Path, *, check: bool = False, **args: object) -> dict:
    args = {
        "checkpoint": CKPT,
        "revision": REV,
        "files": LOCK,
        "model_dir": str(dest),
        "source": "127.0.0.1",
        "ssh_user": fleet.sshd.user,
        "ssh_port": fleet.sshd.port,
        "ssh_key": str(fleet.key),
        "timeout": 20,
        **args,
    }
    return run_module("model_pull", tmp_path, check=check, **args)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
    }


def test_a_pull_makes_the_box_whole_and_a_second_run_opens_no_ssh(fleet, tmp_path):
    dest = tmp_path / "models"
    served = len(fleet.served())

    first = pull(fleet, dest, tmp_path)

    assert first.get("failed") is not True, first
    final = dest / CKPT / REV
    assert first["changed"] is True and first["path"] == str(final)
    assert {p: d for p, d in _tree(final).items() if p != ".lobes-manifest.json"} == FILES
    assert first["bytes_copied"] == first["bytes_total"] == TOTAL
    assert first["pulled"] == sorted(FILES) and first["resumed"] == []
    assert fleet.served()[served:] == [f"read {CKPT} {REV} {p} 0" for p in sorted(FILES)]
    assert not (dest / ".partial" / CKPT / REV).exists()
    assert check_dir(str(final), LOCK, use_manifest=True).whole
    assert "127.0.0.1" in (dest / ".ssh" / "known_hosts").read_text()  # accepted as new

    logins = fleet.sshd.connections()
    second = pull(fleet, dest, tmp_path)

    assert second.get("failed") is not True, second
    assert second["changed"] is False and second["bytes_copied"] == 0 and second["pulled"] == []
    assert fleet.sshd.connections() == logins
    assert len(fleet.served()) == served + len(FILES)


def test_a_partial_staging_file_is_resumed_from_its_size(fleet, tmp_path):
    dest = tmp_path / "models"
    staged = dest / ".partial" / CKPT / REV / BIG
    staged.parent.mkdir(parents=True)
    have = 7_654_321  # what a cut connection left
    staged.write_bytes(FILES[BIG][:have])
    served = len(fleet.served())

    result = pull(fleet, dest, tmp_path)

    assert result.get("failed") is not True, result
    assert f"read {CKPT} {REV} {BIG} {have}" in fleet.served()[served:]
    assert result["bytes_copied"] == TOTAL - have
    assert result["resumed"] == [BIG]
    assert (dest / CKPT / REV / BIG).read_bytes() == FILES[BIG]


def test_a_pull_killed_midway_keeps_its_part_and_the_next_run_resumes_it(fleet, tmp_path):
    dest = tmp_path / "models"
    args = {
        "checkpoint": CKPT,
        "revision": SLOW,
        "files": {BIG: LOCK[BIG]},
        "model_dir": str(dest),
        "source": "127.0.0.1",
        "ssh_user": fleet.sshd.user,
        "ssh_port": fleet.sshd.port,
        "ssh_key": str(fleet.key),
        "timeout": 20,
    }
    staged = dest / ".partial" / CKPT / SLOW / BIG
    proc = subprocess.Popen(
        _module_argv("model_pull", _args_file(tmp_path, args, False)),
        env=_env(),
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(
            lambda: staged.exists() and staged.stat().st_size >= 1 << 20,
            message="the weights partly copied",
            timeout=60,
        )
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    have = staged.stat().st_size
    assert 0 < have < len(FILES[BIG])
    assert not (dest / CKPT / SLOW).exists()
    served = len(fleet.served())

    result = pull(fleet, dest, tmp_path, revision=SLOW, files={BIG: LOCK[BIG]})

    assert result.get("failed") is not True, result
    assert fleet.served()[served:] == [f"read {CKPT} {SLOW} {BIG} {have}"]
    assert result["resumed"] == [BIG] and result["bytes_copied"] == len(FILES[BIG]) - have
    assert (dest / CKPT / SLOW / BIG).read_bytes() == FILES[BIG]


def test_a_source_without_the_revision_fails_with_its_reason_and_keeps_the_staged_part(
    fleet, tmp_path
):
    dest = tmp_path / "models"
    staged = dest / ".partial" / CKPT / STAGED / BIG
    staged.parent.mkdir(parents=True)
    staged.write_bytes(FILES[BIG][:5000])

    result = pull(fleet, dest, tmp_path, revision=STAGED, files={BIG: LOCK[BIG]})

    assert result.get("failed") is True, result
    assert BIG in result["msg"] and f"{CKPT} at {STAGED} is not a whole revision" in result["msg"]
    assert staged.read_bytes() == FILES[BIG][:5000]
    assert not (dest / CKPT / STAGED).exists()


def test_a_staging_file_longer_than_the_lock_is_copied_again_from_zero(fleet, tmp_path):
    dest = tmp_path / "models"
    staged = dest / ".partial" / CKPT / REV / "config.json"
    staged.parent.mkdir(parents=True)
    staged.write_bytes(FILES["config.json"] + b"trailing junk")
    served = len(fleet.served())

    result = pull(fleet, dest, tmp_path)

    assert result.get("failed") is not True, result
    assert f"read {CKPT} {REV} config.json 0" in fleet.served()[served:]
    assert result["resumed"] == [] and result["bytes_copied"] == TOTAL
    assert (dest / CKPT / REV / "config.json").read_bytes() == FILES["config.json"]


def test_a_corrupt_source_file_fails_naming_it_and_nothing_is_promoted(fleet, tmp_path):
    dest = tmp_path / "models"
    served = len(fleet.served())

    result = pull(fleet, dest, tmp_path, revision=BAD)

    assert result.get("failed") is True, result
    found = hashlib.sha256((fleet.source / CKPT / BAD / BIG).read_bytes()).hexdigest()
    assert BIG in result["msg"] and LOCK[BIG]["sha256"] in result["msg"] and found in result["msg"]
    assert not (dest / CKPT / BAD).exists()
    # Copied twice from its start, then given up on.
    assert fleet.served()[served:].count(f"read {CKPT} {BAD} {BIG} 0") == 2


def test_check_mode_reports_the_files_and_changes_nothing(fleet, tmp_path):
    dest = tmp_path / "models"
    staged = dest / ".partial" / CKPT / REV / BIG
    staged.parent.mkdir(parents=True)
    staged.write_bytes(FILES[BIG][:1000])
    before = _snapshot(dest)
    logins = fleet.sshd.connections()

    result = pull(fleet, dest, tmp_path, check=True)

    assert result.get("failed") is not True, result
    assert result["changed"] is True and result["pulled"] == sorted(FILES)
    assert result["bytes_copied"] == TOTAL - 1000
    assert "not whole" in result["diff"]["before"]
    assert _snapshot(dest) == before
    assert fleet.sshd.connections() == logins


def _refusal(fleet: Fleet, tmp_path: Path, command: str) -> None:
    done = ssh(fleet.key, fleet.sshd, command, tmp_path / "known_hosts")
    assert done.returncode == 2, done
    assert done.stdout == b""
    assert b"lobes_model_serve: refused: " in done.stderr and SECRET not in done.stderr
    assert done.stderr.decode().count("\n") == 1


@pytest.mark.parametrize(
    "command",
    [
        f"read {CKPT} {REV} ../../../../secret/passwd 0",  # a path outside the revision
        f"read {CKPT} {REV} ../../../.partial/{CKPT}/{STAGED}/ok.txt 0",  # staging, by path
        f"read {CKPT} {STAGED} ok.txt 0",  # a revision only staged
        f"read acme/linked {STAGED} ok.txt 0",  # a final name that is a symlink to staging
        f"read {CKPT} {HOSTILE} leak.txt 0",  # a symlink out, though the manifest lists it
        f"read {CKPT} {HOSTILE} sub/passwd 0",  # a file under a symlinked directory
        f"read {CKPT} {HOSTILE} .lobes-manifest.json 0",
        f"read {CKPT} main config.json 0",  # not a 40-hex revision
        f"read {CKPT} {REV.upper()} config.json 0",
        f"read {CKPT} {REV} config.json 99999999",  # past the end
        f"read {CKPT} {REV} config.json -1",
        f"list {CKPT} {STAGED}",
        "ls",
        "sh -c 'cat /etc/passwd'",
        "cat /etc/passwd",
        "",
        f"read {CKPT} {REV} config.json 0; id",
    ],
)
def test_the_forced_command_refuses_and_nothing_leaks(fleet, tmp_path, command):
    _refusal(fleet, tmp_path, command)


def test_the_forced_command_serves_a_whole_revision_from_an_offset_and_lists_it(fleet, tmp_path):
    known = tmp_path / "known_hosts"
    read = ssh(fleet.key, fleet.sshd, f"read {CKPT} {REV} config.json 3", known)
    assert (read.returncode, read.stdout) == (0, FILES["config.json"][3:]), read
    listed = ssh(fleet.key, fleet.sshd, f"list {CKPT} {HOSTILE}", known)
    assert listed.returncode == 0, listed
    assert json.loads(listed.stdout) == {"ok.txt": 5}  # the symlinks the manifest lists left out


def test_copy_key_pair_is_kept_and_authorized_lines_touch_no_other(tmp_path):
    require_openssh()
    models = tmp_path / "models"
    made = run_module("model_copy_key", tmp_path, model_dir=str(models))
    key = models / ".ssh" / "lobes_model_copy"
    assert made["changed"] is True and made["path"] == str(key)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    again = run_module("model_copy_key", tmp_path, model_dir=str(models))
    assert again["changed"] is False and again["public_key"] == made["public_key"]

    other = (
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherAdminKeyxxxxxxxxxxxxxxxxxxxxxxxxxxxxx admin@desk"
    )
    authorized = tmp_path / "authorized_keys"
    authorized.write_text(f"# admins\n{other}\n")
    args = {
        "state": "authorized",
        "authorized_keys": str(authorized),
        "model_dir": str(models),
        "serve": "/srv/lobes/gateway/lobes_model_serve.py",
    }
    checked = run_module(
        "model_copy_key", tmp_path, check=True, public_keys=[made["public_key"]], **args
    )
    assert checked["changed"] is True and authorized.read_text() == f"# admins\n{other}\n"

    added = run_module("model_copy_key", tmp_path, public_keys=[made["public_key"]], **args)
    forced = (
        f'command="/usr/bin/python3 /srv/lobes/gateway/lobes_model_serve.py {models}",restrict '
        f"{made['public_key']}"
    )
    assert added["changed"] is True and added["added"] == [forced]
    assert authorized.read_text() == f"# admins\n{other}\n{forced}\n"
    assert added["diff"]["after"] == authorized.read_text()
    assert (
        run_module("model_copy_key", tmp_path, public_keys=[made["public_key"]], **args)["changed"]
        is False
    )

    dropped = run_module("model_copy_key", tmp_path, public_keys=[], exclusive=True, **args)
    assert dropped["removed"] == [forced] and authorized.read_text() == f"# admins\n{other}\n"
    refused = run_module("model_copy_key", tmp_path, public_keys=["ssh-ed25519 AAAA x\ny"], **args)
    assert refused.get("failed") is True and "is not a public key line" in refused["msg"]
    assert authorized.read_text() == f"# admins\n{other}\n"
