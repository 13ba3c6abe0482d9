"""Root test configuration: make the collection importable as ansible_collections.lobes.fleet."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_COLLECTIONS = ROOT / ".collections"
_LINK = _COLLECTIONS / "ansible_collections" / "lobes" / "fleet"

# scripts/venv.sh creates this link; create it here too so a bare `pytest` works.
if not _LINK.exists():
    _LINK.parent.mkdir(parents=True, exist_ok=True)
    _LINK.symlink_to(ROOT)
if str(_COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(_COLLECTIONS))
