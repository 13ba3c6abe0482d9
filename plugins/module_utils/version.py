"""The collection's version: the gateway it deploys must report the same on /health."""

from __future__ import annotations

# Must equal galaxy.yml's version (a unit test holds them together).
COLLECTION_VERSION = "0.1.0"
