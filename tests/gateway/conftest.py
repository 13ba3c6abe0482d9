"""Fixtures: real simulator and gateway processes, stopped at teardown pass or fail."""

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.gateway_proc import GatewayProcess, start_gateway
from tests.support.sim_proc import sim_factory  # noqa: F401  (a fixture)


@pytest.fixture
def gateway_factory() -> Iterator[Any]:
    """start_gateway(env) whose processes all stop at teardown."""
    started: list[GatewayProcess] = []

    def factory(env: dict[str, str], **options: Any) -> GatewayProcess:
        gateway = start_gateway(env, **options)
        started.append(gateway)
        return gateway

    yield factory
    for gateway in started:
        gateway.stop()
