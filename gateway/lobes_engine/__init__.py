"""Box-side helpers of the real engine (vLLM's CPU build): the tiny models it can serve."""
