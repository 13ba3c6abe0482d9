"""Why a test needing a Debian tool skips: one message naming the package and who installs it."""

from __future__ import annotations


def not_installed(tool: str, package: str) -> str:
    """The skip reason for a missing `tool` from Debian's `package`."""
    return (f"{tool} is not installed (Debian's {package}; scripts/test.sh installs it when run "
            "as root, see scripts/tools.sh)")
