"""Root test configuration: make the collection importable as ansible_collections.lobes.fleet,
and start the long-running tests first."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_COLLECTIONS = ROOT / ".collections"
_LINK = _COLLECTIONS / "ansible_collections" / "lobes" / "fleet"

# scripts/venv.sh creates this link; create it here too so a bare `pytest` works.
if not _LINK.exists():
    _LINK.parent.mkdir(parents=True, exist_ok=True)
    _LINK.symlink_to(ROOT)
if str(_COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(_COLLECTIONS))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked slow (minutes each) go first: pytest-xdist hands tests out in collection
    order, so one started late would leave the other workers idle at the end of the run."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
