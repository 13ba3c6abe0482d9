"""The service-selection options shared by the modules that run services.json."""

from __future__ import annotations


class ModuleDocFragment:
    """Options O(names) and O(exclude): which services of services.json a run touches."""

    DOCUMENTATION = r"""
options:
  names:
    description: Only these services; all of them when empty.
    type: list
    elements: str
    default: []
  exclude:
    description: Leave these services alone (for example V(gateway) while the gears start).
    type: list
    elements: str
    default: []
"""
