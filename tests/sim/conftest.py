"""Simulator tests: the sim_factory fixture starts real lobes_sim processes."""

from tests.support.sim_proc import sim_factory

__all__ = ["sim_factory"]
