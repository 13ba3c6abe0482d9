"""One run at a time per state directory: up, down and restart hold its lock.

Two deploys started together would otherwise both find a service missing and both start it.
The lock is an flock on a file of the state directory, so the kernel releases it when its
holder dies however it dies (a SIGKILL to the run included); the file names the holder, for
the message of a run that waited too long.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Iterator

from .layout import Layout

# A deploy that holds the lock waits for its gears' health checks: minutes at most.
LOCK_WAIT_S = 900.0
POLL_S = 0.2


class LockTimeout(RuntimeError):
    """Another run held the state directory's lock for longer than this one would wait."""


@contextlib.contextmanager
def held(layout: Layout, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold the state directory's lock, waiting up to wait_s for another run to let it go."""
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    with open(layout.lock_file, "a+", encoding="utf-8") as handle:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    handle.seek(0)
                    holder = handle.read().strip() or "a process that did not say"
                    raise LockTimeout(
                        f"another run holds {layout.lock_file} ({holder}) and did not let it "
                        f"go within {wait_s:g} s; wait for it to finish, or stop it") from None
                time.sleep(POLL_S)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%dT%H:%M:%S')}: "
                     f"{' '.join(sys.argv)}\n")
        handle.flush()
        yield
