"""python3 -m lobes_supervisor.logwrap LOG -- COMMAND...: a container's main process.

Runs COMMAND with its output copied to stdout (docker logs) and appended to LOG, a file on a
host volume, so a gear's or the gateway's output, crash traces included, outlives the container
(what a crashed service printed is kept). Each start and exit is marked in LOG, so boots stay
apart; the log rotates like the supervisor's. Signals are passed on, and the exit status is
the command's.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import BinaryIO

from .monitor import rotate_log

USAGE = "usage: python3 -m lobes_supervisor.logwrap LOG -- COMMAND [ARG...]"


def _mark(log: BinaryIO, message: str) -> None:
    log.write(f"[lobes logwrap {time.strftime('%Y-%m-%dT%H:%M:%S')}] {message}\n".encode())
    log.flush()


def _copy_output(child: subprocess.Popen, log: BinaryIO) -> None:
    out = sys.stdout.buffer
    for chunk in iter(lambda: os.read(child.stdout.fileno(), 65536), b""):
        out.write(chunk)
        out.flush()
        log.write(chunk)
        log.flush()


def run(log_path: Path, command: list[str]) -> int:
    """Run command, its output teed to log_path; return its exit status (128+N for signal N)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    rotate_log(log_path)
    with log_path.open("ab") as log:
        _mark(log, f"started: {shlex.join(command)}")
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda received, frame: child.send_signal(received))
        _copy_output(child, log)
        status = child.wait()
        _mark(log, f"exited with status {status}")
    return 128 - status if status < 0 else status


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(USAGE, file=sys.stderr)
        return 2
    return run(Path(argv[0]), argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
