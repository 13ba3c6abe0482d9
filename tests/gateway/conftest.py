"""Fixtures: real simulator and gateway processes, stopped at teardown pass or fail."""

from tests.support.gateway_proc import gateway_factory
from tests.support.sim_proc import sim_factory

__all__ = ["gateway_factory", "sim_factory"]
