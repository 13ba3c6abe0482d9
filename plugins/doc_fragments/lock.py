"""The lock file option of the modules that write the fleet's lock file."""

from __future__ import annotations


class ModuleDocFragment:
    """O(lock_file), the lock file a module writes (C(fleet.lock.yml) beside the inventory)."""

    DOCUMENTATION = r"""
options:
  lock_file:
    description: The lock file; created when it does not exist.
    type: path
    required: true
"""
