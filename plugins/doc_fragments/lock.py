"""The fleet's lock file: the option of the modules that write it, and where they all run."""

from __future__ import annotations


class ModuleDocFragment:
    """O(lock_file), the lock file a module writes (C(fleet.lock.yml) beside the inventory);
    CONTROLLER, the note of every module that reads or writes it."""

    DOCUMENTATION = r"""
options:
  lock_file:
    description: The lock file; created when it does not exist.
    type: path
    required: true
"""

    CONTROLLER = r"""
options: {}
notes:
  - "Run it on the controller (C(delegate_to: localhost), C(run_once)): the lock file is the
    controller's, beside the inventory, and is read with PyYAML, which ansible-core brings
    there."
"""
