"""The end of a service's log, as a failure quotes it: its last lines, its secrets masked.

A service that exits or never becomes healthy is reported with why, which is in its log (the
gateway's one-line start-up errors, a traceback). The log may hold what the service printed of
its environment, so every secret value of that environment (the names the contract calls
secret) is replaced before a line leaves the box in a failure message.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from lobes_contract import is_secret_env
from lobes_service_files import EnvFileError, Service, read_env_file

TAIL_LINES = 15
# Read from the end: a log may be large, its last lines never are.
_TAIL_BYTES = 16 * 1024
# A line longer than this is cut (after masking, so no secret is cut in two).
_LINE_CHARS = 400
MASK = "********"


def secret_values(env: Mapping[str, str]) -> set[str]:
    """Every secret value of an environment: each secret variable's whole value and, for a
    list of keys (`k1,k2` or GATEWAY_CLIENT_KEYS' `name=key:class`), each key in it."""
    secrets = set()
    for name, value in env.items():
        if not is_secret_env(name):
            continue
        secrets.add(value.strip())
        for item in value.split(","):
            secrets.add(item.split("=", 1)[-1].split(":", 1)[0].strip())
    secrets.discard("")
    return secrets


def service_secrets(spec: Service) -> set[str]:
    """The secret values of a service's env_file (when it parses) and of its own env."""
    env: dict[str, str] = {}
    if spec.env_path is not None and os.path.exists(spec.env_path):
        # One that does not parse was refused before any start (control._check_env_file).
        with contextlib.suppress(OSError, EnvFileError):
            env.update(read_env_file(spec.env_path))
    env.update(spec.env)
    return secret_values(env)


def masked_tail(path: Path, secrets: Iterable[str], lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of the log at `path`, each secret replaced by MASK; "" when
    the log is missing or empty."""
    try:
        with path.open("rb") as log:
            start = max(0, log.seek(0, os.SEEK_END) - _TAIL_BYTES)
            log.seek(start)
            text = log.read().decode("utf-8", "replace")
    except OSError:
        return ""
    for secret in sorted(secrets, key=len, reverse=True):  # a key inside another: longest first
        text = text.replace(secret, MASK)
    kept = text.splitlines()
    if start > 0:
        kept = kept[1:]  # read from mid-line: its start, and any secret there, was cut off
    return "\n".join(line[:_LINE_CHARS] for line in kept[-lines:])
