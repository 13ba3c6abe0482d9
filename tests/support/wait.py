"""Waiting on a condition instead of sleeping: poll until it holds, fail naming what it was."""

from __future__ import annotations

import http.client
import time
import urllib.request
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The condition did not hold in time; the message names it and the last value seen."""


def wait_until(predicate: Callable[[], T], *, message: str, timeout: float = 10.0,
               interval: float = 0.05) -> T:
    """Call `predicate` every `interval` s until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"waited {timeout:g} s for {message}; last saw {value!r}")
        time.sleep(interval)


def http_ok(url: str) -> bool:
    """Whether a GET of `url` answers 200 now (False while nothing or an error answers)."""
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except (OSError, ValueError, http.client.HTTPException):
        return False
