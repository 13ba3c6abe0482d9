"""The options every module that handles a checkpoint's files on a box shares."""

from __future__ import annotations


class ModuleDocFragment:
    """O(model_dir), where the box keeps its checkpoints; with C(checkpoint), O(checkpoint);
    with C(copy), the SSH options of a copy from another box (O(ssh_user), O(ssh_key),
    O(ssh_port), O(timeout))."""

    DOCUMENTATION = r"""
options:
  model_dir:
    description: The directory that holds the box's checkpoints (inventory C(fleet_model_dir)).
    type: path
    default: /var/lib/lobes/models
"""

    CHECKPOINT = r"""
options:
  checkpoint:
    description: The hub repo id, C(org/name).
    type: str
    required: true
"""

    COPY = r"""
options:
  ssh_user:
    description: The user to log in as on O(source).
    type: str
    default: root
  ssh_key:
    description:
      - The private key on this box to log in with; C(<model_dir>/.ssh/lobes_model_copy) when
        not set (where M(lobes.fleet.model_copy_key) writes it).
    type: path
  ssh_port:
    description: The SSH port of O(source).
    type: int
    default: 22
  timeout:
    description: Seconds to wait for the connection, and then for the source's next bytes.
    type: int
    default: 30
"""
