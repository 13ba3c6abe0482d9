"""A real OpenSSH server for one test or benchmark: its own host key, authorized_keys and log,
on 127.0.0.1 or on an address of a network namespace."""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from ansible_collections.lobes.fleet.plugins.module_utils.model_copy import ssh_argv

from tests.support.ports import free_port
from tests.support.tools import not_installed
from tests.support.wait import wait_until

SSHD = "/usr/sbin/sshd"
# sshd's privilege separation directory: compiled in, not configurable.
PRIVSEP_DIR = Path("/run/sshd")


def require_openssh() -> None:
    """Skip, naming the Debian package, where the server or the client is missing."""
    if not os.access(SSHD, os.X_OK):
        pytest.skip(not_installed("sshd", "openssh-server"))
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.skip(not_installed(tool, "openssh-client"))
    if not PRIVSEP_DIR.is_dir():
        try:
            PRIVSEP_DIR.mkdir(mode=0o755)
        except OSError as error:
            pytest.skip(f"sshd needs {PRIVSEP_DIR}, which cannot be created here: {error}")


@dataclass
class Sshd:
    """sshd -D as a child process, logging (VERBOSE) to a file the test reads; listening on
    `address`, inside the network namespace `netns` when one is named (`ip netns exec`)."""

    root: Path
    port: int = field(default_factory=free_port)
    user: str = field(default_factory=getpass.getuser)
    proc: subprocess.Popen | None = None
    address: str = "127.0.0.1"
    netns: str | None = None

    @property
    def authorized_keys(self) -> Path:
        return self.root / "authorized_keys"

    @property
    def log(self) -> Path:
        return self.root / "sshd.log"

    def start(self) -> Sshd:
        self.root.mkdir(parents=True, exist_ok=True)
        host_key = self.root / "host_ed25519"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True
        )
        self.authorized_keys.touch()
        config = self.root / "sshd_config"
        config.write_text(
            f"HostKey {host_key}\nAuthorizedKeysFile {self.authorized_keys}\nStrictModes no\n"
            f"PidFile {self.root / 'sshd.pid'}\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nUsePAM no\nPermitRootLogin prohibit-password\n"
            "LogLevel VERBOSE\n"
        )
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    *(["ip", "netns", "exec", self.netns] if self.netns else []),
                    SSHD,
                    "-D",
                    "-e",
                    "-f",
                    str(config),
                    "-p",
                    str(self.port),
                    "-o",
                    f"ListenAddress={self.address}",
                ],
                stdout=log,
                stderr=log,
            )
        wait_until(
            lambda: "Server listening" in self.log.read_text(),
            message=f"sshd on {self.port}",
            timeout=20,
        )
        return self

    def connections(self) -> int:
        """Logins accepted so far (one per ssh command)."""
        return self.log.read_text().count("Accepted publickey for")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def ssh(key: Path, server: Sshd, command: str, known_hosts: Path) -> subprocess.CompletedProcess:
    """One ssh command to the server with key, with model_pull's own command line."""
    argv = [*ssh_argv(str(key), server.port, server.user, "127.0.0.1", str(known_hosts), 60),
            command]
    return subprocess.run(
        argv, capture_output=True, timeout=60, check=False, stdin=subprocess.DEVNULL
    )
