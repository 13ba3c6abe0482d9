"""lobes_sim: a vLLM-compatible simulator of the fleet's inference gears (stdlib only)."""

__version__ = "0.1.0"
