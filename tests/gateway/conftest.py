"""Fixtures: real simulator and gateway processes, stopped at teardown pass or fail."""

from tests.support.gateway_proc import gateway_factory  # noqa: F401  (a fixture)
from tests.support.sim_proc import sim_factory  # noqa: F401  (a fixture)
