"""Mesh: what this box knows of others. Replica sets and their probed verdicts (replicas), the
peer routes' views and each pool's placer, under one prober (peers), the served windows of the
local backends (windows). Imports policy and transport."""
