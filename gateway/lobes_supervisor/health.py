"""python3 -m lobes_supervisor.health URL TIMEOUT_S: wait until URL answers 200.

Exit 0 once it does, 1 when TIMEOUT_S passes first. systemd units run it as ExecStartPost, so a
gear's unit is active (and the next gear's unit, ordered after it, starts) only once the gear
is healthy; the supervisor calls wait_until_healthy between two starts for the same reason.
"""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable

POLL_S = 0.5


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except (OSError, urllib.error.URLError):
        return False


def wait_until_healthy(url: str, timeout_s: float,
                       check: Callable[[], None] | None = None,
                       confirm: Callable[[], bool] | None = None) -> bool:
    """Whether URL answered 200 within `timeout_s`, and `confirm` (when given) says that what
    answered is the service started (not another program on its port); `check`, called
    between polls, raises to stop waiting sooner (the supervisor's: the service exited)."""
    deadline = time.monotonic() + timeout_s
    while not (answers(url) and (confirm is None or confirm())):
        if check is not None:
            check()
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python3 -m lobes_supervisor.health URL TIMEOUT_S", file=sys.stderr)
        return 2
    url, timeout = argv[0], float(argv[1])
    if wait_until_healthy(url, timeout):
        return 0
    print(f"{url} did not answer 200 within {timeout:g} s", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
