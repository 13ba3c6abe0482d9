"""App: the rooms wired together. The connection loop (gateway), the one failover loop
(dispatch), relaying an answer (relay, meter), the gateway's own endpoints (views), the
WebSocket tunnel (realtime)."""
