"""Fixtures of the mesh scenario's seed replays (run by its verify playbook)."""

from __future__ import annotations

import pytest
from fleet_mesh import Mesh, load_mesh, mesh_file


@pytest.fixture(scope="session")
def mesh() -> Mesh:
    return load_mesh(mesh_file())
