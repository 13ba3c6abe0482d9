"""Text files a module renders onto the box: read one with its mode, replace one atomically."""

from __future__ import annotations

import os
import tempfile


def read_with_mode(path: str) -> tuple:
    """(text, permission bits) of a file, or (None, None) when it does not exist."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read(), os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        return None, None


def replace_atomically(path: str, text: str, mode: int) -> None:
    """Atomic replace, created with its final mode so a secret is never world-readable."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".lobes-")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
