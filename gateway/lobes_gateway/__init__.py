"""lobes_gateway: the pure-stdlib OpenAI-compatible gateway of one lobes.fleet box."""

__version__ = "0.1.0"
