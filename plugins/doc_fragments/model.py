"""The options every module that handles a checkpoint's files on a box shares."""

from __future__ import annotations


class ModuleDocFragment:
    """O(model_dir), where the box keeps its checkpoints; with C(checkpoint), O(checkpoint)."""

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
