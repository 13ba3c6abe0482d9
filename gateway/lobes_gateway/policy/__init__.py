"""Policy: pure decisions, no sockets. The environment into a frozen config (config), a request
into a Route (routing), the key gate and per-key limits (auth), the shed verdict (pressure), where
a pooled request goes (placement). Imports the transport layer only."""
