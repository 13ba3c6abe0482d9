"""Shared DOCUMENTATION attributes of the lobes.fleet modules."""

from __future__ import annotations


class ModuleDocFragment:
    """Attribute fragments: O(extends_documentation_fragment) lobes.fleet.attributes[.name]."""

    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description:
      - Can run in check_mode and return changed status prediction without modifying target.
  diff_mode:
    description:
      - Will return details on what has changed (or possibly needs changing in check_mode),
        when in diff mode.
"""

    PURE = r"""
options: {}
attributes:
  check_mode:
    support: full
    details: Computes and returns the same result; it changes nothing in either mode.
  diff_mode:
    support: none
"""

    FILES = r"""
options: {}
attributes:
  check_mode:
    support: full
    details: Reports what would change and writes nothing.
  diff_mode:
    support: full
    details: Shows each file's before and after, with secret values masked.
"""

    READ_ONLY = r"""
options: {}
attributes:
  check_mode:
    support: full
    details: Read-only; it behaves the same in check mode.
  diff_mode:
    support: none
"""

    CHANGES = r"""
options: {}
attributes:
  check_mode:
    support: full
    details: Reports what would change and changes nothing.
  diff_mode:
    support: full
    details: Shows what changes, before and after.
"""

    POSIX = r"""
options: {}
attributes:
  platform:
    description: Target OS/families that can be operated against.
    support: full
    platforms: posix
"""
