"""lobes_gateway: the pure-stdlib OpenAI-compatible gateway of one lobes.fleet box."""

from lobes_contract import VERSION as __version__

__all__ = ["__version__"]
