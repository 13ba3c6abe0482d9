"""lobes_sim: a vLLM-compatible simulator of the fleet's inference gears (stdlib only)."""
